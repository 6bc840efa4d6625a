// Lightning indexer forward; see indexer.h. Mirrors HF GlmMoeDsaIndexer / DeepseekV32Indexer in
// exact fp32 (RoPE on the first qk_rope dims of each head: "rope first", unlike MLA).
#include "model/indexer.h"

#include <cmath>

#include "ops/elementwise.h"
#include "ops/indexer.h"
#include "ops/linear.h"
#include "ops/norm.h"
#include "ops/rope.h"
#include "ops/topk.h"

namespace dsi {

Tensor indexer_topk(const LayerContext& ctx, const IndexerWeights& w, const Tensor& u,
                    const Tensor& c_q, Tensor& key_cache) {
  const ModelConfig& c = *ctx.cfg;
  const int64_t n = ctx.n, heads = c.n_index_heads, hd = c.index_head_dim;
  const Device dev = u.device();

  Tensor q = Tensor::empty({n, heads * hd}, DType::F32, dev);
  ops::linear(c_q, w.wq_b, q);
  Tensor q3 = q.view({n, heads, hd});
  ops::rope(q3, ctx.positions, ctx.rope->inv_freq, ctx.rope->attention_factor,
            c.indexer_rope_style, /*offset=*/0);

  Tensor k = Tensor::empty({n, hd}, DType::F32, dev);
  ops::linear(u, w.wk, k);
  Tensor new_keys = key_cache.slice(ctx.start, ctx.start + n);
  ops::layer_norm(k, w.k_norm_weight, w.k_norm_bias, 1e-6f, new_keys);
  Tensor new_keys3 = new_keys.view({n, 1, hd});
  ops::rope(new_keys3, ctx.positions, ctx.rope->inv_freq, ctx.rope->attention_factor,
            c.indexer_rope_style, /*offset=*/0);

  Tensor weights = Tensor::empty({n, heads}, DType::F32, dev);
  ops::linear(u, w.weights_proj, weights);
  ops::scale_inplace(weights, 1.0f / std::sqrt(float(heads)));

  const int64_t n_keys = ctx.start + n;
  Tensor logits = Tensor::empty({n, n_keys}, DType::F32, dev);
  ops::indexer_logits(q3, weights, key_cache.slice(0, n_keys), ctx.bounds,
                      1.0f / std::sqrt(float(hd)), logits);
  Tensor selected = Tensor::empty({n, c.index_topk}, DType::I32, dev);
  ops::topk(logits, ctx.bounds, c.index_topk, selected, nullptr);
  return selected;
}

}  // namespace dsi
