// The whole model on the GPU: every fixture with its weights, caches and activations on cuda:0
// reproduces the HF goldens and the CPU reference (logits, MTP logits, per-layer top-k sets, greedy
// tokens), prefill-then-decode equals one prefill, and MTP speculative decoding keeps greedy output.
#include <gtest/gtest.h>

#include "core/npy.h"
#include "cuda/cuda_test_util.h"
#include "runtime/generator.h"
#include "runtime/ranks.h"
#include "test_util.h"
#include "tolerances.h"

namespace dsi {
namespace {

class CudaModel : public test::CudaTest, public ::testing::WithParamInterface<std::string> {
 protected:
  const DsaModel& gpu_model() { return test::gpu_fixture_model(GetParam()); }
};

Tensor golden(const std::string& fixture, const std::string& file) {
  return read_npy(test::fixture_dir(fixture) + "/goldens/" + file);
}

TEST_P(CudaModel, LogitsTopkAndGreedyMatchGoldens) {
  const DsaModel& model = gpu_model();
  ASSERT_FALSE(model.device().is_cpu());
  const auto manifest = test::load_manifest(GetParam());
  for (const auto& p : manifest.at("prompts")) {
    SCOPED_TRACE(GetParam() + " " + p.at("name").get<std::string>());
    const auto ids = p.at("ids").get<std::vector<int32_t>>();
    const int64_t n = int64_t(ids.size());
    const PromptLogits r = prompt_logits(model, ids, 0, /*with_mtp=*/true);
    EXPECT_LE(test::nmse(r.logits, golden(GetParam(), p.at("logits"))), tol::kGoldenLogitsNmse);
    if (!p.at("mtp_logits").is_null()) {
      EXPECT_LE(test::nmse(r.mtp_logits, golden(GetParam(), p.at("mtp_logits"))),
                tol::kGoldenLogitsNmse);
    }
    // Per-layer top-k sets, bit for bit.
    SequenceKvCache cache = model.make_cache(n, false);
    ForwardTrace trace;
    model.forward(Tensor::from_i32(ids, {n}), cache, &trace);
    const Tensor g = golden(GetParam(), p.at("topk"));
    const std::vector<int32_t> want = test::golden_topk_by_position(g);  // listed as the engine does
    for (size_t l = 0; l < trace.topk.size(); ++l) {
      const Tensor t = to_host(trace.topk[l]);
      ASSERT_EQ(std::memcmp(t.raw(), want.data() + l * size_t(n * g.dim(2)), t.nbytes()), 0) << "layer " << l;
    }
    GenerationParams gp;
    gp.kv_cache_dtype = "f32";  // the reference's cache: outputs comparable token for token
    gp.max_new_tokens = int(p.at("greedy").size());
    gp.ignore_eos = true;
    EXPECT_EQ(generate(model, ids, gp).output_ids, p.at("greedy").get<std::vector<int32_t>>());
  }
}

TEST_P(CudaModel, DecodeEqualsPrefillAndSpeculationKeepsGreedy) {
  const DsaModel& model = gpu_model();
  const auto manifest = test::load_manifest(GetParam());
  const auto& p = manifest.at("prompts").back();
  const auto ids = p.at("ids").get<std::vector<int32_t>>();
  const int64_t n = int64_t(ids.size());
  const PromptLogits full = prompt_logits(model, ids, 0, false);
  const PromptLogits one_by_one = prompt_logits(model, ids, 1, false);
  EXPECT_LE(test::nmse(one_by_one.logits, full.logits), tol::kSelfConsistencyNmse);
  GenerationParams gp;
  gp.kv_cache_dtype = "f32";  // the reference's cache: outputs comparable token for token
  gp.max_new_tokens = 16;
  gp.ignore_eos = true;
  const auto plain = generate(model, ids, gp).output_ids;
  for (int k : {1, 3}) {
    gp.speculative_tokens = k;
    EXPECT_EQ(generate(model, ids, gp).output_ids, plain) << "K " << k;
  }
  (void)n;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaModel,
                         ::testing::Values("glm_tiny", "dsv32_tiny", "glm_tiny_fp8"));

}  // namespace
}  // namespace dsi
