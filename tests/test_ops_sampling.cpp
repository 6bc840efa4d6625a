// Op tests, sampling: argmax tie order, greedy limits of sample(), the exact inverse-CDF mapping of
// u over the nucleus, a chi-square goodness-of-fit test of temperature + top-p sampling, and the
// top_k / min_p filters against a written-out reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "ops/sampling.h"
#include "test_ops_common.h"
#include "test_util.h"

namespace dsi {
namespace {

// The nucleus of softmax(logits / T) in float64: tokens by (probability desc, id asc), the smallest
// prefix whose mass reaches top_p; probabilities renormalised over it.
struct Nucleus {
  std::vector<int32_t> ids;
  std::vector<double> p;    // renormalised, same order as ids
  double mass_before_last;  // mass (of the full distribution) without the last nucleus token
  double mass;              // mass of the nucleus
};
Nucleus ref_nucleus(const std::vector<float>& logits, double T, double top_p) {
  const double m = *std::max_element(logits.begin(), logits.end());
  std::vector<double> p;
  for (float l : logits) p.push_back(std::exp((l - m) / T));
  const double total = std::accumulate(p.begin(), p.end(), 0.0);
  for (double& x : p) x /= total;
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return p[size_t(a)] > p[size_t(b)]; });
  Nucleus nu{{}, {}, 0, 0};
  for (int32_t id : order) {
    nu.mass_before_last = nu.mass;
    nu.ids.push_back(id);
    nu.mass += p[size_t(id)];
    if (nu.mass >= top_p) break;
  }
  for (int32_t id : nu.ids) nu.p.push_back(p[size_t(id)] / nu.mass);
  return nu;
}

// The vocabulary of the goodness-of-fit tests, ids deliberately not in probability order.
const std::vector<float> kLogits6 = {-0.4f, 0.8f, -1.0f, 1.0f, 0.0f, 0.5f};

int32_t ref_argmax(const float* l, int64_t v) {
  int32_t best = 0;
  for (int64_t i = 1; i < v; ++i)
    if (l[i] > l[best]) best = int32_t(i);
  return best;
}

// argmax picks the maximum, the lowest id among equal maxima; rows may be strided.
TEST(OpSampling, ArgmaxLowestIdOnTies) {
  const Tensor hand = Tensor::from_f32({1, 5, 5, 2, /**/ 3, 3, 3, 3, /**/ -9, -2, -7, -2}, {3, 4});
  Tensor out = Tensor::empty({3}, DType::I32);
  ops::argmax(hand, out);
  EXPECT_EQ(out.i32()[0], 1);
  EXPECT_EQ(out.i32()[1], 0);
  EXPECT_EQ(out.i32()[2], 1);
  std::vector<float> v = test::random_floats(8 * 1000, 1000);
  for (float& x : v) x = std::round(x * 20.0f);  // many ties at the top
  const Tensor wide = Tensor::from_f32(v, {8, 1000});
  const Tensor rows = wide.narrow(1, 100, 700);
  Tensor out8 = Tensor::empty({8}, DType::I32);
  ops::argmax(rows, out8);
  for (int64_t r = 0; r < 8; ++r)
    EXPECT_EQ(out8.i32()[r], ref_argmax(v.data() + r * 1000 + 100, 700)) << r;
}

// temperature <= 0 is greedy: the argmax (lowest id on ties) whatever u and top_p are.
TEST(OpSampling, TemperatureZeroIsArgmax) {
  std::mt19937_64 rng(1010);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<float> l = test::random_floats(50, 1020 + uint64_t(trial));
    for (float& x : l) x = std::round(x * 5.0f);
    const int32_t want = ref_argmax(l.data(), 50);
    for (float T : {0.0f, -1.0f})
      EXPECT_EQ(ops::sample(Tensor::from_f32(l, {50}), T, 0.9f, test::uniform01(rng)), want)
          << trial;
  }
}

// A tiny top_p keeps only the most likely token: always the argmax, even for u near 1, and the
// lowest id when the top is tied.
TEST(OpSampling, TinyTopPIsArgmax) {
  const Tensor l = Tensor::from_f32(kLogits6, {6});
  const Tensor tied = Tensor::from_f32({0.1f, 2.0f, -1.0f, 2.0f}, {4});
  for (double u : {0.0, 0.3, 0.7, 0.999999}) {
    EXPECT_EQ(ops::sample(l, 0.7f, 1e-6f, u), 3) << u;
    EXPECT_EQ(ops::sample(tied, 1.0f, 1e-6f, u), 1) << u;
  }
}

