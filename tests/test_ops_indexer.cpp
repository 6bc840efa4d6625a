// Op tests, lightning indexer: indexer_logits against the float64 formula
// sum_j w_j * relu(scale * q_j . k_s) with -inf at and past each row's bound, exact ties from the
// relu and from duplicate keys, and the tie order those ties get from topk.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "ops/indexer.h"
#include "ops/topk.h"
#include "test_ops_common.h"
#include "test_util.h"

namespace dsi {
namespace {

using test::to_f64;

// Float64 logits [rows, n_keys] and the per-logit sum of |w_j| * |scale| * sum_c |q_jc k_sc|.
struct RefLogits {
  std::vector<double> logit, abs_sum;
};
RefLogits ref_indexer(const Tensor& q, const Tensor& w, const Tensor& keys,
                      const std::vector<int32_t>& bounds, double scale) {
  const std::vector<double> qv = to_f64(q), wv = to_f64(w), kv = to_f64(keys);
  const int64_t rows = q.dim(0), heads = q.dim(1), d = q.dim(2), n = keys.dim(0);
  RefLogits r{std::vector<double>(size_t(rows * n)), std::vector<double>(size_t(rows * n))};
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t s = 0; s < n; ++s) {
      double acc = 0, a = 0;
      for (int64_t j = 0; j < heads; ++j) {
        double dot = 0, dot_abs = 0;
        for (int64_t c = 0; c < d; ++c) {
          dot += qv[size_t((t * heads + j) * d + c)] * kv[size_t(s * d + c)];
          dot_abs += std::fabs(qv[size_t((t * heads + j) * d + c)] * kv[size_t(s * d + c)]);
        }
        acc += wv[size_t(t * heads + j)] * std::max(scale * dot, 0.0);
        a += std::fabs(wv[size_t(t * heads + j)] * scale) * dot_abs;
      }
      r.logit[size_t(t * n + s)] = s < bounds[size_t(t)] ? acc : -test::kInf;
      r.abs_sum[size_t(t * n + s)] = a;
    }
  return r;
}

// Compares logits with the reference: -inf exactly at and past each bound, finite values within the
// per-element dot-product bound before it, and a whole-matrix NMSE over the finite entries.
void expect_logits(const Tensor& got, const RefLogits& want, const std::vector<int32_t>& bounds) {
  const int64_t rows = got.dim(0), n = got.dim(1);
  std::vector<double> fin_ref, fin_abs;
  std::vector<float> fin_got;
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t s = 0; s < n; ++s) {
      const float g = got.f32()[t * n + s];
      if (s >= bounds[size_t(t)]) {
        EXPECT_TRUE(std::isinf(g) && g < 0) << "row " << t << " key " << s << " past bound: " << g;
        continue;
      }
      fin_got.push_back(g);
      fin_ref.push_back(want.logit[size_t(t * n + s)]);
      fin_abs.push_back(want.abs_sum[size_t(t * n + s)]);
    }
  if (fin_got.empty()) return;
  test::expect_reduction_near(Tensor::from_f32(fin_got, {int64_t(fin_got.size())}), fin_ref,
                              fin_abs, "indexer logits");
}

// Random q, weights (either sign) and row-strided keys; bounds 0, 1, n_keys and in between.
TEST(OpIndexer, MatchesFloat64WithCausalBounds) {
  const int64_t rows = 6, heads = 4, d = 32, n = 19;
  const Tensor q = test::rand_tensor({rows, heads, d}, 600);
  const Tensor w = test::rand_tensor({rows, heads}, 601, 0.5f);
  const Tensor cache = test::rand_tensor({n, d + 8}, 602);
  const Tensor keys = cache.narrow(1, 4, d);  // row stride d + 8
  const std::vector<int32_t> bounds = {0, 1, 7, 19, 12, 18};
  const double scale = 1.0 / std::sqrt(double(d));
  Tensor logits = Tensor::empty({rows, n}, DType::F32);
  ops::indexer_logits(q, w, keys, Tensor::from_i32(bounds, {rows}), float(scale), logits);
  expect_logits(logits, ref_indexer(q, w, keys, bounds, scale), bounds);
}

// The relu matters: with a negative scale every dot flips sign, so the positive terms become zero
// and vice versa (a formula missing the relu, or applying it before the scale, fails here).
TEST(OpIndexer, ReluAppliesToTheScaledDot) {
  const Tensor q = test::rand_tensor({2, 3, 16}, 610);
  const Tensor w = test::rand_tensor({2, 3}, 611);
  const Tensor keys = test::rand_tensor({9, 16}, 612);
  const std::vector<int32_t> bounds = {9, 5};
  for (double scale : {0.25, -0.25}) {
    Tensor logits = Tensor::empty({2, 9}, DType::F32);
    ops::indexer_logits(q, w, keys, Tensor::from_i32(bounds, {2}), float(scale), logits);
    expect_logits(logits, ref_indexer(q, w, keys, bounds, scale), bounds);
  }
}

