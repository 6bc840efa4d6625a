// Op tests, RoPE family: the rotation (both layouts, offsets, strided views) against a float64
// rotation, and compute_rope_freqs against float64 versions of HF's default and YaRN formulas.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <vector>

#include "model/config.h"
#include "ops/rope.h"
#include "test_ops_common.h"
#include "test_util.h"
#include "tolerances.h"

namespace dsi {
namespace {

using test::expect_elementwise_near;
using test::to_f64;

// Float64 rotation of x (logical [n, H, d], row-major) in place: for each row r and head h, pair i
// of the dims [offset, offset + 2*half) rotates by pos[r] * inv_freq[i], cos/sin times
// attention_factor. Interleaved pairs are (2i, 2i+1); half-split pairs are (i, i + half).
std::vector<double> ref_rope(std::vector<double> x, int64_t n, int64_t heads, int64_t d,
                             const std::vector<int32_t>& pos, const std::vector<float>& inv_freq,
                             double attention_factor, RopeStyle style, int offset) {
  const int64_t half = int64_t(inv_freq.size());
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t h = 0; h < heads; ++h) {
      double* v = x.data() + (r * heads + h) * d + offset;
      for (int64_t i = 0; i < half; ++i) {
        const double angle = double(pos[size_t(r)]) * double(inv_freq[size_t(i)]);
        const double c = std::cos(angle) * attention_factor, s = std::sin(angle) * attention_factor;
        const int64_t a = style == RopeStyle::kInterleaved ? 2 * i : i;
        const int64_t b = style == RopeStyle::kInterleaved ? 2 * i + 1 : i + half;
        const double x1 = v[a], x2 = v[b];
        v[a] = x1 * c - x2 * s;
        v[b] = x2 * c + x1 * s;
      }
    }
  }
  return x;
}

std::vector<float> default_inv_freq(double theta, int rot_dim) {
  RopeConfig c;
  c.theta = theta;
  return ops::compute_rope_freqs(c, rot_dim).inv_freq;
}

// Rotates a fresh [n, H, d] tensor with ops::rope and compares with ref_rope. Positions stay below
// 64 so that the fp32 angle pos * inv_freq is exact to ~2e-6 rad (element-wise tolerance applies).
void check_rope(int64_t n, int64_t heads, int64_t d, int rot_dim, int offset, RopeStyle style,
                float attention_factor, const std::vector<int32_t>& pos, uint64_t seed) {
  const std::vector<float> inv_freq = default_inv_freq(10000.0, rot_dim);
  Tensor x = test::rand_tensor({n, heads, d}, seed);
  const std::vector<double> want =
      ref_rope(to_f64(x), n, heads, d, pos, inv_freq, attention_factor, style, offset);
  ops::rope(x, Tensor::from_i32(pos, {n}), Tensor::from_f32(inv_freq, {int64_t(inv_freq.size())}),
            attention_factor, style, offset);
  expect_elementwise_near(x, want, "rope");
}

// Interleaved RoPE rotates pairs (x[2i], x[2i+1]) by pos * inv_freq_i, several heads, positions >
// 0.
TEST(OpRope, InterleavedMatchesFloat64Rotation) {
  check_rope(4, 3, 32, 32, 0, RopeStyle::kInterleaved, 1.0f, {5, 17, 42, 63}, 101);
}

// Half-split RoPE rotates (x[i], x[i + d/2]); several heads, positions > 0.
TEST(OpRope, HalfSplitMatchesFloat64Rotation) {
  check_rope(4, 3, 32, 32, 0, RopeStyle::kHalfSplit, 1.0f, {3, 9, 33, 61}, 102);
}

// The two layouts really differ (a test that mixed them up would otherwise pass both cases above).
TEST(OpRope, StylesGiveDifferentResults) {
  const std::vector<float> f = default_inv_freq(10000.0, 16);
  Tensor a = test::rand_tensor({1, 1, 16}, 103), b = a.contiguous();
  const Tensor pos = Tensor::from_i32({7}, {1}), freq = Tensor::from_f32(f, {8});
  ops::rope(a, pos, freq, 1.0f, RopeStyle::kInterleaved, 0);
  ops::rope(b, pos, freq, 1.0f, RopeStyle::kHalfSplit, 0);
  EXPECT_GT(test::max_abs_diff(a, b), 0.1);
}

