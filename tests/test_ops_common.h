// Helpers shared by the op tests (tests/test_ops_*.cpp): random tensors, float64 views of results,
// tolerance checks keyed to tests/tolerances.h, NaN guard buffers, and independent scalar decoders
// (bf16, fp16, fp8 e4m3fn written from their definitions, not from src/core/dtype).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "test_util.h"
#include "tolerances.h"

namespace dsi::test {

inline constexpr double kInf = std::numeric_limits<double>::infinity();
inline constexpr float kNinfF = -std::numeric_limits<float>::infinity();

// Tensor::from_f32 that also takes an empty vector: from_f32 memcpy's from the vector's data(),
// null when empty, which UBSan rejects (see OpElementwise.EmptyHostTensorsFromVectors).
inline Tensor host_f32(const std::vector<float>& v, const Shape& shape) {
  if (v.empty() && shape_numel(shape) == 0) return Tensor::empty(shape, DType::F32);
  return Tensor::from_f32(v, shape);
}

// A contiguous F32 tensor of random_floats(seed) in [-scale, scale).
inline Tensor rand_tensor(const Shape& shape, uint64_t seed, float scale = 1.0f) {
  std::vector<float> v = random_floats(size_t(shape_numel(shape)), seed);
  for (float& x : v) x *= scale;
  return host_f32(v, shape);
}

// Element offset (in elements) of logical index `flat` (row-major over shape) of a strided view.
inline int64_t strided_offset(const Tensor& t, int64_t flat) {
  int64_t off = 0;
  for (int d = t.ndim() - 1; d >= 0; --d) {
    const int64_t n = t.dim(d);
    off += (flat % n) * t.stride(d);
    flat /= n;
  }
  return off;
}

// Logical element i (row-major) of an F32 tensor with any strides.
inline float at_f32(const Tensor& t, int64_t i) { return t.f32()[strided_offset(t, i)]; }
inline int32_t at_i32(const Tensor& t, int64_t i) { return t.i32()[strided_offset(t, i)]; }

// All elements of an F32 tensor (any strides) as float64, row-major.
inline std::vector<double> to_f64(const Tensor& t) {
  std::vector<double> v(size_t(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[size_t(i)] = at_f32(t, i);
  return v;
}

inline Tensor from_f64(const std::vector<double>& v, const Shape& shape) {
  std::vector<float> f(v.begin(), v.end());
  return host_f32(f, shape);
}

// Element-wise fp32 op vs a float64 reference: |got - ref| <= abs + rel * |ref| (as allclose).
inline void expect_elementwise_near(const Tensor& got, const std::vector<double>& ref,
                                    const std::string& what) {
  ASSERT_EQ(got.numel(), int64_t(ref.size())) << what;
  int bad = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double g = at_f32(got, i), r = ref[size_t(i)];
    const double tol = tol::kElementwiseAbs + tol::kElementwiseRel * std::fabs(r);
    if (!(std::fabs(g - r) <= tol) && bad++ < 5)
      ADD_FAILURE() << what << ": element " << i << " got " << g << " want " << r;
  }
  EXPECT_EQ(bad, 0) << what << ": elements out of tolerance";
}

// A reduction (dot products, GEMMs, softmax sums) vs float64: whole-tensor NMSE <= kReductionNmse,
// and, where `abs_sum` is given (the float64 sum of |terms| of each output), a per-element bound
// |got - ref| <= kDotAbsSumRel * abs_sum (an output whose terms are all zero must be exactly 0).
inline void expect_reduction_near(const Tensor& got, const std::vector<double>& ref,
                                  const std::vector<double>& abs_sum, const std::string& what) {
  ASSERT_EQ(got.numel(), int64_t(ref.size())) << what;
  const Tensor want = from_f64(ref, got.shape());
  EXPECT_LE(nmse(got, want), tol::kReductionNmse) << what;
  if (abs_sum.empty()) return;
  ASSERT_EQ(abs_sum.size(), ref.size()) << what;
  int bad = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double g = at_f32(got, i), r = ref[size_t(i)];
    const double tol = tol::kDotAbsSumRel * abs_sum[size_t(i)];
    if (!(std::fabs(g - r) <= tol) && bad++ < 5)
      ADD_FAILURE() << what << ": element " << i << " got " << g << " want " << r << " (bound "
                    << tol << ")";
  }
  EXPECT_EQ(bad, 0) << what << ": elements out of the per-element bound";
}

// ---- Guard regions: an output view inside a larger buffer filled with a NaN pattern. ----
// The guard pattern: a quiet NaN as f32; as i32 (2143593893) it is no valid index and not -1.
inline constexpr uint32_t kGuardBits = 0x7fc5a5a5u;

inline Tensor guard_filled(const Shape& shape, DType dtype) {
  EXPECT_EQ(dtype_size(dtype), 4u) << "guard buffers hold 4-byte elements";
  Tensor t = Tensor::empty(shape, dtype);
  auto* p = static_cast<uint32_t*>(t.raw());
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = kGuardBits;
  return t;
}

// A contiguous view of `shape` placed `pad` elements into a guard-filled flat buffer with `pad`
// elements after it.
inline Tensor contiguous_view_in(const Tensor& buf, const Shape& shape, int64_t pad) {
  EXPECT_GE(buf.numel(), pad + shape_numel(shape) + pad);
  char* p = static_cast<char*>(buf.raw()) + pad * int64_t(dtype_size(buf.dtype()));
  return Tensor::wrap(p, shape, buf.dtype(), buf.device(), buf.storage());
}

// Checks that every element of `buf` outside `view` still holds the guard pattern (nothing wrote
// out of bounds) and every element inside was written (no guard pattern, and no NaN for F32).
inline void expect_guard_intact(const Tensor& buf, const Tensor& view, const std::string& what) {
  const auto* base = static_cast<const uint32_t*>(buf.raw());
  const int64_t start =
      (static_cast<const char*>(view.raw()) - static_cast<const char*>(buf.raw())) / 4;
  std::vector<char> inside(size_t(buf.numel()), 0);
  for (int64_t i = 0; i < view.numel(); ++i) {
    const int64_t off = start + strided_offset(view, i);
    ASSERT_TRUE(off >= 0 && off < buf.numel()) << what << ": view leaves its buffer";
    inside[size_t(off)] = 1;
  }
  int64_t clobbered = 0, unwritten = 0;
  for (int64_t i = 0; i < buf.numel(); ++i) {
    uint32_t bits = base[i];
    float f;
    std::memcpy(&f, &bits, 4);
    if (inside[size_t(i)]) {
      if (bits == kGuardBits || (buf.dtype() == DType::F32 && std::isnan(f))) ++unwritten;
    } else if (bits != kGuardBits) {
      ++clobbered;
    }
  }
  EXPECT_EQ(clobbered, 0) << what << ": elements outside the output view were written";
  EXPECT_EQ(unwritten, 0) << what << ": output elements left unwritten (still NaN)";
}

// ---- Independent scalar decoders, straight from the format definitions. ----
inline double ref_bf16(uint16_t h) {  // the top 16 bits of an IEEE binary32
  const uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline double ref_f16(uint16_t h) {  // IEEE binary16: 1 sign, 5 exponent (bias 15), 10 mantissa
  const int sign = (h >> 15) & 1, e = (h >> 10) & 0x1f, m = h & 0x3ff;
  double v;
  if (e == 0)
    v = std::ldexp(double(m), -24);
  else if (e == 31)
    v = m ? std::nan("") : kInf;
  else
    v = std::ldexp(1.0 + m / 1024.0, e - 15);
  return sign ? -v : v;
}

inline double ref_e4m3(uint8_t b) {  // OCP e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa; no inf
  const int sign = (b >> 7) & 1, e = (b >> 3) & 0xf, m = b & 0x7;
  double v;
  if (e == 0xf && m == 0x7)
    v = std::nan("");
  else if (e == 0)
    v = std::ldexp(double(m), -9);
  else
    v = std::ldexp(1.0 + m / 8.0, e - 7);
  return sign ? -v : v;
}

// Uniform double in [0, 1) from 53 random bits (portable across standard libraries).
inline double uniform01(std::mt19937_64& rng) { return double(rng() >> 11) * 0x1.0p-53; }

}  // namespace dsi::test