// u maps to the nucleus by the inverse CDF in (probability desc, id asc) order: just below each
// cumulative boundary gives that token, just above gives the next; u never leaves the nucleus.
TEST(OpSampling, InverseCdfOverNucleus) {
  const Tensor l = Tensor::from_f32(kLogits6, {6});
  for (double top_p : {0.8, 1.0}) {
    const Nucleus nu = ref_nucleus(kLogits6, 0.7, top_p);
    double cum = 0;
    for (size_t j = 0; j < nu.ids.size(); ++j) {
      const double lo = cum;
      cum += nu.p[j];
      EXPECT_EQ(ops::sample(l, 0.7f, float(top_p), lo + 1e-6), nu.ids[j]) << top_p << " " << j;
      if (j + 1 < nu.ids.size()) {
        EXPECT_EQ(ops::sample(l, 0.7f, float(top_p), cum - 1e-6), nu.ids[j]) << top_p << " " << j;
      }
    }
    EXPECT_EQ(ops::sample(l, 0.7f, float(top_p), 1.0 - 1e-12), nu.ids.back()) << top_p;
  }
  // top_p = 1 keeps every token: all six are reachable.
  EXPECT_EQ(ref_nucleus(kLogits6, 0.7, 1.0).ids.size(), 6u);
}

// Chi-square goodness of fit, vocab 6 at temperature 0.7 and top_p 0.8: the nucleus is tokens
// {3, 1, 5} (mass 0.838; {3, 1} alone has 0.655), drawn with the renormalised probabilities.
// 20000 draws from std::mt19937_64 (seed 20250101). Three categories: df = 2, alpha = 0.001,
// critical value chi2_{0.999}(2) = -2 ln(0.001) = 13.816. Tokens outside the nucleus must never be
// drawn.
TEST(OpSampling, ChiSquareTemperatureTopP) {
  const Nucleus nu = ref_nucleus(kLogits6, 0.7, 0.8);
  ASSERT_EQ(nu.ids, (std::vector<int32_t>{3, 1, 5}));
  ASSERT_LT(nu.mass_before_last, 0.8 - 0.05);  // the cut is far from float rounding
  ASSERT_GT(nu.mass, 0.8 + 0.02);
  const Tensor l = Tensor::from_f32(kLogits6, {6});
  std::mt19937_64 rng(20250101);
  const int draws = 20000;
  std::vector<int> count(6, 0);
  for (int i = 0; i < draws; ++i) {
    const int32_t t = ops::sample(l, 0.7f, 0.8f, test::uniform01(rng));
    ASSERT_TRUE(t >= 0 && t < 6) << t;
    ++count[size_t(t)];
  }
  for (int32_t t : {0, 2, 4})
    EXPECT_EQ(count[size_t(t)], 0) << "token " << t << " is outside the nucleus";
  double chi2 = 0;
  for (size_t j = 0; j < nu.ids.size(); ++j) {
    const double expected = draws * nu.p[j];
    chi2 += std::pow(count[size_t(nu.ids[j])] - expected, 2) / expected;
  }
  EXPECT_LT(chi2, 13.816) << "counts " << count[3] << " " << count[1] << " " << count[5];
}

// A grid of u over [0, 1) never yields a token outside the nucleus (top_p 0.5: tokens 3 and 1
// only).
TEST(OpSampling, NeverDrawsOutsideNucleus) {
  const Tensor l = Tensor::from_f32(kLogits6, {6});
  const Nucleus nu = ref_nucleus(kLogits6, 0.7, 0.5);
  ASSERT_EQ(nu.ids, (std::vector<int32_t>{3, 1}));
  std::vector<int> count(6, 0);
  for (int i = 0; i < 10000; ++i) ++count[size_t(ops::sample(l, 0.7f, 0.5f, i / 10000.0))];
  EXPECT_GT(count[3], 0);
  EXPECT_GT(count[1], 0);
  EXPECT_EQ(count[0] + count[2] + count[4] + count[5], 0);
}

