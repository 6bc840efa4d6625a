// Op tests, element-wise family: add / axpy / scale in place, SiLU-and-multiply, strided copy and
// the embedding gather (F32 / BF16 / F16 tables) against float64 formulas, plus their error checks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "dsinfer/error.h"
#include "ops/beside.h"
#include "ops/elementwise.h"
#include "test_ops_common.h"
#include "test_util.h"

namespace dsi {
namespace {

using test::expect_elementwise_near;
using test::to_f64;

// a += b on strided rows of a (a column range of a wider buffer whose other columns stay put).
TEST(OpElementwise, AddInplace) {
  Tensor wide = test::rand_tensor({5, 40}, 500);
  Tensor a = wide.narrow(1, 8, 24);
  const Tensor b = test::rand_tensor({5, 24}, 501);
  std::vector<double> want = to_f64(a);
  const std::vector<double> bv = to_f64(b);
  for (size_t i = 0; i < want.size(); ++i) want[i] += bv[i];
  const Tensor before = wide.contiguous();
  ops::add_inplace(a, b);
  expect_elementwise_near(a, want, "add_inplace");
  for (int64_t r = 0; r < 5; ++r)
    for (int64_t j : {0, 7, 32, 39}) EXPECT_EQ(wide.f32()[r * 40 + j], before.f32()[r * 40 + j]);
}

// a += scale * b.
TEST(OpElementwise, AxpyInplace) {
  Tensor a = test::rand_tensor({4, 33}, 510);
  const Tensor b = test::rand_tensor({4, 33}, 511, 3.0f);
  std::vector<double> want = to_f64(a);
  const std::vector<double> bv = to_f64(b);
  for (size_t i = 0; i < want.size(); ++i) want[i] += -0.37 * bv[i];
  ops::axpy_inplace(a, b, -0.37f);
  expect_elementwise_near(a, want, "axpy_inplace");
}

// a *= scale on strided rows.
TEST(OpElementwise, ScaleInplace) {
  Tensor wide = test::rand_tensor({3, 20}, 520);
  Tensor a = wide.narrow(1, 2, 15);
  std::vector<double> want = to_f64(a);
  for (double& v : want) v *= 1.7;
  ops::scale_inplace(a, 1.7f);
  expect_elementwise_near(a, want, "scale_inplace");
  EXPECT_EQ(wide.f32()[0], test::rand_tensor({3, 20}, 520).f32()[0]);
}

// out = silu(gate) * up = gate / (1 + exp(-gate)) * up, with gate/up as strided halves of one
// [n, 2f] buffer, gates up to |30|, and in place (out == gate).
TEST(OpElementwise, SiluMul) {
  const int64_t n = 4, f = 25;
  const Tensor fused = test::rand_tensor({n, 2 * f}, 530, 30.0f);
  const Tensor gate = fused.narrow(1, 0, f), up = fused.narrow(1, f, f);
  std::vector<double> want(size_t(n * f));
  const std::vector<double> g = to_f64(gate), u = to_f64(up);
  for (size_t i = 0; i < want.size(); ++i) want[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
  Tensor out = Tensor::empty({n, f}, DType::F32);
  ops::silu_mul(gate, up, out);
  expect_elementwise_near(out, want, "silu_mul");
  Tensor g2 = gate.contiguous();
  ops::silu_mul(g2, up, g2);
  expect_elementwise_near(g2, want, "silu_mul in place");
}

// copy: a strided 3-D view into a contiguous tensor (bit-exact), and back into a strided view of a
// NaN guard buffer (bit-exact, nothing else written).
TEST(OpElementwise, CopyStridedRoundTrip) {
  const Tensor big = test::rand_tensor({3, 5, 12}, 540);
  const Tensor src = big.narrow(1, 1, 3).narrow(2, 4, 6);  // [3, 3, 6], strides (60, 12, 1)
  Tensor dst = Tensor::empty({3, 3, 6}, DType::F32);
  ops::copy(src, dst);
  for (int64_t i = 0; i < dst.numel(); ++i) EXPECT_EQ(dst.f32()[i], test::at_f32(src, i)) << i;
  Tensor buf = test::guard_filled({4, 4, 9}, DType::F32);
  Tensor back = buf.narrow(0, 1, 3).narrow(1, 1, 3).narrow(2, 2, 6);
  ops::copy(dst, back);
  test::expect_guard_intact(buf, back, "copy");
  for (int64_t i = 0; i < dst.numel(); ++i) EXPECT_EQ(test::at_f32(back, i), dst.f32()[i]) << i;
}

// Embedding gathers rows exactly for F32, BF16 and F16 tables (decoded independently), repeated
// ids, into a strided output view inside a guard buffer.
TEST(OpElementwise, EmbeddingAllTableDtypes) {
  const int64_t vocab = 11, d = 7;
  const std::vector<int32_t> ids = {3, 0, 10, 3, 7};
  std::mt19937_64 rng(550);
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    Tensor table = Tensor::empty({vocab, d}, dt);
    std::vector<double> decoded(size_t(vocab * d));
    for (int64_t i = 0; i < vocab * d; ++i) {
      if (dt == DType::F32) {
        table.f32()[i] = float(test::uniform01(rng) * 4 - 2);
        decoded[size_t(i)] = table.f32()[i];
      } else {
        // Random finite patterns with |x| < 2: clear the exponent field's top bit (bf16: field
        // < 128) or two of its bits (f16: field <= 14); subnormals included.
        uint16_t h = uint16_t(rng());
        h = uint16_t(h & (dt == DType::BF16 ? 0xbfff : 0xbbff));
        static_cast<uint16_t*>(table.raw())[i] = h;
        decoded[size_t(i)] = dt == DType::BF16 ? test::ref_bf16(h) : test::ref_f16(h);
      }
    }
    Tensor buf = test::guard_filled({7, 12}, DType::F32);
    Tensor out = buf.narrow(0, 1, 5).narrow(1, 3, d);
    ops::embedding(table, Tensor::from_i32(ids, {5}), out);
    test::expect_guard_intact(buf, out, std::string("embedding ") + std::string(dtype_name(dt)));
    for (int64_t r = 0; r < 5; ++r)
      for (int64_t j = 0; j < d; ++j)
        EXPECT_EQ(test::at_f32(out, r * d + j), float(decoded[size_t(ids[size_t(r)] * d + j)]))
            << dtype_name(dt) << " row " << r << " col " << j;
  }
}

// An id outside [0, vocab) (too large or negative) is an error naming the id.
TEST(OpElementwise, EmbeddingOutOfVocabularyThrows) {
  const Tensor table = test::rand_tensor({5, 4}, 560);
  Tensor out = Tensor::empty({2, 4}, DType::F32);
  test::expect_error(
      [&] {
        ops::embedding(table, Tensor::from_i32({1, 123456}, {2}), out);
      },
      {"123456"});
  test::expect_error([&] { ops::embedding(table, Tensor::from_i32({-3, 1}, {2}), out); }, {"-3"});
  test::expect_error([&] { ops::embedding(table, Tensor::from_i32({5, 0}, {2}), out); }, {"5"});
}

// Mismatched shapes are errors, not silent partial updates.
TEST(OpElementwise, ShapeMismatchThrows) {
  Tensor a = test::rand_tensor({3, 4}, 570);
  const Tensor before = a.contiguous();
  test::expect_error([&] { ops::add_inplace(a, test::rand_tensor({3, 5}, 571)); }, {"[3, 5]"});
  test::expect_error(
      [&] {
        ops::axpy_inplace(a, test::rand_tensor({4, 4}, 572), 2.0f);
      },
      {"[4, 4]"});
  EXPECT_EQ(std::memcmp(a.raw(), before.raw(), a.nbytes()), 0);
}

// Empty host tensors can be built from empty vectors (an n = 0 batch is a normal op input).
TEST(OpElementwise, EmptyHostTensorsFromVectors) {
  const Tensor f = Tensor::from_f32({}, {0, 30});
  const Tensor i = Tensor::from_i32({}, {4, 0});
  EXPECT_EQ(f.shape(), (Shape{0, 30}));
  EXPECT_EQ(i.shape(), (Shape{4, 0}));
  Tensor out = Tensor::empty({0, 30}, DType::F32);
  ops::copy(f, out);
  EXPECT_EQ(out.numel(), 0);
}

// run_beside on the CPU: the side piece, then the main one; an error in either reaches the caller.
TEST(OpBeside, CpuRunsSideThenMain) {
  std::vector<int> order;
  ops::run_beside(Device::cpu(), [&] { order.push_back(1); }, [&] { order.push_back(2); });
  EXPECT_EQ(order, (std::vector<int>{1, 2}));
  test::expect_error([&] { ops::run_beside(Device::cpu(), [] { fail("side broke"); }, [] {}); }, {"side broke"});
  test::expect_error([&] { ops::run_beside(Device::cpu(), [] {}, [] { fail("main broke"); }); }, {"main broke"});
}

}  // namespace
}  // namespace dsi
