// The bundled trained model (models/kjv-dsa) against its training script's own evaluation
// (tests/data/kjv_eval_slice.json, written by `tools/train_kjv.py eval-slice`): held-out
// cross-entropy with top-k and with dense attention, the MTP head's, the greedy continuation of a
// held-out prompt, and MTP speculative decoding (output unchanged, acceptance per position close to
// what the training evaluation measured with the same prompts).
#include <gtest/gtest.h>

#include <fstream>

#include "runtime/generator.h"
#include "runtime/perplexity.h"
#include "runtime/ranks.h"
#include "test_util.h"

namespace dsi {
namespace {

const std::string kModel = "models/kjv-dsa";

nlohmann::json reference() {
  std::ifstream f(test::source_dir() + "/tests/data/kjv_eval_slice.json");
  EXPECT_TRUE(f.good());
  return nlohmann::json::parse(f);
}

const DsaModel& bundled(bool dense) {
  static std::unique_ptr<DsaModel> sparse_model, dense_model;
  auto& m = dense ? dense_model : sparse_model;
  if (!m) m = load_rank_model(test::source_dir() + "/" + kModel, RankContext{}, ModelOverrides{dense});
  return *m;
}

// Cross-entropies agree to float noise: both sides compute in fp32 from the same bf16 weights, in
// different summation orders (torch batched vs this engine); measured differences ~1e-6.
constexpr double kCeTol = 2e-5;

TEST(BundledModel, HeldOutCrossEntropyMatchesTrainingEvaluation) {
  const nlohmann::json ref = reference();
  const auto tokens = ref.at("tokens").get<std::vector<int32_t>>();
  const int window = ref.at("seq_len").get<int>();
  for (const bool dense : {false, true}) {
    SCOPED_TRACE(dense ? "dense attention" : "top-k attention");
    const nlohmann::json& want = ref.at(dense ? "dense" : "topk");
    const PerplexityResult r = perplexity(bundled(dense), tokens, window, /*with_mtp=*/true);
    EXPECT_EQ(r.windows, want.at("windows").get<int64_t>());
    EXPECT_EQ(r.tokens_scored, want.at("tokens_scored").get<int64_t>());
    EXPECT_NEAR(r.ce, want.at("ce").get<double>(), kCeTol);
    EXPECT_NEAR(r.top1_acc, want.at("top1_acc").get<double>(), 2.0 / double(r.tokens_scored));
    EXPECT_EQ(r.mtp_tokens_scored, want.at("mtp_tokens_scored").get<int64_t>());
    EXPECT_NEAR(r.mtp_ce, want.at("mtp_ce").get<double>(), kCeTol);
    std::printf("[ %s ] held-out slice: ce %.6f (training eval %.6f), ppl %.3f, MTP ce %.6f\n",
                dense ? "dense" : "top-k", r.ce, want.at("ce").get<double>(), r.ppl, r.mtp_ce);
  }
}

// The training script's greedy continuation (full recompute in PyTorch) of its first acceptance
// prompt is what the engine generates from the caches.
TEST(BundledModel, GreedyContinuationIsStable) {
  const nlohmann::json acc = reference().at("acceptance");
  const auto prompt = acc.at("sample_prompt_ids").get<std::vector<int32_t>>();
  const auto want = acc.at("sample_continuation_ids").get<std::vector<int32_t>>();
  GenerationParams gp;
  gp.max_new_tokens = int(want.size());
  gp.ignore_eos = true;
  EXPECT_EQ(generate(bundled(false), prompt, gp).output_ids, want);
}

// Speculative decoding with K = 3 on the training evaluation's prompts: the same tokens as plain
// greedy decoding, and per-position acceptance within noise of the training evaluation (which
// simulated the same rounds; the last rounds differ because it drafts past the 64th token).
TEST(BundledModel, SpeculativeDecodingMatchesTrainingAcceptance) {
  const nlohmann::json ref = reference();
  const nlohmann::json& acc = ref.at("acceptance");
  const int k = acc.at("k_draft").get<int>(), n_gen = acc.at("generated").get<int>();
  int64_t rounds = 0;
  std::vector<int64_t> accepted(size_t(k), 0);
  for (const auto& p : ref.at("acceptance_prompts")) {
    const auto prompt = p.get<std::vector<int32_t>>();
    GenerationParams gp;
    gp.max_new_tokens = n_gen;
    const GenerationResult plain = generate(bundled(false), prompt, gp);
    gp.speculative_tokens = k;
    const GenerationResult spec = generate(bundled(false), prompt, gp);
    EXPECT_EQ(spec.output_ids, plain.output_ids);
    rounds += spec.speculative.rounds;
    for (int j = 0; j < k; ++j) accepted[size_t(j)] += spec.speculative.accepted_at[size_t(j)];
  }
  const auto want = acc.at("per_position_acceptance").get<std::vector<double>>();
  for (int j = 0; j < k; ++j) {
    const double got = double(accepted[size_t(j)]) / double(rounds);
    std::printf("[ acceptance ] position %d: %.3f (training eval %.3f)\n", j + 1, got, want[size_t(j)]);
    EXPECT_NEAR(got, want[size_t(j)], 0.08) << "position " << j + 1;
  }
}

}  // namespace
}  // namespace dsi
