// RMSNorm and LayerNorm kernels: one block per row, its values held in registers (see norm.cu), fp32
// block reductions (fixed tree, so run-to-run deterministic), the rest of the arithmetic in the CPU
// reference's order with _rn intrinsics.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dsi::cuda {

struct NormParams {
  const float* x;       // [rows, d], row stride x_stride
  const float* weight;  // [d]
  const float* bias;    // [d] (LayerNorm only; null for RMSNorm)
  float* out;           // [rows, d], row stride out_stride
  int64_t x_stride, out_stride;
  int64_t rows, d;
  float eps;
  // Residual form (RMSNorm): x is first replaced by x + delta (written back to resid == x), and
  // that sum is normalised.
  const float* delta = nullptr;  // [rows, d], row stride delta_stride
  float* resid = nullptr;
  int64_t delta_stride = 0;
};
void launch_rms_norm(const NormParams& p, cudaStream_t stream);
void launch_layer_norm(const NormParams& p, cudaStream_t stream);

}  // namespace dsi::cuda