// The attention factor multiplies both cos and sin (the rotated vector is scaled by it).
TEST(OpRope, AttentionFactorScalesCosAndSin) {
  check_rope(3, 2, 16, 16, 0, RopeStyle::kInterleaved, 1.25f, {1, 30, 50}, 104);
  check_rope(3, 2, 16, 16, 0, RopeStyle::kHalfSplit, 0.5f, {2, 31, 51}, 105);
}

// Position 0 is the identity, bit for bit (cos 0 = 1, sin 0 = 0).
TEST(OpRope, PositionZeroIsIdentity) {
  Tensor x = test::rand_tensor({2, 2, 16}, 106);
  const Tensor before = x.contiguous();
  ops::rope(x, Tensor::from_i32({0, 0}, {2}), Tensor::from_f32(default_inv_freq(1e4, 16), {8}),
            1.0f, RopeStyle::kHalfSplit, 0);
  EXPECT_EQ(std::memcmp(x.raw(), before.raw(), x.nbytes()), 0);
}

// With an offset, only dims [offset, offset + rot) rotate: the last 16 dims of [n, 1, 80] rows;
// the first 64 dims stay bit-identical. Both layouts.
TEST(OpRope, OffsetRotatesOnlyTheTailOfAWideRow) {
  for (RopeStyle style : {RopeStyle::kInterleaved, RopeStyle::kHalfSplit}) {
    const int64_t n = 5, d = 80;
    const int offset = 64;
    const std::vector<int32_t> pos = {1, 8, 20, 47, 62};
    const std::vector<float> f = default_inv_freq(1e6, 16);
    Tensor x = test::rand_tensor({n, 1, d}, 107);
    const Tensor before = x.contiguous();
    const std::vector<double> want = ref_rope(to_f64(x), n, 1, d, pos, f, 1.0, style, offset);
    ops::rope(x, Tensor::from_i32(pos, {n}), Tensor::from_f32(f, {8}), 1.0f, style, offset);
    expect_elementwise_near(x, want, "rope tail");
    for (int64_t r = 0; r < n; ++r)
      EXPECT_EQ(std::memcmp(x.f32() + r * d, before.f32() + r * d, size_t(offset) * 4), 0)
          << "row " << r << ": dims before the offset changed";
  }
}

// The model's view: q.narrow(2, nope, rope) of a [rows, H, nope + rope] tensor (strided rows and
// heads). The rope dims rotate per head; the nope dims stay bit-identical.
TEST(OpRope, StridedHeadViewRotatesOnlyItsDims) {
  const int64_t rows = 3, heads = 4, nope = 24, rope = 16, width = nope + rope;
  const std::vector<int32_t> pos = {11, 12, 40};
  const std::vector<float> f = default_inv_freq(1e4, int(rope));
  Tensor q = test::rand_tensor({rows, heads, width}, 108);
  const Tensor before = q.contiguous();
  Tensor q_pe = q.narrow(2, nope, rope);
  // Expected: the rope part of every head rotated, everything else unchanged.
  std::vector<double> want =
      ref_rope(to_f64(before), rows, heads, width, pos, f, 1.0, RopeStyle::kInterleaved, int(nope));
  ops::rope(q_pe, Tensor::from_i32(pos, {rows}), Tensor::from_f32(f, {rope / 2}), 1.0f,
            RopeStyle::kInterleaved, 0);
  expect_elementwise_near(q, want, "rope strided view");
  for (int64_t rh = 0; rh < rows * heads; ++rh)
    EXPECT_EQ(std::memcmp(q.f32() + rh * width, before.f32() + rh * width, nope * 4), 0)
        << "row*head " << rh << ": nope dims changed";
}

