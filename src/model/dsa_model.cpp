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

SequenceKvCache DsaModel::make_cache(int64_t capacity, bool with_mtp, KvCacheDtype dtype) const {
  return SequenceKvCache(cfg_, capacity, with_mtp, rank_.dcp, device_, dtype);
}

LayerContext DsaModel::plan_context(const std::vector<BatchSeq>& seqs, bool mtp,
                                    const Padding& pad) const {
  const DcpLayout& dcp = rank_.dcp;
  DSI_CHECK(!seqs.empty() || pad.extra_seqs > 0, "forward: no sequences");
  DSI_CHECK(pad.extra_seqs >= 0 && pad.extra_rows >= 1, "forward: {} padding sequences of {} rows",
            pad.extra_seqs, pad.extra_rows);
  const KvPool* pool = seqs.empty() ? nullptr : &seqs[0].cache->pool();
  int64_t n = pad.extra_seqs * pad.extra_rows;
  size_t max_pages = size_t(std::max<int64_t>(1, pad.min_pages));
  for (const BatchSeq& s : seqs) {
    DSI_CHECK(s.cache != nullptr && s.n > 0, "forward: a sequence with {} rows", s.n);
    DSI_CHECK(&s.cache->pool() == pool, "forward: the sequences of one call must share a pool");
    const int64_t start = mtp ? s.cache->mtp_length() : s.cache->length();
    DSI_CHECK(start + s.n <= s.cache->capacity(),
              "forward: {} + {} tokens exceed the sequence's cache capacity {}", start, s.n,
              s.cache->capacity());
    n += s.n;
    max_pages = std::max(max_pages, s.cache->pages().size());
  }
  const int64_t n_seqs = int64_t(seqs.size()) + pad.extra_seqs;
  LayerContext ctx;
  ctx.cfg = &cfg_;
  ctx.rope = &rope_;
  ctx.rank = &rank_;
  ctx.n = n;
  ctx.positions = Tensor::empty({n}, DType::I32);
  ctx.store_slots = Tensor::empty({n}, DType::I32);
  ctx.local_bounds = Tensor::empty({n}, DType::I32);
  ctx.pages.row_seq = Tensor::empty({n}, DType::I32);
  ctx.pages.block_tables = Tensor::empty({n_seqs, int64_t(max_pages)}, DType::I32);
  ctx.pages.page_size = int(kPageTokens);
  ctx.local_keys = pad.min_keys;
  int32_t* tables = ctx.pages.block_tables.i32();
  std::fill(tables, tables + n_seqs * int64_t(max_pages), -1);
  int64_t row = 0;
  for (size_t b = 0; b < seqs.size(); ++b) {
    const SequenceKvCache& c = *seqs[b].cache;
    const int64_t start = mtp ? c.mtp_length() : c.length();
    for (int64_t i = 0; i < seqs[b].n; ++i, ++row) {
      // Causal bounds are global per row (row at p sees keys [0, p]), then localised per row.
      const int64_t p = start + i;
      ctx.positions.i32()[row] = int32_t(p);
      ctx.local_bounds.i32()[row] = int32_t(dcp.local_len(p + 1));
      ctx.store_slots.i32()[row] = dcp.owns(p) ? int32_t(c.slot_of(p)) : -1;
      ctx.pages.row_seq.i32()[row] = int32_t(b);
    }
    ctx.local_keys = std::max(ctx.local_keys, dcp.local_len(start + seqs[b].n));
    std::copy(c.pages().begin(), c.pages().end(), tables + int64_t(b) * int64_t(max_pages));
  }
  for (int64_t b = int64_t(seqs.size()); b < n_seqs; ++b)  // the padding
    for (int64_t i = 0; i < pad.extra_rows; ++i, ++row) {
      ctx.positions.i32()[row] = 0;
      ctx.local_bounds.i32()[row] = 0;
      ctx.store_slots.i32()[row] = -1;
      ctx.pages.row_seq.i32()[row] = int32_t(b);
    }
  return ctx;
}

LayerContext DsaModel::upload_context(const LayerContext& host) const {
  LayerContext ctx = host;
  for (Tensor* t : {&ctx.positions, &ctx.store_slots, &ctx.local_bounds, &ctx.pages.row_seq,
                    &ctx.pages.block_tables})
    *t = to_device(*t, device_);
  return ctx;
}