// top_p outside (0, 1] is an error naming it.
TEST(OpSampling, BadTopPThrows) {
  const Tensor l = Tensor::from_f32(kLogits6, {6});
  test::expect_error([&] { ops::sample(l, 0.7f, 0.0f, 0.5); }, {"top_p"});
  test::expect_error([&] { ops::sample(l, 0.7f, 1.5f, 0.5); }, {"1.5"});
}

// The filtered distribution in float64 (the op rounds logit - max in float: agreement to ~1e-8),
// written out independently: softmax(logits / T), the
// top_k most likely (0: all; ties by id), the nucleus of top_p of what is left, then the tokens at
// least min_p times as likely as the top one; renormalised. Returns the full vocab vector.
std::vector<double> ref_filtered(const std::vector<float>& logits, double T, int top_k, double top_p,
                                 double min_p) {
  const double m = *std::max_element(logits.begin(), logits.end());
  std::vector<double> p;
  for (float l : logits) p.push_back(std::exp((l - m) / T));
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return p[size_t(a)] > p[size_t(b)]; });
  if (top_k > 0 && size_t(top_k) < order.size()) order.resize(size_t(top_k));
  double total = 0;
  for (int32_t id : order) total += p[size_t(id)];
  std::vector<int32_t> kept;
  double mass = 0;
  for (int32_t id : order) {
    kept.push_back(id);
    mass += p[size_t(id)];
    if (mass >= top_p * total) break;
  }
  const double top = p[size_t(kept[0])];
  std::vector<double> out(logits.size(), 0.0);
  double z = 0;
  for (int32_t id : kept)
    if (p[size_t(id)] >= min_p * top) z += p[size_t(id)];
  for (int32_t id : kept)
    if (p[size_t(id)] >= min_p * top) out[size_t(id)] = p[size_t(id)] / z;
  return out;
}

// top_k and min_p: the distribution equals the written-out reference over a grid of settings
// (alone and together with top_p), top_k = 1 is greedy at any temperature, and tokens outside the
// kept set are never drawn.
TEST(OpSampling, TopKAndMinP) {
  std::mt19937_64 rng(4242);
  std::vector<float> v(40);
  for (float& x : v) x = float(std::normal_distribution<double>(0.0, 2.0)(rng));
  v[7] = v[11];  // a tie, broken by id
  const Tensor l = Tensor::from_f32(v, {40});
  for (int top_k : {0, 1, 2, 5, 40, 100})
    for (double top_p : {1.0, 0.6})
      for (double min_p : {0.0, 0.05, 0.5}) {
        SamplingParams sp;
        sp.temperature = 0.8f;
        sp.top_k = top_k;
        sp.top_p = float(top_p);
        sp.min_p = float(min_p);
        const std::vector<double> got = ops::token_distribution(l, sp);
        const std::vector<double> want = ref_filtered(v, double(sp.temperature), top_k, double(sp.top_p),
                                                      double(sp.min_p));
        ASSERT_EQ(got.size(), want.size());
        for (size_t i = 0; i < got.size(); ++i) {
          EXPECT_EQ(got[i] == 0.0, want[i] == 0.0) << "k " << top_k << " p " << top_p << " min_p " << min_p << " id " << i;
          EXPECT_NEAR(got[i], want[i], 1e-7) << "k " << top_k << " p " << top_p << " min_p " << min_p << " id " << i;
        }
        for (int i = 0; i < 200; ++i) {
          const int32_t t = ops::sample(l, sp, (i + 0.5) / 200.0);
          EXPECT_GT(want[size_t(t)], 0.0) << "drew token " << t << " outside the kept set";
        }
      }
  SamplingParams one;
  one.temperature = 1.7f;
  one.top_k = 1;
  for (double u : {0.0, 0.3, 0.999999})
    EXPECT_EQ(ops::sample(l, one, u), ref_argmax(v.data(), 40)) << u;
}