// Keys built to tie exactly: keys in the negative cone of every query head, or orthogonal to all of
// them, score exactly 0 (relu); duplicated keys score bit-identically. topk over these logits then
// orders the ties by ascending position: positives by score, then every zero in position order.
TEST(OpIndexer, ExactTiesFromReluAndDuplicateKeys) {
  const int64_t heads = 2, d = 8, n = 14;
  // Query heads live in dims 0..3 with positive entries; weights positive.
  std::vector<float> q(size_t(heads * d), 0.0f);
  for (int64_t j = 0; j < heads; ++j)
    for (int64_t c = 0; c < 4; ++c) q[size_t(j * d + c)] = 0.25f + 0.1f * float(j + c);
  const std::vector<float> w = {0.7f, 0.4f};
  // Key kinds: 'p' positive in dims 0..3, 'n' negative there, 'o' only dims 4..7, 'd' duplicate.
  const char kinds[n + 1] = "pnopodnpoddnpn";
  const std::vector<float> r = test::random_floats(size_t(n * d), 620);
  std::vector<float> k(size_t(n * d), 0.0f);
  int64_t last_p = -1;
  for (int64_t s = 0; s < n; ++s) {
    for (int64_t c = 0; c < d; ++c) {
      const float mag = 0.1f + std::fabs(r[size_t(s * d + c)]);
      if (kinds[s] == 'p' && c < 4) k[size_t(s * d + c)] = mag;
      if (kinds[s] == 'n' && c < 4) k[size_t(s * d + c)] = -mag;
      if (kinds[s] == 'o' && c >= 4) k[size_t(s * d + c)] = r[size_t(s * d + c)];
      if (kinds[s] == 'd') k[size_t(s * d + c)] = k[size_t(last_p * d + c)];
    }
    if (kinds[s] == 'p') last_p = s;
  }
  const std::vector<int32_t> bounds = {int32_t(n)};
  Tensor logits = Tensor::empty({1, n}, DType::F32);
  ops::indexer_logits(Tensor::from_f32(q, {1, heads, d}), Tensor::from_f32(w, {1, heads}),
                      Tensor::from_f32(k, {n, d}), Tensor::from_i32(bounds, {1}), 0.5f, logits);
  expect_logits(logits,
                ref_indexer(Tensor::from_f32(q, {1, heads, d}), Tensor::from_f32(w, {1, heads}),
                            Tensor::from_f32(k, {n, d}), bounds, 0.5),
                bounds);
  const float* l = logits.f32();
  int64_t dup_of = -1;
  for (int64_t s = 0; s < n; ++s) {
    if (kinds[s] == 'n' || kinds[s] == 'o') {
      EXPECT_EQ(l[s], 0.0f) << "key " << s << " must score exactly 0";
    }
    if (kinds[s] == 'p') {
      EXPECT_GT(l[s], 0.0f) << s;
      dup_of = s;
    }
    if (kinds[s] == 'd') {
      EXPECT_EQ(std::memcmp(&l[s], &l[dup_of], 4), 0) << "duplicate key " << s;
    }
  }
  // Expected order: (score desc, position asc) over the float64 scores (exact for
  // zeros/duplicates).
  const RefLogits ref =
      ref_indexer(Tensor::from_f32(q, {1, heads, d}), Tensor::from_f32(w, {1, heads}),
                  Tensor::from_f32(k, {n, d}), bounds, 0.5);
  std::vector<int32_t> want(static_cast<size_t>(n));
  std::iota(want.begin(), want.end(), 0);
  std::stable_sort(want.begin(), want.end(), [&](int32_t a, int32_t b) {
    return ref.logit[size_t(a)] > ref.logit[size_t(b)];
  });
  // The top-k for every k is the first k of that order, listed by position.
  for (int k = 1; k <= int(n); ++k) {
    Tensor idx = Tensor::empty({1, k}, DType::I32);
    ops::topk(logits, Tensor::from_i32(bounds, {1}), k, idx, nullptr);
    std::vector<int32_t> set(want.begin(), want.begin() + k);
    std::sort(set.begin(), set.end());
    for (int j = 0; j < k; ++j) EXPECT_EQ(idx.i32()[j], set[size_t(j)]) << "k " << k << " slot " << j;
  }
}

// A bound past the number of keys is an error naming it.
TEST(OpIndexer, BoundPastKeysThrows) {
  Tensor logits = Tensor::empty({1, 4}, DType::F32);
  test::expect_error(
      [&] {
        ops::indexer_logits(test::rand_tensor({1, 2, 8}, 630), test::rand_tensor({1, 2}, 631),
                            test::rand_tensor({4, 8}, 632), Tensor::from_i32({5}, {1}), 1.0f,
                            logits);
      },
      {"5"});
}

}  // namespace
}  // namespace dsi
