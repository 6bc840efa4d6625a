// Op tests, top-k: the total order (score descending, then position ascending) decides the set,
// which is listed by ascending position; ties, bounds, -1 padding, NaN safety, guard regions, determinism, and a randomized comparison with a std::sort
// reference over the sizes the engineering guide lists.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "ops/topk.h"
#include "test_ops_common.h"
#include "test_util.h"

namespace dsi {
namespace {

using test::kNinfF;

// The k best of s[0 : bound) by (score desc, position asc), listed by position, -1 padded: a full
// std::sort of the valid positions (those not scoring -inf or NaN) with the total order written out
// here, the first k kept and sorted by position.
std::vector<int32_t> ref_topk(const float* s, int64_t bound, int k) {
  std::vector<int32_t> idx;
  for (int32_t i = 0; i < int32_t(bound); ++i)
    if (s[i] > kNinfF) idx.push_back(i);
  std::sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) {
    if (s[a] != s[b]) return s[a] > s[b];
    return a < b;
  });
  if (idx.size() > size_t(k)) idx.resize(size_t(k));
  std::sort(idx.begin(), idx.end());
  idx.resize(size_t(k), -1);
  return idx;
}

struct TopkOut {
  Tensor idx, val;
};
TopkOut run_topk(const Tensor& scores, const std::vector<int32_t>& bounds, int k) {
  const int64_t rows = scores.dim(0);
  TopkOut o{Tensor::empty({rows, k}, DType::I32), Tensor::empty({rows, k}, DType::F32)};
  ops::topk(scores, Tensor::from_i32(bounds, {rows}), k, o.idx, &o.val);
  return o;
}

// Checks row r of a topk result against ref_topk, and that each value is the score at its index
// (bitwise) or -inf for a -1 slot.
void expect_row(const TopkOut& o, const Tensor& scores, int64_t r, int64_t bound, int k,
                const std::string& what) {
  const float* s = scores.f32() + r * scores.stride(0);
  const std::vector<int32_t> want = ref_topk(s, bound, k);
  int bad = 0;
  for (int j = 0; j < k; ++j) {
    const int32_t got = o.idx.i32()[r * k + j];
    const float v = o.val.f32()[r * k + j];
    const float want_v = want[size_t(j)] < 0 ? kNinfF : s[want[size_t(j)]];
    if ((got != want[size_t(j)] || std::memcmp(&v, &want_v, 4) != 0) && bad++ < 3)
      ADD_FAILURE() << what << " row " << r << " rank " << j << ": got (" << got << ", " << v
                    << ") want (" << want[size_t(j)] << ", " << want_v << ")";
  }
  EXPECT_EQ(bad, 0) << what << " row " << r;
}

// A hand-checked row: the three 3s, the 2 and the first of the two 1s (the lower position wins the
// tie), listed by position.
TEST(OpTopk, TotalOrderScoreThenPosition) {
  const Tensor s = Tensor::from_f32({1, 3, 3, 2, 3, 1}, {1, 6});
  const TopkOut o = run_topk(s, {6}, 5);
  const std::vector<int32_t> want = {0, 1, 2, 3, 4};
  const std::vector<float> want_v = {1, 3, 3, 2, 3};
  for (int j = 0; j < 5; ++j) {
    EXPECT_EQ(o.idx.i32()[j], want[size_t(j)]) << j;
    EXPECT_EQ(o.val.f32()[j], want_v[size_t(j)]) << j;
  }
}

// Many exact ties (three interleaved levels over 300 keys): the lowest positions of a level win.
TEST(OpTopk, ManyExactTies) {
  std::vector<float> v(300);
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(i % 3);
  const Tensor s = Tensor::from_f32(v, {1, 300});
  for (int k : {1, 99, 100, 150, 300}) expect_row(run_topk(s, {300}, k), s, 0, 300, k, "ties");
  const TopkOut o = run_topk(s, {300}, 100);
  for (int j = 0; j < 100; ++j) EXPECT_EQ(v[size_t(o.idx.i32()[j])], 2.0f);
  for (int j = 1; j < 100; ++j) EXPECT_LT(o.idx.i32()[j - 1], o.idx.i32()[j]);
}

// All-equal rows select the lowest positions, in order; an all -inf row selects nothing (-1):
// -inf marks "no key", the same rule the DCP merge applies to its candidates.
TEST(OpTopk, AllEqualRows) {
  for (float c : {0.5f, 0.0f, kNinfF}) {
    const Tensor s = Tensor::from_f32(std::vector<float>(64, c), {1, 64});
    const TopkOut o = run_topk(s, {64}, 10);
    for (int j = 0; j < 10; ++j) {
      EXPECT_EQ(o.idx.i32()[j], c == kNinfF ? -1 : j) << c;
      EXPECT_EQ(o.val.f32()[j], c);
    }
  }
}

