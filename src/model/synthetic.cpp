// Synthetic checkpoints; see synthetic.h.
#include "model/synthetic.h"

#include <cstring>
#include <random>

#include <fmt/format.h>

#include "core/dtype.h"

namespace dsi {

namespace {

enum class Kind { kProjection, kNorm, kSmall, kBias };

struct Spec {
  Shape shape;
  Kind kind;
};

// name -> shape and kind, for every tensor of the model (main layers and the MTP layer).
std::map<std::string, Spec> tensor_specs(const ModelConfig& c) {
  std::map<std::string, Spec> t;
  const int64_t D = c.hidden_size, H = c.n_heads;
  auto proj = [&](const std::string& n, int64_t out, int64_t in) {
    t[n + ".weight"] = {{out, in}, Kind::kProjection};
  };
  auto norm = [&](const std::string& n, int64_t d) { t[n + ".weight"] = {{d}, Kind::kNorm}; };
  auto mlp = [&](const std::string& p, int64_t inter) {
    proj(p + ".gate_proj", inter, D);
    proj(p + ".up_proj", inter, D);
    proj(p + ".down_proj", D, inter);
  };
  auto layer = [&](int i, bool indexer, bool moe) {
    const std::string p = fmt::format("model.layers.{}.", i);
    norm(p + "input_layernorm", D);
    norm(p + "post_attention_layernorm", D);
    const std::string a = p + "self_attn.";
    proj(a + "q_a_proj", c.q_lora_rank, D);
    norm(a + "q_a_layernorm", c.q_lora_rank);
    proj(a + "q_b_proj", H * c.qk_head_dim(), c.q_lora_rank);
    proj(a + "kv_a_proj_with_mqa", c.kv_lora_rank + c.head_dim_rope, D);
    norm(a + "kv_a_layernorm", c.kv_lora_rank);
    proj(a + "kv_b_proj", H * (c.head_dim_nope + c.v_head_dim), c.kv_lora_rank);
    proj(a + "o_proj", D, H * c.v_head_dim);
    if (indexer) {
      proj(a + "indexer.wq_b", int64_t(c.n_index_heads) * c.index_head_dim, c.q_lora_rank);
      proj(a + "indexer.wk", c.index_head_dim, D);
      t[a + "indexer.weights_proj.weight"] = {{c.n_index_heads, D}, Kind::kSmall};
      norm(a + "indexer.k_norm", c.index_head_dim);
      t[a + "indexer.k_norm.bias"] = {{c.index_head_dim}, Kind::kBias};
    }
    if (!moe) {
      mlp(p + "mlp", c.intermediate_size);
      return;
    }
    t[p + "mlp.gate.weight"] = {{c.n_experts, D}, Kind::kSmall};
    t[p + "mlp.gate.e_score_correction_bias"] = {{c.n_experts}, Kind::kBias};
    for (int e = 0; e < c.n_experts; ++e) mlp(fmt::format("{}mlp.experts.{}", p, e), c.moe_intermediate_size);
    mlp(p + "mlp.shared_experts", int64_t(c.moe_intermediate_size) * c.n_shared_experts);
  };
  for (int i = 0; i < c.n_layers; ++i) layer(i, c.indexer_full[size_t(i)], c.layer_is_moe[size_t(i)]);
  t["model.embed_tokens.weight"] = {{c.vocab_size, D}, Kind::kSmall};
  norm("model.norm", D);
  t["lm_head.weight"] = {{c.vocab_size, D}, Kind::kSmall};
  if (c.n_mtp_layers > 0) {
    const int L = c.n_layers;
    layer(L, /*indexer=*/true, /*moe=*/c.n_experts > 0);
    const std::string p = fmt::format("model.layers.{}.", L);
    norm(p + "enorm", D);
    norm(p + "hnorm", D);
    t[p + "eh_proj.weight"] = {{D, 2 * D}, Kind::kSmall};
    norm(p + "shared_head.norm", D);
  }
  return t;
}

// A table of pseudo-random bytes per dtype, tiled over each tensor at a per-tensor offset: fast
// enough for tens of GB of weights, and never NaN.
struct Pool {
  static constexpr size_t kBytes = size_t(1) << 22;
  std::vector<uint8_t> bf16, e4m3, f32, norm_bf16;
  explicit Pool(uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    bf16.resize(kBytes);
    e4m3.resize(kBytes);
    f32.resize(kBytes);
    norm_bf16.resize(kBytes);
    for (size_t i = 0; i < kBytes / 2; ++i) {
      const uint16_t w = f32_to_bf16(0.05f * u(rng)), n = f32_to_bf16(1.0f + 0.1f * u(rng));
      std::memcpy(&bf16[2 * i], &w, 2);
      std::memcpy(&norm_bf16[2 * i], &n, 2);
    }
    for (size_t i = 0; i < kBytes; ++i) e4m3[i] = f32_to_e4m3(400.0f * u(rng));
    for (size_t i = 0; i < kBytes / 4; ++i) {
      const float v = 0.01f * u(rng);
      std::memcpy(&f32[4 * i], &v, 4);
    }
  }
};

void tile(const std::vector<uint8_t>& src, size_t offset, uint8_t* dst, size_t n) {
  size_t done = 0;
  offset %= src.size();
  while (done < n) {
    const size_t len = std::min(n - done, src.size() - offset);
    std::memcpy(dst + done, src.data() + offset, len);
    done += len;
    offset = 0;
  }
}

}  // namespace

Checkpoint synthetic_checkpoint(const ModelConfig& cfg, uint64_t seed) {
  const bool fp8 = cfg.quant.fp8;
  std::map<std::string, TensorInfo> infos;
  std::map<std::string, Kind> kinds;
  for (const auto& [name, spec] : tensor_specs(cfg)) {
    TensorInfo ti;
    ti.name = name;
    ti.shape = spec.shape;
    ti.dtype = spec.kind == Kind::kBias ? DType::F32 : DType::BF16;
    if (spec.kind == Kind::kProjection && fp8) {
      ti.dtype = DType::F8_E4M3;
      const std::string scale = name.substr(0, name.size() - std::string(".weight").size()) +
                                ".weight_scale_inv";
      TensorInfo si;
      si.name = scale;
      si.dtype = DType::F32;
      si.shape = {(spec.shape[0] + cfg.quant.block_out - 1) / cfg.quant.block_out,
                  (spec.shape[1] + cfg.quant.block_in - 1) / cfg.quant.block_in};
      si.nbytes = size_t(shape_numel(si.shape)) * 4;
      infos[scale] = si;
      kinds[scale] = Kind::kProjection;
    }
    ti.nbytes = size_t(shape_numel(ti.shape)) * dtype_size(ti.dtype);
    infos[name] = ti;
    kinds[name] = spec.kind;
  }
  auto pool = std::make_shared<Pool>(seed);
  auto make = [pool, kinds](const TensorInfo& ti) {
    Tensor t = Tensor::empty(ti.shape, ti.dtype);
    const size_t offset = std::hash<std::string>{}(ti.name) % Pool::kBytes & ~size_t(3);
    const Kind kind = kinds.at(ti.name);
    if (ti.dtype == DType::F8_E4M3) {
      tile(pool->e4m3, offset, static_cast<uint8_t*>(t.raw()), t.nbytes());
    } else if (ti.dtype == DType::BF16) {
      tile(kind == Kind::kNorm ? pool->norm_bf16 : pool->bf16, offset, static_cast<uint8_t*>(t.raw()),
           t.nbytes());
    } else if (kind == Kind::kProjection) {  // block scales: fp8 values up to 400 -> |w| <= 0.05
      for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = 1.25e-4f;
    } else {
      tile(pool->f32, offset, static_cast<uint8_t*>(t.raw()), t.nbytes());
    }
    return t;
  };
  return Checkpoint::synthetic(fmt::format("synthetic {} model", cfg.model_type), std::move(infos),
                               std::move(make));
}

int64_t decode_weight_bytes(const ModelConfig& c, int layer) {
  const int64_t proj = c.quant.fp8 ? 1 : 2;  // bytes per projection weight (scales: negligible)
  const int64_t D = c.hidden_size, H = c.n_heads;
  int64_t b = proj * (int64_t(c.q_lora_rank) * D + H * c.qk_head_dim() * c.q_lora_rank +
                      (c.kv_lora_rank + c.head_dim_rope) * D +
                      H * (c.head_dim_nope + c.v_head_dim) * c.kv_lora_rank + D * H * c.v_head_dim);
  if (c.indexer_full[size_t(layer)])
    b += proj * (int64_t(c.n_index_heads) * c.index_head_dim * c.q_lora_rank + c.index_head_dim * D) +
         2 * int64_t(c.n_index_heads) * D;
  if (!c.layer_is_moe[size_t(layer)]) return b + proj * 3 * int64_t(c.intermediate_size) * D;
  const int64_t expert = proj * 3 * int64_t(c.moe_intermediate_size) * D;
  return b + 2 * int64_t(c.n_experts) * D + expert * (c.n_experts_active + c.n_shared_experts);
}

}  // namespace dsi
