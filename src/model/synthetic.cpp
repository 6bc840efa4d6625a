// Synthetic checkpoints; see synthetic.h.
#include "model/synthetic.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <memory>
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

// A table of pseudo-random bytes per kind of tensor, repeated over a buffer as long as the table plus
// the largest tensor of that kind, so every tensor is a view of the buffer at a per-tensor offset
// (nothing allocated or copied per tensor: tens of GB of weights cost one buffer per kind), and
// never NaN. Views are read-only in use, as a mapped checkpoint's are.
enum class Fill { kBf16, kNormBf16, kE4m3, kF32, kScale, kCount };

struct Pool {
  static constexpr size_t kBytes = size_t(1) << 22;
  std::shared_ptr<Storage> buf[size_t(Fill::kCount)];

  Pool(uint64_t seed, const std::array<size_t, size_t(Fill::kCount)>& longest) {
    std::vector<uint8_t> table[size_t(Fill::kCount)];
    for (auto& t : table) t.resize(kBytes);
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (size_t i = 0; i < kBytes / 2; ++i) {
      const uint16_t w = f32_to_bf16(0.05f * u(rng)), n = f32_to_bf16(1.0f + 0.1f * u(rng));
      std::memcpy(&table[size_t(Fill::kBf16)][2 * i], &w, 2);
      std::memcpy(&table[size_t(Fill::kNormBf16)][2 * i], &n, 2);
    }
    for (size_t i = 0; i < kBytes; ++i) table[size_t(Fill::kE4m3)][i] = f32_to_e4m3(400.0f * u(rng));
    for (size_t i = 0; i < kBytes / 4; ++i) {
      const float v = 0.01f * u(rng), scale = 1.25e-4f;  // block scales: fp8 up to 400 -> |w| <= 0.05
      std::memcpy(&table[size_t(Fill::kF32)][4 * i], &v, 4);
      std::memcpy(&table[size_t(Fill::kScale)][4 * i], &scale, 4);
    }
    for (size_t k = 0; k < size_t(Fill::kCount); ++k) {
      if (longest[k] == 0) continue;
      const size_t n = kBytes + longest[k];
      buf[k] = std::make_shared<HostStorage>(n);
      auto* dst = static_cast<uint8_t*>(buf[k]->data());
      for (size_t done = 0; done < n; done += kBytes)
        std::memcpy(dst + done, table[k].data(), std::min(kBytes, n - done));
    }
  }
};

Fill fill_of(DType dtype, Kind kind) {
  if (dtype == DType::F8_E4M3) return Fill::kE4m3;
  if (dtype == DType::BF16) return kind == Kind::kNorm ? Fill::kNormBf16 : Fill::kBf16;
  return kind == Kind::kProjection ? Fill::kScale : Fill::kF32;
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
  std::array<size_t, size_t(Fill::kCount)> longest{};
  for (const auto& [name, ti] : infos) {
    size_t& l = longest[size_t(fill_of(ti.dtype, kinds.at(name)))];
    l = std::max(l, ti.nbytes);
  }
  auto pool = std::make_shared<Pool>(seed, longest);
  auto make = [pool, kinds](const TensorInfo& ti) {
    const Fill fill = fill_of(ti.dtype, kinds.at(ti.name));
    const std::shared_ptr<Storage>& buf = pool->buf[size_t(fill)];
    // Scales are one value; the others start at a per-tensor offset into the repeated table.
    const size_t offset = fill == Fill::kScale ? 0 : std::hash<std::string>{}(ti.name) % Pool::kBytes & ~size_t(3);
    return Tensor::wrap(static_cast<uint8_t*>(buf->data()) + offset, ti.shape, ti.dtype, Device::cpu(), buf);
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
