// CUDA op tests, part 1 (and the test binary's main): device memory, element-wise ops, norms, RoPE,
// linear layers and sampling. Each case runs the same inputs through the CPU reference and the CUDA
// backend in one process and compares (ggml test-backend-ops style): integer outputs exactly, floats
// by the kind of output (cuda_tolerances.h), outputs inside NaN-guarded buffers, repeated runs
// bitwise equal. Without a visible GPU every test is skipped.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "backends/cuda/device.h"
#include "core/dtype.h"
#include "cuda/cuda_test_util.h"
#include "ops/elementwise.h"
#include "ops/linear.h"
#include "ops/norm.h"
#include "ops/rope.h"
#include "ops/sampling.h"

namespace dsi {
namespace {

using test::dev;
using test::dev_strided;
using test::gpu;
using test::host;

class CudaMemory : public test::CudaTest {};
class CudaElementwise : public test::CudaTest {};
class CudaNorm : public test::CudaTest {};
class CudaRope : public test::CudaTest {};
class CudaLinear : public test::CudaTest {};
class CudaSampling : public test::CudaTest {};

// A host tensor of random bytes (any dtype).
Tensor random_bytes(const Shape& shape, DType dtype, uint64_t seed) {
  Tensor t = Tensor::empty(shape, dtype);
  std::mt19937_64 rng(seed);
  auto* p = static_cast<uint8_t*>(t.raw());
  for (size_t i = 0; i < t.nbytes(); ++i) p[i] = uint8_t(rng());
  return t;
}

// ---------------------------------------------------------------- memory

TEST_F(CudaMemory, RoundTripEveryDtype) {
  for (DType dt : {DType::F32, DType::F16, DType::BF16, DType::F8_E4M3, DType::I64, DType::I32,
                   DType::I16, DType::I8, DType::U8, DType::BOOL}) {
    for (const Shape& shape : {Shape{3, 5, 7}, Shape{0, 4}, Shape{1}, Shape{}}) {
      const Tensor h = random_bytes(shape, dt, 11);
      const Tensor d = dev(h);
      EXPECT_EQ(d.device(), gpu());
      EXPECT_TRUE(d.defined());
      const Tensor back = host(d);
      EXPECT_TRUE(back.device().is_cpu());
      test::expect_bitwise(back, h, std::string(dtype_name(dt)) + shape_str(shape));
    }
  }
}

TEST_F(CudaMemory, ZerosAndEmpty) {
  const Tensor z = Tensor::zeros({129, 33}, DType::F32, gpu());
  const Tensor zh = host(z);
  for (int64_t i = 0; i < zh.numel(); ++i) ASSERT_EQ(zh.f32()[i], 0.0f) << i;
  const Tensor e = Tensor::empty({0, 7}, DType::I32, gpu());
  EXPECT_TRUE(e.defined());
  EXPECT_EQ(host(e).numel(), 0);
}

TEST_F(CudaMemory, StridedCopiesAcrossDevices) {
  const Tensor h = test::rand_tensor({4, 6, 10}, 3);
  const Tensor d = dev(h);
  // device strided -> host (to_host / contiguous)
  const Tensor dv = d.narrow(2, 3, 5).narrow(0, 1, 2);
  const Tensor hv = h.narrow(2, 3, 5).narrow(0, 1, 2);
  test::expect_bitwise(host(dv), hv.contiguous(), "device view to host");
  // device strided -> device strided (kernel), with guards
  test::Guarded g = test::guarded_strided(dv.shape(), DType::F32);
  ops::copy(dv, g.view);
  test::expect_bitwise(g.check("device to device strided"), hv.contiguous(), "device to device");
  // host strided -> device strided
  test::Guarded g2 = test::guarded_strided(hv.shape(), DType::F32);
  g2.view.copy_from(hv);
  test::expect_bitwise(g2.check("host to device strided"), hv.contiguous(), "host to device");
  // device strided -> host strided
  Tensor hb = test::guard_filled({4, 8, 12}, DType::F32);
  Tensor hview = hb.narrow(1, 2, 6).narrow(2, 1, 10);
  hview.copy_from(d.narrow(0, 0, 4));
  test::expect_bitwise(hview.contiguous(), h, "device to host strided");
  test::expect_guard_intact(hb, hview, "device to host strided");
  // 2-byte elements, strided both sides
  const Tensor b16 = random_bytes({5, 9}, DType::BF16, 5);
  const Tensor db16 = dev(b16).narrow(1, 2, 6);
  Tensor out16 = Tensor::empty({5, 12}, DType::BF16, gpu()).narrow(1, 3, 6);
  ops::copy(db16, out16);
  test::expect_bitwise(host(out16), b16.narrow(1, 2, 6).contiguous(), "bf16 strided");
}

TEST_F(CudaMemory, OpsRejectMixedDevices) {
  Tensor a = dev(test::rand_tensor({2, 3}, 1));
  const Tensor b = test::rand_tensor({2, 3}, 2);
  const std::string msg = test::error_of([&] { ops::add_inplace(a, b); });
  EXPECT_NE(msg.find("is on cpu"), std::string::npos) << msg;
}

// ---------------------------------------------------------------- element-wise

enum class Ew { kScale, kAdd, kAxpy, kSilu };

void run_elementwise(Ew op, int64_t n, int64_t d) {
  const std::string what = "op " + std::to_string(int(op)) + " [" + std::to_string(n) + ", " +
                           std::to_string(d) + "]";
  const Tensor a = test::rand_tensor({n, d}, 100 + uint64_t(n) * 7 + uint64_t(d), 4.0f);
  const Tensor b = test::rand_tensor({n, d}, 200 + uint64_t(n) * 7 + uint64_t(d), 4.0f);
  Tensor cpu = a.contiguous();
  test::Guarded g = test::guarded_strided({n, d}, DType::F32);
  g.view.copy_from(a);
  const Tensor db = dev_strided(b);
  switch (op) {
    case Ew::kScale:
      ops::scale_inplace(cpu, 0.37f);
      ops::scale_inplace(g.view, 0.37f);
      break;
    case Ew::kAdd:
      ops::add_inplace(cpu, b);
      ops::add_inplace(g.view, db);
      break;
    case Ew::kAxpy:
      ops::axpy_inplace(cpu, b, -1.7f);
      ops::axpy_inplace(g.view, db, -1.7f);
      break;
    case Ew::kSilu: {
      Tensor out = Tensor::empty({n, d}, DType::F32);
      ops::silu_mul(a, b, out);
      cpu = out;
      test::Guarded go = test::guarded_strided({n, d}, DType::F32);
      ops::silu_mul(dev_strided(a), db, go.view);
      test::expect_elementwise_close(go.check(what), cpu, what);
      return;
    }
  }
  const Tensor got = g.check(what);
  // Pure IEEE products and sums, rounded alike on both sides: bitwise.
  test::expect_bitwise(got, cpu, what);
}

TEST_F(CudaElementwise, AllOpsOddShapes) {
  for (Ew op : {Ew::kScale, Ew::kAdd, Ew::kAxpy, Ew::kSilu})
    for (auto [n, d] : std::vector<std::pair<int64_t, int64_t>>{{0, 5}, {1, 1}, {3, 7}, {129, 257},
                                                                 {5, 6144}})
      run_elementwise(op, n, d);
}

TEST_F(CudaElementwise, SiluMulInPlace) {
  const Tensor a = test::rand_tensor({17, 300}, 7, 6.0f), b = test::rand_tensor({17, 300}, 8);
  Tensor cpu = a.contiguous();
  ops::silu_mul(cpu, b, cpu);
  Tensor g = dev(a);
  ops::silu_mul(g, dev(b), g);
  test::expect_elementwise_close(host(g), cpu, "silu_mul in place");
}

Tensor table_of(DType dt, int64_t vocab, int64_t d, uint64_t seed) {
  const std::vector<float> v = test::random_floats(size_t(vocab * d), seed);
  if (dt == DType::F32) return Tensor::from_f32(v, {vocab, d});
  Tensor t = Tensor::empty({vocab, d}, dt);
  for (size_t i = 0; i < v.size(); ++i) {
    if (dt == DType::BF16) t.data<uint16_t>()[i] = f32_to_bf16(v[i] * 3.0f);
    if (dt == DType::F16) t.data<uint16_t>()[i] = f32_to_f16(v[i] * 3.0f);
    if (dt == DType::F8_E4M3) t.data<uint8_t>()[i] = f32_to_e4m3(v[i] * 400.0f);
  }
  return t;
}

TEST_F(CudaElementwise, EmbeddingEveryTableDtype) {
  for (DType dt : {DType::F32, DType::BF16, DType::F16, DType::F8_E4M3}) {
    const int64_t vocab = 300, d = 70;
    const Tensor table = table_of(dt, vocab, d, 9);
    const Tensor dtable = dev(table);
    for (int64_t n : {0, 1, 3, 129}) {
      std::vector<int32_t> ids(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) ids[size_t(i)] = int32_t((i * 97 + 13) % vocab);
      if (n > 2) {
        ids[0] = 0;
        ids[1] = int32_t(vocab - 1);
      }
      const Tensor hid = n ? Tensor::from_i32(ids, {n}) : Tensor::empty({0}, DType::I32);
      Tensor cpu = Tensor::empty({n, d}, DType::F32);
      ops::embedding(table, hid, cpu);
      test::Guarded g = test::guarded_strided({n, d}, DType::F32);
      ops::embedding(dtable, dev(hid), g.view);
      const std::string what = std::string("embedding ") + std::string(dtype_name(dt));
      test::expect_bitwise(g.check(what), cpu, what);  // exact conversions both sides
    }
  }
}

TEST_F(CudaElementwise, EmbeddingOutOfRangeIdsGiveTheCpuError) {
  const Tensor table = table_of(DType::BF16, 50, 8, 3);
  const Tensor dtable = dev(table);
  const std::vector<std::vector<int32_t>> cases = {{1, 2, 50, 3}, {0, -1, 7}, {60, -5}};
  for (const std::vector<int32_t>& ids : cases) {
    const int64_t n = int64_t(ids.size());
    const Tensor hid = Tensor::from_i32(ids, {n});
    Tensor cpu_out = Tensor::empty({n, 8}, DType::F32);
    Tensor gpu_out = Tensor::empty({n, 8}, DType::F32, gpu());
    const std::string cpu_msg = test::error_of([&] { ops::embedding(table, hid, cpu_out); });
    const std::string gpu_msg = test::error_of([&] { ops::embedding(dtable, dev(hid), gpu_out); });
    EXPECT_FALSE(cpu_msg.empty());
    EXPECT_EQ(gpu_msg, cpu_msg);
  }
}

// ---------------------------------------------------------------- norms

TEST_F(CudaNorm, RmsAndLayerNormOddShapes) {
  for (int64_t n : {0, 1, 3, 130}) {
    for (int64_t d : {1, 7, 64, 576, 2049, 6144}) {
      const std::string what = "[" + std::to_string(n) + ", " + std::to_string(d) + "]";
      const Tensor x = test::rand_tensor({n, d}, uint64_t(n * 131 + d), 3.0f);
      const Tensor w = test::rand_tensor({d}, uint64_t(d) + 5, 2.0f);
      const Tensor b = test::rand_tensor({d}, uint64_t(d) + 6);
      const Tensor dx = dev_strided(x), dw = dev(w), db = dev(b);
      Tensor cpu = Tensor::empty({n, d}, DType::F32);
      ops::rms_norm(x, w, 1e-6f, cpu);
      test::Guarded g = test::guarded_strided({n, d}, DType::F32);
      ops::rms_norm(dx, dw, 1e-6f, g.view);
      const Tensor got = g.check("rms_norm " + what);
      test::expect_nmse_close(got, cpu, tol::kCudaReductionNmse, "rms_norm " + what);
      ops::rms_norm(dx, dw, 1e-6f, g.view);
      test::expect_bitwise(g.check("rms_norm rerun"), got, "rms_norm repeat " + what);

      ops::layer_norm(x, w, b, 1e-5f, cpu);
      test::Guarded g2 = test::guarded_strided({n, d}, DType::F32);
      ops::layer_norm(dx, dw, db, 1e-5f, g2.view);
      test::expect_nmse_close(g2.check("layer_norm " + what), cpu, tol::kCudaReductionNmse,
                              "layer_norm " + what);
    }
  }
}

TEST_F(CudaNorm, RmsNormInPlace) {
  const Tensor x = test::rand_tensor({9, 512}, 4), w = test::rand_tensor({512}, 5);
  Tensor cpu = x.contiguous();
  ops::rms_norm(cpu, w, 1e-5f, cpu);
  Tensor g = dev(x);
  ops::rms_norm(g, dev(w), 1e-5f, g);
  test::expect_nmse_close(host(g), cpu, tol::kCudaReductionNmse, "rms_norm in place");
}

// The residual form: the same bits as add_inplace then rms_norm on the GPU (h and out), for rows
// held in registers, rows longer than that (re-read after the add), odd widths and out == h.
TEST_F(CudaNorm, AddRmsNormIsAddThenNorm) {
  for (int64_t n : {1, 3}) {
    for (int64_t d : {7, 576, 6144, 4099, 20000}) {
      const std::string what = "add_rms_norm [" + std::to_string(n) + ", " + std::to_string(d) + "]";
      const Tensor h0 = test::rand_tensor({n, d}, uint64_t(n * 7 + d), 3.0f);
      const Tensor delta = test::rand_tensor({n, d}, uint64_t(n * 7 + d + 1), 2.0f);
      const Tensor w = dev(test::rand_tensor({d}, uint64_t(d) + 2, 2.0f));
      Tensor h_ref = dev_strided(h0);
      const Tensor dd = dev_strided(delta);
      ops::add_inplace(h_ref, dd);
      Tensor out_ref = Tensor::empty({n, d}, DType::F32, gpu());
      ops::rms_norm(h_ref, w, 1e-6f, out_ref);
      test::Guarded hg = test::guarded_strided({n, d}, DType::F32);
      hg.view.copy_from(dev(h0));
      test::Guarded og = test::guarded_strided({n, d}, DType::F32);
      ops::add_rms_norm(hg.view, dd, w, 1e-6f, og.view);
      test::expect_bitwise(hg.check(what + " h"), host(h_ref), what + " h");
      test::expect_bitwise(og.check(what + " out"), host(out_ref), what + " out");
      Tensor same = dev(h0);  // out is h itself: the normalised sum
      ops::add_rms_norm(same, dd, w, 1e-6f, same);
      test::expect_bitwise(host(same), host(out_ref), what + " out == h");
    }
  }
}

// ---------------------------------------------------------------- RoPE

TEST_F(CudaRope, BothStylesStridedViewsAndAttentionFactor) {
  RopeConfig yarn;
  yarn.type = "yarn";
  yarn.factor = 40.0;
  yarn.original_max_position_embeddings = 4096;
  yarn.mscale = 1.0;
  yarn.mscale_all_dim = 0.707;
  for (const RopeConfig& cfg : {RopeConfig{}, yarn}) {
    for (RopeStyle style : {RopeStyle::kInterleaved, RopeStyle::kHalfSplit}) {
      // q-like: [n, 5 heads, 192], rope on dims [128, 192); k-like: [n, 1, 576] at 512; and a
      // full-width rotation with odd half.
      for (auto [heads, d, rot, offset] : std::vector<std::tuple<int64_t, int64_t, int, int>>{
               {5, 192, 64, 128}, {1, 576, 64, 512}, {3, 14, 14, 0}}) {
        const ops::RopeFreqs f = ops::compute_rope_freqs(cfg, rot);
        for (int64_t n : {0, 1, 7, 130}) {
          const std::string what = "rope " + cfg.type + " style " + std::to_string(int(style)) +
                                   " [" + std::to_string(n) + ", " + std::to_string(heads) + ", " +
                                   std::to_string(d) + "]";
          const Tensor x = test::rand_tensor({n, heads, d}, uint64_t(n + heads + d), 2.0f);
          std::vector<int32_t> pos(static_cast<size_t>(n));
          for (int64_t i = 0; i < n; ++i) pos[size_t(i)] = int32_t((i * 7919) % 200000);
          if (n > 1) pos[1] = 163839;
          const Tensor hp = n ? Tensor::from_i32(pos, {n}) : Tensor::empty({0}, DType::I32);
          const Tensor hf = Tensor::from_f32(f.inv_freq, {int64_t(f.inv_freq.size())});
          Tensor cpu = x.contiguous();
          ops::rope(cpu, hp, hf, f.attention_factor, style, offset);
          test::Guarded g = test::guarded_strided({n, heads, d}, DType::F32);
          g.view.copy_from(x);
          ops::rope(g.view, dev(hp), dev(hf), f.attention_factor, style, offset);
          test::expect_elementwise_close(g.check(what), cpu, what);
          // Into another (strided) tensor: the rotated dims of the in-place result; x unchanged.
          test::Guarded src = test::guarded_strided({n, heads, d}, DType::F32);
          src.view.copy_from(x);
          test::Guarded into = test::guarded_strided({n, heads, int64_t(rot)}, DType::F32);
          ops::rope(src.view, dev(hp), dev(hf), f.attention_factor, style, offset, &into.view);
          test::expect_elementwise_close(into.check(what + " into"), cpu.narrow(2, offset, rot).contiguous(),
                                         what + " into");
          test::expect_bitwise(src.check(what + " source"), x.contiguous(), what + " source");
        }
      }
    }
  }
}

// ---------------------------------------------------------------- linear

// A weight of dtype dt [out, in]; fp8 with 128x128 block scales and slice offsets (row0, col0).
LinearWeight make_weight(DType dt, int64_t out, int64_t in, uint64_t seed, int64_t row0 = 0,
                         int64_t col0 = 0) {
  LinearWeight w;
  w.weight = table_of(dt, out, in, seed);
  if (dt == DType::F8_E4M3) {
    w.row0 = row0;
    w.col0 = col0;
    const int64_t so = (row0 + out + 127) / 128, si = (col0 + in + 127) / 128;
    std::vector<float> s = test::random_floats(size_t(so * si), seed + 1);
    for (float& v : s) v = 1e-3f * (1.5f + v);
    w.scale_inv = Tensor::from_f32(s, {so, si});
  }
  return w;
}

LinearWeight to_gpu(const LinearWeight& w) {
  LinearWeight d = w;
  d.weight = dev(w.weight);
  if (w.scale_inv.defined()) d.scale_inv = dev(w.scale_inv);
  return d;
}

TEST_F(CudaLinear, EveryWeightDtypeOddShapes) {
  for (DType dt : {DType::F32, DType::BF16, DType::F16, DType::F8_E4M3}) {
    for (auto [out_f, in_f, row0, col0] : std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t>>{
             {300, 260, 0, 0}, {1, 1, 0, 0}, {129, 128, 5, 17}, {257, 513, 127, 1}}) {
      const LinearWeight w = make_weight(dt, out_f, in_f, uint64_t(out_f + in_f), row0, col0);
      const LinearWeight dw = to_gpu(w);
      for (int64_t n : {0, 1, 3, 33}) {
        const std::string what = std::string("linear ") + std::string(dtype_name(dt)) + " [" +
                                 std::to_string(n) + "] x [" + std::to_string(out_f) + ", " +
                                 std::to_string(in_f) + "] offsets " + std::to_string(row0) + "," +
                                 std::to_string(col0);
        const Tensor x = test::rand_tensor({n, in_f}, uint64_t(n) + 77);
        Tensor cpu = Tensor::empty({n, out_f}, DType::F32);
        ops::linear(x, w, cpu);
        test::Guarded g = test::guarded_strided({n, out_f}, DType::F32);
        const Tensor dx = dev_strided(x);
        ops::linear(dx, dw, g.view);
        const Tensor got = g.check(what);
        test::expect_nmse_close(got, cpu, tol::kCudaGemmNmse, what);
        ops::linear(dx, dw, g.view);
        test::expect_bitwise(g.check(what), got, what + " repeat");
      }
      // Dequantisation itself is exact on both sides.
      const int64_t r0 = out_f > 3 ? 2 : 0, r1 = out_f > 3 ? out_f - 1 : out_f;
      test::expect_bitwise(ops::dequantize_rows(dw, r0, r1), ops::dequantize_rows(w, r0, r1),
                           std::string("dequantize_rows ") + std::string(dtype_name(dt)));
    }
  }
}

TEST_F(CudaLinear, ChunkedDequantisationAndZeroInputWidth) {
  // 4200 x 4100 bf16: more than one 64 MiB fp32 chunk.
  const LinearWeight w = make_weight(DType::BF16, 4200, 4100, 21);
  const Tensor x = test::rand_tensor({3, 4100}, 22);
  Tensor cpu = Tensor::empty({3, 4200}, DType::F32);
  ops::linear(x, w, cpu);
  Tensor g = Tensor::empty({3, 4200}, DType::F32, gpu());
  ops::linear(dev(x), to_gpu(w), g);
  test::expect_nmse_close(host(g), cpu, tol::kCudaGemmNmse, "chunked bf16 linear");

  LinearWeight empty_in;
  empty_in.weight = Tensor::empty({5, 0}, DType::F32);
  Tensor cz = Tensor::empty({2, 5}, DType::F32);
  ops::linear(Tensor::empty({2, 0}, DType::F32), empty_in, cz);
  test::Guarded gz = test::guarded({2, 5}, DType::F32);
  ops::linear(Tensor::empty({2, 0}, DType::F32, gpu()), to_gpu(empty_in), gz.view);
  test::expect_bitwise(gz.check("in = 0"), cz, "in = 0");
}

TEST_F(CudaLinear, BadFp8ScalesGiveTheCpuError) {
  LinearWeight w = make_weight(DType::F8_E4M3, 130, 40, 3);
  w.scale_inv = Tensor::from_f32({1, 2, 3}, {3, 1});  // wrong shape: [2, 1] expected
  const Tensor x = test::rand_tensor({2, 40}, 1);
  Tensor co = Tensor::empty({2, 130}, DType::F32);
  Tensor go = Tensor::empty({2, 130}, DType::F32, gpu());
  const std::string cpu_msg = test::error_of([&] { ops::linear(x, w, co); });
  const std::string gpu_msg = test::error_of([&] { ops::linear(dev(x), to_gpu(w), go); });
  EXPECT_FALSE(cpu_msg.empty());
  EXPECT_EQ(gpu_msg, cpu_msg);
}

// ---------------------------------------------------------------- sampling

TEST_F(CudaSampling, ArgmaxTiesNanAndOddVocabularies) {
  for (int64_t vocab : {1, 3, 129, 2049, 151552}) {
    const int64_t rows = 7;
    std::vector<float> v = test::random_floats(size_t(rows * vocab), uint64_t(vocab));
    auto at = [&](int64_t r, int64_t i) -> float& { return v[size_t(r * vocab + i)]; };
    if (vocab > 2) {
      for (int64_t i = 0; i < vocab; ++i) at(1, i) = float(i % 3 == 2);  // ties: first 2 wins
      at(2, 0) = NAN;                                                     // NaN first: 0
      at(3, vocab / 2) = NAN;                                             // NaN elsewhere ignored
      at(3, vocab - 1) = 5.0f;
      for (int64_t i = 0; i < vocab; ++i) at(4, i) = i % 2 ? -0.0f : 0.0f;  // -0 == +0: id 0
      at(5, vocab - 1) = INFINITY;
      for (int64_t i = 0; i < vocab; ++i) at(6, i) = -INFINITY;
    }
    const Tensor l = Tensor::from_f32(v, {rows, vocab});
    Tensor cpu = Tensor::empty({rows}, DType::I32);
    ops::argmax(l, cpu);
    test::Guarded g = test::guarded({rows}, DType::I32);
    ops::argmax(dev_strided(l), g.view);
    test::expect_same_i32(g.check("argmax"), cpu, "argmax vocab " + std::to_string(vocab));
  }
}

TEST_F(CudaSampling, DistributionAndSampleAreTheCpus) {
  const Tensor l = test::rand_tensor({1000}, 5, 4.0f);
  const Tensor dl = dev(l);
  for (float temp : {0.0f, 0.7f, 1.3f}) {
    for (float top_p : {0.5f, 1.0f}) {
      EXPECT_EQ(ops::token_distribution(dl, temp, top_p), ops::token_distribution(l, temp, top_p));
      for (double u : {0.0, 0.3, 0.999})
        EXPECT_EQ(ops::sample(dl, temp, top_p, u), ops::sample(l, temp, top_p, u));
    }
  }
}

}  // namespace
}  // namespace dsi

int main(int argc, char** argv) {
  bool listing = false;
  for (int i = 1; i < argc; ++i)
    if (std::strncmp(argv[i], "--gtest_list_tests", 18) == 0) listing = true;
  ::testing::InitGoogleTest(&argc, argv);
  if (!listing) {  // test discovery parses the listing: print nothing else then
    if (dsi::test::has_gpu())
      std::printf("dsinfer_cuda_tests: running on %s\n", dsi::cuda::device_description(0).c_str());
    else
      std::printf("dsinfer_cuda_tests: no CUDA device is visible (cudaGetDeviceCount failed or "
                  "returned 0): every test is skipped\n");
  }
  return RUN_ALL_TESTS();
}
