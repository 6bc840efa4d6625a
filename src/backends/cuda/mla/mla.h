// Absorbed MLA on the GPU: the per-head W_UK / W_UV products as cuBLAS strided-batched sgemm, and
// sparse attention over each row's selected keys with one block per (row, head): gather the keys,
// fp32 scores, softmax with max subtraction, natural-log LSE. A first, simple kernel (each head
// re-reads the row's keys); the FlashMLA-style sparse decode kernel comes with the performance work.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/common.cuh"

namespace dsi::cuda {

struct SparseMlaParams {
  const float* q;          // [rows, heads, dk], strides q_s0, q_s1 (last dim contiguous)
  const void* kv;          // [n_keys, dk] f32 or bf16 (kv_kind), row stride kv_stride; the value
                           // is the first dv dims
  FloatKind kv_kind;       // kF32 or kBF16
  const int32_t* indices;  // [rows, topk] contiguous, -1 (any negative) = empty slot
  float* out;              // [rows, heads, dv] contiguous
  float* lse;              // [rows, heads] contiguous, natural log; -inf for a row with no key
  int64_t q_s0, q_s1, kv_stride;
  int64_t rows, heads, dk, n_keys, topk;
  int dv;
  float softmax_scale;
  unsigned long long* bad;  // lowered to the first flat index r * topk + j with indices >= n_keys
};
// Dynamic shared memory the kernel needs for a given topk (bytes).
size_t sparse_mla_smem_bytes(int64_t topk);
void launch_sparse_mla(const SparseMlaParams& p, cudaStream_t stream);

}  // namespace dsi::cuda
