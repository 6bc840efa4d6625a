// Op tests of the fp8-activation linear (ops::linear_fp8_act, DeepSeek V3's recipe) and its
// activation quantiser on the CPU reference: the quantiser against its definition, the GEMM
// against a float64 evaluation of the same quantised formula (tight) and against the exact fp32
// linear (loose: the cost of e4m3 activations), slice offsets, odd shapes, errors; and the plain
// fp32-activation linear on the same sliced fp8 weights (its scale blocks, exactly).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/cpu_linear_fp8.h"
#include "core/dtype.h"
#include "ops/linear.h"
#include "test_ops_common.h"
#include "test_util.h"

namespace dsi {
namespace {

// e4m3 activations against the exact linear: a 3-bit mantissa rounds each x by up to 2^-4
// relative (RMS about 2^-4 / sqrt(3) / 1.5), so the output's normalised MSE is about 1e-3; measured
// 5e-4 .. 7e-4 on these inputs. The bound leaves room for other seeds, not for a wrong scale (which
// gives O(1)).
constexpr double kFp8ActVsExactNmse = 2e-3;
// The reference against a float64 evaluation of its own formula (same q and scales): only fp32
// rounding of the sums differs.
constexpr double kFp8ActVsFormulaNmse = tol::kReductionNmse;

// An e4m3 weight [out, in] (random bytes but the NaNs) with positive block scales for the slice
// offsets (row0, col0): scale_inv [ceil((row0 + out) / bo), ceil((col0 + in) / bi)].
LinearWeight fp8_weight(int64_t out, int64_t in, int64_t row0, int64_t col0, uint64_t seed,
                        int bo = 128, int bi = 128) {
  std::mt19937_64 rng(seed);
  LinearWeight w;
  w.weight = Tensor::empty({out, in}, DType::F8_E4M3);
  auto* p = static_cast<uint8_t*>(w.weight.raw());
  for (int64_t i = 0; i < out * in; ++i) {
    uint8_t b;
    do b = uint8_t(rng() & 0xff);
    while ((b & 0x7f) == 0x7f);
    p[i] = b;
  }
  const int64_t so = (row0 + out + bo - 1) / bo, si = (col0 + in + bi - 1) / bi;
  std::vector<float> s(size_t(so * si));
  for (float& x : s) x = float(0.5 + 1.5 * test::uniform01(rng)) * 0x1.0p-6f;
  w.scale_inv = Tensor::from_f32(s, {so, si});
  w.block_out = bo;
  w.block_in = bi;
  w.row0 = row0;
  w.col0 = col0;
  return w;
}

// Activations with a spread of magnitudes per row (row i scaled by 2^(i % 7 - 3)).
Tensor activations(int64_t n, int64_t in, uint64_t seed) {
  Tensor x = test::rand_tensor({n, in}, seed);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < in; ++j) x.f32()[i * in + j] *= std::ldexp(1.0f, int(i % 7) - 3);
  return x;
}

double nmse(const Tensor& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double g = test::at_f32(got, i), w = want[size_t(i)];
    num += (g - w) * (g - w);
    den += w * w;
  }
  return den == 0 ? num : num / den;
}

// float64 y = x W^T with W dequantised exactly (scale blocks shifted by row0, col0).
std::vector<double> exact_linear(const Tensor& x, const LinearWeight& w) {
  const int64_t n = x.dim(0), in = w.in_features(), out = w.out_features();
  const auto* wp = static_cast<const uint8_t*>(w.weight.raw());
  std::vector<double> y(size_t(n * out));
  for (int64_t o = 0; o < out; ++o) {
    const float* sw = w.scale_inv.f32() + ((w.row0 + o) / w.block_out) * w.scale_inv.dim(1);
    for (int64_t i = 0; i < n; ++i) {
      double s = 0;
      for (int64_t j = 0; j < in; ++j)
        s += double(x.f32()[i * x.stride(0) + j]) * test::ref_e4m3(wp[o * in + j]) *
             double(sw[(w.col0 + j) / w.block_in]);
      y[size_t(i * out + o)] = s;
    }
  }
  return y;
}

