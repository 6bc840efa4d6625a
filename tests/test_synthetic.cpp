// Synthetic checkpoints (benchmarks at real geometries): every tensor the loader asks for exists
// with the right shape and dtype, bf16 and fp8 models load and give finite logits, the decode byte
// count follows the config, and the shipped GLM-5.2 / DeepSeek-V3.2 configs parse.
#include <gtest/gtest.h>

#include <cmath>

#include "model/dsa_model.h"
#include "model/synthetic.h"
#include "test_util.h"

namespace dsi {
namespace {

TEST(Synthetic, ModelsLoadAndRunInBothWeightTypes) {
  for (const std::string fixture : {"glm_tiny", "dsv32_tiny"}) {
    for (bool fp8 : {false, true}) {
      SCOPED_TRACE(fixture + (fp8 ? " fp8" : " bf16"));
      ModelConfig cfg = load_config(test::fixture_dir(fixture) + "/config.json");
      cfg.quant.fp8 = fp8;
      if (cfg.n_mtp_layers < 0) cfg.n_mtp_layers = 1;
      const Checkpoint ck = synthetic_checkpoint(cfg, 3);
      EXPECT_EQ(ck.info("model.layers.0.self_attn.q_b_proj.weight").dtype,
                fp8 ? DType::F8_E4M3 : DType::BF16);
      EXPECT_EQ(ck.has("model.layers.0.self_attn.q_b_proj.weight_scale_inv"), fp8);
      auto model = DsaModel::load(ck, cfg, RankContext{});
      ASSERT_TRUE(model->has_mtp());
      const std::vector<int32_t> ids = {1, 2, 3, 4, 5};
      SequenceKvCache cache = model->make_cache(8, false);
      const Tensor logits = model->logits(model->forward(Tensor::from_i32(ids, {5}), cache));
      for (int64_t i = 0; i < logits.numel(); ++i) ASSERT_TRUE(std::isfinite(logits.f32()[i])) << i;
      // Same seed, same weights.
      const Checkpoint again = synthetic_checkpoint(cfg, 3);
      const Tensor a = ck.get("model.layers.1.mlp.experts.0.down_proj.weight");
      const Tensor b = again.get("model.layers.1.mlp.experts.0.down_proj.weight");
      ASSERT_EQ(a.nbytes(), b.nbytes());
      EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0);
    }
  }
}

TEST(Synthetic, ShippedConfigsAndDecodeBytes) {
  const ModelConfig glm = load_config(test::source_dir() + "/configs/glm-5.2.json");
  EXPECT_EQ(glm.n_layers, 78);
  EXPECT_EQ(std::count(glm.indexer_full.begin(), glm.indexer_full.end(), true), 21);
  EXPECT_TRUE(glm.index_share_for_mtp_iteration);
  EXPECT_TRUE(glm.quant.fp8);
  const ModelConfig ds = load_config(test::source_dir() + "/configs/deepseek-v3.2.json");
  EXPECT_EQ(ds.n_layers, 61);
  EXPECT_EQ(ds.n_group, 8);
  // A GLM-5 MoE layer at batch 1 with fp8 weights reads attention (~170 MB) plus 9 experts of
  // 3 x 2048 x 6144 bytes (~340 MB): well above the attention alone, well below all 256 experts.
  const int64_t moe = decode_weight_bytes(glm, 6), dense = decode_weight_bytes(glm, 0);
  const int64_t expert = 3LL * 2048 * 6144;
  EXPECT_GT(moe, 9 * expert);
  EXPECT_LT(moe, 9 * expert + 250'000'000);
  ModelConfig bf16 = glm;
  bf16.quant.fp8 = false;
  EXPECT_NEAR(double(decode_weight_bytes(bf16, 6)) / double(moe), 2.0, 0.01);
  EXPECT_GT(dense, 3LL * 12288 * 6144);
}

}  // namespace
}  // namespace dsi

