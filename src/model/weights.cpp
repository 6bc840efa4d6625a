// Checkpoint -> ModelWeights. Names follow the HF on-disk layout; the tensor-parallel split of every
// linear weight comes from one table (kShardTable), as DeepSeek's convert.py and HF's tp_plan do.
#include "model/weights.h"

#include <cstring>
#include <map>
#include <string_view>
#include <tuple>

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
  load_span_as_f32(src.raw(), t.dtype(), 0, t.numel(), out.f32());
  return out;
}

// How a linear weight [out, in] is split across T ranks: kColumn splits the output rows (each
// rank computes a slice of the outputs), kRow the input columns (each rank computes a partial sum,
// all-reduced by the model).
enum class Split { kReplicated, kColumn, kRow };

struct ShardRule {
  std::string_view module;  // the name after "model.layers.{i}." (or top-level / MTP-level)
  Split split;
};

// The one table of tensor-parallel splits. Routed experts are not split: each rank holds whole
// experts (expert parallelism, see load_moe) because every rank sees every token anyway, fp8 block
// scales stay whole, and one all-reduce sums routed, shared and dense partials alike.
constexpr ShardRule kShardTable[] = {
    {"self_attn.q_a_proj", Split::kReplicated},
    {"self_attn.q_b_proj", Split::kColumn},              // by heads
    {"self_attn.kv_a_proj_with_mqa", Split::kReplicated},  // the latent is shared by all heads
    {"self_attn.kv_b_proj", Split::kColumn},             // by heads (W_UK, W_UV)
    {"self_attn.o_proj", Split::kRow},                   // by heads; partial sums
    {"self_attn.indexer.wq_b", Split::kReplicated},      // every rank runs all index heads
    {"self_attn.indexer.wk", Split::kReplicated},
    {"self_attn.indexer.weights_proj", Split::kReplicated},
    {"mlp.gate_proj", Split::kColumn},
    {"mlp.up_proj", Split::kColumn},
    {"mlp.down_proj", Split::kRow},
    {"mlp.shared_experts.gate_proj", Split::kColumn},
    {"mlp.shared_experts.up_proj", Split::kColumn},
    {"mlp.shared_experts.down_proj", Split::kRow},
    {"mlp.gate", Split::kReplicated},  // the router
    {"mlp.experts.*", Split::kReplicated},  // routed experts: whole, each on its owner rank
    {"eh_proj", Split::kReplicated},
    {"shared_head.head", Split::kColumn},  // vocabulary-parallel
    {"lm_head", Split::kColumn},           // vocabulary-parallel
};

Split split_of(std::string_view module) {
  for (const ShardRule& r : kShardTable) {
    const bool pattern = r.module.size() > 2 && r.module.substr(r.module.size() - 2) == ".*";
    if (pattern ? module.substr(0, r.module.size() - 1) == r.module.substr(0, r.module.size() - 1)
                : module == r.module)
      return r.split;
  }
  fail("no tensor-parallel rule for module '{}'", module);
}

// Rows [begin, begin + len) of `n` for shard `s` of a dimension split in ceil(n / T) pieces.
std::pair<int64_t, int64_t> shard_range(int64_t n, TpShard s) {
  const int64_t chunk = (n + s.size - 1) / s.size;
  const int64_t begin = std::min(n, chunk * s.rank);
  return {begin, std::min(n, begin + chunk) - begin};
}

class Loader {
 public:
  Loader(const Checkpoint& ck, const ModelConfig& cfg, TpShard shard)
      : ck_(ck), cfg_(cfg), shard_(shard) {}

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

  // The weight `prefix` + `module` (without ".weight"; fp8 weights bring ".weight_scale_inv"),
  // full size [out, in], sharded as kShardTable says for `module`.
  LinearWeight linear(const std::string& prefix, const std::string& module, int64_t out,
                      int64_t in) const {
    const std::string name = prefix.empty() ? module : prefix + "." + module;
    return shard(full_linear(name, out, in), split_of(module));
  }

  MlpWeights mlp(const std::string& prefix, const std::string& module, int64_t inter) const {
    const int64_t d = cfg_.hidden_size;
    return MlpWeights{linear(prefix, module + ".gate_proj", inter, d),
                      linear(prefix, module + ".up_proj", inter, d),
                      linear(prefix, module + ".down_proj", d, inter)};
  }

