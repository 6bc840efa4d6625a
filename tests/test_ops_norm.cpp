// Op tests, normalisation family: rms_norm and layer_norm against float64 formulas, in place,
// on strided rows, d = 1, a zero row, and inside a NaN guard buffer.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "ops/norm.h"
#include "test_ops_common.h"
#include "test_util.h"

namespace dsi {
namespace {

using test::expect_elementwise_near;
using test::to_f64;

// out[i, j] = x[i, j] / sqrt(mean_j x[i, j]^2 + eps) * w[j], in float64.
std::vector<double> ref_rms_norm(const Tensor& x, const Tensor& w, double eps) {
  const std::vector<double> xv = to_f64(x), wv = to_f64(w);
  const int64_t n = x.dim(0), d = x.dim(1);
  std::vector<double> out(xv.size());
  for (int64_t i = 0; i < n; ++i) {
    double ss = 0;
    for (int64_t j = 0; j < d; ++j) ss += xv[size_t(i * d + j)] * xv[size_t(i * d + j)];
    const double inv = 1.0 / std::sqrt(ss / double(d) + eps);
    for (int64_t j = 0; j < d; ++j)
      out[size_t(i * d + j)] = xv[size_t(i * d + j)] * inv * wv[size_t(j)];
  }
  return out;
}

// out[i, j] = (x[i, j] - mean) / sqrt(biased var + eps) * w[j] + b[j], in float64.
std::vector<double> ref_layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps) {
  const std::vector<double> xv = to_f64(x), wv = to_f64(w), bv = to_f64(b);
  const int64_t n = x.dim(0), d = x.dim(1);
  std::vector<double> out(xv.size());
  for (int64_t i = 0; i < n; ++i) {
    double mean = 0, var = 0;
    for (int64_t j = 0; j < d; ++j) mean += xv[size_t(i * d + j)];
    mean /= double(d);
    for (int64_t j = 0; j < d; ++j) var += std::pow(xv[size_t(i * d + j)] - mean, 2);
    var /= double(d);
    for (int64_t j = 0; j < d; ++j)
      out[size_t(i * d + j)] =
          (xv[size_t(i * d + j)] - mean) / std::sqrt(var + eps) * wv[size_t(j)] + bv[size_t(j)];
  }
  return out;
}

// RMSNorm of random rows (several widths) matches float64.
TEST(OpNorm, RmsNormMatchesFloat64) {
  for (int64_t d : {7, 64, 512}) {
    const Tensor x = test::rand_tensor({5, d}, 200 + uint64_t(d), 3.0f);
    const Tensor w = test::rand_tensor({d}, 300 + uint64_t(d), 2.0f);
    Tensor out = Tensor::empty({5, d}, DType::F32);
    ops::rms_norm(x, w, 1e-6f, out);
    expect_elementwise_near(out, ref_rms_norm(x, w, 1e-6), "rms_norm d=" + std::to_string(d));
  }
}

// eps enters under the square root: with tiny inputs (mean square ~1e-6) eps = 1e-5 dominates.
TEST(OpNorm, RmsNormEpsMatters) {
  const Tensor x = test::rand_tensor({3, 32}, 210, 1e-3f);
  const Tensor w = test::rand_tensor({32}, 211);
  Tensor out = Tensor::empty({3, 32}, DType::F32);
  ops::rms_norm(x, w, 1e-5f, out);
  expect_elementwise_near(out, ref_rms_norm(x, w, 1e-5), "rms_norm eps 1e-5");
  Tensor out0 = Tensor::empty({3, 32}, DType::F32);
  ops::rms_norm(x, w, 0.0f, out0);
  EXPECT_GT(test::max_abs_diff(out, out0), 0.1);
}

// out == x (in place) gives the same values as a separate output.
TEST(OpNorm, RmsNormInPlace) {
  Tensor x = test::rand_tensor({4, 48}, 220, 2.0f);
  const Tensor w = test::rand_tensor({48}, 221);
  const std::vector<double> want = ref_rms_norm(x, w, 1e-6);
  ops::rms_norm(x, w, 1e-6f, x);
  expect_elementwise_near(x, want, "rms_norm in place");
}

// Strided input rows (a column range of a wider tensor) and a strided output view.
TEST(OpNorm, RmsNormStridedRows) {
  const Tensor wide = test::rand_tensor({6, 100}, 230, 2.0f);
  const Tensor x = wide.narrow(1, 30, 40);
  const Tensor w = test::rand_tensor({40}, 231);
  Tensor out_wide = Tensor::zeros({6, 50}, DType::F32);
  Tensor out = out_wide.narrow(1, 5, 40);
  ops::rms_norm(x, w, 1e-6f, out);
  expect_elementwise_near(out, ref_rms_norm(x, w, 1e-6), "rms_norm strided");
}

// d = 1: x / sqrt(x^2 + eps) * w, i.e. about sign(x) * w.
TEST(OpNorm, RmsNormSingleElementRows) {
  const Tensor x = Tensor::from_f32({0.5f, -3.0f, 1e-4f}, {3, 1});
  const Tensor w = Tensor::from_f32({2.0f}, {1});
  Tensor out = Tensor::empty({3, 1}, DType::F32);
  ops::rms_norm(x, w, 1e-6f, out);
  expect_elementwise_near(out, ref_rms_norm(x, w, 1e-6), "rms_norm d=1");
  EXPECT_NEAR(out.f32()[1], -2.0, 1e-5);
}

// A row of zeros with eps > 0 gives exactly zeros (no NaN), its neighbours are unaffected.
TEST(OpNorm, RmsNormZeroRow) {
  std::vector<float> v = test::random_floats(3 * 16, 240);
  std::fill(v.begin() + 16, v.begin() + 32, 0.0f);
  const Tensor x = Tensor::from_f32(v, {3, 16});
  const Tensor w = test::rand_tensor({16}, 241);
  Tensor out = Tensor::empty({3, 16}, DType::F32);
  ops::rms_norm(x, w, 1e-6f, out);
  for (int j = 0; j < 16; ++j) EXPECT_EQ(out.f32()[16 + j], 0.0f) << j;
  expect_elementwise_near(out, ref_rms_norm(x, w, 1e-6), "rms_norm zero row");
}

// Guard region: a strided output view inside a NaN-filled buffer; nothing outside is written and
// every output element is.
TEST(OpNorm, RmsNormGuardRegion) {
  const Tensor x = test::rand_tensor({5, 24}, 250);
  const Tensor w = test::rand_tensor({24}, 251);
  Tensor buf = test::guard_filled({7, 40}, DType::F32);
  Tensor out = buf.narrow(0, 1, 5).narrow(1, 9, 24);
  ops::rms_norm(x, w, 1e-6f, out);
  test::expect_guard_intact(buf, out, "rms_norm");
  expect_elementwise_near(out, ref_rms_norm(x, w, 1e-6), "rms_norm guarded");
}

// LayerNorm (biased variance, weight and bias) matches float64 on rows with a non-zero mean.
TEST(OpNorm, LayerNormMatchesFloat64) {
  for (int64_t d : {5, 128}) {
    std::vector<float> v = test::random_floats(size_t(4 * d), 260 + uint64_t(d));
    for (size_t i = 0; i < v.size(); ++i)
      v[i] = v[i] * 2.0f + float(i / size_t(d));  // row means 0..3
    const Tensor x = Tensor::from_f32(v, {4, d});
    const Tensor w = test::rand_tensor({d}, 270 + uint64_t(d), 2.0f);
    const Tensor b = test::rand_tensor({d}, 280 + uint64_t(d));
    Tensor out = Tensor::empty({4, d}, DType::F32);
    ops::layer_norm(x, w, b, 1e-6f, out);
    expect_elementwise_near(out, ref_layer_norm(x, w, b, 1e-6),
                            "layer_norm d=" + std::to_string(d));
  }
}

// The residual form: h becomes h + delta (fp32 adds) and out its RMSNorm; out may be h itself.
TEST(OpNorm, AddRmsNormUpdatesTheResidualAndNormalisesTheSum) {
  const Tensor h0 = test::rand_tensor({3, 40}, 295, 3.0f), delta = test::rand_tensor({3, 40}, 296);
  const Tensor w = test::rand_tensor({40}, 297);
  Tensor sum = h0.contiguous();
  for (int64_t i = 0; i < sum.numel(); ++i) sum.f32()[i] += delta.f32()[i];
  const std::vector<double> want = ref_rms_norm(sum, w, 1e-6);
  Tensor h = h0.contiguous(), out = Tensor::empty({3, 40}, DType::F32);
  ops::add_rms_norm(h, delta, w, 1e-6f, out);
  for (int64_t i = 0; i < sum.numel(); ++i) ASSERT_EQ(h.f32()[i], sum.f32()[i]) << i;
  expect_elementwise_near(out, want, "add_rms_norm");
  Tensor h2 = h0.contiguous();
  ops::add_rms_norm(h2, delta, w, 1e-6f, h2);
  for (int64_t i = 0; i < sum.numel(); ++i) ASSERT_EQ(h2.f32()[i], out.f32()[i]) << i;
  Tensor wrong = Tensor::empty({3, 41}, DType::F32);
  EXPECT_THROW(ops::add_rms_norm(h, wrong, w, 1e-6f, out), Error);
}

// LayerNorm in place and on strided rows.
TEST(OpNorm, LayerNormInPlaceAndStrided) {
  Tensor wide = test::rand_tensor({3, 70}, 290, 3.0f);
  Tensor x = wide.narrow(1, 10, 50);
  const Tensor w = test::rand_tensor({50}, 291), b = test::rand_tensor({50}, 292);
  const std::vector<double> want = ref_layer_norm(x, w, b, 1e-6);
  const Tensor before = wide.contiguous();
  ops::layer_norm(x, w, b, 1e-6f, x);
  expect_elementwise_near(x, want, "layer_norm in place strided");
  for (int64_t r = 0; r < 3; ++r)
    for (int64_t j : {0, 9, 60, 69}) EXPECT_EQ(wide.f32()[r * 70 + j], before.f32()[r * 70 + j]);
}

// LayerNorm with d = 1 is exactly the bias (x - mean = 0), and a constant row gives the bias too.
TEST(OpNorm, LayerNormDegenerateRows) {
  const Tensor x1 = Tensor::from_f32({4.0f, -7.0f}, {2, 1});
  const Tensor w1 = Tensor::from_f32({3.0f}, {1}), b1 = Tensor::from_f32({0.25f}, {1});
  Tensor out1 = Tensor::empty({2, 1}, DType::F32);
  ops::layer_norm(x1, w1, b1, 1e-6f, out1);
  EXPECT_EQ(out1.f32()[0], 0.25f);
  EXPECT_EQ(out1.f32()[1], 0.25f);
  const Tensor x = Tensor::from_f32(std::vector<float>(8, 1.5f), {1, 8});
  const Tensor w = test::rand_tensor({8}, 293), b = test::rand_tensor({8}, 294);
  Tensor out = Tensor::empty({1, 8}, DType::F32);
  ops::layer_norm(x, w, b, 1e-6f, out);
  for (int j = 0; j < 8; ++j) EXPECT_EQ(out.f32()[j], b.f32()[j]);
}

}  // namespace
}  // namespace dsi
