// Rotary embedding (in place, or into another tensor), interleaved or half-split: one thread per (row, head, pair). cos/sin are
// taken in double and rounded once (glibc's cosf/sinf are within 0.56 ulp; the CUDA fp32 ones 2 ulp),
// the rotation uses _rn intrinsics in the CPU reference's order.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/tensor.h"
#include "model/config.h"

namespace dsi::cuda {

struct RopeParams {
  const float* x;            // [rows, heads, d] with strides x_s0, x_s1 (last dim contiguous)
  float* out;                // where the rotated dims go: x + offset (in place), strides o_s0, o_s1
  const int32_t* positions;  // [rows]
  const float* inv_freq;     // [half]
  int64_t x_s0, x_s1, o_s0, o_s1;
  int64_t rows, heads, half;
  int offset;                // the rotated dims are [offset, offset + 2 * half)
  bool interleaved;          // pairs (2i, 2i+1); else (i, i + half)
  float attention_factor;    // multiplies cos and sin
};
void launch_rope(const RopeParams& p, cudaStream_t stream);

// The params of cuda::rope's call (checked as it checks them), for kernels that rotate on the way.
RopeParams rope_params(const Tensor& x, const Tensor& positions, const Tensor& inv_freq, float attention_factor,
                       RopeStyle style, int offset, Tensor* out);

}  // namespace dsi::cuda