// The model's key rows as a strided slice of a wider product, given a head dimension by
// Tensor::unsqueeze (as attention does for the stacked input projection): rotated exactly as the
// same rows alone, the columns around them untouched.
TEST(OpRope, UnsqueezedRowSliceRotatesLikeTheRowsAlone) {
  const int64_t rows = 3, wide = 70, first = 37, d = 24;
  const std::vector<int32_t> pos = {5, 9, 300};
  const std::vector<float> f = default_inv_freq(1e4, int(d));
  Tensor all = test::rand_tensor({rows, wide}, 211);
  const Tensor before = all.contiguous();
  Tensor alone = all.narrow(1, first, d).contiguous();
  Tensor view = all.narrow(1, first, d).unsqueeze(1);
  ASSERT_EQ(view.shape(), (Shape{rows, 1, d}));
  EXPECT_EQ(view.stride(0), wide);
  EXPECT_EQ(view.stride(2), 1);
  Tensor alone3 = alone.view({rows, 1, d});
  const Tensor p = Tensor::from_i32(pos, {rows}), fr = Tensor::from_f32(f, {d / 2});
  ops::rope(view, p, fr, 1.0f, RopeStyle::kHalfSplit, 0);
  ops::rope(alone3, p, fr, 1.0f, RopeStyle::kHalfSplit, 0);
  for (int64_t r = 0; r < rows; ++r) {
    EXPECT_EQ(std::memcmp(all.f32() + r * wide + first, alone.f32() + r * d, d * 4), 0) << "row " << r;
    EXPECT_EQ(std::memcmp(all.f32() + r * wide, before.f32() + r * wide, first * 4), 0) << "row " << r;
    EXPECT_EQ(std::memcmp(all.f32() + r * wide + first + d, before.f32() + r * wide + first + d,
                          (wide - first - d) * 4), 0)
        << "row " << r;
  }
  EXPECT_EQ(view.unsqueeze(3).shape(), (Shape{rows, 1, d, 1}));
  test::expect_error([&] { (void)view.unsqueeze(5); }, {"unsqueeze: dimension 5"});
}

// Into another tensor (the model writes RoPE(q_pe) straight into the absorbed query): the same
// bits as rotating a copy in place; the source stays untouched; a wrong shape is refused.
TEST(OpRope, IntoAnotherTensorMatchesInPlaceAndLeavesTheSource) {
  for (RopeStyle style : {RopeStyle::kInterleaved, RopeStyle::kHalfSplit}) {
    const int64_t rows = 3, heads = 4, nope = 24, rope = 16, width = nope + rope, lat = 20;
    const std::vector<int32_t> pos = {11, 12, 40};
    const Tensor hp = Tensor::from_i32(pos, {rows});
    const Tensor f = Tensor::from_f32(default_inv_freq(1e4, int(rope)), {rope / 2});
    Tensor q = test::rand_tensor({rows, heads, width}, 110);
    const Tensor before = q.contiguous();
    Tensor in_place = q.contiguous();
    ops::rope(in_place, hp, f, 0.75f, style, int(nope));
    Tensor dst = Tensor::zeros({rows, heads, lat + rope}, DType::F32);
    Tensor dst_pe = dst.narrow(2, lat, rope);
    ops::rope(q, hp, f, 0.75f, style, int(nope), &dst_pe);
    EXPECT_EQ(std::memcmp(q.f32(), before.f32(), size_t(q.numel()) * 4), 0) << "the source changed";
    for (int64_t rh = 0; rh < rows * heads; ++rh) {
      EXPECT_EQ(std::memcmp(dst.f32() + rh * (lat + rope) + lat, in_place.f32() + rh * width + nope,
                            size_t(rope) * 4), 0) << "row*head " << rh;
      for (int64_t j = 0; j < lat; ++j) EXPECT_EQ(dst.f32()[rh * (lat + rope) + j], 0.0f);
    }
    Tensor wrong = Tensor::empty({rows, heads, rope + 2}, DType::F32);
    EXPECT_THROW(ops::rope(q, hp, f, 1.0f, style, int(nope), &wrong), Error);
  }
}

// Large positions: the fp32 angle pos * inv_freq carries a rounding error of up to
// |angle| * 2^-24 (as in HF); within that explicit bound the result matches the float64 rotation.
TEST(OpRope, LargePositionsWithinFp32AngleBound) {
  const std::vector<int32_t> pos = {4095, 65536, 163839};
  const std::vector<float> f = default_inv_freq(1e4, 32);
  Tensor x = test::rand_tensor({3, 2, 32}, 109);
  const std::vector<double> in = to_f64(x);
  const std::vector<double> want = ref_rope(in, 3, 2, 32, pos, f, 1.0, RopeStyle::kHalfSplit, 0);
  ops::rope(x, Tensor::from_i32(pos, {3}), Tensor::from_f32(f, {16}), 1.0f, RopeStyle::kHalfSplit,
            0);
  for (int64_t r = 0; r < 3; ++r)
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t i = 0; i < 16; ++i) {
        const int64_t base = (r * 2 + h) * 32;
        const double angle_err = double(pos[size_t(r)]) * f[size_t(i)] * 0x1.0p-24 + 1e-6;
        const double bound =
            angle_err * (std::fabs(in[size_t(base + i)]) + std::fabs(in[size_t(base + i + 16)])) +
            tol::kElementwiseAbs;
        for (int64_t j : {i, i + 16})
          EXPECT_NEAR(x.f32()[base + j], want[size_t(base + j)], bound)
              << r << "," << h << "," << j;
      }
}

