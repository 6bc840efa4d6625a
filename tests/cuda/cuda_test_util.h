// Helpers of the CUDA op tests: the skip-without-GPU fixture, host <-> device moves, NaN-guarded
// device outputs, and GPU-vs-CPU comparisons that check the special-value map before the values.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backends/cuda/device.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "cuda/cuda_tolerances.h"
#include "ops/linear.h"
#include "runtime/ranks.h"
#include "test_ops_common.h"
#include "test_util.h"

namespace dsi::test {

inline bool has_gpu() {
  static const bool yes = cuda::device_count() > 0;
  return yes;
}

inline Device gpu() { return Device::cuda(0); }

// Every CUDA test derives from this: without a visible device the test is skipped, never failed.
class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!has_gpu()) GTEST_SKIP() << "no CUDA device visible: CUDA op tests skipped";
  }
};

inline Tensor dev(const Tensor& host) { return to_device(host, gpu()); }

// A test fixture's checkpoint as one model on cuda:0, loaded once per test binary.
inline const DsaModel& gpu_fixture_model(const std::string& fixture) {
  static std::map<std::string, std::unique_ptr<DsaModel>> models;
  auto& m = models[fixture];
  if (!m) m = load_rank_model(fixture_dir(fixture), RankContext{}, {}, gpu());
  return *m;
}
inline Tensor host(const Tensor& t) { return to_host(t); }

// An output view inside a NaN-guarded device buffer. make_view places the view in a buffer; it is
// applied to the device buffer (for the op) and to its host copy (for the check).
struct Guarded {
  Tensor dbuf;
  Tensor view;  // on the device: pass this to the op
  std::function<Tensor(const Tensor&)> make_view;

  // Downloads the buffer, checks that nothing outside the view was written and everything inside
  // was, and returns the view's contents (host, contiguous).
  Tensor check(const std::string& what) const {
    const Tensor hb = host(dbuf);
    const Tensor hv = make_view(hb);
    expect_guard_intact(hb, hv, what);
    return hv.contiguous();
  }
};

// A contiguous view of `shape` with `pad` guard elements before and after it.
inline Guarded guarded(const Shape& shape, DType dtype, int64_t pad = 37) {
  Guarded g;
  g.dbuf = dev(guard_filled({pad + shape_numel(shape) + pad}, dtype));
  g.make_view = [shape, pad](const Tensor& b) { return contiguous_view_in(b, shape, pad); };
  g.view = g.make_view(g.dbuf);
  return g;
}

// A strided view of `shape`: every dimension sits inside a larger one (1 guard slice before,
// 1 after; 3 after in the last dimension, which stays contiguous).
inline Guarded guarded_strided(const Shape& shape, DType dtype) {
  Shape outer = shape;
  for (size_t d = 0; d < outer.size(); ++d) outer[d] += d + 1 == outer.size() ? 4 : 2;
  Guarded g;
  g.dbuf = dev(guard_filled(outer, dtype));
  g.make_view = [shape](const Tensor& b) {
    Tensor v = b;
    for (int d = 0; d < int(shape.size()); ++d) v = v.narrow(d, 1, shape[size_t(d)]);
    return v;
  };
  g.view = g.make_view(g.dbuf);
  return g;
}

// A device copy of `t` placed as a strided view (same layout as guarded_strided; guards not checked):
// exercises the ops' strided-input paths.
inline Tensor dev_strided(const Tensor& t) {
  Guarded g = guarded_strided(t.shape(), t.dtype());
  g.view.copy_from(t);
  return g.view;
}

enum class FloatClass { kFinite, kNan, kPosInf, kNegInf };
inline FloatClass float_class(float v) {
  if (std::isnan(v)) return FloatClass::kNan;
  if (std::isinf(v)) return v > 0 ? FloatClass::kPosInf : FloatClass::kNegInf;
  return FloatClass::kFinite;
}

// The special-value maps (NaN, +inf, -inf positions) of two host F32 tensors are equal.
inline bool expect_same_specials(const Tensor& got, const Tensor& want, const std::string& what) {
  EXPECT_EQ(got.shape(), want.shape()) << what;
  if (got.shape() != want.shape()) return false;
  int bad = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const float g = at_f32(got, i), w = at_f32(want, i);
    if (float_class(g) != float_class(w) && bad++ < 5)
      ADD_FAILURE() << what << ": element " << i << " is " << g << " on the GPU, " << w
                    << " on the CPU";
  }
  EXPECT_EQ(bad, 0) << what << ": special-value maps differ";
  return bad == 0;
}