// float64 evaluation of linear_fp8_act's formula from the quantiser's own q and scales.
std::vector<double> formula(const Tensor& x, const LinearWeight& w) {
  const int64_t n = x.dim(0), in = w.in_features(), out = w.out_features();
  const int bi = w.block_in;
  const int64_t groups = (w.col0 + in + bi - 1) / bi;
  Tensor q = Tensor::empty({n, in}, DType::F8_E4M3), sx = Tensor::empty({n, groups}, DType::F32);
  cpu::quantize_act_fp8(x, w.col0, bi, q, sx);
  const auto* qp = static_cast<const uint8_t*>(q.raw());
  const auto* wp = static_cast<const uint8_t*>(w.weight.raw());
  std::vector<double> y(size_t(n * out));
  for (int64_t o = 0; o < out; ++o) {
    const float* sw = w.scale_inv.f32() + ((w.row0 + o) / w.block_out) * w.scale_inv.dim(1);
    for (int64_t i = 0; i < n; ++i) {
      double s = 0;
      for (int64_t j = 0; j < in; ++j) {
        const int64_t g = (w.col0 + j) / bi;
        s += test::ref_e4m3(qp[i * in + j]) * test::ref_e4m3(wp[o * in + j]) *
             double(sx.f32()[i * groups + g]) * double(sw[g]);
      }
      y[size_t(i * out + o)] = s;
    }
  }
  return y;
}

TEST(OpLinearFp8Act, QuantiserFollowsItsDefinition) {
  const int64_t n = 5, in = 300, col0 = 40;
  const int block = 128;
  Tensor x = activations(n, in, 3);
  for (int64_t j = 88; j < 216; ++j) x.f32()[1 * in + j] = 0.0f;  // row 1, group 1: all zeros
  x.f32()[2 * in + 7] = NAN;                                        // row 2, group 0: NaN
  x.f32()[3 * in + 250] = INFINITY;                                 // row 3, group 2: +inf
  const int64_t groups = (col0 + in + block - 1) / block;           // 3: 88 + 128 + 84 columns
  ASSERT_EQ(groups, 3);
  Tensor q = Tensor::empty({n, in}, DType::F8_E4M3), s = Tensor::empty({n, groups}, DType::F32);
  ops::quantize_act_fp8(x, col0, block, q, s);
  const auto* qp = static_cast<const uint8_t*>(q.raw());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t j0 = std::max<int64_t>(0, g * block - col0), j1 = std::min(in, (g + 1) * block - col0);
      const float sc = s.f32()[i * groups + g];
      const std::string what = "row " + std::to_string(i) + " group " + std::to_string(g);
      if (i == 2 && g == 0) {
        EXPECT_TRUE(std::isnan(sc)) << what;
        continue;
      }
      if (i == 3 && g == 2) {
        EXPECT_EQ(sc, INFINITY) << what;
        continue;
      }
      if (i == 1 && g == 1) {
        EXPECT_EQ(sc, 1.0f) << what;
        for (int64_t j = j0; j < j1; ++j) EXPECT_EQ(test::ref_e4m3(qp[i * in + j]), 0.0) << what;
        continue;
      }
      float amax = 0;
      for (int64_t j = j0; j < j1; ++j) amax = std::max(amax, std::fabs(x.f32()[i * in + j]));
      EXPECT_EQ(sc, amax / 448.0f) << what;
      for (int64_t j = j0; j < j1; ++j) {
        const double v = double(x.f32()[i * in + j]) / sc, r = test::ref_e4m3(qp[i * in + j]);
        // Nearest e4m3: within half a quantum (2^-4 relative for normals, 2^-10 absolute below 2^-6).
        const double half = std::max(std::ldexp(std::fabs(v), -4), std::ldexp(1.0, -10));
        EXPECT_LE(std::fabs(r - v), half * (1 + 1e-12)) << what << " column " << j;
        EXPECT_LE(std::fabs(r), 448.0) << what;
      }
    }
}

TEST(OpLinearFp8Act, MatchesFormulaAndExactLinear) {
  struct Case {
    int64_t n, out, in, row0, col0;
  };
  for (const Case& c : std::vector<Case>{{1, 1, 1, 0, 0},
                                         {3, 129, 128, 0, 0},
                                         {5, 127, 257, 5, 17},
                                         {9, 300, 129, 127, 127},
                                         {2, 64, 700, 64, 64}}) {
    const std::string what = "n " + std::to_string(c.n) + " [" + std::to_string(c.out) + ", " +
                             std::to_string(c.in) + "] offsets " + std::to_string(c.row0) + "," +
                             std::to_string(c.col0);
    const LinearWeight w = fp8_weight(c.out, c.in, c.row0, c.col0, uint64_t(c.out * 7 + c.in));
    const Tensor xs = activations(c.n, c.in + 3, uint64_t(c.n + c.in)).narrow(1, 2, c.in);  // strided rows
    Tensor out = Tensor::empty({c.n, c.out}, DType::F32);
    ops::linear_fp8_act(xs, w, out);
    const double e_formula = nmse(out, formula(xs, w));
    EXPECT_LE(e_formula, kFp8ActVsFormulaNmse) << what;
    if (c.in >= 128) {  // a single product is not a meaningful sample of the quantisation error
      const double e_exact = nmse(out, exact_linear(xs, w));
      EXPECT_LE(e_exact, kFp8ActVsExactNmse) << what;
      EXPECT_GE(e_exact, 1e-6) << what << ": activations were not quantised";
      std::printf("[ info ] %s: normalised MSE vs formula %.3g, vs exact linear %.3g\n", what.c_str(),
                  e_formula, e_exact);
    }
  }
}