// ---- compute_rope_freqs ----

// Float64 version of HF _compute_yarn_parameters for a rotary dim `dim` (find_correction_dim,
// floor/ceil when truncating, clamp to [0, dim-1], +0.001 for a zero-width ramp, linear ramp,
// blend).
struct RefYarn {
  std::vector<double> inv_freq;
  double attention_factor;
};

double ref_get_mscale(double scale, double m) {
  return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0;
}

RefYarn ref_yarn(const RopeConfig& c, int dim) {
  auto correction_dim = [&](double rotations) {
    return dim *
           std::log(double(c.original_max_position_embeddings) /
                    (rotations * 2 * std::numbers::pi)) /
           (2 * std::log(c.theta));
  };
  double low = correction_dim(c.beta_fast), high = correction_dim(c.beta_slow);
  if (c.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, double(dim - 1));
  if (low == high) high += 0.001;
  RefYarn r;
  for (int i = 0; i < dim / 2; ++i) {
    const double pos_freq = std::pow(c.theta, double(2 * i) / dim);
    const double extra = 1.0 / pos_freq, inter = 1.0 / (c.factor * pos_freq);
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    const double extrapolation_factor = 1.0 - ramp;
    r.inv_freq.push_back(inter * (1 - extrapolation_factor) + extra * extrapolation_factor);
  }
  if (c.attention_factor)
    r.attention_factor = *c.attention_factor;
  else if (c.mscale != 0 && c.mscale_all_dim != 0)
    r.attention_factor =
        ref_get_mscale(c.factor, c.mscale) / ref_get_mscale(c.factor, c.mscale_all_dim);
  else
    r.attention_factor = ref_get_mscale(c.factor, 1.0);
  return r;
}

void expect_freqs_near(const std::vector<float>& got, const std::vector<double>& want,
                       const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], tol::kRopeFreqRel * want[i]) << what << " i=" << i;
}

RopeConfig yarn_config(double theta, double factor, int64_t orig, double beta_fast,
                       double beta_slow) {
  RopeConfig c;
  c.type = "yarn";
  c.theta = theta;
  c.factor = factor;
  c.original_max_position_embeddings = orig;
  c.beta_fast = beta_fast;
  c.beta_slow = beta_slow;
  return c;
}

// Default RoPE: inv_freq_i = theta^(-2i/d) within 1e-6 relative; attention factor 1.
TEST(OpRopeFreqs, DefaultThetaFormula) {
  for (double theta : {1e4, 1e6, 8e6})
    for (int dim : {16, 64}) {
      RopeConfig c;
      c.theta = theta;
      const ops::RopeFreqs f = ops::compute_rope_freqs(c, dim);
      std::vector<double> want;
      for (int i = 0; i < dim / 2; ++i) want.push_back(std::pow(theta, -2.0 * i / dim));
      expect_freqs_near(f.inv_freq, want, "default theta=" + std::to_string(theta));
      EXPECT_EQ(f.attention_factor, 1.0f);
    }
}

