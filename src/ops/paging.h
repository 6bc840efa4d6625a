// Paged KV caches (runtime/kv_cache.h): writing new rows into their pool slots, and turning the
// indexer's selections (a sequence's local token indices) into pool slots for attention. Pages hold
// `page_size` slots; block_tables: [n_seqs, max_pages] i32 page ids (-1 = no page); row_seq: [rows]
// i32, the sequence of each row.
#pragma once

#include "core/tensor.h"

namespace dsi::ops {

// dst[slots[i], :] = src[i, :] for every i with slots[i] >= 0.
// src: [n, d] f32 (row-strided ok); slots: [n] i32 (< dst.dim(0)); dst: [n_slots, d] f32
// (row-strided ok). Slots must be distinct.
void scatter_rows(const Tensor& src, const Tensor& slots, Tensor& dst);

// out[r, j] = block_tables[row_seq[r], l / page_size] * page_size + l % page_size with
// l = local[r, j]; -1 stays -1. local, out: [rows, k] i32. A local index past the sequence's pages
// (or onto a -1 page) is an error.
void slots_from_local(const Tensor& local, const Tensor& block_tables, const Tensor& row_seq,
                      int page_size, Tensor& out);

}  // namespace dsi::ops
