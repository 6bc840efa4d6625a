// CPU reference: lightning-indexer logits in exact fp32 (no Hadamard rotation or fp8: those are GPU
// numerics). Same operation order as HF: scale the dot product, relu, then weight and sum the heads.
#include <cmath>
#include <limits>
#include <vector>

#include "backends/cpu/cpu_ops.h"
#include "backends/cpu/paging.h"
#include "ops/indexer.h"

namespace dsi::cpu {

void indexer_logits(const Tensor& q, const Tensor& weights, const Tensor& keys,
                    const Tensor& bounds, float softmax_scale, Tensor& logits,
                    const ops::KeyPages* pages) {
  DSI_CHECK(q.ndim() == 3 && q.is_contiguous(), "indexer_logits: q must be [rows, heads, d], got {}",
            q.desc());
  const int64_t rows = q.dim(0), heads = q.dim(1), d = q.dim(2);
  check_shape(weights, {rows, heads}, "indexer_logits weights");
  DSI_CHECK(keys.ndim() == 2 && keys.dim(1) == d && keys.stride(1) == 1,
            "indexer_logits: keys {} for q {}", keys.desc(), q.desc());
  DSI_CHECK(keys.dtype() == DType::F32 || keys.dtype() == DType::BF16,
            "indexer_logits: keys must be f32 or bf16 (a bf16 cache), got {}", keys.desc());
  std::vector<float> key_f32(static_cast<size_t>(d));  // a bf16 key, widened exactly
  DSI_CHECK(logits.ndim() == 2 && logits.dim(0) == rows,
            "indexer_logits: logits {} for {} rows", logits.desc(), rows);
  const int64_t n_keys = logits.dim(1);
  check_shape(bounds, {rows}, "indexer_logits bounds");
  DSI_CHECK(weights.is_contiguous() && bounds.is_contiguous() && logits.is_contiguous(),
            "indexer_logits: weights, bounds and logits must be contiguous");
  const PageLookup lookup(pages, rows, "indexer_logits");
  if (!pages) check_shape(logits, {rows, keys.dim(0)}, "indexer_logits logits");
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t bound = bounds.i32()[r];
    DSI_CHECK(bound >= 0 && bound <= n_keys, "indexer_logits: bound {} outside [0, {}]", bound, n_keys);
    const float* w = weights.f32() + r * heads;
    float* out = logits.f32() + r * n_keys;
    for (int64_t s = 0; s < n_keys; ++s) {
      if (s >= bound) {
        out[s] = ninf;
        continue;
      }
      const int64_t slot = lookup.slot(r, s);
      DSI_CHECK(slot >= 0 && slot < keys.dim(0), "indexer_logits: key {} of row {} maps to slot {} "
                "outside the {} keys", s, r, slot, keys.dim(0));
      const float* k = key_row_f32(keys, slot, key_f32.data());
      float acc = 0.0f;
      for (int64_t j = 0; j < heads; ++j) {
        const float* qj = q.f32() + (r * heads + j) * d;
        float dot = 0.0f;
        for (int64_t c = 0; c < d; ++c) dot += qj[c] * k[c];
        const float relu = std::max(dot * softmax_scale, 0.0f);
        acc += w[j] * relu;
      }
      out[s] = acc;
    }
  }
}

}  // namespace dsi::cpu