Tensor DsaModel::decoder_layer(const LayerContext& ctx, const LayerWeights& w, Tensor& h,
                               LayerKvCache& kv, DcpTopk& topk, const Tensor& pending) const {
  const int64_t n = ctx.n, d = cfg_.hidden_size;
  const float eps = float(cfg_.rms_norm_eps);
  Tensor x = Tensor::empty({n, d}, DType::F32, h.device());
  if (pending.defined())
    ops::add_rms_norm(h, pending, w.input_layernorm, eps, x);  // the previous layer's residual add
  else
    ops::rms_norm(h, w.input_layernorm, eps, x);
  Tensor attn = mla_attention(ctx, w.self_attn, x, kv, topk);
  rank_.all_reduce_tp(attn);  // o_proj partial sums of each rank's heads
  ops::add_rms_norm(h, attn, w.post_attention_layernorm, eps, x);  // h += attn; x = norm(h)

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
    ops::moe(x, router_logits, w.moe.e_score_correction_bias, rp, w.moe.experts, w.moe.first_expert,
             cfg_.n_experts, ids, weights, ffn, &w.moe.shared_experts);
  }
  rank_.all_reduce_tp(ffn);  // column/row-split MLPs and this rank's experts: partial sums
  return ffn;                // h += ffn happens in the next norm (ops::add_rms_norm)
}

Tensor DsaModel::forward(const Tensor& tokens, SequenceKvCache& cache, ForwardTrace* trace) const {
  DSI_CHECK(tokens.ndim() == 1 && tokens.dim(0) > 0, "forward: no tokens");
  return forward(tokens, {BatchSeq{&cache, tokens.dim(0)}}, trace);
}

Tensor DsaModel::forward(const Tensor& tokens, const std::vector<BatchSeq>& seqs,
                         ForwardTrace* trace) const {
  const LayerContext ctx = make_context(seqs, /*mtp=*/false);
  DSI_CHECK(tokens.ndim() == 1 && tokens.dim(0) == ctx.n, "forward: {} tokens for {} rows",
            tokens.desc(), ctx.n);
  Tensor out = forward_planned(to_device(tokens, device_), ctx, *seqs[0].cache, trace);
  for (const BatchSeq& s : seqs) s.cache->set_length(s.cache->length() + s.n);
  return out;
}

Tensor DsaModel::forward_planned(const Tensor& tokens, const LayerContext& ctx,
                                 SequenceKvCache& cache, ForwardTrace* trace) const {
  const int64_t n = ctx.n;
  DSI_CHECK(tokens.ndim() == 1 && tokens.dim(0) == n && tokens.device() == device_,
            "forward: {} tokens on {} for {} rows on {}", tokens.desc(), tokens.device().str(), n,
            device_.str());
  Tensor h = Tensor::empty({n, cfg_.hidden_size}, DType::F32, device_);
  ops::embedding(weights_.embed_tokens, tokens, h);
  DcpTopk topk;
  Tensor ffn;  // the last layer's MLP output, not yet added to h
  for (int i = 0; i < cfg_.n_layers; ++i) {
    ffn = decoder_layer(ctx, weights_.layers[size_t(i)], h, cache.layer(i), topk, ffn);
    if (trace) trace->topk.push_back(topk.global);
  }
  Tensor out = Tensor::empty({n, cfg_.hidden_size}, DType::F32, device_);
  if (ffn.defined())
    ops::add_rms_norm(h, ffn, weights_.norm, float(cfg_.rms_norm_eps), out);
  else
    ops::rms_norm(h, weights_.norm, float(cfg_.rms_norm_eps), out);
  return out;
}