  IndexerWeights indexer(const std::string& p) const {
    const int64_t d = cfg_.hidden_size, hd = cfg_.index_head_dim;
    IndexerWeights w;
    w.wq_b = linear(p, "self_attn.indexer.wq_b", cfg_.n_index_heads * hd, cfg_.q_lora_rank);
    w.wk = linear(p, "self_attn.indexer.wk", hd, d);
    w.weights_proj = linear(p, "self_attn.indexer.weights_proj", cfg_.n_index_heads, d);
    w.k_norm_weight = vec(p + ".self_attn.indexer.k_norm.weight", hd);
    w.k_norm_bias = vec(p + ".self_attn.indexer.k_norm.bias", hd);
    return w;
  }

  AttentionWeights attention(const std::string& p, bool full_indexer) const {
    const ModelConfig& c = cfg_;
    const int64_t d = c.hidden_size, h = c.n_heads;
    AttentionWeights w;
    const LinearWeight q_a = linear(p, "self_attn.q_a_proj", c.q_lora_rank, d);
    w.q_a_layernorm = vec(p + ".self_attn.q_a_layernorm.weight", c.q_lora_rank);
    w.q_b_proj = linear(p, "self_attn.q_b_proj", h * c.qk_head_dim(), c.q_lora_rank);
    w.kv_a_proj_with_mqa =
        linear(p, "self_attn.kv_a_proj_with_mqa", c.kv_lora_rank + c.head_dim_rope, d);
    w.kv_a_layernorm = vec(p + ".self_attn.kv_a_layernorm.weight", c.kv_lora_rank);
    w.kv_b_proj = linear(p, "self_attn.kv_b_proj", h * (c.head_dim_nope + c.v_head_dim),
                         c.kv_lora_rank);
    w.o_proj = linear(p, "self_attn.o_proj", d, h * c.v_head_dim);
    const std::string wk = p + ".self_attn.indexer.wk.weight";
    if (full_indexer) {
      w.indexer = indexer(p);
    } else {
      DSI_CHECK(!ck_.has(wk),
                "{}: '{}' exists but the config makes this layer \"shared\" (no own indexer)",
                ck_.dir(), wk);
    }
    stack_input_projections(q_a, w);
    return w;
  }

  // AttentionWeights::in_proj: q_a_proj, then kv_a_proj_with_mqa and indexer.wk where they share
  // its dtype, scale blocks and width (all three are replicated, so whole); fp8 parts padded with
  // zero rows to whole scale blocks, their scale rows stacked likewise.
  static void stack_input_projections(const LinearWeight& q_a, AttentionWeights& w) {
    const bool fp8 = q_a.scale_inv.defined();
    auto fits = [&](const LinearWeight& x) {
      return x.defined() && x.weight.dtype() == q_a.weight.dtype() &&
             x.in_features() == q_a.in_features() && x.row0 == 0 && x.col0 == 0 &&
             (!fp8 || (x.block_out == q_a.block_out && x.block_in == q_a.block_in));
    };
    const int64_t pad = fp8 ? q_a.block_out : 1;
    auto padded = [&](const LinearWeight& x) { return (x.out_features() + pad - 1) / pad * pad; };
    LinearWeight* kv = fits(w.kv_a_proj_with_mqa) ? &w.kv_a_proj_with_mqa : nullptr;
    LinearWeight* k = w.indexer && fits(w.indexer->wk) ? &w.indexer->wk : nullptr;
    int64_t rows = padded(q_a);
    if (kv != nullptr) {
      w.in_proj_kv_row = rows;
      rows += padded(*kv);
    }
    if (k != nullptr) {
      w.in_proj_index_k_row = rows;
      rows += padded(*k);
    }
    const int64_t in = q_a.in_features();
    LinearWeight s = q_a;
    s.weight = Tensor::zeros({rows, in}, q_a.weight.dtype());
    if (fp8) s.scale_inv = Tensor::zeros({rows / pad, q_a.scale_inv.dim(1)}, DType::F32);
    auto put = [&](const LinearWeight& x, int64_t row) {
      s.weight.slice(row, row + x.out_features()).copy_from(x.weight);
      if (fp8) s.scale_inv.slice(row / pad, row / pad + x.scale_inv.dim(0)).copy_from(x.scale_inv);
    };
    put(q_a, 0);
    if (kv != nullptr) {
      put(*kv, w.in_proj_kv_row);
      *kv = LinearWeight{};
    }
    if (k != nullptr) {
      put(*k, w.in_proj_index_k_row);
      *k = LinearWeight{};
    }
    w.in_proj = std::move(s);
  }

