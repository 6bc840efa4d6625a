// Op tests, linear family: y = x W^T for F32 / BF16 / F16 / F8_E4M3 (block-scaled) weights against
// a float64 reference that decodes the weight bytes independently; odd shapes, strided rows, guard
// regions, dequantize_rows, and the fp8-without-scale error.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "ops/linear.h"
#include "test_ops_common.h"
#include "test_util.h"

namespace dsi {
namespace {

using test::to_f64;

// ---- Weight builders (raw bit patterns; the reference decodes them with test::ref_*) ----

LinearWeight f32_weight(int64_t out, int64_t in, uint64_t seed) {
  return {test::rand_tensor({out, in}, seed), Tensor(), 128, 128};
}

// bf16: the top half of random fp32 values (truncation; any bit pattern is a valid input).
LinearWeight bf16_weight(int64_t out, int64_t in, uint64_t seed) {
  const std::vector<float> v = test::random_floats(size_t(out * in), seed);
  Tensor w = Tensor::empty({out, in}, DType::BF16);
  auto* p = static_cast<uint16_t*>(w.raw());
  for (size_t i = 0; i < v.size(); ++i) {
    uint32_t u;
    std::memcpy(&u, &v[i], 4);
    p[i] = uint16_t(u >> 16);
  }
  return {w, Tensor(), 128, 128};
}

// f16: random sign, exponent 10..16 (|w| in [2^-5, 4)), random mantissa; plus a few subnormals.
LinearWeight f16_weight(int64_t out, int64_t in, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Tensor w = Tensor::empty({out, in}, DType::F16);
  auto* p = static_cast<uint16_t*>(w.raw());
  for (int64_t i = 0; i < out * in; ++i) {
    const uint64_t r = rng();
    const uint16_t e = (i % 17 == 0) ? 0 : uint16_t(10 + r % 7);
    p[i] = uint16_t(((r >> 8) & 1) << 15 | e << 10 | ((r >> 16) & 0x3ff));
  }
  return {w, Tensor(), 128, 128};
}

// fp8 e4m3fn bytes (any pattern but the two NaNs) with positive block scales scale_inv
// [ceil(out / bo), ceil(in / bi)] in [0.5, 2) * 2^-6.
LinearWeight fp8_weight(int64_t out, int64_t in, int bo, int bi, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Tensor w = Tensor::empty({out, in}, DType::F8_E4M3);
  auto* p = static_cast<uint8_t*>(w.raw());
  for (int64_t i = 0; i < out * in; ++i) {
    uint8_t b;
    do b = uint8_t(rng() & 0xff);
    while ((b & 0x7f) == 0x7f);
    p[i] = b;
  }
  const int64_t so = (out + bo - 1) / bo, si = (in + bi - 1) / bi;
  std::vector<float> s(size_t(so * si));
  for (float& x : s) x = float(0.5 + 1.5 * test::uniform01(rng)) * 0x1.0p-6f;
  return {w, Tensor::from_f32(s, {so, si}), bo, bi};
}

// The float64 dequantised weight W[i][j] (row-major [out, in]): decoded value, times
// scale_inv[(row0 + i) / bo][(col0 + j) / bi] for fp8.
std::vector<double> ref_dequant(const LinearWeight& lw) {
  const int64_t out = lw.out_features(), in = lw.in_features();
  std::vector<double> w(size_t(out * in));
  for (int64_t i = 0; i < out; ++i)
    for (int64_t j = 0; j < in; ++j) {
      const int64_t k = i * in + j;
      double v = 0;
      switch (lw.weight.dtype()) {
        case DType::F32:
          v = lw.weight.f32()[k];
          break;
        case DType::BF16:
          v = test::ref_bf16(static_cast<const uint16_t*>(lw.weight.raw())[k]);
          break;
        case DType::F16:
          v = test::ref_f16(static_cast<const uint16_t*>(lw.weight.raw())[k]);
          break;
        case DType::F8_E4M3:
          v = test::ref_e4m3(static_cast<const uint8_t*>(lw.weight.raw())[k]) *
              double(
                  lw.scale_inv.f32()[((lw.row0 + i) / lw.block_out) * lw.scale_inv.dim(1) +
                                     (lw.col0 + j) / lw.block_in]);
          break;
        default:
          ADD_FAILURE() << "unexpected dtype";
      }
      w[size_t(k)] = v;
    }
  return w;
}

// y[r][o] = sum_j x[r][j] W[o][j] in float64, with the per-output sum of |terms|.
struct RefOut {
  std::vector<double> y, abs_sum;
};
RefOut ref_linear(const Tensor& x, const LinearWeight& lw) {
  const std::vector<double> xv = to_f64(x), w = ref_dequant(lw);
  const int64_t n = x.dim(0), in = lw.in_features(), out = lw.out_features();
  RefOut r{std::vector<double>(size_t(n * out)), std::vector<double>(size_t(n * out))};
  for (int64_t i = 0; i < n; ++i)
    for (int64_t o = 0; o < out; ++o) {
      double s = 0, a = 0;
      for (int64_t j = 0; j < in; ++j) {
        const double t = xv[size_t(i * in + j)] * w[size_t(o * in + j)];
        s += t;
        a += std::fabs(t);
      }
      r.y[size_t(i * out + o)] = s;
      r.abs_sum[size_t(i * out + o)] = a;
    }
  return r;
}

// Runs linear on x (any row stride) into a fresh output and compares with the float64 reference.
void check_linear(const Tensor& x, const LinearWeight& w, const std::string& what) {
  Tensor out = Tensor::empty({x.dim(0), w.out_features()}, DType::F32);
  ops::linear(x, w, out);
  const RefOut want = ref_linear(x, w);
  test::expect_reduction_near(out, want.y, want.abs_sum, what);
}

// F32 weights (the direct BLAS path: a dot product per weight row at one row, sgemm at more) with
// n = 1, 3 and 37 rows, contiguous and row-strided input.
TEST(OpLinear, F32MatchesFloat64) {
  const LinearWeight w = f32_weight(50, 70, 400);
  for (int64_t n : {1, 3, 37}) {
    check_linear(test::rand_tensor({n, 70}, 401 + uint64_t(n)), w, "f32");
    check_linear(test::rand_tensor({n, 90}, 402 + uint64_t(n)).narrow(1, 11, 70), w, "f32 strided");
  }
}

// BF16 weights are decoded exactly (top half of an fp32).
TEST(OpLinear, Bf16MatchesFloat64) {
  const LinearWeight w = bf16_weight(45, 130, 410);
  for (int64_t n : {1, 37}) {
    check_linear(test::rand_tensor({n, 130}, 411 + uint64_t(n)), w, "bf16");
    check_linear(test::rand_tensor({n, 140}, 412 + uint64_t(n)).narrow(1, 3, 130), w,
                 "bf16 strided");
  }
}

// F16 weights (normals and subnormals) are decoded exactly.
TEST(OpLinear, F16MatchesFloat64) {
  const LinearWeight w = f16_weight(33, 90, 420);
  for (int64_t n : {1, 37}) check_linear(test::rand_tensor({n, 90}, 421 + uint64_t(n)), w, "f16");
}

// FP8 with 128x128 block scales where out = 200 and in = 300 are not multiples of the block (the
// last block row and column are partial); strided input rows; n = 1 and 37.
TEST(OpLinear, Fp8PartialBlocks128) {
  const LinearWeight w = fp8_weight(200, 300, 128, 128, 430);
  ASSERT_EQ(w.scale_inv.shape(), (Shape{2, 3}));
  for (int64_t n : {1, 37}) {
    const Tensor wide = test::rand_tensor({n, 310}, 431 + uint64_t(n));
    check_linear(wide.narrow(1, 7, 300), w, "fp8 128x128 n=" + std::to_string(n));
  }
}

// FP8 with 64x32 blocks (block_out != block_in), again with partial blocks: out 100, in 70.
TEST(OpLinear, Fp8Blocks64x32) {
  const LinearWeight w = fp8_weight(100, 70, 64, 32, 440);
  ASSERT_EQ(w.scale_inv.shape(), (Shape{2, 3}));
  check_linear(test::rand_tensor({37, 70}, 441), w, "fp8 64x32");
}

// FP8 weights large enough to be dequantised in several row chunks at 9 rows (sgemm; 1000 x 300:
// chunk boundaries not aligned with the 128-row scale blocks), and streamed at 1 and 5 rows.
TEST(OpLinear, Fp8ManyRowChunks) {
  const LinearWeight w = fp8_weight(1000, 300, 128, 128, 450);
  check_linear(test::rand_tensor({9, 300}, 453), w, "fp8 1000x300");
  check_linear(test::rand_tensor({5, 300}, 451), w, "fp8 1000x300 5 rows");
  check_linear(test::rand_tensor({1, 300}, 452), w, "fp8 1000x300 one row");
}

// Up to 8 rows stream each weight row once, 2048 columns at a time (4 rows for f32 weights), more
// take sgemm: row counts on both sides of those limits, against rows that end on, just past and
// short of a segment's end and rows of many segments, f32, bf16 and fp8 (blocks of 128, and a
// slice that starts 40 columns into its first block).
TEST(OpLinear, FewRowsOfLongInputs) {
  for (int64_t in : {2047, 2048, 2049, 8193, 20000}) {
    const LinearWeight f = f32_weight(3, in, 460 + uint64_t(in));
    const LinearWeight b = bf16_weight(5, in, 470 + uint64_t(in));
    LinearWeight q = fp8_weight(4, in + 40, 128, 128, 475 + uint64_t(in));
    q.weight = q.weight.narrow(1, 40, in).contiguous();
    q.col0 = 40;
    for (int64_t n : {1, 2, 4, 5, 8, 9}) {
      const std::string what = "in " + std::to_string(in) + " n " + std::to_string(n);
      check_linear(test::rand_tensor({n, in}, 480 + uint64_t(in + n)), f, "f32 " + what);
      check_linear(test::rand_tensor({n, in}, 490 + uint64_t(in + n)), b, "bf16 " + what);
      check_linear(test::rand_tensor({n, in}, 495 + uint64_t(in + n)), q, "fp8 " + what);
    }
  }
}

// n = 0 writes nothing (a NaN guard buffer around a [0, out] view stays intact); in = 0 gives
// zeros.
TEST(OpLinear, EmptyShapes) {
  const LinearWeight w = fp8_weight(20, 30, 128, 128, 460);
  Tensor buf = test::guard_filled({8, 20}, DType::F32);
  Tensor out0 = buf.narrow(0, 4, 0);
  ops::linear(test::rand_tensor({0, 30}, 461), w, out0);
  test::expect_guard_intact(buf, out0, "linear n=0");
  const LinearWeight w_empty{Tensor::empty({6, 0}, DType::F32), Tensor(), 128, 128};
  Tensor out = test::guard_filled({2, 6}, DType::F32);
  ops::linear(Tensor::empty({2, 0}, DType::F32), w_empty, out);
  for (int i = 0; i < 12; ++i) EXPECT_EQ(out.f32()[i], 0.0f) << i;
}

// Guard regions: the output is a strided view inside a NaN buffer (f32 and fp8 weights); x's rows
// strided too (columns of a wider tensor), at 3 rows (streamed) and 9 (sgemm).
TEST(OpLinear, GuardRegion) {
  for (const LinearWeight& w : {f32_weight(40, 64, 470), fp8_weight(40, 64, 16, 16, 471)}) {
    for (const int64_t n : {3, 9}) {
      const Tensor x = test::rand_tensor({n, 70}, 472).narrow(1, 3, 64);
      Tensor buf = test::guard_filled({n + 2, 52}, DType::F32);
      Tensor out = buf.narrow(0, 1, n).narrow(1, 5, 40);
      ops::linear(x, w, out);
      const std::string what = std::string("linear ") + std::string(dtype_name(w.weight.dtype())) + " n " +
                               std::to_string(n);
      test::expect_guard_intact(buf, out, what);
      const RefOut want = ref_linear(x, w);
      test::expect_reduction_near(out, want.y, want.abs_sum, what);
    }
  }
}

// dequantize_rows of a row range crossing scale-block boundaries equals the exact product
// e4m3 * scale_inv rounded once to fp32; bf16 and f16 rows decode exactly.
TEST(OpLinear, DequantizeRowsRange) {
  const LinearWeight w = fp8_weight(300, 200, 128, 128, 480);
  const Tensor rows = ops::dequantize_rows(w, 100, 290);
  ASSERT_EQ(rows.shape(), (Shape{190, 200}));
  const std::vector<double> full = ref_dequant(w);
  int bad = 0;
  for (int64_t i = 0; i < 190; ++i)
    for (int64_t j = 0; j < 200; ++j)
      if (rows.f32()[i * 200 + j] != float(full[size_t((i + 100) * 200 + j)]) && bad++ < 5)
        ADD_FAILURE() << "row " << i + 100 << " col " << j;
  EXPECT_EQ(bad, 0);
  for (const LinearWeight& h : {bf16_weight(10, 12, 481), f16_weight(10, 12, 482)}) {
    const Tensor r = ops::dequantize_rows(h, 3, 7);
    const std::vector<double> ref = ref_dequant(h);
    for (int64_t i = 0; i < 4 * 12; ++i) EXPECT_EQ(r.f32()[i], float(ref[size_t(36 + i)])) << i;
  }
  EXPECT_EQ(ops::dequantize_rows(w, 5, 5).dim(0), 0);
}

// An fp8 weight without weight_scale_inv is an error naming the missing tensor.
TEST(OpLinear, Fp8WithoutScaleInvThrows) {
  LinearWeight w = fp8_weight(20, 30, 128, 128, 490);
  w.scale_inv = Tensor();
  Tensor out = Tensor::empty({2, 20}, DType::F32);
  test::expect_error(
      [&] {
        ops::linear(test::rand_tensor({2, 30}, 491), w, out);
      },
      {"weight_scale_inv"});
  test::expect_error([&] { ops::dequantize_rows(w, 0, 1); }, {"weight_scale_inv"});
}

// A scale_inv whose shape is not [ceil(out / bo), ceil(in / bi)] is an error, not a silently
// mis-strided (or out-of-bounds) read of the scales.
TEST(OpLinear, Fp8ScaleInvShapeIsChecked) {
  LinearWeight w = fp8_weight(200, 300, 128, 128, 495);
  w.scale_inv = Tensor::from_f32(std::vector<float>(8, 1.0f), {2, 4});
  Tensor out = Tensor::empty({1, 200}, DType::F32);
  test::expect_error(
      [&] {
        ops::linear(test::rand_tensor({1, 300}, 496), w, out);
      },
      {"scale_inv", "[2, 4]"});
}

// Slice offsets outside the first scale block, a block size of zero, and a weight that is not a
// contiguous [out, in] are errors that say which, for the product and for dequantize_rows alike.
TEST(OpLinear, WeightLayoutIsChecked) {
  const Tensor x = test::rand_tensor({1, 30}, 498);
  Tensor out = Tensor::empty({1, 20}, DType::F32);
  const auto expect_both = [&](const LinearWeight& w, const std::vector<std::string>& words) {
    test::expect_error([&] { ops::linear(x, w, out); }, words);
    test::expect_error([&] { ops::dequantize_rows(w, 0, 1); }, words);
  };
  LinearWeight w = fp8_weight(20, 30, 16, 16, 497);
  w.row0 = 16;
  expect_both(w, {"slice offsets (16, 0)", "16x16"});
  w.row0 = 0;
  w.col0 = -1;
  expect_both(w, {"slice offsets (0, -1)"});
  w.col0 = 0;
  w.block_in = 0;
  expect_both(w, {"block size 16x0"});
  LinearWeight flat = bf16_weight(20, 30, 499);
  flat.weight = flat.weight.view({600});
  test::expect_error([&] { ops::dequantize_rows(flat, 0, 1); }, {"contiguous [out, in]"});
}

}  // namespace
}  // namespace dsi
