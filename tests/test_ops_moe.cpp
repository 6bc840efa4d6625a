// Op tests, MoE: noaux_tc routing (sigmoid scores, correction bias for selection only, grouped
// selection, tie order, weight normalisation) on hand-built cases and against a float64 reference;
// moe_experts and the dense mlp against float64 SwiGLU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "ops/elementwise.h"
#include "ops/moe.h"
#include "test_ops_common.h"
#include "test_util.h"
#include "tolerances.h"

namespace dsi {
namespace {

using test::to_f64;

// Logit whose sigmoid is p.
float logit_of(double p) { return float(std::log(p / (1.0 - p))); }

struct Route {
  std::vector<int32_t> ids;    // [n, k], best first
  std::vector<double> w;       // [n, k]
  double margin = test::kInf;  // smallest gap at a selection boundary (expert or group level)
};

// Float64 noaux_tc routing of one token, written from dsa-reference.md section 2: s =
// sigmoid(logit), b = s + bias; with groups, a group scores the sum of its two largest b and only
// the topk_group best groups (score desc, group id asc) stay eligible; pick k eligible experts by
// (b desc, id asc); weights s / sum(s) (norm_topk_prob) * routed_scaling_factor.
Route ref_route_token(const float* logits, const float* bias, int64_t E, const RouterParams& p) {
  std::vector<double> s(static_cast<size_t>(E)), b(static_cast<size_t>(E));
  for (int64_t i = 0; i < E; ++i) {
    s[size_t(i)] = 1.0 / (1.0 + std::exp(-double(logits[i])));
    b[size_t(i)] = s[size_t(i)] + bias[i];
  }
  Route r;
  std::vector<bool> eligible(size_t(E), true);
  if (p.n_group > 1) {
    const int64_t per = E / p.n_group;
    std::vector<double> g(size_t(p.n_group));
    for (int gi = 0; gi < p.n_group; ++gi) {
      std::vector<double> m(b.begin() + gi * per, b.begin() + (gi + 1) * per);
      std::sort(m.rbegin(), m.rend());
      g[size_t(gi)] = m[0] + m[1];
    }
    std::vector<int> order(size_t(p.n_group));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int x, int y) { return g[size_t(x)] > g[size_t(y)]; });
    if (p.topk_group < p.n_group)
      r.margin =
          g[size_t(order[size_t(p.topk_group - 1)])] - g[size_t(order[size_t(p.topk_group)])];
    for (int j = p.topk_group; j < p.n_group; ++j)
      for (int64_t i = 0; i < per; ++i) eligible[size_t(order[size_t(j)] * per + i)] = false;
  }
  std::vector<int32_t> cand;
  for (int64_t i = 0; i < E; ++i)
    if (eligible[size_t(i)]) cand.push_back(int32_t(i));
  std::stable_sort(cand.begin(), cand.end(),
                   [&](int32_t x, int32_t y) { return b[size_t(x)] > b[size_t(y)]; });
  const size_t k = size_t(p.n_experts_active);
  if (cand.size() > k) r.margin = std::min(r.margin, b[size_t(cand[k - 1])] - b[size_t(cand[k])]);
  double sum = 0;
  for (size_t j = 0; j < k; ++j) sum += s[size_t(cand[j])];
  for (size_t j = 0; j < k; ++j) {
    r.ids.push_back(cand[j]);
    r.w.push_back(s[size_t(cand[j])] / (p.norm_topk_prob ? sum : 1.0) * p.routed_scaling_factor);
  }
  return r;
}

struct RouteOut {
  Tensor ids, w;
};
RouteOut run_route(const Tensor& logits, const Tensor& bias, const RouterParams& p) {
  const int64_t n = logits.dim(0);
  RouteOut o{Tensor::empty({n, p.n_experts_active}, DType::I32),
             Tensor::empty({n, p.n_experts_active}, DType::F32)};
  ops::moe_route(logits, bias, p, o.ids, o.w);
  return o;
}

