// CPU reference of the fp8-activation linear (see cpu_linear_fp8.h): DeepSeek V3's fp8 recipe,
// activations quantised per token per 128-column block (scale amax / 448, as DeepSeek's act_quant),
// weights e4m3 with 128x128 block scales, per-block partial sums scaled in fp32 (as DeepGEMM does).
// Plain loops: this is the reference the CUDA kernels are checked against, not a fast path.
#include "backends/cpu/cpu_linear_fp8.h"

#include <cmath>
#include <limits>
#include <vector>

#include "backends/cpu/cpu_ops.h"
#include "core/dtype.h"
#include "ops/linear.h"

namespace dsi::cpu {

namespace {

// The activation scale of one group from its largest magnitude (NaN when the group held a NaN).
float act_scale(float amax, bool nan) {
  if (nan) return std::numeric_limits<float>::quiet_NaN();
  const float s = amax / 448.0f;
  return s == 0.0f ? 1.0f : s;  // an all-zero group: any scale quantises it to zeros
}


}  // namespace

void quantize_act_fp8(const Tensor& x, int64_t col0, int block, Tensor& q, Tensor& scales) {
  // Arguments checked by ops::quantize_act_fp8.
  const int64_t n = x.dim(0), in = x.dim(1), groups = (col0 + in + block - 1) / block;
  auto* qp = static_cast<uint8_t*>(q.raw());
  for (int64_t i = 0; i < n; ++i) {
    const float* xr = x.f32() + i * x.stride(0);
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t j0 = std::max<int64_t>(0, g * block - col0);
      const int64_t j1 = std::min<int64_t>(in, (g + 1) * block - col0);
      float amax = 0.0f;
      bool nan = false;
      for (int64_t j = j0; j < j1; ++j) {
        nan |= std::isnan(xr[j]);
        amax = std::max(amax, std::fabs(xr[j]));
      }
      const float s = act_scale(amax, nan);
      scales.f32()[i * groups + g] = s;
      for (int64_t j = j0; j < j1; ++j) qp[i * in + j] = f32_to_e4m3(xr[j] / s);
    }
  }
}

void linear_fp8_act(const Tensor& x, const LinearWeight& w, Tensor& out) {
  // Arguments checked by ops::linear_fp8_act.
  const Tensor& wt = w.weight;
  const int64_t out_f = w.out_features(), in_f = w.in_features(), n = x.dim(0);
  if (n == 0 || out_f == 0) return;
  const int bi = w.block_in;
  const int64_t groups = (w.col0 + in_f + bi - 1) / bi;
  Tensor q = Tensor::empty({n, in_f}, DType::F8_E4M3);
  Tensor sx = Tensor::empty({n, groups}, DType::F32);
  quantize_act_fp8(x, w.col0, bi, q, sx);
  // Decoded operands (exact): products of two e4m3 values are exact in fp32.
  std::vector<float> xq(static_cast<size_t>(n * in_f)), w8(static_cast<size_t>(in_f));
  for (int64_t k = 0; k < n * in_f; ++k) xq[size_t(k)] = e4m3_to_f32(static_cast<uint8_t*>(q.raw())[k]);
  const auto* wp = static_cast<const uint8_t*>(wt.raw());
  const int64_t scols = w.scale_inv.dim(1);
  for (int64_t o = 0; o < out_f; ++o) {
    for (int64_t j = 0; j < in_f; ++j) w8[size_t(j)] = e4m3_to_f32(wp[o * in_f + j]);
    const float* sw = w.scale_inv.f32() + ((w.row0 + o) / w.block_out) * scols;
    for (int64_t i = 0; i < n; ++i) {
      const float* xr = xq.data() + i * in_f;
      float acc = 0.0f;
      for (int64_t g = 0; g < groups; ++g) {
        const int64_t j0 = std::max<int64_t>(0, g * bi - w.col0);
        const int64_t j1 = std::min<int64_t>(in_f, (g + 1) * bi - w.col0);
        float part = 0.0f;
        for (int64_t j = j0; j < j1; ++j) part += xr[j] * w8[size_t(j)];
        acc += part * (sx.f32()[i * groups + g] * sw[g]);
      }
      out.f32()[i * out.stride(0) + o] = acc;
    }
  }
}

}  // namespace dsi::cpu
