// The model against the HF transformers oracle (tests/fixtures/*/goldens, written by
// tools/make_fixtures.py): logits, MTP logits, per-layer top-k sets and greedy continuations.
#include <gtest/gtest.h>

#include <algorithm>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/npy.h"
#include "model/dsa_model.h"
#include "ops/rope.h"
#include "runtime/generator.h"
#include "test_util.h"
#include "tolerances.h"

namespace dsi {
namespace {

struct Prompt {
  std::string name;
  std::vector<int32_t> ids;
  std::string logits, mtp_logits, topk;
  std::vector<int32_t> greedy;
};

std::vector<Prompt> prompts_of(const nlohmann::json& manifest) {
  std::vector<Prompt> out;
  for (const auto& p : manifest.at("prompts")) {
    Prompt q;
    q.name = p.at("name");
    q.ids = p.at("ids").get<std::vector<int32_t>>();
    q.logits = p.at("logits");
    if (!p.at("mtp_logits").is_null()) q.mtp_logits = p.at("mtp_logits");
    q.topk = p.at("topk");
    q.greedy = p.at("greedy").get<std::vector<int32_t>>();
    out.push_back(q);
  }
  return out;
}

Tensor golden(const std::string& fixture, const std::string& file) {
  return read_npy(test::fixture_dir(fixture) + "/goldens/" + file);
}

class Golden : public ::testing::TestWithParam<std::string> {};

TEST_P(Golden, LogitsAndMtpLogitsMatchHF) {
  const std::string fx = GetParam();
  const DsaModel& model = test::fixture_model(fx);
  ASSERT_TRUE(model.has_mtp());
  for (const Prompt& p : prompts_of(test::load_manifest(fx))) {
    SCOPED_TRACE(fx + " " + p.name + " (" + std::to_string(p.ids.size()) + " tokens)");
    const PromptLogits r = prompt_logits(model, p.ids, 0, /*with_mtp=*/true);
    const Tensor g = golden(fx, p.logits);
    EXPECT_LE(test::nmse(r.logits, g), tol::kGoldenLogitsNmse);
    EXPECT_LE(test::max_abs_diff(r.logits, g), tol::kGoldenLogitsMaxAbs);
    if (p.mtp_logits.empty()) {
      EXPECT_EQ(r.mtp_logits.dim(0), 0);
      continue;
    }
    const Tensor gm = golden(fx, p.mtp_logits);
    EXPECT_LE(test::nmse(r.mtp_logits, gm), tol::kGoldenLogitsNmse);
    EXPECT_LE(test::max_abs_diff(r.mtp_logits, gm), tol::kGoldenLogitsMaxAbs);
  }
}

TEST_P(Golden, TopkSetsMatchHFExactly) {
  const std::string fx = GetParam();
  const DsaModel& model = test::fixture_model(fx);
  const int n_layers = model.config().n_layers, k = model.config().index_topk;
  for (const Prompt& p : prompts_of(test::load_manifest(fx))) {
    SCOPED_TRACE(fx + " " + p.name);
    const int64_t n = int64_t(p.ids.size());
    SequenceKvCache cache(model.config(), n, false);
    ForwardTrace trace;
    model.forward(Tensor::from_i32(p.ids, {n}), cache, &trace);
    const Tensor g = golden(fx, p.topk);  // [layers, n, k]
    ASSERT_EQ(g.shape(), (Shape{n_layers, n, k}));
    ASSERT_EQ(int(trace.topk.size()), n_layers);
    const std::vector<int32_t> want = test::golden_topk_by_position(g);  // listed as the engine does
    for (int l = 0; l < n_layers; ++l) {
      for (int64_t i = 0; i < n * k; ++i)
        ASSERT_EQ(trace.topk[size_t(l)].i32()[i], want[size_t(l * n * k + i)])
            << "layer " << l << " row " << i / k << " slot " << i % k;
    }
  }
}

TEST_P(Golden, GreedyTokensMatchHFFullRecompute) {
  const std::string fx = GetParam();
  const DsaModel& model = test::fixture_model(fx);
  for (const Prompt& p : prompts_of(test::load_manifest(fx))) {
    SCOPED_TRACE(fx + " " + p.name);
    GenerationParams gp;
    gp.max_new_tokens = int(p.greedy.size());
    gp.ignore_eos = true;
    const GenerationResult r = generate(model, p.ids, gp);
    EXPECT_EQ(r.output_ids, p.greedy);
    EXPECT_EQ(r.finish_reason, "length");
  }
}

TEST_P(Golden, RopeAndSoftmaxScaleMatchHF) {
  const std::string fx = GetParam();
  const nlohmann::json m = test::load_manifest(fx);
  const ModelConfig& cfg = test::fixture_model(fx).config();
  const ops::RopeFreqs f = ops::compute_rope_freqs(cfg.rope, cfg.head_dim_rope);
  const auto hf = m.at("rope_inv_freq").get<std::vector<double>>();
  ASSERT_EQ(f.inv_freq.size(), hf.size());
  for (size_t i = 0; i < hf.size(); ++i)
    EXPECT_NEAR(f.inv_freq[i], hf[i], tol::kRopeFreqRel * hf[i]) << "inv_freq[" << i << "]";
  EXPECT_NEAR(f.attention_factor, m.at("rope_attention_scaling").get<double>(), 1e-7);
  EXPECT_NEAR(cfg.attn_softmax_scale(), m.at("attn_softmax_scale").get<double>(), 1e-9);
}

TEST_P(Golden, E4M3DecodingMatchesTorch) {
  const nlohmann::json m = test::load_manifest(GetParam());
  const auto& table = m.at("e4m3_table");
  ASSERT_EQ(table.size(), 256u);
  for (int v = 0; v < 256; ++v) {
    const float mine = e4m3_to_f32(uint8_t(v));
    if (table[size_t(v)].is_null()) {
      EXPECT_TRUE(std::isnan(mine)) << v;
    } else {
      EXPECT_EQ(mine, table[size_t(v)].get<float>()) << v;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Golden, ::testing::ValuesIn(test::fixture_names()));

}  // namespace
}  // namespace dsi