// GPU vs CPU, element-wise: |g - c| <= abs + rel * |c| on finite entries.
inline void expect_elementwise_close(const Tensor& got, const Tensor& want, const std::string& what) {
  if (!expect_same_specials(got, want, what)) return;
  int bad = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double g = at_f32(got, i), w = at_f32(want, i);
    if (float_class(float(w)) != FloatClass::kFinite) continue;
    const double tol = tol::kCudaElementwiseAbs + tol::kCudaElementwiseRel * std::fabs(w);
    if (!(std::fabs(g - w) <= tol) && bad++ < 5)
      ADD_FAILURE() << what << ": element " << i << " GPU " << g << " CPU " << w;
  }
  EXPECT_EQ(bad, 0) << what << ": elements out of tolerance";
}

// GPU vs CPU, normalised MSE over the finite entries (sum (g - c)^2 / sum c^2).
inline void expect_nmse_close(const Tensor& got, const Tensor& want, double tol,
                              const std::string& what) {
  if (!expect_same_specials(got, want, what)) return;
  double num = 0, den = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double g = at_f32(got, i), w = at_f32(want, i);
    if (float_class(float(w)) != FloatClass::kFinite) continue;
    num += (g - w) * (g - w);
    den += w * w;
  }
  const double e = den == 0 ? num : num / den;
  EXPECT_LE(e, tol) << what << ": normalised MSE " << e;
}

// Bitwise equality of two host tensors of the same shape and dtype (any layout).
inline void expect_bitwise(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_EQ(a.shape(), b.shape()) << what;
  ASSERT_EQ(a.dtype(), b.dtype()) << what;
  const Tensor ac = a.contiguous(), bc = b.contiguous();
  EXPECT_EQ(std::memcmp(ac.raw(), bc.raw(), ac.nbytes()), 0) << what << ": not bitwise equal";
}

// Exact equality of two host I32 tensors, reporting the first differences.
inline void expect_same_i32(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  int bad = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const int32_t g = at_i32(got, i), w = at_i32(want, i);
    if (g != w && bad++ < 5)
      ADD_FAILURE() << what << ": element " << i << " GPU " << g << " CPU " << w;
  }
  EXPECT_EQ(bad, 0) << what << ": integer outputs differ";
}

// A weight of dtype dt [out, in] with values of unit order after dequantisation; fp8 gets block
// scales of bo x bi for the slice offsets (row0, col0).
inline LinearWeight make_weight(DType dt, int64_t out, int64_t in, uint64_t seed, int64_t row0 = 0,
                         int64_t col0 = 0, int bo = 128, int bi = 128) {
  const std::vector<float> v = test::random_floats(size_t(out * in), seed);
  LinearWeight w;
  if (dt == DType::F32) {
    w.weight = Tensor::from_f32(v, {out, in});
    return w;
  }
  w.weight = Tensor::empty({out, in}, dt);
  for (size_t i = 0; i < v.size(); ++i) {
    if (dt == DType::BF16) w.weight.data<uint16_t>()[i] = f32_to_bf16(v[i]);
    if (dt == DType::F16) w.weight.data<uint16_t>()[i] = f32_to_f16(v[i]);
    if (dt == DType::F8_E4M3) w.weight.data<uint8_t>()[i] = f32_to_e4m3(v[i] * 448.0f);
  }
  if (dt == DType::F8_E4M3) {
    w.row0 = row0;
    w.col0 = col0;
    w.block_out = bo;
    w.block_in = bi;
    const int64_t so = (row0 + out + bo - 1) / bo, si = (col0 + in + bi - 1) / bi;
    std::vector<float> s = test::random_floats(size_t(so * si), seed + 1);
    for (float& x : s) x = (1.5f + x) / 448.0f;
    w.scale_inv = Tensor::from_f32(s, {so, si});
  }
  return w;
}

inline LinearWeight to_gpu(const LinearWeight& w) {
  LinearWeight d = w;
  d.weight = dev(w.weight);
  if (w.scale_inv.defined()) d.scale_inv = dev(w.scale_inv);
  return d;
}

// The dsi::Error message of fn ("" when it does not throw).
inline std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace dsi::test
