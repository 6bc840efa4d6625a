// Lightning indexer logits (DeepSeek-V3.2 DSA): for query row r and key s < bound[r],
//   logit[r, s] = sum_j w[r, j] * relu(softmax_scale * q[r, j] . k[s])
// where w already carries the H_I^-1/2 factor. Keys at or past the bound get -inf.
// Reference: dsa-reference.md section 2 (exact fp32 form; the fp8 form is a GPU numeric).
#pragma once

#include "core/tensor.h"

namespace dsi::ops {

// Where row r finds its key s: contiguously (keys[s]), or in pages of a pool
// (keys[block_tables[row_seq[r], s / page_size] * page_size + s % page_size]; ops/paging.h).
struct KeyPages {
  Tensor block_tables;  // [n_seqs, max_pages] i32 page ids, -1 = none
  Tensor row_seq;       // [rows] i32
  int page_size = 64;
};

// q: [rows, n_heads, d] f32; weights: [rows, n_heads] f32; keys: [n_keys, d] f32 (row-strided ok)
// or, with `pages`, a pool [n_slots, d]; bounds: [rows] i32, keys [0, bounds[r]) are visible to
// row r (bounds[r] <= n_keys = logits.dim(1)); logits: [rows, n_keys] f32.
void indexer_logits(const Tensor& q, const Tensor& weights, const Tensor& keys,
                    const Tensor& bounds, float softmax_scale, Tensor& logits,
                    const KeyPages* pages = nullptr);

}  // namespace dsi::ops