  // Routed experts are spread across ranks: rank r holds experts [floor(r E / T), floor((r + 1) E / T)),
  // E / T each when T divides E; else some hold one more, and with more ranks than experts some
  // hold none (their MoE adds only the shared expert's share).
  MoeWeights moe(const std::string& p) const {
    const ModelConfig& c = cfg_;
    MoeWeights w;
    w.gate = linear(p, "mlp.gate", c.n_experts, c.hidden_size);
    w.e_score_correction_bias = vec(p + ".mlp.gate.e_score_correction_bias", c.n_experts);
    w.first_expert = int(int64_t(shard_.rank) * c.n_experts / shard_.size);
    const int end = int(int64_t(shard_.rank + 1) * c.n_experts / shard_.size);
    for (int e = w.first_expert; e < end; ++e)
      w.experts.push_back(mlp(p, "mlp.experts." + std::to_string(e), c.moe_intermediate_size));
    w.shared_experts = mlp(p, "mlp.shared_experts", c.shared_intermediate_size());
    return w;
  }

  LayerWeights layer(int i, bool full_indexer, bool is_moe) const {
    const ModelConfig& c = cfg_;
    const std::string p = "model.layers." + std::to_string(i);
    LayerWeights w;
    w.input_layernorm = vec(p + ".input_layernorm.weight", c.hidden_size);
    w.post_attention_layernorm = vec(p + ".post_attention_layernorm.weight", c.hidden_size);
    w.self_attn = attention(p, full_indexer);
    w.is_moe = is_moe;
    if (is_moe) {
      w.moe = moe(p);
    } else {
      w.mlp = mlp(p, "mlp", c.intermediate_size);
    }
    return w;
  }

  // An already-loaded weight sharded as `module`'s rule says (tied embeddings).
  LinearWeight sharded(LinearWeight w, const std::string& module) const {
    return shard(std::move(w), split_of(module));
  }

 private:
  // The whole weight, as mapped views (no data is read until used).
  LinearWeight full_linear(const std::string& name, int64_t out, int64_t in) const {
    LinearWeight w;
    const std::string wname = name + ".weight";
    w.weight = ck_.get(wname, {out, in});
    DSI_CHECK(is_float(w.weight.dtype()), "{}: tensor '{}' has dtype {}, expected a float type",
              ck_.dir(), wname, dtype_name(w.weight.dtype()));
    const std::string sname = name + ".weight_scale_inv";
    if (w.weight.dtype() == DType::F8_E4M3) {
      w.block_out = cfg_.quant.block_out;
      w.block_in = cfg_.quant.block_in;
      const int64_t so = (out + w.block_out - 1) / w.block_out;
      const int64_t si = (in + w.block_in - 1) / w.block_in;
      DSI_CHECK(ck_.has(sname), "{}: fp8 tensor '{}' has no '{}' (block scales [{}, {}])",
                ck_.dir(), wname, sname, so, si);
      w.scale_inv = ck_.get(sname, {so, si});
    } else {
      DSI_CHECK(!ck_.has(sname), "{}: '{}' exists but '{}' is {}, not F8_E4M3", ck_.dir(), sname,
                wname, dtype_name(w.weight.dtype()));
    }
    return w;
  }

  // This rank's slice of `w`; block scales are cut to the blocks the slice touches (fp32).
  LinearWeight shard(LinearWeight w, Split split) const {
    const bool sliced = split != Split::kReplicated && shard_.size > 1;
    const bool rows = split == Split::kColumn;
    int64_t begin = 0, len = 0;
    if (sliced) {
      std::tie(begin, len) = shard_range(rows ? w.out_features() : w.in_features(), shard_);
      // Rows of a mapped weight are a view; columns need a copy of just those columns.
      w.weight = rows ? w.weight.slice(begin, begin + len)
                      : w.weight.narrow(1, begin, len).contiguous();
    }
    if (w.scale_inv.defined()) {
      Tensor s = w.scale_inv;
      if (sliced) {
        const int64_t block = rows ? w.block_out : w.block_in;
        const int64_t b0 = begin / block, b1 = (begin + len + block - 1) / block;
        s = s.narrow(rows ? 0 : 1, b0, b1 - b0);
        (rows ? w.row0 : w.col0) = begin - b0 * block;
      }
      w.scale_inv = to_f32(s, "weight_scale_inv", ck_.dir());
    }
    return w;
  }

  const Checkpoint& ck_;
  const ModelConfig& cfg_;
  TpShard shard_;
};

}  // namespace

