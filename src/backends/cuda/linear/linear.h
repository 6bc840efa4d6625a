// Linear layers on the GPU. Up to 8 rows of x (decode): the weight-streaming GEMV (gemv.h), which
// reads the weight once in its own dtype. More rows: fp32 weights go straight to cuBLAS sgemm;
// bf16 / f16 / fp8-block-scaled weights are dequantised to fp32 in chunks of rows (exactly as the
// CPU reference) and multiplied with sgemm. Either way the only difference to the CPU is the
// summation order.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/common.cuh"
#include "backends/cuda/linear/gemv.h"

namespace dsi {
struct LinearWeight;
}  // namespace dsi

namespace dsi::cuda {

// The weight half of a GEMV's params (w, kind, shape, fp8 scales and blocks) for a weight that
// passed the linear op's checks; x, y, strides and n are the caller's.
GemvParams gemv_weight_params(const LinearWeight& w);
// The CPU reference's checks of a weight (and a row range of it), with its messages.
void validate_weight(const LinearWeight& w, int64_t row_begin, int64_t row_end);

// out[r - row_begin, c] = W[r, c] (* scale_inv[(row0 + r) / block_out, (col0 + c) / block_in] for fp8)
struct DequantParams {
  const void* w;           // [out_features, in] of kind, contiguous
  const float* scale_inv;  // [ceil((row0 + out_features) / block_out), scale_cols]; fp8 only, else null
  float* out;              // [rows, in] contiguous
  int64_t scale_cols;
  int64_t row_begin, rows, in;
  int64_t row0, col0;
  int block_out, block_in;
  FloatKind kind;
};
void launch_dequantize(const DequantParams& p, cudaStream_t stream);

}  // namespace dsi::cuda
