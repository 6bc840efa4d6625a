// MLA attention forward; see attention.h. Mirrors HF GlmMoeDsaAttention / DeepseekV32Attention, but
// attends in the absorbed form over the latent cache (mathematically equal to HF's expanded K/V).
// Under TP a rank runs its H/T heads; under DCP its cache holds only the tokens it owns and the
// partial attention is combined across the group (runtime/dcp.h).
#include "model/attention.h"

#include <cstdlib>
#include <string_view>

#include "model/indexer.h"
#include "ops/beside.h"
#include "ops/elementwise.h"
#include "ops/kv_fp8.h"
#include "ops/linear.h"
#include "ops/mla.h"
#include "ops/norm.h"
#include "ops/paging.h"
#include "ops/rope.h"

namespace dsi {

namespace {
// The cache store of a layer that reuses its top-k runs beside q_b unless DSI_STORE_BESIDE=0 (for
// comparisons; docs/decode-performance.md).
bool store_beside() {
  static const bool on = [] {
    const char* env = std::getenv("DSI_STORE_BESIDE");
    return env == nullptr || std::string_view(env) != "0";
  }();
  return on;
}
}  // namespace

Tensor mla_attention(const LayerContext& ctx, const AttentionWeights& w, const Tensor& u,
                     LayerKvCache& kv, DcpTopk& topk) {
  const ModelConfig& c = *ctx.cfg;
  const int64_t n = ctx.n, heads = w.kv_b_proj.out_features() / (c.head_dim_nope + c.v_head_dim), nope = c.head_dim_nope, rope = c.head_dim_rope;
  const int64_t lora = c.kv_lora_rank, dk = lora + rope;
  const float eps = float(c.rms_norm_eps);
  const Device dev = u.device();

  // One product for the stacked input projections (AttentionWeights::in_proj); a part outside
  // the stack runs alone.
  Tensor in = Tensor::empty({n, w.in_proj.out_features()}, DType::F32, dev);
  ops::linear(u, w.in_proj, in);
  auto part = [&](int64_t row, int64_t width, const LinearWeight& own) {
    if (row >= 0) return in.narrow(1, row, width);
    Tensor t = Tensor::empty({n, width}, DType::F32, dev);
    ops::linear(u, own, t);
    return t;
  };

  // Queries: c_q = RMSNorm(q_a_proj u); q = q_b_proj c_q -> [n, H, nope | rope]. Where the GPU runs
  // the norm inside q_b's product (ops::rms_norm_linear_fuses), c_q stays unnormalised and the
  // indexer's query product applies the norm too; else it is normalised once, here.
  Tensor c_q = in.narrow(1, 0, c.q_lora_rank);
  const bool norm_in_products = ops::rms_norm_linear_fuses(c_q, w.q_a_layernorm, w.q_b_proj);
  if (!norm_in_products) ops::rms_norm(c_q, w.q_a_layernorm, eps, c_q);
  const Tensor* q_norm = norm_in_products ? &w.q_a_layernorm : nullptr;
  Tensor q = Tensor::empty({n, heads, c.qk_head_dim()}, DType::F32, dev);
  Tensor q2 = q.view({n, heads * c.qk_head_dim()});
  // q = q_b_proj c_q.
  auto queries = [&] {
    if (norm_in_products) ops::rms_norm_linear(c_q, w.q_a_layernorm, eps, w.q_b_proj, q2);
    else ops::linear(c_q, w.q_b_proj, q2);
  };
  // This row's keys into the cache: [c_kv | k_pe] = kv_a_proj_with_mqa u; the cache keeps
  // RMSNorm(c_kv) and RoPE(k_pe).
  auto cache_store = [&] {
    Tensor kv_a = part(w.in_proj_kv_row, dk, w.kv_a_proj_with_mqa);
    if (kv.latent.dtype() == DType::U8) {  // the fp8 656-byte entries (ops/kv_fp8.h): one fused op
      ops::MlaKeyPrep prep{w.kv_a_layernorm, eps, ctx.positions, ctx.rope->inv_freq,
                           ctx.rope->attention_factor, RopeStyle::kInterleaved};
      ops::mla_cache_store_fp8(kv_a, ctx.store_slots, kv.latent, &prep);
    } else {
      Tensor ckv = kv_a.narrow(1, 0, lora);
      ops::rms_norm(ckv, w.kv_a_layernorm, eps, ckv);
      Tensor kv3 = kv_a.unsqueeze(1);
      ops::rope(kv3, ctx.positions, ctx.rope->inv_freq, ctx.rope->attention_factor,
                RopeStyle::kInterleaved, /*offset=*/int(lora));
      ops::scatter_rows(kv_a, ctx.store_slots, kv.latent);
    }
  };

  // Absorbed queries [n, H, kv_lora | rope]: W_UK^T q_nope and RoPE(q_pe).
  auto absorbed_queries = [&] {
    Tensor q_abs = Tensor::empty({n, heads, dk}, DType::F32, dev);
    ops::mla_absorbed_queries(q, nope, w.kv_b_proj, ctx.positions, ctx.rope->inv_freq, ctx.rope->attention_factor,
                              RopeStyle::kInterleaved, q_abs);
    return q_abs;
  };
  // The winners' pool slots: this rank attends to the ones it owns, wherever their pages are.
  bool fresh_slots = false;
  auto make_slots = [&] {
    fresh_slots = !topk.slots.defined();
    if (!fresh_slots) return;
    topk.slots = Tensor::empty(topk.local.shape(), DType::I32, dev);
    ops::slots_from_local(topk.local, ctx.pages.block_tables, ctx.pages.row_seq, ctx.pages.page_size, topk.slots);
  };
  const bool exchanged = ctx.rank->dcp.size > 1;
  const bool own_indexer = w.indexer && !ctx.reuse_topk;
  auto scores = [&] {
    const Tensor index_k = part(w.in_proj_index_k_row, c.index_head_dim, w.indexer->wk);
    return indexer_scores(ctx, *w.indexer, u, c_q, q_norm, eps, index_k, kv.index_keys);
  };
  Tensor q_all;
  bool settled = true;
  if (own_indexer && !exchanged) {
    // The indexer and the top-k (a chain of small kernels) beside the queries and the cache store
    // (q_b_proj streams its weights): ops/beside.h. Without a DCP exchange there is no collective in
    // either. The attention then follows both, so its start is not settled.
    ops::run_beside(
        dev,
        [&] {
          topk = dcp_topk(*ctx.rank, scores(), ctx.local_bounds, c.index_topk);
          make_slots();
        },
        [&] {
          queries();
          cache_store();
          q_all = absorbed_queries();
        });
    settled = false;
  } else if (!own_indexer && !exchanged && store_beside()) {
    // A layer that reuses an earlier layer's top-k: the cache store (a small kernel) beside q_b's
    // product and the absorbed queries. The join makes the store complete before the attention.
    DSI_CHECK(topk.local.defined() && topk.local.dim(0) == n,
              "shared indexer layer: no top-k from a previous full layer");
    make_slots();
    ops::run_beside(dev, cache_store, [&] {
      queries();
      q_all = absorbed_queries();
    });
  } else {
    queries();
    cache_store();
    // The absorbed queries are made right before attention, unless the DCP exchange carries them:
    // then the attention kernel's predecessor writes neither the cache nor the slots, and it can
    // gather its first keys while that predecessor still runs (ops::sparse_mla_fp8's inputs_settled).
    const Tensor q_abs = exchanged ? absorbed_queries() : Tensor();
    // The DCP exchange: the group's queries, and on a layer with its own indexer the exact global
    // top-k over every member's scores, in one all-gather (runtime/dcp.h).
    if (own_indexer) {
      const Tensor s = scores();
      q_all = dcp_exchange(*ctx.rank, q_abs, &s, ctx.local_bounds, c.index_topk, &topk);
    } else {
      DSI_CHECK(topk.local.defined() && topk.local.dim(0) == n,
                "shared indexer layer: no top-k from a previous full layer");
      if (exchanged) q_all = dcp_exchange(*ctx.rank, q_abs, nullptr, ctx.local_bounds, 0, nullptr);
    }
    make_slots();
    if (!exchanged) q_all = absorbed_queries();
    settled = !exchanged || !fresh_slots;
  }
  Tensor o_lat = dcp_attend(*ctx.rank, q_all, kv.latent, topk.slots, float(c.attn_softmax_scale()),
                            int(lora), settled);

  Tensor o = Tensor::empty({n, heads, c.v_head_dim}, DType::F32, dev);
  ops::mla_up_v(o_lat, w.kv_b_proj, o);
  Tensor out = Tensor::empty({n, c.hidden_size}, DType::F32, dev);
  ops::linear(o.view({n, heads * c.v_head_dim}), w.o_proj, out);
  return out;
}

}  // namespace dsi