// bound < k: all valid entries (by position), then -1 with value -inf; bound = 0 gives all -1;
// entries at or past the bound are never selected even when they score higher.
TEST(OpTopk, BoundsAndPadding) {
  const Tensor s = Tensor::from_f32({0.1f, 0.9f, 0.5f, 9.0f, 8.0f, 0.2f, 0.3f, 0.4f, 7.f,  6.f,
                                     5.0f, 4.0f, 3.0f, 2.0f, 1.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f},
                                    {2, 10});
  const TopkOut o = run_topk(s, {3, 0}, 6);
  const std::vector<int32_t> want = {0, 1, 2, -1, -1, -1};
  for (int j = 0; j < 6; ++j) {
    EXPECT_EQ(o.idx.i32()[j], want[size_t(j)]) << j;
    EXPECT_EQ(o.idx.i32()[6 + j], -1) << j;
    EXPECT_EQ(o.val.f32()[6 + j], kNinfF) << j;
    if (j >= 3) {
      EXPECT_EQ(o.val.f32()[j], kNinfF) << j;
    }
  }
  EXPECT_EQ(o.val.f32()[1], 0.9f);
}

// k = 0 writes nothing at all (a zero-size view inside a guard buffer stays intact).
TEST(OpTopk, KZero) {
  const Tensor s = test::rand_tensor({3, 8}, 700);
  Tensor ibuf = test::guard_filled({16}, DType::I32), vbuf = test::guard_filled({16}, DType::F32);
  Tensor idx = test::contiguous_view_in(ibuf, {3, 0}, 8),
         val = test::contiguous_view_in(vbuf, {3, 0}, 8);
  ops::topk(s, Tensor::from_i32({8, 3, 0}, {3}), 0, idx, &val);
  test::expect_guard_intact(ibuf, idx, "topk k=0 indices");
  test::expect_guard_intact(vbuf, val, "topk k=0 values");
}

// NaN scores never crash and never rank above a finite score; the finite scores keep their total
// order, no position is selected twice, and every value output is the score at its index.
TEST(OpTopk, NaNNeverRanksAboveFinite) {
  const float nan = std::nanf("");
  const std::vector<float> v = {nan, 2.0f, nan, -1.0f, kNinfF, 2.0f, nan, 0.0f, -5.0f, nan};
  const Tensor s = Tensor::from_f32(v, {1, 10});
  for (int k : {3, 6, 10}) {
    const TopkOut o = run_topk(s, {10}, k);
    // Only the five finite scores are selectable; NaN and -inf never are. Best first they are
    // 1, 5, 7, 3, 8; the k best are listed by position.
    std::vector<int32_t> want = {1, 5, 7, 3, 8};
    want.resize(size_t(std::min(k, 5)));
    std::sort(want.begin(), want.end());
    for (int j = 0; j < k; ++j) {
      const int32_t i = o.idx.i32()[j];
      if (j < int(want.size())) {
        EXPECT_EQ(i, want[size_t(j)]) << "rank " << j;
        EXPECT_EQ(o.val.f32()[j], v[size_t(i)]) << "value at rank " << j;
      } else {
        EXPECT_EQ(i, -1) << "rank " << j;
        EXPECT_EQ(o.val.f32()[j], kNinfF) << "rank " << j;
      }
    }
  }
}

// Randomized: continuous and heavily tied (8 levels) scores over n in {0, 1, 3, 127, 128, 129,
// 2047, 2048, 2049} keys, k in {2048, 16}, bounds 0, n and random; equal to the std::sort
// reference.
TEST(OpTopk, RandomizedAgainstSortReference) {
  std::mt19937_64 rng(710);
  for (int64_t n : {0, 1, 3, 127, 128, 129, 2047, 2048, 2049})
    for (int k : {2048, 16})
      for (bool tied : {false, true}) {
        const int64_t rows = 4;
        std::vector<float> v = test::random_floats(size_t(rows * n), rng());
        if (tied)
          for (float& x : v) x = std::floor(x * 4.0f) / 4.0f;
        const Tensor s = test::host_f32(v, {rows, n});
        std::vector<int32_t> bounds = {int32_t(n), 0, int32_t(rng() % uint64_t(n + 1)),
                                       int32_t(rng() % uint64_t(n + 1))};
        const TopkOut o = run_topk(s, bounds, k);
        for (int64_t r = 0; r < rows; ++r)
          expect_row(o, s, r, bounds[size_t(r)], k,
                     "n=" + std::to_string(n) + " k=" + std::to_string(k) + (tied ? " tied" : ""));
      }
}

