// Element-wise kernels: scale, add, axpy, SiLU-and-multiply (rows of [n, d], strided rows), and the
// embedding gather. Products and sums use the _rn intrinsics (no FMA contraction), as the CPU
// reference is compiled with -ffp-contract=off: the results are bitwise the CPU's.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/common.cuh"

namespace dsi::cuda {

enum class RowOp : int { kScale = 0, kAdd = 1, kAxpy = 2, kSiluMul = 3 };

// Over rows x cols: kScale a *= scale; kAdd a += b; kAxpy a += b * scale; kSiluMul
// out = silu(a) * b (out may alias a).
struct RowwiseParams {
  float* a;          // [rows, cols], row stride a_stride (in place for kScale/kAdd/kAxpy)
  const float* b;    // [rows, cols], row stride b_stride (unused for kScale)
  float* out;        // [rows, cols], row stride out_stride (kSiluMul only)
  int64_t a_stride, b_stride, out_stride;
  int64_t rows, cols;
  float scale;
  RowOp op;
};
void launch_rowwise(const RowwiseParams& p, cudaStream_t stream);

struct EmbeddingParams {
  const void* table;          // [vocab, d] of table_kind, contiguous
  const int32_t* ids;         // [n]
  float* out;                 // [n, d], strides out_s0, out_s1
  int64_t out_s0, out_s1;
  int64_t n, d, vocab;
  FloatKind table_kind;
  unsigned long long* bad;    // lowered to the first i with ids[i] outside [0, vocab)
};
void launch_embedding(const EmbeddingParams& p, cudaStream_t stream);

}  // namespace dsi::cuda