// logit_bias is added to the logits before everything else: -100 removes the argmax from greedy and
// sampled choices, +100 forces a token, and the distribution is softmax((logits + bias) / T).
TEST(OpSampling, LogitBias) {
  std::vector<float> v = {0.5f, 2.0f, -1.0f, 1.5f, 0.0f, 1.9f};
  const Tensor l = Tensor::from_f32(v, {6});
  SamplingParams greedy;
  EXPECT_EQ(ops::sample(l, greedy, 0.0), 1);
  greedy.logit_bias = {{1, -100.0f}};
  EXPECT_EQ(ops::sample(l, greedy, 0.0), 5);
  greedy.logit_bias = {{2, 100.0f}};
  EXPECT_EQ(ops::sample(l, greedy, 0.0), 2);
  SamplingParams sp;
  sp.temperature = 0.7f;
  sp.logit_bias = {{1, -100.0f}, {4, 0.75f}};
  std::vector<float> biased = v;
  biased[1] -= 100.0f;
  biased[4] += 0.75f;
  const std::vector<double> got = ops::token_distribution(l, sp);
  const std::vector<double> want = ref_filtered(biased, 0.7, 0, 1.0, 0.0);
  for (size_t i = 0; i < v.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-7) << i;
  EXPECT_LT(got[1], 1e-40);
  sp.logit_bias = {{6, 1.0f}};
  test::expect_error([&] { ops::sample(l, sp, 0.5); }, {"logit_bias", "6"});
}

// Penalties, against their formulas written out per token: the prompt holds 1 (logit 2.0) and 2
// (logit -1.0); 3 was generated twice and 5 once before, and a pending draft adds 5 again.
// repetition r: 1 -> 2.0 / r, 2 -> -1.0 * r, 3 -> 1.5 / r, 5 -> 1.9 / r; then frequency f and
// presence q: 3 -= 2 f + q, 5 -= 2 f + q. Tokens 0 and 4 keep their logits.
TEST(OpSampling, PenaltiesFollowTheirFormulas) {
  const std::vector<float> v = {0.5f, 2.0f, -1.0f, 1.5f, 0.0f, 1.9f};
  const Tensor l = Tensor::from_f32(v, {6});
  const ops::TokenHistory h({1, 2, 1, 3, 3, 5}, 3);
  EXPECT_EQ(h.prompt.size(), 2u);
  EXPECT_EQ(h.generated.at(3), 2);
  SamplingParams sp;
  sp.repetition_penalty = 1.25f;
  sp.frequency_penalty = 0.5f;
  sp.presence_penalty = -0.25f;
  const std::vector<int32_t> pending = {5};
  const Tensor got = ops::penalized(l, sp, h, pending);
  const float r = 1.25f, f = 0.5f, q = -0.25f;
  const std::vector<float> want = {0.5f, 2.0f / r, -1.0f * r, 1.5f / r - (2 * f + q), 0.0f,
                                   1.9f / r - (2 * f + q)};
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got.f32()[i], want[i], 1e-6) << i;
  EXPECT_EQ(l.f32()[3], 1.5f) << "the input logits are left as they are";
  // Without penalties the logits come back untouched (the same tensor).
  EXPECT_EQ(ops::penalized(l, SamplingParams{}, h).raw(), l.raw());
  // Out of range: an error naming the penalty; a history token outside the vocabulary too.
  sp.repetition_penalty = 0.0f;
  test::expect_error([&] { ops::penalized(l, sp, h); }, {"repetition_penalty"});
  sp.repetition_penalty = 1.0f;
  sp.frequency_penalty = 3.0f;
  test::expect_error([&] { ops::penalized(l, sp, h); }, {"frequency_penalty", "[-2, 2]"});
  sp.frequency_penalty = 0.5f;
  const ops::TokenHistory outside({1, 9}, 1);
  test::expect_error([&] { ops::penalized(l, sp, outside); }, {"9", "vocabulary"});
}

// top_k below 0 or min_p outside [0, 1] is an error naming it.
TEST(OpSampling, BadTopKOrMinPThrows) {
  const Tensor l = Tensor::from_f32(kLogits6, {6});
  SamplingParams sp;
  sp.temperature = 0.7f;
  sp.top_k = -1;
  test::expect_error([&] { ops::sample(l, sp, 0.5); }, {"top_k", "-1"});
  sp.top_k = 0;
  sp.min_p = 1.5f;
  test::expect_error([&] { ops::sample(l, sp, 0.5); }, {"min_p", "1.5"});
}

}  // namespace
}  // namespace dsi
