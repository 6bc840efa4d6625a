// Checkpoint -> ModelWeights. Names follow the HF on-disk layout (dsa-reference.md section 3).
#include "model/weights.h"

#include <cstring>


namespace dsi {

namespace {

bool is_float(DType t) {
  return t == DType::F32 || t == DType::BF16 || t == DType::F16 || t == DType::F8_E4M3;
}

// Small tensors (norm weights, biases, scales) are converted to fp32 once.
Tensor to_f32(const Tensor& t, const std::string& name, const std::string& dir) {
  DSI_CHECK(is_float(t.dtype()), "{}: tensor '{}' has dtype {}, expected a float type", dir, name,
            dtype_name(t.dtype()));
  Tensor out = Tensor::empty(t.shape(), DType::F32);
  const Tensor src = t.is_contiguous() ? t : t.contiguous();
  for (int64_t i = 0; i < t.numel(); ++i) out.f32()[i] = load_as_f32(src.raw(), t.dtype(), i);
  return out;
}

class Loader {
 public:
  Loader(const Checkpoint& ck, const ModelConfig& cfg) : ck_(ck), cfg_(cfg) {}

  Tensor vec(const std::string& name, int64_t n) const {
    return to_f32(ck_.get(name, {n}), name, ck_.dir());
  }

  Tensor table(const std::string& name, int64_t rows, int64_t cols) const {
    Tensor t = ck_.get(name, {rows, cols});
    DSI_CHECK(is_float(t.dtype()) && t.dtype() != DType::F8_E4M3,
              "{}: tensor '{}' has dtype {}, expected F32, BF16 or F16", ck_.dir(), name,
              dtype_name(t.dtype()));
    return t;
  }

  // `module` is the name without ".weight"; fp8 weights bring "<module>.weight_scale_inv".
  LinearWeight linear(const std::string& module, int64_t out, int64_t in) const {
    LinearWeight w;
    const std::string wname = module + ".weight";
    w.weight = ck_.get(wname, {out, in});
    DSI_CHECK(is_float(w.weight.dtype()), "{}: tensor '{}' has dtype {}, expected a float type",
              ck_.dir(), wname, dtype_name(w.weight.dtype()));
    const std::string sname = module + ".weight_scale_inv";
    if (w.weight.dtype() == DType::F8_E4M3) {
      w.block_out = cfg_.quant.block_out;
      w.block_in = cfg_.quant.block_in;
      const int64_t so = (out + w.block_out - 1) / w.block_out;
      const int64_t si = (in + w.block_in - 1) / w.block_in;
      DSI_CHECK(ck_.has(sname), "{}: fp8 tensor '{}' has no '{}' (block scales [{}, {}])", ck_.dir(),
                wname, sname, so, si);
      w.scale_inv = to_f32(ck_.get(sname, {so, si}), sname, ck_.dir());
    } else {
      DSI_CHECK(!ck_.has(sname), "{}: '{}' exists but '{}' is {}, not F8_E4M3", ck_.dir(), sname,
                wname, dtype_name(w.weight.dtype()));
    }
    return w;
  }

  MlpWeights mlp(const std::string& prefix, int64_t inter) const {
    const int64_t d = cfg_.hidden_size;
    return MlpWeights{linear(prefix + ".gate_proj", inter, d), linear(prefix + ".up_proj", inter, d),
                      linear(prefix + ".down_proj", d, inter)};
  }

  IndexerWeights indexer(const std::string& p) const {
    const int64_t d = cfg_.hidden_size, hd = cfg_.index_head_dim;
    IndexerWeights w;
    w.wq_b = linear(p + ".wq_b", cfg_.n_index_heads * hd, cfg_.q_lora_rank);
    w.wk = linear(p + ".wk", hd, d);
    w.weights_proj = linear(p + ".weights_proj", cfg_.n_index_heads, d);
    w.k_norm_weight = vec(p + ".k_norm.weight", hd);
    w.k_norm_bias = vec(p + ".k_norm.bias", hd);
    return w;
  }