namespace dsi {
namespace {

// A small model with the real MLA cache geometry (kv_lora 512, rope 64, index dim 128), so the
// deployment's fp8 caches apply.
ModelConfig fp8_cache_geometry() {
  ModelConfig c = load_config(test::fixture_dir("glm_tiny") + "/config.json");
  c.kv_lora_rank = 512;
  c.head_dim_rope = 64;
  c.index_head_dim = 128;
  c.index_topk = 16;
  return c;
}

// Prefill 32 tokens, then decode 8 one by one, with a cache of each kind: the narrower caches stay
// close to the f32 one, and are really taken (not equal to it).
TEST(KvCacheDtypes, ModelLogitsFollowTheF32Cache) {
  const ModelConfig cfg = fp8_cache_geometry();
  const Checkpoint ck = synthetic_checkpoint(cfg, 5);
  auto model = DsaModel::load(ck, cfg, RankContext{});
  std::vector<int32_t> ids;
  for (int i = 0; i < 40; ++i) ids.push_back((i * 37 + 11) % 400);
  const int64_t n = int64_t(ids.size());
  auto run = [&](KvCacheDtype dtype, DType stored) {
    SequenceKvCache cache = model->make_cache(n, false, dtype);
    EXPECT_EQ(cache.layer(0).latent.dtype(), stored);
    Tensor out = Tensor::empty({n, cfg.vocab_size}, DType::F32);
    Tensor first = out.slice(0, 32);
    first.copy_from(model->logits(model->forward(Tensor::from_i32({ids.begin(), ids.begin() + 32}, {32}), cache)));
    for (int64_t i = 32; i < n; ++i) {
      Tensor row = out.slice(i, i + 1);
      row.copy_from(model->logits(model->forward(Tensor::from_i32({ids[size_t(i)]}, {1}), cache)));
    }
    return out;
  };
  const Tensor f32 = run(KvCacheDtype::kF32, DType::F32);
  const double e16 = test::nmse(run(KvCacheDtype::kBf16, DType::BF16), f32);
  const double e8 = test::nmse(run(KvCacheDtype::kFp8, DType::U8), f32);
  std::printf("[ measured ] logits nmse against the f32 KV cache: bf16 %.3g, fp8 %.3g\n", e16, e8);
  // bf16 keeps 8 mantissa bits (relative error <= 2^-9 per value), e4m3 3 (<= 2^-4).
  EXPECT_LT(e16, 1e-3);
  EXPECT_GT(e16, 0.0);
  EXPECT_LT(e8, 2e-2);
  EXPECT_GT(e8, e16);
}

TEST(KvCacheFp8, GeometryChecks) {
  const ModelConfig tiny = load_config(test::fixture_dir("glm_tiny") + "/config.json");
  test::expect_error([&] { KvPool(tiny, 2, false, Device::cpu(), KvCacheDtype::kFp8); },
                     {"656-byte layout", "kv_lora_rank"});
  test::expect_error([] { parse_kv_cache_dtype("bf8"); }, {"'bf8'", "f32, bf16, fp8 or auto"});
  const ModelConfig c = fp8_cache_geometry();
  // fp8 pages: 656 bytes per latent entry and 132 per index key, against 4 x 576 and 4 x 128.
  EXPECT_LT(KvPool::bytes_per_page(c, false, KvCacheDtype::kFp8) * 3,
            KvPool::bytes_per_page(c, false, KvCacheDtype::kF32));
  EXPECT_EQ(KvPool::bytes_per_page(c, true, KvCacheDtype::kBf16) * 2,
            KvPool::bytes_per_page(c, true, KvCacheDtype::kF32));
  // "auto": the CPU reference keeps f32; a GPU takes fp8 where the geometry allows, else bf16.
  EXPECT_EQ(resolve_kv_cache_dtype("auto", c, Device::cpu()), KvCacheDtype::kF32);
  EXPECT_EQ(resolve_kv_cache_dtype("auto", c, Device::cuda(0)), KvCacheDtype::kFp8);
  EXPECT_EQ(resolve_kv_cache_dtype("auto", tiny, Device::cuda(0)), KvCacheDtype::kBf16);
  EXPECT_EQ(resolve_kv_cache_dtype("f32", c, Device::cuda(0)), KvCacheDtype::kF32);
  EXPECT_EQ(resolve_kv_cache_dtype("bf16", tiny, Device::cpu()), KvCacheDtype::kBf16);
  EXPECT_STREQ(kv_cache_dtype_name(KvCacheDtype::kBf16), "bf16");
}

}  // namespace
}  // namespace dsi
