// RoPE of the CUDA backend; see rope.h and ops/rope.h.
#include "backends/cuda/common.cuh"
#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/rope/rope.cuh"

namespace dsi::cuda {

namespace {

__global__ void rope_kernel(RopeParams p) {
  pdl_enter();
  const int64_t total = p.rows * p.heads * p.half;
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < total; t += step) {
    rope_item(p, t / (p.half * p.heads), (t / p.half) % p.heads, t % p.half);
  }
}

}  // namespace

void launch_rope(const RopeParams& p, cudaStream_t s) {
  const int64_t total = p.rows * p.heads * p.half;
  if (total == 0) return;
  launch(rope_kernel, grid_for(total, 256), 256, 0, s, p);
}

RopeParams rope_params(const Tensor& x, const Tensor& positions, const Tensor& inv_freq, float attention_factor,
                       RopeStyle style, int offset, Tensor* out) {
  DSI_CHECK(x.ndim() == 3 && x.stride(2) == 1, "rope: x must be [n, heads, d], got {}", x.desc());
  check_dtype(x, DType::F32, "rope x");
  check_shape(positions, {x.dim(0)}, "rope positions");
  DSI_CHECK(inv_freq.ndim() == 1, "rope: inv_freq must be [rot_dim / 2], got {}", inv_freq.desc());
  const int64_t half = inv_freq.dim(0);
  DSI_CHECK(offset >= 0 && offset + 2 * half <= x.dim(2), "rope: dims [{}, {}) outside {}", offset,
            offset + 2 * half, x.desc());
  check_on(positions, x.device(), "rope", "positions");
  check_on(inv_freq, x.device(), "rope", "inv_freq");
  DSI_CHECK(positions.is_contiguous() && inv_freq.is_contiguous(),
            "rope: positions and inv_freq must be contiguous");
  if (out != nullptr) check_on(*out, x.device(), "rope", "out");
  RopeParams p{};
  p.x = x.f32();
  p.positions = positions.i32();
  p.inv_freq = inv_freq.f32();
  p.x_s0 = x.stride(0);
  p.x_s1 = x.stride(1);
  p.out = out != nullptr ? out->f32() : x.f32() + offset;
  p.o_s0 = out != nullptr ? out->stride(0) : x.stride(0);
  p.o_s1 = out != nullptr ? out->stride(1) : x.stride(1);
  p.rows = x.dim(0);
  p.heads = x.dim(1);
  p.half = half;
  p.offset = offset;
  p.interleaved = style == RopeStyle::kInterleaved;
  p.attention_factor = attention_factor;
  return p;
}

void rope(Tensor& x, const Tensor& positions, const Tensor& inv_freq, float attention_factor,
          RopeStyle style, int offset, Tensor* out) {
  const RopeParams p = rope_params(x, positions, inv_freq, attention_factor, style, offset, out);
  DeviceGuard guard(x.device());
  launch_rope(p, stream());
}

}  // namespace dsi::cuda