Tensor DsaModel::vocab_parallel_logits(const Tensor& hidden, const LinearWeight& head) const {
  const int64_t n = hidden.dim(0), vocab = cfg_.vocab_size;
  if (rank_.cfg.tp == 1) {
    Tensor out = Tensor::empty({n, vocab}, DType::F32, device_);
    ops::linear(hidden, head, out);
    return out;
  }
  // Each rank computes its vocabulary slice (padded to the common slice width with -inf), then
  // the slices are gathered and laid side by side.
  const int64_t shard = weights_.vocab_shard, mine = head.out_features();
  Tensor part = Tensor::empty({n, shard}, DType::F32, device_);
  Tensor local = Tensor::empty({n, mine}, DType::F32, device_);
  ops::linear(hidden, head, local);
  Tensor part_mine = part.narrow(1, 0, mine);
  ops::copy(local, part_mine);
  if (mine < shard) {
    Tensor pad = part.narrow(1, mine, shard - mine);
    pad.copy_from(Tensor::from_f32(std::vector<float>(size_t(n * (shard - mine)), -INFINITY),
                                   {n, shard - mine}));
  }
  const int T = rank_.cfg.tp;
  Tensor all = Tensor::empty({T * n, shard}, DType::F32, device_);
  rank_.comm->all_gather(rank_.tp_group, part, all);
  Tensor out = Tensor::empty({n, vocab}, DType::F32, device_);
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
  DSI_CHECK(hidden.ndim() == 2 && hidden.dim(0) > 0, "mtp_forward: no rows");
  std::vector<DcpTopk*> shares;
  if (share) shares.push_back(share);
  return mtp_forward(hidden, next_tokens, {BatchSeq{&cache, hidden.dim(0)}}, trace, shares);
}

Tensor DsaModel::mtp_forward(const Tensor& hidden, const Tensor& next_tokens,
                             const std::vector<BatchSeq>& seqs, ForwardTrace* trace,
                             const std::vector<DcpTopk*>& shares) const {
  DSI_CHECK(weights_.mtp.has_value(), "this checkpoint has no MTP layer");
  const MtpWeights& m = *weights_.mtp;
  LayerContext ctx = make_context(seqs, /*mtp=*/true);
  const int64_t n = ctx.n, d = cfg_.hidden_size;
  DSI_CHECK(hidden.ndim() == 2 && hidden.dim(0) == n && next_tokens.ndim() == 1 &&
                next_tokens.dim(0) == n,
            "mtp_forward: {} hidden rows and {} tokens for {} rows", hidden.desc(),
            next_tokens.desc(), n);
  DSI_CHECK(shares.empty() || shares.size() == seqs.size(), "mtp_forward: {} shares for {} sequences",
            shares.size(), seqs.size());
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

  DcpTopk topk;
  const bool reuse = !shares.empty() && shares[0]->local.defined();
  if (reuse) {
    // Every sequence reuses its first step's selection for its one row.
    const int64_t k = shares[0]->local.dim(1);
    topk.local = Tensor::empty({n, k}, DType::I32, device_);
    topk.global = Tensor::empty({n, k}, DType::I32, device_);
    for (size_t b = 0; b < seqs.size(); ++b) {
      DSI_CHECK(seqs[b].n == 1 && shares[b]->local.defined() && shares[b]->local.dim(1) == k,
                "mtp_forward: a shared MTP selection is reused for one row per sequence");
      Tensor l = topk.local.slice(int64_t(b), int64_t(b) + 1);
      l.copy_from(shares[b]->local);
      Tensor g = topk.global.slice(int64_t(b), int64_t(b) + 1);
      g.copy_from(shares[b]->global);
    }
    ctx.reuse_topk = true;
  }
  const Tensor ffn = decoder_layer(ctx, m.layer, h, seqs[0].cache->mtp(), topk, Tensor());
  if (!shares.empty() && !reuse) {
    int64_t row = 0;
    for (size_t b = 0; b < seqs.size(); ++b) {
      row += seqs[b].n;
      *shares[b] = DcpTopk{topk.local.slice(row - 1, row), topk.global.slice(row - 1, row), Tensor()};
    }
  }
  if (trace) trace->topk.push_back(topk.global);
  Tensor out = Tensor::empty({n, d}, DType::F32, device_);
  ops::add_rms_norm(h, ffn, m.shared_head_norm, eps, out);
  for (const BatchSeq& s : seqs) s.cache->set_mtp_length(s.cache->mtp_length() + s.n);
  return out;
}

Tensor DsaModel::mtp_logits(const Tensor& mtp_hidden) const {
  DSI_CHECK(weights_.mtp.has_value(), "this checkpoint has no MTP layer");
  return vocab_parallel_logits(mtp_hidden, weights_.mtp->head);
}

}  // namespace dsi
