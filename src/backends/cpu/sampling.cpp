// CPU reference: argmax (lowest id wins ties) and temperature / top-p sampling from a given uniform.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "backends/cpu/cpu_ops.h"
#include "ops/topk.h"

namespace dsi::cpu {

namespace {
// Token ids by probability descending, then id ascending: the order of the nucleus and the CDF.
std::vector<int32_t> ranked(const std::vector<double>& p) {
  std::vector<int32_t> order(p.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return p[size_t(a)] > p[size_t(b)]; });
  return order;
}
}  // namespace

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

std::vector<double> token_distribution(const Tensor& logits, float temperature, float top_p) {
  DSI_CHECK(logits.ndim() == 1, "sampling: logits must be [vocab], got {}", logits.desc());
  check_dtype(logits, DType::F32, "sampling logits");
  const int64_t v = logits.dim(0);
  DSI_CHECK(v > 0, "sampling: empty vocabulary");
  const float* l = logits.f32();
  std::vector<double> p(static_cast<size_t>(v), 0.0);
  if (temperature <= 0.0f) {
    Tensor out = Tensor::empty({1}, DType::I32);
    argmax(logits.view({1, v}), out);
    p[size_t(out.i32()[0])] = 1.0;
    return p;
  }
  DSI_CHECK(top_p > 0.0f && top_p <= 1.0f, "sampling: top_p = {} outside (0, 1]", top_p);
  const float m = *std::max_element(l, l + v);
  double total = 0.0;
  for (int64_t i = 0; i < v; ++i) {
    p[size_t(i)] = std::exp(double(l[i] - m) / double(temperature));
    total += p[size_t(i)];
  }
  std::vector<int32_t> order = ranked(p);
  // Keep the smallest prefix whose mass reaches top_p; zero the rest and renormalise.
  size_t keep = 0;
  double mass = 0.0;
  while (keep < order.size()) {
    mass += p[size_t(order[keep])];
    ++keep;
    if (mass >= double(top_p) * total) break;
  }
  for (size_t i = keep; i < order.size(); ++i) p[size_t(order[i])] = 0.0;
  for (double& x : p) x /= mass;
  return p;
}

int32_t draw_token(const std::vector<double>& p, double u) {
  DSI_CHECK(!p.empty(), "draw_token: empty distribution");
  const std::vector<int32_t> order = ranked(p);
  double mass = 0.0;
  for (double x : p) mass += x;
  DSI_CHECK(mass > 0.0, "draw_token: the distribution has no mass");
  double target = u * mass;
  int32_t last = order[0];
  for (int32_t id : order) {
    if (p[size_t(id)] <= 0.0) break;
    last = id;
    target -= p[size_t(id)];
    if (target < 0.0) return id;
  }
  return last;  // u * mass rounded past the total: the last token with mass
}

int32_t sample(const Tensor& logits, float temperature, float top_p, double u) {
  return draw_token(token_distribution(logits, temperature, top_p), u);
}

}  // namespace dsi::cpu