ModelWeights load_weights(const Checkpoint& ck, ModelConfig& cfg, TpShard shard) {
  DSI_CHECK(shard.size >= 1 && shard.rank >= 0 && shard.rank < shard.size,
            "load_weights: shard {} of {}", shard.rank, shard.size);
  const Loader ld(ck, cfg, shard);
  ModelWeights w;
  w.embed_tokens = ld.table("model.embed_tokens.weight", cfg.vocab_size, cfg.hidden_size);
  for (int i = 0; i < cfg.n_layers; ++i)
    w.layers.push_back(ld.layer(i, cfg.indexer_full[size_t(i)], cfg.layer_is_moe[size_t(i)]));
  w.norm = ld.vec("model.norm.weight", cfg.hidden_size);
  std::tie(w.vocab_begin, std::ignore) = shard_range(cfg.vocab_size, shard);
  w.vocab_shard = (cfg.vocab_size + shard.size - 1) / shard.size;
  if (ck.has("lm_head.weight") || !cfg.tie_word_embeddings) {
    w.lm_head = ld.linear("", "lm_head", cfg.vocab_size, cfg.hidden_size);
  } else {
    LinearWeight tied;
    tied.weight = w.embed_tokens;
    w.lm_head = ld.sharded(tied, "lm_head");
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
    m.eh_proj = ld.linear(mp, "eh_proj", cfg.hidden_size, 2 * cfg.hidden_size);
    m.shared_head_norm = ld.vec(mp + ".shared_head.norm.weight", cfg.hidden_size);
    m.embed_tokens = ck.has(mp + ".embed_tokens.weight")
                         ? ld.table(mp + ".embed_tokens.weight", cfg.vocab_size, cfg.hidden_size)
                         : w.embed_tokens;
    m.head = ck.has(mp + ".shared_head.head.weight")
                 ? ld.linear(mp, "shared_head.head", cfg.vocab_size, cfg.hidden_size)
                 : w.lm_head;
    w.mtp = std::move(m);
  }
  return w;
}

namespace {
// Call fn on every tensor of a piece of the weights (a LinearWeight: its weight and its scales).
template <typename F>
void visit_linear(LinearWeight& l, F&& fn) {
  fn(l.weight);
  fn(l.scale_inv);
}
template <typename F>
void visit_mlp(MlpWeights& m, F&& fn) {
  visit_linear(m.gate_proj, fn);
  visit_linear(m.up_proj, fn);
  visit_linear(m.down_proj, fn);
}
template <typename F>
void visit_layer(LayerWeights& l, F&& fn) {
  fn(l.input_layernorm);
  fn(l.post_attention_layernorm);
  AttentionWeights& a = l.self_attn;
  for (LinearWeight* lw : {&a.in_proj, &a.q_b_proj, &a.kv_a_proj_with_mqa, &a.kv_b_proj, &a.o_proj})
    visit_linear(*lw, fn);
  for (Tensor* t : {&a.q_a_layernorm, &a.kv_a_layernorm}) fn(*t);
  if (a.indexer) {
    IndexerWeights& ix = *a.indexer;
    for (LinearWeight* lw : {&ix.wq_b, &ix.wk, &ix.weights_proj}) visit_linear(*lw, fn);
    fn(ix.k_norm_weight);
    fn(ix.k_norm_bias);
  }
  visit_mlp(l.mlp, fn);
  visit_linear(l.moe.gate, fn);
  fn(l.moe.e_score_correction_bias);
  for (MlpWeights& e : l.moe.experts) visit_mlp(e, fn);
  visit_mlp(l.moe.shared_experts, fn);
}
}  // namespace

ModelWeights weights_to_device(const ModelWeights& src, Device device) {
  ModelWeights w = src;
  std::map<const void*, Tensor> moved;  // source data pointer -> its device copy
  auto move = [&](Tensor& t) {
    if (!t.defined()) return;
    auto it = moved.find(t.raw());
    if (it != moved.end() && it->second.shape() == t.shape() && it->second.dtype() == t.dtype()) {
      t = it->second;
      return;
    }
    Tensor d = to_device(t.is_contiguous() ? t : t.contiguous(), device);
    moved[t.raw()] = d;
    t = d;
  };
  move(w.embed_tokens);
  for (LayerWeights& l : w.layers) visit_layer(l, move);
  move(w.norm);
  visit_linear(w.lm_head, move);
  if (w.mtp) {
    MtpWeights& m = *w.mtp;
    visit_layer(m.layer, move);
    for (Tensor* t : {&m.enorm, &m.hnorm, &m.shared_head_norm, &m.embed_tokens}) move(*t);
    visit_linear(m.eh_proj, move);
    visit_linear(m.head, move);
  }
  return w;
}

}  // namespace dsi
