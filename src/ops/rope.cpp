// RoPE frequency tables (HF modeling_rope_utils: default and YaRN, computed in fp32 as there) and
// dispatch of the rotation.
#include "ops/rope.h"

#include <algorithm>
#include <cmath>

#include "ops/dispatch.h"

namespace dsi::ops {

namespace {
// YaRN: the dimension at which a wavelength makes `num_rotations` turns over the original context.
double correction_dim(double num_rotations, int dim, double base, double max_pos) {
  return (dim * std::log(max_pos / (num_rotations * 2.0 * M_PI))) / (2.0 * std::log(base));
}
double yarn_mscale(double scale, double m) { return scale <= 1.0 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; }
}  // namespace

RopeFreqs compute_rope_freqs(const RopeConfig& rope, int rot_dim) {
  DSI_CHECK(rot_dim > 0 && rot_dim % 2 == 0, "rope: rotary dim {} must be positive and even", rot_dim);
  const int half = rot_dim / 2;
  RopeFreqs f;
  f.inv_freq.resize(size_t(half));
  std::vector<float> pos_freqs(static_cast<size_t>(half));
  for (int i = 0; i < half; ++i) {
    const float e = float(2 * i) / float(rot_dim);
    pos_freqs[size_t(i)] = std::pow(float(rope.theta), e);
  }
  if (!rope.is_yarn()) {
    for (int i = 0; i < half; ++i) f.inv_freq[size_t(i)] = 1.0f / pos_freqs[size_t(i)];
    return f;
  }
  const double factor = rope.factor;
  const double orig = double(rope.original_max_position_embeddings);
  double low = correction_dim(rope.beta_fast, rot_dim, rope.theta, orig);
  double high = correction_dim(rope.beta_slow, rot_dim, rope.theta, orig);
  if (rope.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, double(rot_dim - 1));
  if (low == high) high += 0.001;  // avoids a zero-width ramp, as HF does
  for (int i = 0; i < half; ++i) {
    const float ramp = std::clamp((float(i) - float(low)) / float(high - low), 0.0f, 1.0f);
    const float extrapolation = 1.0f - ramp;  // weight of the unscaled frequency
    const float inv_extra = 1.0f / pos_freqs[size_t(i)];
    const float inv_inter = 1.0f / (float(factor) * pos_freqs[size_t(i)]);
    f.inv_freq[size_t(i)] = inv_inter * (1.0f - extrapolation) + inv_extra * extrapolation;
  }
  if (rope.attention_factor) {
    f.attention_factor = float(*rope.attention_factor);
  } else if (rope.mscale != 0.0 && rope.mscale_all_dim != 0.0) {
    f.attention_factor =
        float(yarn_mscale(factor, rope.mscale) / yarn_mscale(factor, rope.mscale_all_dim));
  } else {
    f.attention_factor = float(yarn_mscale(factor, 1.0));
  }
  return f;
}

void rope(Tensor& x, const Tensor& positions, const Tensor& inv_freq, float attention_factor,
          RopeStyle style, int offset, Tensor* out) {
  if (out != nullptr) {
    DSI_CHECK(out->ndim() == 3 && out->dim(0) == x.dim(0) && out->dim(1) == x.dim(1) &&
                  out->dim(2) == 2 * inv_freq.dim(0) && out->stride(2) == 1 && out->dtype() == DType::F32,
              "rope: out must be [{}, {}, {}] f32 with a contiguous last dim, got {}", x.dim(0), x.dim(1),
              2 * inv_freq.dim(0), out->desc());
    DSI_CHECK(out->device() == x.device(), "rope: out is on {}, x on {}", out->device().str(), x.device().str());
  }
  DSI_DISPATCH(x.device(), rope, x, positions, inv_freq, attention_factor, style, offset, out);
}

}  // namespace dsi::ops
