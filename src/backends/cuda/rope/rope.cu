// RoPE of the CUDA backend; see rope.h and ops/rope.h.
#include "backends/cuda/common.cuh"
#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/rope/rope.h"

namespace dsi::cuda {

namespace {

__global__ void rope_kernel(RopeParams p) {
  pdl_enter();
  const int64_t total = p.rows * p.heads * p.half;
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < total; t += step) {
    const int64_t i = t % p.half;
    const int64_t h = (t / p.half) % p.heads;
    const int64_t r = t / (p.half * p.heads);
    const float* v = p.x + r * p.x_s0 + h * p.x_s1 + p.offset;
    float* o = p.out + r * p.o_s0 + h * p.o_s1;
    const int64_t a = p.interleaved ? 2 * i : i;
    const int64_t b = p.interleaved ? 2 * i + 1 : i + p.half;
    rope_pair(v[a], v[b], float(p.positions[r]), p.inv_freq[i], p.attention_factor, o[a], o[b]);
  }
}

}  // namespace

void launch_rope(const RopeParams& p, cudaStream_t s) {
  const int64_t total = p.rows * p.heads * p.half;
  if (total == 0) return;
  launch(rope_kernel, grid_for(total, 256), 256, 0, s, p);
}

void rope(Tensor& x, const Tensor& positions, const Tensor& inv_freq, float attention_factor,
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
  DeviceGuard guard(x.device());
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
  launch_rope(p, stream());
}

}  // namespace dsi::cuda