// Routes one token given its sigmoid scores and compares ids (exactly, in order) and weights with
// the expected values.
void expect_route(const std::vector<double>& scores, const std::vector<float>& bias,
                  const RouterParams& p, const std::vector<int32_t>& want_ids,
                  const std::string& what) {
  std::vector<float> logits;
  for (double sc : scores) logits.push_back(logit_of(sc));
  const int64_t E = int64_t(scores.size());
  const RouteOut o = run_route(Tensor::from_f32(logits, {1, E}), Tensor::from_f32(bias, {E}), p);
  const int k = p.n_experts_active;
  double sum = 0;
  for (int32_t id : want_ids) sum += 1.0 / (1.0 + std::exp(-double(logits[size_t(id)])));
  std::vector<double> want_w;
  for (int j = 0; j < k; ++j) {
    EXPECT_EQ(o.ids.i32()[j], want_ids[size_t(j)]) << what << " slot " << j;
    const double sj = 1.0 / (1.0 + std::exp(-double(logits[size_t(want_ids[size_t(j)])])));
    want_w.push_back(sj / (p.norm_topk_prob ? sum : 1.0) * p.routed_scaling_factor);
  }
  test::expect_elementwise_near(o.w, want_w, what + " weights");
}

// Grouped selection: expert 0 is the best overall (0.97) but its group's top-2 sum (1.02) loses to
// groups 1 (1.18) and 2 (1.11), so it must not be picked; without groups it would be.
TEST(OpMoe, RouteGroupedSelectionDropsBestExpertOfLosingGroup) {
  const std::vector<double> s = {0.97, 0.05, 0.05, 0.05, 0.60, 0.58, 0.10, 0.10,
                                 0.56, 0.55, 0.54, 0.10, 0.30, 0.30, 0.30, 0.30};
  const std::vector<float> zero(16, 0.0f);
  RouterParams p;
  p.n_experts_active = 4;
  p.n_group = 4;
  p.topk_group = 2;
  p.routed_scaling_factor = 2.5f;
  expect_route(s, zero, p, {4, 5, 8, 9}, "grouped");
  p.n_group = 1;
  p.topk_group = 1;
  expect_route(s, zero, p, {0, 4, 5, 8}, "ungrouped");
}

// The correction bias changes which experts are picked but not their weights: expert 3 (s = 0.2)
// is lifted to b = 0.85 and picked; its weight is 0.2 / (0.9 + 0.2), not based on 0.85.
TEST(OpMoe, RouteBiasSelectsButDoesNotWeigh) {
  const std::vector<double> s = {0.9, 0.8, 0.7, 0.2, 0.1, 0.3, 0.4, 0.05};
  std::vector<float> bias(8, 0.0f);
  RouterParams p;
  p.n_experts_active = 2;
  p.routed_scaling_factor = 1.5f;
  expect_route(s, bias, p, {0, 1}, "no bias");
  bias[3] = 0.65f;
  expect_route(s, bias, p, {0, 3}, "bias on expert 3");
  // Uniform bias shifts every b alike: the selection and the weights are unchanged.
  expect_route(s, std::vector<float>(8, -0.4f), p, {0, 1}, "uniform bias");
}

// norm_topk_prob = false: weights are the raw sigmoid scores times routed_scaling_factor.
TEST(OpMoe, RouteWithoutNormalisation) {
  const std::vector<double> s = {0.2, 0.9, 0.6, 0.7};
  RouterParams p;
  p.n_experts_active = 3;
  p.norm_topk_prob = false;
  p.routed_scaling_factor = 2.0f;
  expect_route(s, std::vector<float>(4, 0.0f), p, {1, 3, 2}, "unnormalised");
}

// Exact ties: equal scores pick the lower expert id, equal group scores keep the lower group id.
// Groups 1, 2, 3 tie (0.6 + 0.6) and only two are kept: 1 and 2, so experts 2, 3, 4 (not 6).
TEST(OpMoe, RouteTiesPreferLowerIds) {
  RouterParams p;
  p.n_experts_active = 3;
  p.n_group = 4;
  p.topk_group = 2;
  expect_route({0.1, 0.1, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6}, std::vector<float>(8, 0.0f), p, {2, 3, 4},
               "tied groups");
  expect_route(std::vector<double>(8, 0.5), std::vector<float>(8, 0.0f), p, {0, 1, 2}, "all equal");
  p.n_group = 1;
  p.topk_group = 1;
  expect_route({0.3, 0.7, 0.5, 0.7, 0.7, 0.1, 0.5, 0.2}, std::vector<float>(8, 0.0f), p, {1, 3, 4},
               "tied experts");
}

