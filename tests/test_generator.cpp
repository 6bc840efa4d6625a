// Generation limits: prompts longer than the context are refused with a clear error, and decoding
// stops at the model's context length instead of running past the caches.
#include <gtest/gtest.h>

#include "model/dsa_model.h"
#include "runtime/generator.h"
#include "test_util.h"

namespace dsi {
namespace {

std::unique_ptr<DsaModel> with_context(const std::string& fixture, int64_t max_pos) {
  ModelConfig cfg = load_config(test::fixture_dir(fixture) + "/config.json");
  cfg.max_position_embeddings = max_pos;
  const Checkpoint ck = Checkpoint::open(test::fixture_dir(fixture));
  ModelWeights w = load_weights(ck, cfg);
  return std::make_unique<DsaModel>(cfg, std::move(w));
}

TEST(Generator, PromptLongerThanContextIsRefused) {
  auto m = with_context("glm_tiny", 10);
  std::vector<int32_t> prompt(11, 5);
  GenerationParams gp;
  test::expect_error([&] { generate(*m, prompt, gp); }, {"11 tokens", "context length 10"});
  test::expect_error([&] { prompt_logits(*m, prompt, 0, false); }, {"context length 10"});
}

TEST(Generator, DecodeStopsAtContextLength) {
  auto m = with_context("glm_tiny", 10);
  GenerationParams gp;
  gp.max_new_tokens = 50;
  gp.ignore_eos = true;
  const GenerationResult r = generate(*m, std::vector<int32_t>(7, 5), gp);
  // 7 prompt tokens fill positions 0..6; tokens at positions 7, 8, 9 are decoded, and the token
  // sampled from position 9's logits is the last one (it would sit at position 10).
  EXPECT_EQ(r.output_ids.size(), 4u);
  EXPECT_EQ(r.finish_reason, "context");
}

TEST(Generator, BadParametersAreRefused) {
  auto m = DsaModel::load(test::fixture_dir("glm_tiny"));
  GenerationParams gp;
  gp.sampling.top_p = 0.0f;
  test::expect_error([&] { generate(*m, {1, 2}, gp); }, {"top_p"});
  gp = GenerationParams{};
  gp.sampling.temperature = -1.0f;
  test::expect_error([&] { generate(*m, {1, 2}, gp); }, {"temperature"});
  gp = GenerationParams{};
  test::expect_error([&] { generate(*m, {}, gp); }, {"empty"});
  test::expect_error([&] { generate(*m, {1, 512}, gp); }, {"512", "vocabulary"});
}

TEST(Generator, ZeroNewTokens) {
  auto m = DsaModel::load(test::fixture_dir("glm_tiny"));
  GenerationParams gp;
  gp.max_new_tokens = 0;
  const GenerationResult r = generate(*m, {1, 2, 3}, gp);
  EXPECT_TRUE(r.output_ids.empty());
  EXPECT_EQ(r.stats.prompt_tokens, 3);
}

}  // namespace
}  // namespace dsi
