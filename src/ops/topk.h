// Exact top-k in dsinfer's total order: score descending, then position ascending. The same order
// is used everywhere (CPU, GPU, every DCP rank and the DCP merge), so selections are reproducible.
#pragma once

#include "core/tensor.h"

namespace dsi::ops {

// For each row r, selects the k best of scores[r, 0 : bounds[r]) (column index = position).
// scores: [rows, n] f32; bounds: [rows] i32 (<= n); indices: [rows, k] i32, best first, -1 when
// fewer than k entries are valid; values (optional, may be undefined): [rows, k] f32, -inf for -1.
void topk(const Tensor& scores, const Tensor& bounds, int k, Tensor& indices, Tensor* values);

// True when (score a, position pa) ranks before (score b, position pb) in the total order.
inline bool topk_before(float a, int64_t pa, float b, int64_t pb) {
  return a > b || (a == b && pa < pb);
}

}  // namespace dsi::ops