// Random logits and biases over many tokens: the whole routing equals the float64 reference (ids
// exact and in order, weights element-wise) with groups and normalisation, and without.
TEST(OpMoe, RouteRandomAgainstFloat64) {
  const int64_t n = 64, E = 64;
  struct Cfg {
    int k, n_group, topk_group;
    bool norm;
    float rsf;
  };
  for (const Cfg& c :
       {Cfg{6, 8, 3, true, 2.5f}, Cfg{8, 1, 1, false, 1.0f}, Cfg{4, 4, 2, true, 1.0f}}) {
    RouterParams p;
    p.n_experts_active = c.k;
    p.n_group = c.n_group;
    p.topk_group = c.topk_group;
    p.norm_topk_prob = c.norm;
    p.routed_scaling_factor = c.rsf;
    const Tensor logits = test::rand_tensor({n, E}, 900 + uint64_t(c.k), 4.0f);
    const Tensor bias = test::rand_tensor({E}, 910 + uint64_t(c.k), 0.1f);
    const RouteOut o = run_route(logits, bias, p);
    std::vector<double> want_w;
    for (int64_t t = 0; t < n; ++t) {
      const Route r = ref_route_token(logits.f32() + t * E, bias.f32(), E, p);
      ASSERT_GT(r.margin, 1e-5) << "token " << t
                                << ": near-tie makes the fp32 comparison ambiguous";
      for (int j = 0; j < c.k; ++j)
        EXPECT_EQ(o.ids.i32()[t * c.k + j], r.ids[size_t(j)])
            << "k=" << c.k << " token " << t << " slot " << j;
      want_w.insert(want_w.end(), r.w.begin(), r.w.end());
    }
    test::expect_elementwise_near(o.w, want_w, "route weights k=" + std::to_string(c.k));
  }
}

// ---- Experts ----

// Float64 values of a weight (F32 or BF16), row-major [out, in].
std::vector<double> weight_f64(const LinearWeight& w) {
  if (w.weight.dtype() == DType::F32) return to_f64(w.weight);
  std::vector<double> v(size_t(w.weight.numel()));
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = test::ref_bf16(static_cast<const uint16_t*>(w.weight.raw())[i]);
  return v;
}

// Float64 SwiGLU: down(silu(gate x) * up x) for one row x.
std::vector<double> ref_mlp_row(const std::vector<double>& x, const MlpWeights& m) {
  const int64_t inter = m.gate_proj.out_features(), hidden = m.gate_proj.in_features();
  const std::vector<double> g = weight_f64(m.gate_proj), u = weight_f64(m.up_proj),
                            d = weight_f64(m.down_proj);
  std::vector<double> h(static_cast<size_t>(inter)), y(size_t(hidden), 0.0);
  for (int64_t i = 0; i < inter; ++i) {
    double a = 0, b = 0;
    for (int64_t j = 0; j < hidden; ++j) {
      a += g[size_t(i * hidden + j)] * x[size_t(j)];
      b += u[size_t(i * hidden + j)] * x[size_t(j)];
    }
    h[size_t(i)] = a / (1.0 + std::exp(-a)) * b;
  }
  for (int64_t o = 0; o < hidden; ++o)
    for (int64_t i = 0; i < inter; ++i) y[size_t(o)] += d[size_t(o * inter + i)] * h[size_t(i)];
  return y;
}

MlpWeights make_mlp(int64_t hidden, int64_t inter, uint64_t seed, bool bf16_down = false) {
  MlpWeights m;
  m.gate_proj.weight = test::rand_tensor({inter, hidden}, seed, 0.5f);
  m.up_proj.weight = test::rand_tensor({inter, hidden}, seed + 1, 0.5f);
  m.down_proj.weight = test::rand_tensor({hidden, inter}, seed + 2, 0.5f);
  if (bf16_down) {
    Tensor b = Tensor::empty({hidden, inter}, DType::BF16);
    for (int64_t i = 0; i < hidden * inter; ++i) {
      uint32_t u;
      std::memcpy(&u, m.down_proj.weight.f32() + i, 4);
      static_cast<uint16_t*>(b.raw())[i] = uint16_t(u >> 16);
    }
    m.down_proj.weight = b;
  }
  return m;
}

