// The DSA model forward; see dsa_model.h. Layer structure: dsa-reference.md section 2,
//   u = RMSNorm_in(h); h += Attn(u); v = RMSNorm_post(h); h += FFN(v); logits = lm_head(RMSNorm(h)).
#include "model/dsa_model.h"

#include <algorithm>
#include <cmath>

#include "model/attention.h"
#include "ops/elementwise.h"
#include "ops/linear.h"
#include "ops/moe.h"
#include "ops/norm.h"
#include "ops/rope.h"

namespace dsi {

std::unique_ptr<DsaModel> DsaModel::load(const std::string& dir) {
  ModelConfig cfg = load_config(dir + "/config.json");
  Checkpoint ck = Checkpoint::open(dir);
  return load(ck, std::move(cfg), RankContext{});
}

std::unique_ptr<DsaModel> DsaModel::load(const Checkpoint& ck, ModelConfig cfg,
                                         const RankContext& rank, Device device) {
  rank.cfg.validate(cfg);
  ModelWeights w = load_weights(ck, cfg, TpShard{rank.tp_rank, rank.cfg.tp});
  if (!device.is_cpu()) w = weights_to_device(w, device);
  return std::make_unique<DsaModel>(std::move(cfg), std::move(w), rank, device);
}

DsaModel::DsaModel(ModelConfig cfg, ModelWeights weights, RankContext rank, Device device)
    : cfg_(std::move(cfg)), weights_(std::move(weights)), rank_(std::move(rank)), device_(device) {
  const ops::RopeFreqs f =
      ops::compute_rope_freqs(cfg_.rope, cfg_.head_dim_rope);
  rope_.inv_freq = to_device(Tensor::from_f32(f.inv_freq, {int64_t(f.inv_freq.size())}), device_);
  rope_.attention_factor = f.attention_factor;
}

SequenceKvCache DsaModel::make_cache(int64_t capacity, bool with_mtp) const {
  return SequenceKvCache(cfg_, capacity, with_mtp, rank_.dcp, device_);
}

LayerContext DsaModel::make_context(int64_t start, int64_t n) const {
  const DcpLayout& dcp = rank_.dcp;
  LayerContext ctx;
  ctx.cfg = &cfg_;
  ctx.rope = &rope_;
  ctx.rank = &rank_;
  ctx.start = start;
  ctx.n = n;
  ctx.positions = Tensor::empty({n}, DType::I32);
  // Causal bounds are global per row (row at p sees keys [0, p]), then localised per row.
  ctx.local_bounds = Tensor::empty({n}, DType::I32);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t p = start + i;
    ctx.positions.i32()[i] = int32_t(p);
    ctx.local_bounds.i32()[i] = int32_t(dcp.local_len(p + 1));
    if (dcp.owns(p)) ctx.owned_rows.push_back(int32_t(i));
  }
  ctx.local_start = dcp.local_len(start);
  ctx.local_keys = dcp.local_len(start + n);
  ctx.positions = to_device(ctx.positions, device_);
  ctx.local_bounds = to_device(ctx.local_bounds, device_);
  return ctx;
}

void DsaModel::decoder_layer(const LayerContext& ctx, const LayerWeights& w, Tensor& h,
                             LayerKvCache& kv, DcpTopk& topk) const {
  const int64_t n = ctx.n, d = cfg_.hidden_size;
  const float eps = float(cfg_.rms_norm_eps);
  Tensor x = Tensor::empty({n, d}, DType::F32, h.device());
  ops::rms_norm(h, w.input_layernorm, eps, x);
  Tensor attn = mla_attention(ctx, w.self_attn, x, kv, topk);
  rank_.all_reduce_tp(attn);  // o_proj partial sums of each rank's heads
  ops::add_inplace(h, attn);

  ops::rms_norm(h, w.post_attention_layernorm, eps, x);
  Tensor ffn = Tensor::empty({n, d}, DType::F32, h.device());
  if (!w.is_moe) {
    ops::mlp(x, w.mlp, ffn);
  } else {
    Tensor router_logits = Tensor::empty({n, cfg_.n_experts}, DType::F32, h.device());
    ops::linear(x, w.moe.gate, router_logits);
    const int k = cfg_.n_experts_active;
    Tensor ids = Tensor::empty({n, k}, DType::I32, h.device());
    Tensor weights = Tensor::empty({n, k}, DType::F32, h.device());
    RouterParams rp;
    rp.n_experts_active = k;
    rp.n_group = cfg_.n_group;
    rp.topk_group = cfg_.topk_group;
    rp.norm_topk_prob = cfg_.norm_topk_prob;
    rp.routed_scaling_factor = float(cfg_.routed_scaling_factor);
    ops::moe_route(router_logits, w.moe.e_score_correction_bias, rp, ids, weights);
    ops::moe_experts(x, ids, weights, w.moe.experts, w.moe.first_expert, cfg_.n_experts, ffn);
    Tensor shared = Tensor::empty({n, d}, DType::F32, h.device());
    ops::mlp(x, w.moe.shared_experts, shared);
    ops::add_inplace(ffn, shared);
  }
  rank_.all_reduce_tp(ffn);  // column/row-split MLPs and this rank's experts: partial sums
  ops::add_inplace(h, ffn);
}

