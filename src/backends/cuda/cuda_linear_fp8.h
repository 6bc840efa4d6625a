// The CUDA backend's fp8-activation linear ops (ops/linear.h: linear_fp8_act, quantize_act_fp8),
// with the CPU reference's signatures and semantics (backends/cpu/cpu_linear_fp8.h). No CUDA
// includes: ops/linear.cpp includes it into a plain C++ translation unit.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace dsi {
struct LinearWeight;
}

namespace dsi::cuda {

void quantize_act_fp8(const Tensor& x, int64_t col0, int block, Tensor& q, Tensor& scales);
// Through cuBLASLt's block-scaled fp8 matmul when it takes the weight (linear/fp8_gemm.h: 128x128
// blocks, no slice offsets, in % 16 == 0, a multiple of 4 column blocks; x padded to a multiple of
// 8 rows), else through the tiled kernel that matches the CPU reference bitwise.
void linear_fp8_act(const Tensor& x, const LinearWeight& w, Tensor& out);
// Always the tiled kernel (for tests and benchmarks).
void linear_fp8_act_tiled(const Tensor& x, const LinearWeight& w, Tensor& out);
// Whether linear_fp8_act would take cuBLASLt's path for these operands.
bool linear_fp8_act_uses_tensor_cores(const Tensor& x, const LinearWeight& w, Tensor& out);

}  // namespace dsi::cuda