// Dense SwiGLU MLP vs float64.
TEST(OpMoe, MlpMatchesFloat64) {
  const MlpWeights m = make_mlp(24, 40, 920);
  const Tensor x = test::rand_tensor({5, 24}, 925, 2.0f);
  Tensor out = Tensor::empty({5, 24}, DType::F32);
  ops::mlp(x, m, out);
  std::vector<double> want;
  const std::vector<double> xv = to_f64(x);
  for (int64_t t = 0; t < 5; ++t) {
    const std::vector<double> y = ref_mlp_row({xv.begin() + t * 24, xv.begin() + (t + 1) * 24}, m);
    want.insert(want.end(), y.begin(), y.end());
  }
  test::expect_reduction_near(out, want, {}, "mlp");
}

// moe_experts = sum_k w[t, k] * Expert_{ids[t, k]}(x[t]): several tokens share experts, one token
// lists the same expert twice, expert 3 is unused, expert 4 has a bf16 down_proj; the output is a
// view inside a guard buffer. Then the same with a shared expert.
TEST(OpMoe, ExpertsMatchFloat64) {
  const int64_t hidden = 16, inter = 12, n = 6, k = 2;
  std::vector<MlpWeights> experts;
  for (int e = 0; e < 5; ++e)
    experts.push_back(make_mlp(hidden, inter, 930 + 10 * uint64_t(e), e == 4));
  const std::vector<int32_t> ids = {1, 0, 1, 2, 2, 2, 4, 1, 0, 4, 1, 0};
  const std::vector<float> w = {0.7f, 0.3f, 1.2f, -0.4f, 0.5f, 0.25f,
                                0.9f, 0.1f, 0.6f, 0.6f,  2.0f, 0.0f};
  const Tensor x = test::rand_tensor({n, hidden}, 990, 2.0f);
  Tensor buf = test::guard_filled({n * hidden + 8}, DType::F32);
  Tensor out = test::contiguous_view_in(buf, {n, hidden}, 4);
  ops::moe_experts(x, Tensor::from_i32(ids, {n, k}), Tensor::from_f32(w, {n, k}), experts, 0,
                   int(experts.size()), out);
  test::expect_guard_intact(buf, out, "moe_experts");
  std::vector<double> want(size_t(n * hidden), 0.0);
  const std::vector<double> xv = to_f64(x);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const std::vector<double> y =
          ref_mlp_row({xv.begin() + t * hidden, xv.begin() + (t + 1) * hidden},
                      experts[size_t(ids[size_t(t * k + j)])]);
      for (int64_t c = 0; c < hidden; ++c)
        want[size_t(t * hidden + c)] += w[size_t(t * k + j)] * y[size_t(c)];
    }
  test::expect_reduction_near(out, want, {}, "moe_experts");

  // With a shared expert of another width: its output is added to every token's.
  const MlpWeights shared = make_mlp(hidden, 20, 999);
  ops::moe_experts(x, Tensor::from_i32(ids, {n, k}), Tensor::from_f32(w, {n, k}), experts, 0,
                   int(experts.size()), out, &shared);
  test::expect_guard_intact(buf, out, "moe_experts with a shared expert");
  for (int64_t t = 0; t < n; ++t) {
    const std::vector<double> y =
        ref_mlp_row({xv.begin() + t * hidden, xv.begin() + (t + 1) * hidden}, shared);
    for (int64_t c = 0; c < hidden; ++c) want[size_t(t * hidden + c)] += y[size_t(c)];
  }
  test::expect_reduction_near(out, want, {}, "moe_experts with a shared expert");
}

// An expert id outside the expert list is an error naming it.
TEST(OpMoe, ExpertIdOutOfRangeThrows) {
  std::vector<MlpWeights> experts = {make_mlp(8, 4, 995), make_mlp(8, 4, 996)};
  Tensor out = Tensor::empty({1, 8}, DType::F32);
  test::expect_error(
      [&] {
        ops::moe_experts(test::rand_tensor({1, 8}, 997), Tensor::from_i32({1, 7}, {1, 2}),
                         Tensor::from_f32({0.5f, 0.5f}, {1, 2}), experts, 0, 2, out);
      },
      {"7"});
}

