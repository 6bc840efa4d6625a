// CPU reference: argmax (lowest id wins ties) and temperature / top-p sampling from a given uniform.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "backends/cpu/cpu_ops.h"
#include "ops/topk.h"

namespace dsi::cpu {

void argmax(const Tensor& logits, Tensor& out) {
  DSI_CHECK(logits.ndim() == 2 && logits.stride(1) == 1, "argmax: logits {}", logits.desc());
  check_shape(out, {logits.dim(0)}, "argmax out");
  const int64_t v = logits.dim(1);
  for (int64_t r = 0; r < logits.dim(0); ++r) {
    const float* l = logits.f32() + r * logits.stride(0);
    int64_t best = 0;
    for (int64_t i = 1; i < v; ++i)
      if (l[i] > l[best]) best = i;
    out.i32()[r] = int32_t(best);
  }
}

int32_t sample(const Tensor& logits, float temperature, float top_p, double u) {
  DSI_CHECK(logits.ndim() == 1, "sample: logits must be [vocab], got {}", logits.desc());
  const int64_t v = logits.dim(0);
  const float* l = logits.f32();
  if (temperature <= 0.0f) {
    Tensor row = logits.view({1, v});
    Tensor out = Tensor::empty({1}, DType::I32);
    argmax(row, out);
    return out.i32()[0];
  }
  DSI_CHECK(top_p > 0.0f && top_p <= 1.0f, "sample: top_p = {} outside (0, 1]", top_p);
  const float m = *std::max_element(l, l + v);
  std::vector<double> p(static_cast<size_t>(v));
  double total = 0.0;
  for (int64_t i = 0; i < v; ++i) {
    p[size_t(i)] = std::exp(double(l[i] - m) / double(temperature));
    total += p[size_t(i)];
  }
  std::vector<int32_t> order(static_cast<size_t>(v));
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return p[size_t(a)] > p[size_t(b)] || (p[size_t(a)] == p[size_t(b)] && a < b);
  });
  // Keep the smallest prefix whose mass reaches top_p.
  size_t keep = 0;
  double mass = 0.0;
  while (keep < order.size()) {
    mass += p[size_t(order[keep])];
    ++keep;
    if (mass >= double(top_p) * total) break;
  }
  double target = u * mass;
  for (size_t i = 0; i < keep; ++i) {
    target -= p[size_t(order[i])];
    if (target < 0.0) return order[i];
  }
  return order[keep - 1];
}

}  // namespace dsi::cpu
