// CPU reference: rotary embedding (in place, or into `out`), interleaved or half-split, angles in fp32 as HF computes
// them (pos * inv_freq, then cos/sin scaled by the attention factor).
#include <cmath>

#include "backends/cpu/cpu_ops.h"

namespace dsi::cpu {

void rope(Tensor& x, const Tensor& positions, const Tensor& inv_freq, float attention_factor,
          RopeStyle style, int offset, Tensor* out) {
  DSI_CHECK(x.ndim() == 3 && x.stride(2) == 1, "rope: x must be [n, heads, d], got {}", x.desc());
  check_dtype(x, DType::F32, "rope x");
  check_shape(positions, {x.dim(0)}, "rope positions");
  const int64_t half = inv_freq.dim(0);
  DSI_CHECK(offset >= 0 && offset + 2 * half <= x.dim(2), "rope: dims [{}, {}) outside {}", offset,
            offset + 2 * half, x.desc());
  const int32_t* pos = positions.i32();
  const float* f = inv_freq.f32();
  std::vector<float> cs(static_cast<size_t>(half)), sn(static_cast<size_t>(half));
  for (int64_t r = 0; r < x.dim(0); ++r) {
    for (int64_t i = 0; i < half; ++i) {
      const float angle = float(pos[r]) * f[i];
      cs[size_t(i)] = std::cos(angle) * attention_factor;
      sn[size_t(i)] = std::sin(angle) * attention_factor;
    }
    for (int64_t h = 0; h < x.dim(1); ++h) {
      const float* v = x.f32() + r * x.stride(0) + h * x.stride(1) + offset;
      float* o = out != nullptr ? out->f32() + r * out->stride(0) + h * out->stride(1)
                                : x.f32() + r * x.stride(0) + h * x.stride(1) + offset;
      for (int64_t i = 0; i < half; ++i) {
        const int64_t a = style == RopeStyle::kInterleaved ? 2 * i : i;
        const int64_t b = style == RopeStyle::kInterleaved ? 2 * i + 1 : i + half;
        const float x1 = v[a], x2 = v[b];
        o[a] = x1 * cs[size_t(i)] - x2 * sn[size_t(i)];
        o[b] = x2 * cs[size_t(i)] + x1 * sn[size_t(i)];
      }
    }
  }
}

}  // namespace dsi::cpu