// Expert parallelism: two ranks holding experts [0, 2) and [2, 4) produce partial outputs whose
// sum is the single-rank output (ids outside a rank's range contribute nothing there).
TEST(OpMoe, ExpertShardsSumToTheWhole) {
  std::vector<MlpWeights> experts;
  for (int e = 0; e < 4; ++e) experts.push_back(make_mlp(8, 4, 1000 + uint64_t(e)));
  const Tensor x = test::rand_tensor({3, 8}, 1010);
  const Tensor ids = Tensor::from_i32({0, 3, 2, 1, 3, 2}, {3, 2});
  const Tensor w = Tensor::from_f32({0.7f, 0.3f, 0.5f, 0.5f, 0.9f, 0.1f}, {3, 2});
  Tensor whole = Tensor::empty({3, 8}, DType::F32), a = Tensor::empty({3, 8}, DType::F32),
         b = Tensor::empty({3, 8}, DType::F32);
  ops::moe_experts(x, ids, w, experts, 0, 4, whole);
  ops::moe_experts(x, ids, w, {experts[0], experts[1]}, 0, 4, a);
  ops::moe_experts(x, ids, w, {experts[2], experts[3]}, 2, 4, b);
  ops::add_inplace(a, b);
  EXPECT_LE(test::nmse(a, whole), tol::kSelfConsistencyNmse);
  Tensor none = Tensor::empty({3, 8}, DType::F32);
  ops::moe_experts(x, Tensor::from_i32({0, 1, 0, 1, 1, 0}, {3, 2}), w, {experts[2], experts[3]}, 2,
                   4, none);
  for (int64_t i = 0; i < none.numel(); ++i) EXPECT_EQ(none.f32()[i], 0.0f);
}

// moe = moe_route, then moe_experts with what it picked: the routing's ids and weights against the
// float64 routing, the output against float64 experts with those picks; logits for another number
// of tokens than x has are refused.
TEST(OpMoe, RoutedFromLogits) {
  const int64_t hidden = 16, inter = 12, n = 3, E = 8;
  std::vector<MlpWeights> experts;
  for (int e = 0; e < E; ++e) experts.push_back(make_mlp(hidden, inter, 1100 + 10 * uint64_t(e)));
  const MlpWeights shared = make_mlp(hidden, 20, 1190);
  RouterParams p;
  p.n_experts_active = 3;
  p.n_group = 4;
  p.topk_group = 2;
  p.routed_scaling_factor = 1.5f;
  const Tensor logits = test::rand_tensor({n, E}, 1191, 3.0f), bias = test::rand_tensor({E}, 1192, 0.1f);
  const Tensor x = test::rand_tensor({n, hidden}, 1193, 2.0f);
  Tensor ids = Tensor::empty({n, 3}, DType::I32), w = Tensor::empty({n, 3}, DType::F32);
  Tensor out = Tensor::empty({n, hidden}, DType::F32);
  ops::moe(x, logits, bias, p, experts, 0, int(E), ids, w, out, &shared);
  std::vector<double> want(size_t(n * hidden), 0.0);
  const std::vector<double> xv = to_f64(x);
  for (int64_t t = 0; t < n; ++t) {
    const Route r = ref_route_token(logits.f32() + t * E, bias.f32(), E, p);
    ASSERT_GT(r.margin, 1e-5) << "token " << t << ": a selection this close may round either way";
    const std::vector<double> row(xv.begin() + t * hidden, xv.begin() + (t + 1) * hidden);
    const std::vector<double> s = ref_mlp_row(row, shared);
    for (int64_t c = 0; c < hidden; ++c) want[size_t(t * hidden + c)] = s[size_t(c)];
    for (int64_t j = 0; j < 3; ++j) {
      EXPECT_EQ(ids.i32()[t * 3 + j], r.ids[size_t(j)]) << "token " << t << " slot " << j;
      EXPECT_NEAR(w.f32()[t * 3 + j], r.w[size_t(j)], 1e-6) << "token " << t << " slot " << j;
      const std::vector<double> y = ref_mlp_row(row, experts[size_t(r.ids[size_t(j)])]);
      for (int64_t c = 0; c < hidden; ++c) want[size_t(t * hidden + c)] += r.w[size_t(j)] * y[size_t(c)];
    }
  }
  test::expect_reduction_near(out, want, {}, "moe");
  test::expect_error([&] { ops::moe(x, test::rand_tensor({2, E}, 1), bias, p, experts, 0, int(E), ids, w, out); },
                     {"router logits"});
}

}  // namespace
}  // namespace dsi