// The fp32-activation linear (ops::linear) on sliced fp8 weights: each dequantised element is its
// e4m3 value times the scale of its block, the blocks shifted by the slice's offsets (row0, col0),
// exactly; the product (streamed dot products up to 8 rows, sgemm over row chunks at more) against
// float64. Small blocks put many block edges inside each row; the [800, 700] weight spans three
// row chunks at 9 rows.
TEST(OpLinearFp8Weights, SliceOffsetsTakeEachBlocksScale) {
  struct Case {
    int64_t n, out, in, row0, col0;
    int bo, bi;
  };
  for (const Case& c : std::vector<Case>{{1, 37, 100, 0, 0, 8, 16},
                                         {1, 37, 100, 3, 5, 8, 16},
                                         {4, 129, 257, 127, 1, 128, 128},
                                         {3, 64, 300, 63, 127, 64, 128},
                                         {1, 800, 700, 100, 60, 128, 128},
                                         {2, 800, 700, 5, 127, 128, 128},
                                         {9, 800, 700, 5, 127, 128, 128}}) {
    const std::string what = "n " + std::to_string(c.n) + " [" + std::to_string(c.out) + ", " +
                             std::to_string(c.in) + "] offsets " + std::to_string(c.row0) + "," +
                             std::to_string(c.col0) + " blocks " + std::to_string(c.bo) + "x" +
                             std::to_string(c.bi);
    const LinearWeight w =
        fp8_weight(c.out, c.in, c.row0, c.col0, uint64_t(c.out * 11 + c.in + c.col0), c.bo, c.bi);
    const Tensor rows = ops::dequantize_rows(w, 0, c.out);
    const auto* wp = static_cast<const uint8_t*>(w.weight.raw());
    int64_t wrong = 0;
    for (int64_t o = 0; o < c.out; ++o)
      for (int64_t j = 0; j < c.in; ++j) {
        const float scale =
            w.scale_inv.f32()[((c.row0 + o) / c.bo) * w.scale_inv.dim(1) + (c.col0 + j) / c.bi];
        wrong += rows.f32()[o * c.in + j] != float(test::ref_e4m3(wp[o * c.in + j])) * scale;
      }
    EXPECT_EQ(wrong, 0) << what << ": dequantised elements off their block's scale";
    const Tensor xs = activations(c.n, c.in + 3, uint64_t(c.n + c.in)).narrow(1, 1, c.in);
    Tensor out = Tensor::empty({c.n, c.out}, DType::F32);
    ops::linear(xs, w, out);
    EXPECT_LE(nmse(out, exact_linear(xs, w)), tol::kReductionNmse) << what;
  }
}

TEST(OpLinearFp8Act, NanRowsAndEmptyShapes) {
  const LinearWeight w = fp8_weight(20, 200, 0, 0, 5);
  Tensor x = activations(3, 200, 6);
  x.f32()[1 * 200 + 150] = NAN;
  Tensor out = Tensor::empty({3, 20}, DType::F32);
  ops::linear_fp8_act(x, w, out);
  for (int64_t o = 0; o < 20; ++o) {
    EXPECT_TRUE(std::isnan(out.f32()[20 + o])) << o;
    EXPECT_TRUE(std::isfinite(out.f32()[o]) && std::isfinite(out.f32()[40 + o])) << o;
  }
  Tensor none = Tensor::empty({0, 20}, DType::F32);
  ops::linear_fp8_act(Tensor::empty({0, 200}, DType::F32), w, none);  // no rows: nothing to do
}

TEST(OpLinearFp8Act, RejectsNonFp8WeightsAndBadShapes) {
  LinearWeight bf;
  bf.weight = Tensor::empty({4, 8}, DType::BF16);
  Tensor out = Tensor::empty({2, 4}, DType::F32);
  try {
    ops::linear_fp8_act(test::rand_tensor({2, 8}, 1), bf, out);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("must be F8_E4M3"), std::string::npos) << e.what();
  }
  const LinearWeight w = fp8_weight(4, 8, 0, 0, 2);
  try {
    ops::linear_fp8_act(test::rand_tensor({2, 9}, 1), w, out);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not match"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dsi
