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
void linear_fp8_act(const Tensor& x, const LinearWeight& w, Tensor& out);

}  // namespace dsi::cuda
