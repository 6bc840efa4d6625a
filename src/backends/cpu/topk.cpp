// CPU reference: exact top-k per row in the total order (score descending, then position ascending),
// the selected set listed by ascending position.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "backends/cpu/cpu_ops.h"
#include "ops/topk.h"

namespace dsi::cpu {

void topk(const Tensor& scores, const Tensor& bounds, int k, Tensor& indices, Tensor* values) {
  DSI_CHECK(scores.ndim() == 2 && scores.stride(1) == 1, "topk: scores must be [rows, n], got {}",
            scores.desc());
  check_dtype(scores, DType::F32, "topk scores");
  const int64_t rows = scores.dim(0), n = scores.dim(1);
  DSI_CHECK(k >= 0, "topk: k = {} must be >= 0", k);
  check_shape(bounds, {rows}, "topk bounds");
  check_shape(indices, {rows, k}, "topk indices");
  DSI_CHECK(indices.is_contiguous(), "topk: indices must be contiguous");
  if (values && values->defined()) {
    check_shape(*values, {rows, k}, "topk values");
    DSI_CHECK(values->is_contiguous(), "topk: values must be contiguous");
  }
  const float ninf = -std::numeric_limits<float>::infinity();
  std::vector<int32_t> order;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t bound = bounds.i32()[r];
    DSI_CHECK(bound >= 0 && bound <= n, "topk: bound {} outside [0, {}]", bound, n);
    const float* s = scores.f32() + r * scores.stride(0);
    // Only finite (or +inf) scores are selectable; NaN and -inf never are.
    order.clear();
    for (int32_t i = 0; i < int32_t(bound); ++i)
      if (s[i] > ninf) order.push_back(i);
    auto key = [&](int32_t i) { return s[i]; };
    const int64_t take = std::min<int64_t>(k, int64_t(order.size()));
    std::nth_element(order.begin(), order.begin() + take, order.end(), [&](int32_t a, int32_t b) {
      return ops::topk_before(key(a), a, key(b), b);
    });
    std::sort(order.begin(), order.begin() + take);  // the set, by position
    int32_t* idx = indices.i32() + r * k;
    for (int64_t j = 0; j < k; ++j) idx[j] = j < take ? order[size_t(j)] : -1;
    if (values && values->defined()) {
      float* v = values->f32() + r * k;
      for (int64_t j = 0; j < k; ++j) v[j] = j < take ? s[order[size_t(j)]] : ninf;
    }
  }
}

void topk_merge(const Tensor& scores, const Tensor& positions, int k, Tensor& winners) {
  DSI_CHECK(scores.ndim() == 2 && scores.is_contiguous(), "topk_merge: scores {}", scores.desc());
  check_dtype(scores, DType::F32, "topk_merge scores");
  check_shape(positions, scores.shape(), "topk_merge positions");
  check_dtype(positions, DType::I32, "topk_merge positions");
  const int64_t rows = scores.dim(0), m = scores.dim(1);
  check_shape(winners, {rows, k}, "topk_merge winners");
  DSI_CHECK(positions.is_contiguous() && winners.is_contiguous(), "topk_merge: contiguous tensors");
  const float ninf = -std::numeric_limits<float>::infinity();
  std::vector<int32_t> cand;
  for (int64_t r = 0; r < rows; ++r) {
    const float* s = scores.f32() + r * m;
    const int32_t* p = positions.i32() + r * m;
    cand.clear();
    for (int32_t j = 0; j < int32_t(m); ++j)
      if (p[j] >= 0 && s[j] > ninf) cand.push_back(j);
    const int64_t take = std::min<int64_t>(k, int64_t(cand.size()));
    std::nth_element(cand.begin(), cand.begin() + take, cand.end(), [&](int32_t a, int32_t b) {
      return ops::topk_before(s[a], p[a], s[b], p[b]);
    });
    int32_t* w = winners.i32() + r * k;
    for (int64_t j = 0; j < k; ++j) w[j] = j < take ? p[cand[size_t(j)]] : -1;
    std::sort(w, w + take);  // the set, by position
  }
}

}  // namespace dsi::cpu
