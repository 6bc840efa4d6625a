// The model with the deployment's fp8 KV caches on the GPU: prefill then decode with 656-byte MLA
// entries and e4m3 indexer keys gives the CPU reference's logits (which quantises at the same
// points) and stays close to the f32 cache; the same for the bf16 cache.
#include <gtest/gtest.h>

#include "cuda/cuda_test_util.h"
#include "model/dsa_model.h"
#include "model/synthetic.h"
#include "test_util.h"

namespace dsi {
namespace {

class CudaKvCacheFp8 : public test::CudaTest {};

TEST_F(CudaKvCacheFp8, ModelMatchesTheCpu) {
  ModelConfig cfg = load_config(test::fixture_dir("glm_tiny") + "/config.json");
  cfg.kv_lora_rank = 512;  // the 656-byte entry's geometry
  cfg.head_dim_rope = 64;
  cfg.index_head_dim = 128;
  cfg.index_topk = 16;
  const Checkpoint ck = synthetic_checkpoint(cfg, 5);
  auto cpu = DsaModel::load(ck, cfg, RankContext{});
  auto gpu = DsaModel::load(ck, cfg, RankContext{}, test::gpu());
  std::vector<int32_t> ids;
  for (int i = 0; i < 40; ++i) ids.push_back((i * 37 + 11) % 400);
  const int64_t n = int64_t(ids.size());
  auto run = [&](const DsaModel& m, KvCacheDtype dtype) {
    SequenceKvCache cache = m.make_cache(n, false, dtype);
    Tensor out = Tensor::empty({n, cfg.vocab_size}, DType::F32);
    Tensor first = out.slice(0, 32);
    first.copy_from(m.logits(m.forward(Tensor::from_i32({ids.begin(), ids.begin() + 32}, {32}), cache)));
    for (int64_t i = 32; i < n; ++i) {
      Tensor row = out.slice(i, i + 1);
      row.copy_from(m.logits(m.forward(Tensor::from_i32({ids[size_t(i)]}, {1}), cache)));
    }
    return out;
  };
  const Tensor g8 = run(*gpu, KvCacheDtype::kFp8), c8 = run(*cpu, KvCacheDtype::kFp8);
  const Tensor c32 = run(*cpu, KvCacheDtype::kF32);
  const double tight = test::nmse(g8, c8), loose = test::nmse(g8, c32);
  std::printf("[ measured ] logits nmse: GPU fp8 vs CPU fp8 %.3g, GPU fp8 vs CPU f32 %.3g\n", tight, loose);
  EXPECT_LT(tight, 1e-4);  // same quantisation points; summation order and bf16 q in attention
  EXPECT_LT(loose, 2e-2);
  // The bf16 cache: the same rounding on both sides, the GPU's only difference is summation order.
  const Tensor g16 = run(*gpu, KvCacheDtype::kBf16), c16 = run(*cpu, KvCacheDtype::kBf16);
  const double t16 = test::nmse(g16, c16), l16 = test::nmse(g16, c32);
  std::printf("[ measured ] logits nmse: GPU bf16 vs CPU bf16 %.3g, GPU bf16 vs CPU f32 %.3g\n", t16, l16);
  EXPECT_LT(t16, 1e-6);
  EXPECT_LT(l16, 1e-3);
}

}  // namespace
}  // namespace dsi
