// Lightning indexer forward; see indexer.h. Mirrors HF GlmMoeDsaIndexer / DeepseekV32Indexer in
// exact fp32 (RoPE on the first qk_rope dims of each head: "rope first", unlike MLA).
#include "model/indexer.h"

#include <cmath>

#include "ops/elementwise.h"
#include "ops/kv_fp8.h"
#include "ops/indexer.h"
#include "ops/linear.h"
#include "ops/norm.h"
#include "ops/paging.h"
#include "ops/rope.h"

namespace dsi {

Tensor indexer_scores(const LayerContext& ctx, const IndexerWeights& w, const Tensor& u,
                      const Tensor& c_q, const Tensor* q_norm, float eps, Tensor k, Tensor& key_pool) {
  const ModelConfig& c = *ctx.cfg;
  const int64_t n = ctx.n, heads = c.n_index_heads, hd = c.index_head_dim;
  const Device dev = u.device();

  // Every rank computes all index heads for every new row (the indexer is replicated).
  Tensor q = Tensor::empty({n, heads * hd}, DType::F32, dev);
  if (q_norm != nullptr) ops::rms_norm_linear(c_q, *q_norm, eps, w.wq_b, q);
  else ops::linear(c_q, w.wq_b, q);
  Tensor q3 = q.view({n, heads, hd});  // RoPE'd below, or inside the fp8 logits (prep)

  DSI_CHECK(k.ndim() == 2 && k.dim(0) == n && k.dim(1) == hd, "indexer: keys {} for {} rows of {}",
            k.desc(), n, hd);
  const bool fp8 = key_pool.dtype() == DType::U8;  // rotated e4m3 keys in 64-token pages
  if (fp8) {  // the key's LayerNorm and RoPE run inside the store
    const ops::IndexerKeyPrep prep{w.k_norm_weight, w.k_norm_bias, 1e-6f, ctx.positions, ctx.rope->inv_freq,
                                   ctx.rope->attention_factor, c.indexer_rope_style};
    ops::indexer_keys_store_fp8(k, ctx.store_slots, key_pool, &prep);
  } else {
    ops::layer_norm(k, w.k_norm_weight, w.k_norm_bias, 1e-6f, k);
    Tensor k3 = k.unsqueeze(1);
    ops::rope(k3, ctx.positions, ctx.rope->inv_freq, ctx.rope->attention_factor,
              c.indexer_rope_style, /*offset=*/0);
    ops::scatter_rows(k, ctx.store_slots, key_pool);
  }

  Tensor weights = Tensor::empty({n, heads}, DType::F32, dev);
  ops::linear(u, w.weights_proj, weights);
  const float weights_scale = 1.0f / std::sqrt(float(heads));

  Tensor logits = Tensor::empty({n, ctx.local_keys}, DType::F32, dev);
  if (fp8) {  // the query's RoPE and the weights' scale run inside the logits op
    const ops::IndexerQueryPrep prep{ctx.positions, ctx.rope->inv_freq, ctx.rope->attention_factor,
                                     c.indexer_rope_style, weights_scale};
    ops::indexer_logits_fp8(q3, weights, key_pool, ctx.pages.block_tables, ctx.pages.row_seq,
                            ctx.local_bounds, 1.0f / std::sqrt(float(hd)), logits, &prep);
  } else {
    ops::rope(q3, ctx.positions, ctx.rope->inv_freq, ctx.rope->attention_factor,
              c.indexer_rope_style, /*offset=*/0);
    ops::scale_inplace(weights, weights_scale);
    ops::indexer_logits(q3, weights, key_pool, ctx.local_bounds, 1.0f / std::sqrt(float(hd)),
                        logits, &ctx.pages);
  }
  return logits;
}

}  // namespace dsi