// YaRN inverse frequencies match the float64 HF formula within 1e-6 relative across the edge cases
// of the correction range: DeepSeek-V3.2's config, no truncation, low clamped to 0, high clamped to
// dim - 1 inside the ramp, both ends past dim - 1, both ends clamped to 0 (zero-width ramp,
// +0.001), high below low, and beta_fast == beta_slow without truncation (zero-width ramp inside
// the range).
TEST(OpRopeFreqs, YarnMatchesHfFormula) {
  struct Case {
    const char* name;
    RopeConfig c;
    int dim;
  };
  std::vector<Case> cases = {
      {"deepseek_v32", yarn_config(1e4, 40, 4096, 32, 1), 64},
      {"no_truncate", yarn_config(1e4, 40, 4096, 32, 1), 64},
      {"low_clamped", yarn_config(1e4, 8, 64, 32, 1), 64},
      {"high_clamped", yarn_config(1e4, 4, 65536, 32, 1e-5), 64},  // ramp (i - 20) / (63 - 20)
      {"both_above_dim", yarn_config(1e4, 4, 1000000000000, 32, 1), 64},
      {"both_zero", yarn_config(1e4, 4, 6, 32, 1), 64},
      {"high_below_low", yarn_config(1e4, 4, 3, 32, 1), 64},
      {"equal_betas", yarn_config(1e4, 16, 4096, 4, 4), 64},
      {"theta_1e6_dim32", yarn_config(1e6, 4, 8192, 32, 1), 32},
  };
  cases[1].c.truncate = false;
  cases[7].c.truncate = false;
  for (const Case& k : cases) {
    const RefYarn want = ref_yarn(k.c, k.dim);
    const ops::RopeFreqs got = ops::compute_rope_freqs(k.c, k.dim);
    expect_freqs_near(got.inv_freq, want.inv_freq, k.name);
    EXPECT_NEAR(got.attention_factor, want.attention_factor, 1e-6 * want.attention_factor)
        << k.name;
  }
  // The ramp really blends: DeepSeek's first frequency is unscaled, its last is divided by factor.
  const ops::RopeFreqs ds = ops::compute_rope_freqs(cases[0].c, 64);
  EXPECT_NEAR(ds.inv_freq[0], 1.0, 1e-6);
  EXPECT_NEAR(ds.inv_freq[31], std::pow(1e4, -62.0 / 64) / 40,
              1e-6 * std::pow(1e4, -62.0 / 64) / 40);
}

// attention_factor: an explicit value wins; mscale and mscale_all_dim both set give
// get_mscale(f, mscale) / get_mscale(f, mscale_all_dim); otherwise get_mscale(f); factor <= 1
// gives 1.
TEST(OpRopeFreqs, YarnAttentionFactorRules) {
  const double ln40 = std::log(40.0);
  RopeConfig c = yarn_config(1e4, 40, 4096, 32, 1);
  c.attention_factor = 0.75;
  c.mscale = 1.0;
  c.mscale_all_dim = 0.5;
  EXPECT_FLOAT_EQ(ops::compute_rope_freqs(c, 64).attention_factor, 0.75f);
  c.attention_factor.reset();
  EXPECT_NEAR(ops::compute_rope_freqs(c, 64).attention_factor,
              (0.1 * ln40 + 1) / (0.05 * ln40 + 1), 1e-6);
  c.mscale_all_dim = 1.0;  // DeepSeek-V3.2: the ratio is exactly 1
  EXPECT_NEAR(ops::compute_rope_freqs(c, 64).attention_factor, 1.0, 1e-7);
  c.mscale = 0.7;
  c.mscale_all_dim = 0.0;  // only one set: get_mscale(factor) with mscale 1
  EXPECT_NEAR(ops::compute_rope_freqs(c, 64).attention_factor, 0.1 * ln40 + 1, 1e-6);
  c.mscale = 0.0;
  EXPECT_NEAR(ops::compute_rope_freqs(c, 64).attention_factor, 0.1 * ln40 + 1, 1e-6);
  for (double factor : {1.0, 0.5}) {
    c.factor = factor;
    c.mscale = 0.0;
    EXPECT_EQ(ops::compute_rope_freqs(c, 64).attention_factor, 1.0f) << factor;
    c.mscale = 2.0;
    c.mscale_all_dim = 1.0;
    EXPECT_EQ(ops::compute_rope_freqs(c, 64).attention_factor, 1.0f) << factor;
    c.mscale_all_dim = 0.0;
  }
}

// An odd or zero rotary dim is rejected with a message naming it.
TEST(OpRopeFreqs, RejectsOddRotaryDim) {
  RopeConfig c;
  test::expect_error([&] { ops::compute_rope_freqs(c, 15); }, {"15"});
  test::expect_error([&] { ops::compute_rope_freqs(c, 0); }, {"0"});
}

}  // namespace
}  // namespace dsi
