// The device side of RoPE (rope.h): one (row, head, pair) rotation, shared by the RoPE kernel and
// the kernels that rotate queries on the way (the transposed GEMV of MLA's absorbed queries).
#pragma once

#include "backends/cuda/common.cuh"
#include "backends/cuda/rope/rope.h"

namespace dsi::cuda {

// Rotates pair i of row r, head h: p.x's dims at p.offset into p.out (the CPU reference's rounding).
__device__ __forceinline__ void rope_item(const RopeParams& p, int64_t r, int64_t h, int64_t i) {
  const float* v = p.x + r * p.x_s0 + h * p.x_s1 + p.offset;
  float* o = p.out + r * p.o_s0 + h * p.o_s1;
  const int64_t a = p.interleaved ? 2 * i : i;
  const int64_t b = p.interleaved ? 2 * i + 1 : i + p.half;
  rope_pair(v[a], v[b], float(p.positions[r]), p.inv_freq[i], p.attention_factor, o[a], o[b]);
}

}  // namespace dsi::cuda
