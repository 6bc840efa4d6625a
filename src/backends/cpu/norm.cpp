// CPU reference: RMSNorm and LayerNorm in fp32 (mirrors HF GlmMoeDsaRMSNorm and nn.LayerNorm).
#include <cmath>

#include "backends/cpu/cpu_ops.h"

namespace dsi::cpu {

namespace {
void check_rows(const Tensor& x, const Tensor& weight, const Tensor& out, const char* op) {
  DSI_CHECK(x.ndim() == 2 && x.stride(1) == 1, "{}: x must be [n, d] with contiguous rows, got {}",
            op, x.desc());
  check_dtype(x, DType::F32, op);
  check_shape(weight, {x.dim(1)}, op);
  check_dtype(weight, DType::F32, op);
  DSI_CHECK(out.shape() == x.shape() && out.stride(1) == 1, "{}: out {} for x {}", op, out.desc(),
            x.desc());
}
}  // namespace

void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) {
  check_rows(x, weight, out, "rms_norm");
  const int64_t n = x.dim(0), d = x.dim(1);
  const float* w = weight.f32();
  for (int64_t i = 0; i < n; ++i) {
    const float* xi = x.f32() + i * x.stride(0);
    float* oi = out.f32() + i * out.stride(0);
    float ss = 0.0f;
    for (int64_t j = 0; j < d; ++j) ss += xi[j] * xi[j];
    const float inv = 1.0f / std::sqrt(ss / float(d) + eps);
    for (int64_t j = 0; j < d; ++j) oi[j] = w[j] * (xi[j] * inv);
  }
}

void add_rms_norm(Tensor& h, const Tensor& delta, const Tensor& weight, float eps, Tensor& out) {
  add_inplace(h, delta);
  rms_norm(h, weight, eps, out);
}

void layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps, Tensor& out) {
  check_rows(x, weight, out, "layer_norm");
  check_shape(bias, {x.dim(1)}, "layer_norm bias");
  const int64_t n = x.dim(0), d = x.dim(1);
  const float* w = weight.f32();
  const float* b = bias.f32();
  for (int64_t i = 0; i < n; ++i) {
    const float* xi = x.f32() + i * x.stride(0);
    float* oi = out.f32() + i * out.stride(0);
    float mean = 0.0f;
    for (int64_t j = 0; j < d; ++j) mean += xi[j];
    mean /= float(d);
    float var = 0.0f;
    for (int64_t j = 0; j < d; ++j) var += (xi[j] - mean) * (xi[j] - mean);
    var /= float(d);
    const float inv = 1.0f / std::sqrt(var + eps);
    for (int64_t j = 0; j < d; ++j) oi[j] = (xi[j] - mean) * inv * w[j] + b[j];
  }
}

}  // namespace dsi::cpu