  AttentionWeights attention(const std::string& p, bool full_indexer) const {
    const ModelConfig& c = cfg_;
    const int64_t d = c.hidden_size, h = c.n_heads;
    AttentionWeights w;
    w.q_a_proj = linear(p + ".q_a_proj", c.q_lora_rank, d);
    w.q_a_layernorm = vec(p + ".q_a_layernorm.weight", c.q_lora_rank);
    w.q_b_proj = linear(p + ".q_b_proj", h * c.qk_head_dim(), c.q_lora_rank);
    w.kv_a_proj_with_mqa = linear(p + ".kv_a_proj_with_mqa", c.kv_lora_rank + c.head_dim_rope, d);
    w.kv_a_layernorm = vec(p + ".kv_a_layernorm.weight", c.kv_lora_rank);
    w.kv_b_proj = linear(p + ".kv_b_proj", h * (c.head_dim_nope + c.v_head_dim), c.kv_lora_rank);
    w.o_proj = linear(p + ".o_proj", d, h * c.v_head_dim);
    // Absorbed form: kv_b_proj viewed [H, nope + v, kv_lora]; rows [0, nope) are W_UK, the rest W_UV.
    const int64_t per_head = c.head_dim_nope + c.v_head_dim, lora = c.kv_lora_rank;
    Tensor kvb = ops::dequantize_rows(w.kv_b_proj, 0, h * per_head);
    w.w_uk = Tensor::empty({h, c.head_dim_nope, lora}, DType::F32);
    w.w_uv = Tensor::empty({h, c.v_head_dim, lora}, DType::F32);
    for (int64_t i = 0; i < h; ++i) {
      const float* src = kvb.f32() + i * per_head * lora;
      std::memcpy(w.w_uk.f32() + i * c.head_dim_nope * lora, src,
                  sizeof(float) * size_t(c.head_dim_nope * lora));
      std::memcpy(w.w_uv.f32() + i * c.v_head_dim * lora, src + c.head_dim_nope * lora,
                  sizeof(float) * size_t(c.v_head_dim * lora));
    }
    const std::string ip = p + ".indexer";
    if (full_indexer) {
      w.indexer = indexer(ip);
    } else {
      DSI_CHECK(!ck_.has(ip + ".wk.weight"),
                "{}: '{}' exists but the config makes this layer \"shared\" (no own indexer)",
                ck_.dir(), ip + ".wk.weight");
    }
    return w;
  }

  LayerWeights layer(int i, bool full_indexer, bool is_moe) const {
    const ModelConfig& c = cfg_;
    const std::string p = "model.layers." + std::to_string(i);
    LayerWeights w;
    w.input_layernorm = vec(p + ".input_layernorm.weight", c.hidden_size);
    w.post_attention_layernorm = vec(p + ".post_attention_layernorm.weight", c.hidden_size);
    w.self_attn = attention(p + ".self_attn", full_indexer);
    w.is_moe = is_moe;
    if (!is_moe) {
      w.mlp = mlp(p + ".mlp", c.intermediate_size);
      return w;
    }
    w.moe.gate = linear(p + ".mlp.gate", c.n_experts, c.hidden_size);
    w.moe.e_score_correction_bias = vec(p + ".mlp.gate.e_score_correction_bias", c.n_experts);
    w.moe.experts.reserve(size_t(c.n_experts));
    for (int e = 0; e < c.n_experts; ++e)
      w.moe.experts.push_back(mlp(p + ".mlp.experts." + std::to_string(e), c.moe_intermediate_size));
    w.moe.shared_experts = mlp(p + ".mlp.shared_experts", c.shared_intermediate_size());
    return w;
  }

  const Checkpoint& ck() const { return ck_; }

 private:
  const Checkpoint& ck_;
  const ModelConfig& cfg_;
};

}  // namespace

ModelWeights load_weights(const Checkpoint& ck, ModelConfig& cfg) {
  const Loader ld(ck, cfg);
  ModelWeights w;
  w.embed_tokens = ld.table("model.embed_tokens.weight", cfg.vocab_size, cfg.hidden_size);
  for (int i = 0; i < cfg.n_layers; ++i)
    w.layers.push_back(ld.layer(i, cfg.indexer_full[size_t(i)], cfg.layer_is_moe[size_t(i)]));
  w.norm = ld.vec("model.norm.weight", cfg.hidden_size);
  if (ck.has("lm_head.weight") || !cfg.tie_word_embeddings) {
    w.lm_head = ld.linear("lm_head", cfg.vocab_size, cfg.hidden_size);
  } else {
    w.lm_head.weight = w.embed_tokens;
  }

  const std::string mp = "model.layers." + std::to_string(cfg.n_layers);
  if (cfg.n_mtp_layers < 0) cfg.n_mtp_layers = ck.has(mp + ".eh_proj.weight") ? 1 : 0;
  DSI_CHECK(cfg.n_mtp_layers <= 1, "{}: num_nextn_predict_layers = {} is not supported (at most 1)",
            ck.dir(), cfg.n_mtp_layers);
  if (cfg.n_mtp_layers == 1) {
    MtpWeights m;
    // The MTP layer always has its own indexer and an MoE FFN (as the released checkpoints).
    m.layer = ld.layer(cfg.n_layers, /*full_indexer=*/true, /*is_moe=*/true);
    m.enorm = ld.vec(mp + ".enorm.weight", cfg.hidden_size);
    m.hnorm = ld.vec(mp + ".hnorm.weight", cfg.hidden_size);
    m.eh_proj = ld.linear(mp + ".eh_proj", cfg.hidden_size, 2 * cfg.hidden_size);
    m.shared_head_norm = ld.vec(mp + ".shared_head.norm.weight", cfg.hidden_size);
    m.embed_tokens = ck.has(mp + ".embed_tokens.weight")
                         ? ld.table(mp + ".embed_tokens.weight", cfg.vocab_size, cfg.hidden_size)
                         : w.embed_tokens;
    m.head = ck.has(mp + ".shared_head.head.weight")
                 ? ld.linear(mp + ".shared_head.head", cfg.vocab_size, cfg.hidden_size)
                 : w.lm_head;
    w.mtp = std::move(m);
  }
  return w;
}

}  // namespace dsi