// Row-strided scores (a column range of a wider buffer) are read with their stride.
TEST(OpTopk, StridedScoreRows) {
  const Tensor wide = test::rand_tensor({3, 50}, 720);
  const Tensor s = wide.narrow(1, 5, 40);
  const std::vector<int32_t> bounds = {40, 17, 3};
  const TopkOut o = run_topk(s, bounds, 8);
  for (int64_t r = 0; r < 3; ++r) expect_row(o, s, r, bounds[size_t(r)], 8, "strided");
}

// Two runs over the same input give bitwise-equal indices and values.
TEST(OpTopk, RepeatedRunsBitwiseEqual) {
  std::vector<float> v = test::random_floats(8 * 3000, 730);
  for (size_t i = 0; i < v.size(); i += 3) v[i] = 0.0f;  // plenty of ties
  const Tensor s = Tensor::from_f32(v, {8, 3000});
  const std::vector<int32_t> bounds = {3000, 2999, 2048, 2047, 1, 0, 1500, 2500};
  const TopkOut a = run_topk(s, bounds, 2048), b = run_topk(s, bounds, 2048);
  EXPECT_EQ(std::memcmp(a.idx.raw(), b.idx.raw(), a.idx.nbytes()), 0);
  EXPECT_EQ(std::memcmp(a.val.raw(), b.val.raw(), a.val.nbytes()), 0);
  for (int64_t r = 0; r < 8; ++r) expect_row(a, s, r, bounds[size_t(r)], 2048, "repeat");
}

// Guard regions: indices and values are views inside guard-filled buffers; padding slots (-1,
// -inf) are written, nothing outside is.
TEST(OpTopk, GuardRegion) {
  const int64_t rows = 3;
  const int k = 12;
  const Tensor s = test::rand_tensor({rows, 20}, 740);
  const std::vector<int32_t> bounds = {20, 5, 0};
  Tensor ibuf = test::guard_filled({rows * k + 14}, DType::I32);
  Tensor vbuf = test::guard_filled({rows * k + 14}, DType::F32);
  Tensor idx = test::contiguous_view_in(ibuf, {rows, k}, 7);
  Tensor val = test::contiguous_view_in(vbuf, {rows, k}, 7);
  ops::topk(s, Tensor::from_i32(bounds, {rows}), k, idx, &val);
  test::expect_guard_intact(ibuf, idx, "topk indices");
  test::expect_guard_intact(vbuf, val, "topk values");
  const TopkOut o{idx, val};
  for (int64_t r = 0; r < rows; ++r) expect_row(o, s, r, bounds[size_t(r)], k, "guarded");
}

// Without a values tensor (nullptr or undefined) the indices are the same.
TEST(OpTopk, ValuesAreOptional) {
  const Tensor s = test::rand_tensor({2, 30}, 750);
  const TopkOut full = run_topk(s, {30, 9}, 10);
  Tensor idx = Tensor::empty({2, 10}, DType::I32), idx2 = Tensor::empty({2, 10}, DType::I32);
  Tensor undefined;
  ops::topk(s, Tensor::from_i32({30, 9}, {2}), 10, idx, nullptr);
  ops::topk(s, Tensor::from_i32({30, 9}, {2}), 10, idx2, &undefined);
  EXPECT_EQ(std::memcmp(idx.raw(), full.idx.raw(), idx.nbytes()), 0);
  EXPECT_EQ(std::memcmp(idx2.raw(), full.idx.raw(), idx.nbytes()), 0);
}

// A bound past the row length or a negative k is an error naming the value.
TEST(OpTopk, BadArgumentsThrow) {
  const Tensor s = test::rand_tensor({1, 8}, 760);
  Tensor idx = Tensor::empty({1, 4}, DType::I32);
  test::expect_error([&] { ops::topk(s, Tensor::from_i32({9}, {1}), 4, idx, nullptr); }, {"9"});
  Tensor idx0 = Tensor::empty({1, 0}, DType::I32);
  test::expect_error([&] { ops::topk(s, Tensor::from_i32({8}, {1}), -2, idx0, nullptr); }, {"-2"});
}

}  // namespace
}  // namespace dsi
