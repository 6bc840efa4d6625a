// Lightning-indexer logits in exact fp32: one thread per (row, key), heads and dims summed
// sequentially in the CPU reference's order with _rn intrinsics, so the logits are bitwise the
// CPU's (and so is the top-k taken from them). A first, simple kernel: the Hadamard + fp8 form of
// the deployed indexer comes with the performance work.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/common.cuh"
#include "backends/cuda/paging/paging.h"

namespace dsi::cuda {

struct IndexerParams {
  const float* q;          // [rows, heads, d] contiguous
  const float* weights;    // [rows, heads] contiguous
  const void* keys;        // [n_slots, d] f32 or bf16 (key_kind), row stride key_stride; row r's
                           // key s in slot pages.slot(r, s)
  FloatKind key_kind;
  PageTable pages;
  const int32_t* bounds;   // [rows], keys [0, bounds[r]) visible to row r
  float* logits;           // [rows, n_keys] contiguous; -inf at and past the bound
  int64_t key_stride;
  int64_t rows, heads, d, n_keys, n_slots;  // n_keys: the logits' width
  float softmax_scale;
  unsigned long long* bad;  // lowered to the first row whose bound is outside [0, n_keys]
  unsigned long long* bad_key;  // lowered to the first (row * n_keys + key) with no slot
};
void launch_indexer_logits(const IndexerParams& p, cudaStream_t stream);

}  // namespace dsi::cuda
