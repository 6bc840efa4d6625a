// CPU reference: argmax (lowest id wins ties) and temperature / top-k / top-p / min-p sampling from a
// given uniform.
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

std::vector<double> token_distribution(const Tensor& logits, const SamplingParams& sp) {
  DSI_CHECK(logits.ndim() == 1, "sampling: logits must be [vocab], got {}", logits.desc());
  check_dtype(logits, DType::F32, "sampling logits");
  const int64_t v = logits.dim(0);
  DSI_CHECK(v > 0, "sampling: empty vocabulary");
  if (!sp.logit_bias.empty()) {  // the biased logits, then the rest as without a bias
    Tensor biased = Tensor::empty({v}, DType::F32);
    std::copy(logits.f32(), logits.f32() + v, biased.f32());
    for (const auto& [id, b] : sp.logit_bias) {
      DSI_CHECK(id >= 0 && id < v, "sampling: logit_bias token {} outside the vocabulary [0, {})", id, v);
      DSI_CHECK(std::isfinite(b), "sampling: logit_bias of token {} is not finite", id);
      biased.f32()[id] += b;
    }
    SamplingParams rest = sp;
    rest.logit_bias.clear();
    return token_distribution(biased, rest);
  }
  const float* l = logits.f32();
  std::vector<double> p(static_cast<size_t>(v), 0.0);
  if (sp.temperature <= 0.0f) {
    Tensor out = Tensor::empty({1}, DType::I32);
    argmax(logits.view({1, v}), out);
    p[size_t(out.i32()[0])] = 1.0;
    return p;
  }
  DSI_CHECK(sp.top_p > 0.0f && sp.top_p <= 1.0f, "sampling: top_p = {} outside (0, 1]", sp.top_p);
  DSI_CHECK(sp.top_k >= 0, "sampling: top_k = {} must be >= 0 (0 keeps every token)", sp.top_k);
  DSI_CHECK(sp.min_p >= 0.0f && sp.min_p <= 1.0f, "sampling: min_p = {} outside [0, 1]", sp.min_p);
  const float m = *std::max_element(l, l + v);
  for (int64_t i = 0; i < v; ++i) p[size_t(i)] = std::exp(double(l[i] - m) / double(sp.temperature));
  std::vector<int32_t> order = ranked(p);
  // top_k: the k most likely tokens.
  size_t keep = sp.top_k > 0 ? std::min(order.size(), size_t(sp.top_k)) : order.size();
  double total = 0.0;
  if (keep == order.size()) {
    for (double x : p) total += x;  // (in id order)
  } else {
    for (size_t i = 0; i < keep; ++i) total += p[size_t(order[i])];
  }
  // top_p: the smallest prefix of those whose mass reaches top_p of theirs.
  size_t nucleus = 0;
  double mass = 0.0;
  while (nucleus < keep) {
    mass += p[size_t(order[nucleus])];
    ++nucleus;
    if (mass >= double(sp.top_p) * total) break;
  }
  keep = nucleus;
  // min_p: the tokens at least min_p times as likely as the most likely one (always kept).
  const double floor = double(sp.min_p) * p[size_t(order[0])];
  while (keep > 1 && p[size_t(order[keep - 1])] < floor) mass -= p[size_t(order[--keep])];
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



}  // namespace dsi::cpu
