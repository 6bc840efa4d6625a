// Exact top-k in dsinfer's total order: score descending, then position ascending. The same order
// is used everywhere (CPU, GPU, every DCP rank and the DCP merge), so selections are reproducible.
// A selection is a set: it is listed by ascending position (the order sparse attention visits the
// keys in, on every backend), not best first, so no backend has to sort the winners by score.
#pragma once

#include "core/tensor.h"

namespace dsi::ops {

// For each row r, selects the k best of scores[r, 0 : bounds[r]) (column index = position).
// Entries scoring -inf (or NaN) are never selected: a row with fewer than k finite entries is
// padded with -1. scores: [rows, n] f32; bounds: [rows] i32 (<= n); indices: [rows, k] i32, the
// selected positions ascending, then -1; values (optional, may be undefined): [rows, k] f32, the
// score at each index (bitwise), -inf where the index is -1.
void topk(const Tensor& scores, const Tensor& bounds, int k, Tensor& indices, Tensor* values);

// Merges candidate lists into the k best by the same total order, comparing global positions.
// scores: [rows, m] f32; positions: [rows, m] i32 (-1 = empty candidate, never selected);
// winners: [rows, k] i32 positions, ascending, -1 padded; candidates scoring -inf are never taken.
// A position must appear at most once per row.
void topk_merge(const Tensor& scores, const Tensor& positions, int k, Tensor& winners);

// True when (score a, position pa) ranks before (score b, position pb) in the total order.
inline bool topk_before(float a, int64_t pa, float b, int64_t pb) {
  return a > b || (a == b && pa < pb);
}

}  // namespace dsi::ops