Tensor DsaModel::forward(const Tensor& tokens, SequenceKvCache& cache, ForwardTrace* trace) const {
  const int64_t n = tokens.dim(0), start = cache.length();
  DSI_CHECK(n > 0, "forward: no tokens");
  DSI_CHECK(start + n <= cache.capacity(), "forward: {} + {} tokens exceed the cache capacity {}",
            start, n, cache.capacity());
  const LayerContext ctx = make_context(start, n);
  Tensor h = Tensor::empty({n, cfg_.hidden_size}, DType::F32, device_);
  ops::embedding(weights_.embed_tokens, to_device(tokens, device_), h);
  DcpTopk topk;
  for (int i = 0; i < cfg_.n_layers; ++i) {
    decoder_layer(ctx, weights_.layers[size_t(i)], h, cache.layer(i), topk);
    if (trace) trace->topk.push_back(topk.global);
  }
  Tensor out = Tensor::empty({n, cfg_.hidden_size}, DType::F32, device_);
  ops::rms_norm(h, weights_.norm, float(cfg_.rms_norm_eps), out);
  cache.set_length(start + n);
  return out;
}

Tensor DsaModel::vocab_parallel_logits(const Tensor& hidden, const LinearWeight& head) const {
  const int64_t n = hidden.dim(0), vocab = cfg_.vocab_size;
  if (rank_.cfg.tp == 1) {
    Tensor out = Tensor::empty({n, vocab}, DType::F32, device_);
    ops::linear(hidden, head, out);
    return out;
  }
  DSI_CHECK(device_.is_cpu(), "vocabulary-parallel logits on {}: not supported yet", device_.str());
  // Each rank computes its vocabulary slice (padded to the common slice width with -inf), then
  // the slices are gathered and laid side by side.
  const int64_t shard = weights_.vocab_shard, mine = head.out_features();
  Tensor part = Tensor::empty({n, shard}, DType::F32);
  Tensor part_mine = part.narrow(1, 0, mine);
  Tensor local = Tensor::empty({n, mine}, DType::F32);
  ops::linear(hidden, head, local);
  ops::copy(local, part_mine);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = mine; j < shard; ++j) part.f32()[i * shard + j] = -INFINITY;
  const int T = rank_.cfg.tp;
  Tensor all = Tensor::empty({T * n, shard}, DType::F32);
  rank_.comm->all_gather(rank_.tp_group, part, all);
  Tensor out = Tensor::empty({n, vocab}, DType::F32);
  for (int r = 0; r < T; ++r) {
    const int64_t begin = r * shard, len = std::min(shard, vocab - begin);
    if (len <= 0) continue;
    Tensor dst = out.narrow(1, begin, len);
    ops::copy(all.slice(r * n, (r + 1) * n).narrow(1, 0, len), dst);
  }
  return out;
}

Tensor DsaModel::logits(const Tensor& hidden) const {
  return vocab_parallel_logits(hidden, weights_.lm_head);
}

Tensor DsaModel::mtp_forward(const Tensor& hidden, const Tensor& next_tokens,
                             SequenceKvCache& cache, ForwardTrace* trace, DcpTopk* share) const {
  DSI_CHECK(weights_.mtp.has_value(), "this checkpoint has no MTP layer");
  const MtpWeights& m = *weights_.mtp;
  const int64_t n = hidden.dim(0), d = cfg_.hidden_size, start = cache.mtp_length();
  DSI_CHECK(next_tokens.dim(0) == n, "mtp_forward: {} hidden rows but {} tokens", n,
            next_tokens.dim(0));
  DSI_CHECK(start + n <= cache.capacity(), "mtp_forward: {} + {} rows exceed the cache capacity {}",
            start, n, cache.capacity());
  const float eps = float(cfg_.rms_norm_eps);
  // x = eh_proj([enorm(embed(t_{i+1})) ; hnorm(h_i)]): the embedding comes first.
  Tensor cat = Tensor::empty({n, 2 * d}, DType::F32, device_);
  Tensor emb = Tensor::empty({n, d}, DType::F32, device_);
  ops::embedding(m.embed_tokens, to_device(next_tokens, device_), emb);
  Tensor cat_e = cat.narrow(1, 0, d);
  ops::rms_norm(emb, m.enorm, eps, cat_e);
  Tensor cat_h = cat.narrow(1, d, d);
  ops::rms_norm(hidden, m.hnorm, eps, cat_h);
  Tensor h = Tensor::empty({n, d}, DType::F32, device_);
  ops::linear(cat, m.eh_proj, h);

  LayerContext ctx = make_context(start, n);
  DcpTopk topk;
  if (share && share->local.defined()) {
    DSI_CHECK(n == 1, "mtp_forward: a shared MTP selection is reused for one row at a time");
    ctx.reuse_topk = true;
    topk = *share;
  }
  decoder_layer(ctx, m.layer, h, cache.mtp(), topk);
  if (share && !share->local.defined())
    *share = DcpTopk{topk.local.slice(n - 1, n), topk.global.slice(n - 1, n)};
  if (trace) trace->topk.push_back(topk.global);
  Tensor out = Tensor::empty({n, d}, DType::F32, device_);
  ops::rms_norm(h, m.shared_head_norm, eps, out);
  cache.set_mtp_length(start + n);
  return out;
}

Tensor DsaModel::mtp_logits(const Tensor& mtp_hidden) const {
  DSI_CHECK(weights_.mtp.has_value(), "this checkpoint has no MTP layer");
  return vocab_parallel_logits(mtp_hidden, weights_.mtp->head);
}

}  // namespace dsi
