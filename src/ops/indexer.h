// Lightning indexer logits (DeepSeek-V3.2 DSA): for query row r and key s < bound[r],
//   logit[r, s] = sum_j w[r, j] * relu(softmax_scale * q[r, j] . k[s])
// where w already carries the H_I^-1/2 factor. Keys at or past the bound get -inf.
// Reference: dsa-reference.md section 2 (exact fp32 form; the fp8 form is a GPU numeric).
#pragma once

#include "core/tensor.h"

namespace dsi::ops {

// q: [rows, n_heads, d] f32; weights: [rows, n_heads] f32; keys: [n_keys, d] f32 (row-strided ok);
// bounds: [rows] i32, keys [0, bounds[r]) are visible to row r (bounds[r] <= n_keys);
// logits: [rows, n_keys] f32.
void indexer_logits(const Tensor& q, const Tensor& weights, const Tensor& keys,
                    const Tensor& bounds, float softmax_scale, Tensor& logits);

}  // namespace dsi::ops
