// CUDA op tests of the linear layers' fast paths: the weight-streaming GEMV that ops::linear uses
// for 1..8 rows (every weight dtype, odd shapes, fp8 slice offsets and block sizes, aligned and
// unaligned operands, GLM-5 decode shapes) and the fp8-activation GEMM (ops::linear_fp8_act and its
// quantiser). Each case runs the CPU reference and the GPU on the same inputs; outputs sit inside
// NaN-guarded buffers; repeated runs must be bitwise equal. Without a visible GPU every test skips.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/cpu_linear_fp8.h"
#include "backends/cuda/cuda_linear_fp8.h"
#include "backends/cuda/cuda_ops.h"
#include "core/dtype.h"
#include "cuda/cuda_test_util.h"
#include "ops/linear.h"

namespace dsi {
namespace {

using test::dev;
using test::dev_strided;
using test::gpu;
using test::host;

// The fp8-activation GEMM against the CPU reference of the same formula: both quantise x
// identically (bitwise, checked separately) and sum each block's exact e4m3 products in the same
// order, so they agree to the last bit; the bound only admits fp32 reassociation noise in case a
// later tensor-core kernel sums in another order (measured 0 for the tiled kernel).
constexpr double kFp8ActGpuVsCpuNmse = 1e-12;
// cuBLASLt's block-scaled fp8 GEMM on the same quantised operands: its tensor cores accumulate each
// 128-column block in their own order and precision before the fp32 promotion.
constexpr double kFp8ActTensorCoresVsCpuNmse = 1e-7;
// ... and against the exact fp32 linear: the e4m3 quantisation of x (see tests/test_ops_linear_fp8.cpp).
constexpr double kFp8ActVsExactNmse = 2e-3;

// The GEMV and the fp32 GEMMs over dequantised weights, against the CPU's fp32 products: more than
// the GEMV's rows of fp8 weights take the dequantising path here (cuda::fp8_prefill off), as the
// fp8-activation path has its own reference (CudaLinearFp8Act).
class CudaLinearGemv : public test::CudaTest {
 protected:
  void SetUp() override {
    test::CudaTest::SetUp();
    was_ = cuda::fp8_prefill();
    cuda::set_fp8_prefill(false);
  }
  void TearDown() override { cuda::set_fp8_prefill(was_); }

 private:
  bool was_ = false;
};
class CudaLinearFp8Act : public test::CudaTest {};

std::string case_name(const char* kind, DType dt, int64_t n, int64_t out, int64_t in) {
  return std::string(kind) + " " + std::string(dtype_name(dt)) + " x[" + std::to_string(n) + ", " +
         std::to_string(in) + "] W[" + std::to_string(out) + ", " + std::to_string(in) + "]";
}

using test::make_weight;
using test::to_gpu;

// ops::linear on the CPU and the GPU; x contiguous (the aligned vector path when the weight allows)
// and row-strided (unaligned rows: packed first), outputs guarded, a repeat bitwise equal.
void check_linear(const LinearWeight& w, int64_t n, uint64_t seed, const std::string& what,
                  int nan_row = -1) {
  const int64_t out_f = w.out_features(), in_f = w.in_features();
  Tensor x = test::rand_tensor({n, in_f}, seed);
  if (nan_row >= 0 && nan_row < n && in_f > 0) x.f32()[nan_row * in_f + in_f / 2] = NAN;
  Tensor cpu = Tensor::empty({n, out_f}, DType::F32);
  ops::linear(x, w, cpu);
  const LinearWeight dw = to_gpu(w);
  for (bool strided : {false, true}) {
    const std::string w2 = what + (strided ? " (strided x, strided out)" : " (contiguous x and out)");
    test::Guarded g = strided ? test::guarded_strided({n, out_f}, DType::F32)
                              : test::guarded({n, out_f}, DType::F32);
    const Tensor dx = strided ? dev_strided(x) : dev(x);
    // With a NaN row the guard check would take its NaN outputs for unwritten ones: read the view
    // directly then (the special-value maps are still compared).
    auto result = [&](const std::string& label) {
      return nan_row >= 0 ? g.make_view(host(g.dbuf)).contiguous() : g.check(label);
    };
    ops::linear(dx, dw, g.view);
    const Tensor got = result(w2);
    test::expect_nmse_close(got, cpu, tol::kCudaGemmNmse, w2);
    ops::linear(dx, dw, g.view);
    test::expect_bitwise(result(w2 + " repeat"), got, w2 + " repeat");
  }
}

// x of n rows whose 128-column block b is scaled by 2^(step b - 20) (the tensor-core kernels give
// each block its own scale) against an fp8 [out, in] weight with 128x128 blocks: ops::linear on the
// GPU against the CPU, in one launch of the kernel that `launches` counts.
void check_scaled_x_blocks(int64_t n, int64_t out, int64_t in, int step, uint64_t seed, uint64_t (*launches)(),
                           const std::string& what) {
  const LinearWeight w = make_weight(DType::F8_E4M3, out, in, seed, 0, 0, 128, 128);
  Tensor x = test::rand_tensor({n, in}, seed + 1);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < in; ++j) x.f32()[r * in + j] *= std::ldexp(1.0f, int(j / 128) * step - 20);
  Tensor cpu = Tensor::empty({n, out}, DType::F32);
  ops::linear(x, w, cpu);
  Tensor g = Tensor::empty({n, out}, DType::F32, gpu());
  const uint64_t before = launches();
  ops::linear(dev(x), to_gpu(w), g);
  EXPECT_EQ(launches() - before, 1u) << what;
  test::expect_nmse_close(host(g), cpu, tol::kCudaGemmNmse, what);
}

TEST_F(CudaLinearGemv, EveryDtypeOddShapes) {
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {1, 1}, {127, 128}, {128, 129}, {129, 127}, {1, 2048}, {2049, 128}, {131, 2056}, {67, 2053}};
  for (DType dt : {DType::F32, DType::BF16, DType::F16, DType::F8_E4M3})
    for (auto [out_f, in_f] : shapes)
      for (int64_t n : {1, 2, 3, 5, 8, 9}) {
        const LinearWeight w = make_weight(dt, out_f, in_f, uint64_t(out_f * 3 + in_f + n));
        check_linear(w, n, uint64_t(n * 1000 + in_f), case_name("linear", dt, n, out_f, in_f));
      }
}

TEST_F(CudaLinearGemv, Fp8SliceOffsetsAndBlockSizes) {
  struct Case {
    int64_t out, in, row0, col0;
    int bo, bi;
    const char* note;
  };
  for (const Case& c : std::vector<Case>{
           {129, 256, 5, 16, 128, 128, "col0 % 16 == 0: vector kernel"},
           {300, 512, 127, 112, 128, 128, "offsets at the block ends"},
           {257, 384, 3, 17, 128, 128, "col0 % 16 != 0: element-wise kernel"},
           {200, 320, 0, 0, 64, 64, "64 x 64 blocks"},
           {200, 320, 10, 0, 100, 100, "100 x 100 blocks: element-wise kernel"},
           {64, 160, 0, 8, 16, 16, "16-column blocks, col0 8"},
           {70, 96, 0, 0, 1, 1, "1 x 1 blocks"}}) {
    const LinearWeight w = make_weight(DType::F8_E4M3, c.out, c.in, uint64_t(c.out + c.in), c.row0,
                                       c.col0, c.bo, c.bi);
    for (int64_t n : {1, 3, 8}) {
      const std::string what = case_name("fp8 linear", DType::F8_E4M3, n, c.out, c.in) + " offsets " +
                               std::to_string(c.row0) + "," + std::to_string(c.col0) + " blocks " +
                               std::to_string(c.bo) + "x" + std::to_string(c.bi) + " (" + c.note + ")";
      check_linear(w, n, uint64_t(n + c.in), what);
    }
  }
}

// Restores the GEMV plan switches a test changes.
struct GemvSwitches {
  bool tensor_cores = cuda::gemv_tensor_cores();
  bool one_row = cuda::gemv_mma_one_row();
  bool tma = cuda::gemv_tma();
  int row_groups = cuda::gemv_row_groups_per_warp();
  ~GemvSwitches() {
    cuda::set_gemv_tensor_cores(tensor_cores);
    cuda::set_gemv_mma_one_row(one_row);
    cuda::set_gemv_tma(tma);
    cuda::set_gemv_row_groups_per_warp(row_groups);
  }
};

// GLM-5 decode shapes (and cut-down ones) that exercise every plan: rows split between 8 warps
// (o_proj, 16 KiB fp8 rows), 1, 2 and 4 rows per warp, streamed row groups (q_b: 16384 rows); NaN
// in one x row (its outputs NaN). fp8: the tensor-core kernels (the default: the tensor-map kernel
// for one row, the mma kernel for several) and the FMA kernels.
TEST_F(CudaLinearGemv, DecodeShapes) {
  struct Case {
    DType dt;
    int64_t out, in;
  };
  GemvSwitches restore;
  for (const Case& c : std::vector<Case>{{DType::F8_E4M3, 6144, 16384},
                                         {DType::F8_E4M3, 2048, 6144},
                                         {DType::F8_E4M3, 6144, 2048},
                                         {DType::F8_E4M3, 16384, 2048},
                                         {DType::BF16, 6144, 4096},
                                         {DType::BF16, 2048, 6144},
                                         {DType::F16, 1000, 8192},
                                         {DType::F32, 3000, 2048}})
    for (int64_t n : {1, 4, 8})
      for (bool tc : {true, false}) {
        if (!tc && c.dt != DType::F8_E4M3) continue;
        cuda::set_gemv_tensor_cores(tc);
        cuda::set_gemv_tma(tc);
        const LinearWeight w = make_weight(c.dt, c.out, c.in, uint64_t(c.out ^ c.in));
        check_linear(w, n, uint64_t(n + 17),
                     case_name("decode linear", c.dt, n, c.out, c.in) + (tc ? "" : " (FMA kernels)"),
                     n > 1 ? 1 : -1);
      }
}

// Streamed row groups (each warp several row groups through its ring, one after the other), forced
// on shapes too small for the plan to choose it: a last block and a last row group cut short, rows
// whose last stretch only some lanes hold (67 x 2064 fp8: 129 chunks; 300 x 1000 bf16: 125), fp8
// slice offsets; 1, 2 and 5 rows of x (fp8 with 5 rows goes to the tensor cores unless they are off).
TEST_F(CudaLinearGemv, StreamedRowGroups) {
  struct Case {
    DType dt;
    int64_t out, in, row0, col0;
  };
  GemvSwitches restore;
  cuda::set_gemv_tensor_cores(false);
  for (int rgw : {2, 3, 7}) {
    cuda::set_gemv_row_groups_per_warp(rgw);
    for (const Case& c : std::vector<Case>{{DType::F8_E4M3, 67, 2064, 0, 0},
                                           {DType::F8_E4M3, 2049, 6144, 5, 16},
                                           {DType::F8_E4M3, 300, 512, 127, 112},
                                           {DType::BF16, 300, 1000, 0, 0},
                                           {DType::F32, 129, 260, 0, 0}})
      for (int64_t n : {1, 2, 5}) {
        const LinearWeight w = make_weight(c.dt, c.out, c.in, uint64_t(c.out + c.in + rgw), c.row0, c.col0);
        check_linear(w, n, uint64_t(n + 3 * rgw),
                     case_name("streamed linear", c.dt, n, c.out, c.in) + " row groups per warp " +
                         std::to_string(rgw),
                     n > 1 ? 1 : -1);
      }
  }
}

// The tensor-core GEMV (3..8 rows of fp8 weights with 128-column blocks, 2 rows on >= 4096 rows,
// and 1 row there too when switched on: its hi and lo halves as two columns of one MMA; never
// below 1024 rows): the CPU reference's results within the GEMM tolerance (x enters as two
// f16 halves of a power-of-two scaled block: 22 bits), a NaN in one x row only in that row's
// outputs, a repeat bitwise equal; contiguous and strided x. Shapes: GLM-5 projections, slices
// whose rows start in the middle of a scale block, a last row group of one row, and x blocks of
// very different magnitudes (the per-block scale); a product of 256 rows stays on the FMA kernels.
TEST_F(CudaLinearGemv, TensorCoreKernelMatches) {
  struct Case {
    int64_t out, in, row0, col0;
  };
  GemvSwitches restore;
  cuda::set_gemv_tensor_cores(true);
  for (const Case& c : std::vector<Case>{{6144, 16384, 0, 0},
                                         {2048, 6144, 0, 0},
                                         {16384, 2048, 0, 0},
                                         {1153, 256, 5, 0},
                                         {1100, 384, 127, 0},
                                         {1057, 128, 0, 0},
                                         {256, 256, 0, 0}}) {
    const LinearWeight w = make_weight(DType::F8_E4M3, c.out, c.in, uint64_t(c.out + 7 * c.in), c.row0,
                                       c.col0, 128, 128);
    for (int64_t n : {1, 2, 3, 4, 5, 8}) {
      const std::string what = case_name("tensor-core linear", DType::F8_E4M3, n, c.out, c.in) + " offsets " +
                               std::to_string(c.row0) + "," + std::to_string(c.col0);
      cuda::set_gemv_mma_one_row(n == 1);
      const uint64_t before = cuda::gemv_tensor_core_launches();
      check_linear(w, n, uint64_t(n * 31 + c.in), what, n > 2 ? 1 : -1);
      const uint64_t expected = (n >= 3 || c.out >= 4096) && c.out >= 1024 ? 4u : 0u;
      EXPECT_EQ(cuda::gemv_tensor_core_launches() - before, expected) << what << ": tensor-core launches";
    }
  }
  // x blocks from 1e-6 to 3e4.
  check_scaled_x_blocks(4, 1024, 1024, 5, 77, cuda::gemv_tensor_core_launches, "tensor-core linear, scaled x blocks");
}

// The one-row tensor-map kernel (gemv_tma.cu): the plans it takes on an H200's 132 SMs, and the CPU
// reference's results within the GEMM tolerance (x as two f16 halves of a power-of-two scaled
// block, as the mma kernel), a NaN in x in every output, a repeat bitwise equal, contiguous and
// strided x. Shapes: GLM-5's o_proj (4 warps a tile, 256-byte pieces) and q_b (8 warps of one tile,
// 512-byte pieces), a last tile of 2 rows with rows of 2304 bytes (1 warp a tile, 256-byte pieces),
// 36864 rows (each warp two tiles in turn), a slice starting one tile into its scale block (one
// starting 5 rows in stays on the FMA kernels: its tiles would straddle scale blocks); x blocks of
// very different magnitudes; GLM-5's in_proj (two tiles on 88 SMs). A product that would leave most
// SMs idle stays on the FMA kernels.
TEST_F(CudaLinearGemv, TensorMapKernelMatches) {
  GemvSwitches restore;
  cuda::set_gemv_tma(true);
  cuda::set_gemv_mma_one_row(false);
  auto plan_of = [](int64_t out, int64_t in) { return cuda::gemv_tma_plan_for(out, in, 132); };
  EXPECT_EQ(plan_of(6144, 16384), (std::array<int, 4>{3, 4, 1, 256}));
  EXPECT_EQ(plan_of(16384, 2048), (std::array<int, 4>{8, 1, 1, 512}));
  EXPECT_EQ(plan_of(2050, 2304), (std::array<int, 4>{1, 1, 1, 256}));
  EXPECT_EQ(plan_of(36864, 1024), (std::array<int, 4>{9, 1, 2, 512}));
  EXPECT_EQ(plan_of(1000, 2048)[0], 0);  // 63 tiles: most SMs would idle
  // 176 tiles (GLM-5's in_proj): two on 88 SMs, the rest idle, yet faster than the FMA kernels.
  EXPECT_EQ(plan_of(2816, 6144), (std::array<int, 4>{2, 4, 1, 512}));
  struct Case {
    int64_t out, in, row0;
    int nan_row;
    bool tma;  // the plan takes the tensor-map kernel
  };
  for (const Case& c : std::vector<Case>{{6144, 16384, 0, -1, true},
                                         {16384, 2048, 0, 0, true},
                                         {2050, 2304, 0, -1, true},
                                         {2816, 6144, 0, -1, true},
                                         {36864, 1024, 0, -1, true},
                                         {4096, 1024, 16, -1, true},
                                         {4096, 1024, 5, -1, false},  // tiles would straddle scale rows
                                         {1000, 2048, 0, -1, false}}) {
    const LinearWeight w =
        make_weight(DType::F8_E4M3, c.out, c.in, uint64_t(3 * c.out + c.in), c.row0, 0, 128, 128);
    const std::string what =
        case_name("tensor-map linear", DType::F8_E4M3, 1, c.out, c.in) + " row offset " + std::to_string(c.row0);
    const uint64_t before = cuda::gemv_tma_launches();
    check_linear(w, 1, uint64_t(c.out + 5), what, c.nan_row);
    EXPECT_EQ(cuda::gemv_tma_launches() - before, c.tma ? 4u : 0u) << what << ": tensor-map launches";
  }
  // x blocks from 1e-6 to 3e7.
  check_scaled_x_blocks(1, 4096, 2048, 3, 79, cuda::gemv_tma_launches, "tensor-map linear, scaled x blocks");
}

// ops::rms_norm_linear: one row of fp8 weights that the tensor-map kernel takes runs the RMSNorm in
// that kernel's prologue (one launch, x left as it was; rms_norm_linear_fuses says so beforehand);
// more rows, and a product the plan leaves to the FMA kernels, run the norm and the linear. Each against the CPU's norm then linear (the GEMV's
// tolerance), a repeat bitwise equal; x with a large scale (the norm's sum of squares) and a NaN
// (every output NaN). q_b's shape and a 2-row, 2304-column one.
TEST_F(CudaLinearGemv, RmsNormInFrontOfTheProduct) {
  GemvSwitches restore;
  const bool norm_was = cuda::norm_in_gemv();
  cuda::set_norm_in_gemv(true);
  cuda::set_gemv_tma(true);
  cuda::set_gemv_mma_one_row(false);
  struct Case {
    int64_t out, in, n;
    float x_scale;
    bool nan, fused;
  };
  for (const Case& c : std::vector<Case>{{16384, 2048, 1, 1.0f, false, true},
                                         {16384, 2048, 1, 3e4f, false, true},
                                         {2050, 2304, 1, 1e-3f, false, true},
                                         {16384, 2048, 1, 1.0f, true, true},
                                         {16384, 2048, 3, 1.0f, false, false},
                                         {1000, 2048, 1, 1.0f, false, false}}) {
    const std::string what = case_name("rms_norm_linear", DType::F8_E4M3, c.n, c.out, c.in) + " x scale " +
                             std::to_string(c.x_scale) + (c.nan ? " NaN" : "");
    const LinearWeight w = make_weight(DType::F8_E4M3, c.out, c.in, uint64_t(c.out + 7 * c.in), 0, 0, 128, 128);
    Tensor x = test::rand_tensor({c.n, c.in}, uint64_t(c.in + c.n));
    for (int64_t i = 0; i < x.numel(); ++i) x.f32()[i] *= c.x_scale;
    if (c.nan) x.f32()[c.in / 3] = NAN;
    Tensor norm_w = test::rand_tensor({c.in}, 41);
    for (int64_t j = 0; j < c.in; ++j) norm_w.f32()[j] += 1.0f;
    Tensor cpu = Tensor::empty({c.n, c.out}, DType::F32);
    ops::rms_norm_linear(x, norm_w, 1e-6f, w, cpu);
    const LinearWeight dw = to_gpu(w);
    const Tensor dx = dev(x), dn = dev(norm_w);
    Tensor g = Tensor::empty({c.n, c.out}, DType::F32, gpu());
    EXPECT_EQ(ops::rms_norm_linear_fuses(dx, dn, dw), c.fused) << what;
    const uint64_t before = cuda::gemv_tma_launches();
    ops::rms_norm_linear(dx, dn, 1e-6f, dw, g);
    EXPECT_EQ(cuda::gemv_tma_launches() - before, c.fused ? 1u : 0u) << what << ": tensor-map launches";
    const Tensor got = host(g);
    if (c.nan) {
      for (int64_t o = 0; o < c.out; ++o)
        if (!std::isnan(got.f32()[o])) {
          ADD_FAILURE() << what << ": output " << o << " is " << got.f32()[o] << ", not NaN";
          break;
        }
    } else {
      test::expect_nmse_close(got, cpu, tol::kCudaGemmNmse, what);
    }
    test::expect_bitwise(host(dx), x, what + ": x untouched");
    ops::rms_norm_linear(dx, dn, 1e-6f, dw, g);
    test::expect_bitwise(host(g), got, what + " repeat");
  }
  cuda::set_norm_in_gemv(norm_was);
}

TEST_F(CudaLinearGemv, SixtyFourRowsStillMatch) {  // the sgemm path next to the GEMV's boundary
  for (DType dt : {DType::BF16, DType::F8_E4M3}) {
    const LinearWeight w = make_weight(dt, 129, 257, 9, 3, 5);
    check_linear(w, 64, 10, case_name("linear", dt, 64, 129, 257));
  }
}

// ---------------------------------------------------------------- fp8 activations

// With cuda::fp8_prefill on (DSI_FP8_PREFILL=1), ops::linear of more than the GEMV's rows of an fp8
// weight is the fp8-activation linear, bit for bit; up to the GEMV's rows it is the GEMV.
TEST_F(CudaLinearFp8Act, PrefillRowsOfFp8WeightsTakeIt) {
  const bool was = cuda::fp8_prefill();
  cuda::set_fp8_prefill(true);
  const LinearWeight w = to_gpu(make_weight(DType::F8_E4M3, 384, 512, 21, 0, 0, 128, 128));
  for (int64_t n : {9, 64, 300}) {
    const Tensor x = dev(test::rand_tensor({n, 512}, uint64_t(n)));
    Tensor a = Tensor::empty({n, 384}, DType::F32, gpu()), b = Tensor::empty({n, 384}, DType::F32, gpu());
    ops::linear(x, w, a);
    ops::linear_fp8_act(x, w, b);
    test::expect_bitwise(host(a), host(b), "fp8 prefill rows " + std::to_string(n));
  }
  cuda::set_fp8_prefill(was);
}

TEST_F(CudaLinearFp8Act, QuantiserIsBitwiseTheCpus) {
  for (auto [n, in, col0] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {1, 1, 0}, {3, 127, 0}, {5, 128, 0}, {2, 129, 1}, {9, 2053, 100}, {64, 700, 64}}) {
    const int block = 128;
    const int64_t groups = (col0 + in + block - 1) / block;
    Tensor x = test::rand_tensor({n, in}, uint64_t(n + in));
    for (int64_t i = 0; i < n; ++i)  // magnitudes from 2^-20 to 2^10, some subnormal in e4m3
      for (int64_t j = 0; j < in; ++j) x.f32()[i * in + j] *= std::ldexp(1.0f, int((i * 7 + j / 128) % 31) - 20);
    if (n > 2) {
      for (int64_t j = 0; j < in; ++j) x.f32()[in + j] = 0.0f;  // an all-zero row
      x.f32()[2 * in] = INFINITY;
    }
    const std::string what = "quantize_act_fp8 x[" + std::to_string(n) + ", " + std::to_string(in) +
                             "] col0 " + std::to_string(col0);
    Tensor q = Tensor::empty({n, in}, DType::F8_E4M3), s = Tensor::empty({n, groups}, DType::F32);
    ops::quantize_act_fp8(x, col0, block, q, s);
    Tensor dq = Tensor::empty({n, in}, DType::F8_E4M3, gpu());
    test::Guarded gs = test::guarded({n, groups}, DType::F32);
    ops::quantize_act_fp8(dev_strided(x), col0, block, dq, gs.view);
    const Tensor hq = host(dq);
    int bad = 0;
    for (int64_t i = 0; i < n * in; ++i) {
      const uint8_t a = static_cast<const uint8_t*>(hq.raw())[i], b = static_cast<const uint8_t*>(q.raw())[i];
      const bool both_nan = (a & 0x7f) == 0x7f && (b & 0x7f) == 0x7f;  // the NaN's sign is free
      if (a != b && !both_nan && bad++ < 5)
        ADD_FAILURE() << what << ": q[" << i / in << ", " << i % in << "] GPU 0x" << std::hex << int(a)
                      << " CPU 0x" << int(b) << std::dec << " (x " << x.f32()[i] << ")";
    }
    EXPECT_EQ(bad, 0) << what << ": quantised bytes differ";
    test::expect_bitwise(gs.check(what + " scales"), s, what + " scales");
  }
}

// Which GEMM a case must take: the tiled kernel, cuBLASLt's (an H200 has it for every supported
// shape), or whichever the op picks.
enum class Path { kTiled, kTensorCores };

void check_fp8_act(int64_t n, int64_t out_f, int64_t in_f, int64_t row0, int64_t col0, uint64_t seed,
                   Path path = Path::kTiled, bool strided_out = true) {
  const std::string what = case_name("linear_fp8_act", DType::F8_E4M3, n, out_f, in_f) + " offsets " +
                           std::to_string(row0) + "," + std::to_string(col0);
  const LinearWeight w = make_weight(DType::F8_E4M3, out_f, in_f, seed, row0, col0);
  const Tensor x = test::rand_tensor({n, in_f}, seed + 5);
  Tensor cpu = Tensor::empty({n, out_f}, DType::F32), exact = Tensor::empty({n, out_f}, DType::F32);
  ops::linear_fp8_act(x, w, cpu);
  ops::linear(x, w, exact);
  const LinearWeight dw = to_gpu(w);
  // cuBLASLt writes a 16-byte aligned contiguous output (36 guard floats) in place when the rows
  // are a multiple of 8; other outputs through a packed copy.
  test::Guarded g = strided_out ? test::guarded_strided({n, out_f}, DType::F32)
                                : test::guarded({n, out_f}, DType::F32, 36);
  const Tensor dx = dev_strided(x);
  const bool tc = cuda::linear_fp8_act_uses_tensor_cores(dx, dw, g.view);
  EXPECT_EQ(tc, path == Path::kTensorCores) << what;
  ops::linear_fp8_act(dx, dw, g.view);
  const Tensor got = g.check(what);
  test::expect_nmse_close(got, cpu, tc ? kFp8ActTensorCoresVsCpuNmse : kFp8ActGpuVsCpuNmse,
                          what + " vs CPU fp8 reference");
  if (in_f >= 128) test::expect_nmse_close(got, exact, kFp8ActVsExactNmse, what + " vs exact linear");
  int64_t differ = 0;
  for (int64_t i = 0; i < got.numel(); ++i) differ += std::memcmp(&got.f32()[i], &cpu.f32()[i], 4) != 0;
  if (differ)
    std::printf("[ info ] %s (%s): %lld of %lld outputs not bitwise the CPU's, NMSE %.3g\n",
                what.c_str(), tc ? "cuBLASLt" : "tiled", static_cast<long long>(differ),
                static_cast<long long>(got.numel()), test::nmse(got, cpu));
  ops::linear_fp8_act(dx, dw, g.view);
  test::expect_bitwise(g.check(what + " repeat"), got, what + " repeat");
  if (tc) {  // the tiled kernel on the same operands stays the reference's bit for bit
    test::Guarded t = test::guarded({n, out_f}, DType::F32, 36);
    cuda::linear_fp8_act_tiled(dx, dw, t.view);
    test::expect_nmse_close(t.check(what + " tiled"), cpu, kFp8ActGpuVsCpuNmse, what + " tiled");
  }
}

TEST_F(CudaLinearFp8Act, OddShapesMatchTheCpuReference) {
  for (int64_t n : {1, 2, 3, 5, 8, 9, 64, 130})
    for (auto [out_f, in_f, row0, col0] : std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t>>{
             {1, 1, 0, 0}, {127, 128, 0, 0}, {129, 129, 5, 17}, {65, 2053, 127, 1}, {200, 384, 64, 64}})
      check_fp8_act(n, out_f, in_f, row0, col0, uint64_t(n * 31 + out_f + in_f));
}

// Shapes cuBLASLt takes: 4, 8, ... column blocks, a partial last block of rows and of columns, rows
// padded to 8 or not, outputs in place or through the packed copy.
TEST_F(CudaLinearFp8Act, TensorCoreShapesMatchTheCpuReference) {
  for (int64_t n : {1, 3, 8, 9, 16, 130})
    for (auto [out_f, in_f] : std::vector<std::pair<int64_t, int64_t>>{{128, 512}, {200, 512}, {260, 1008}})
      for (bool strided : {false, true})
        check_fp8_act(n, out_f, in_f, 0, 0, uint64_t(n * 17 + out_f + in_f), Path::kTensorCores,
                      strided);
}

TEST_F(CudaLinearFp8Act, GlmShapes) {
  check_fp8_act(64, 2048, 6144, 0, 0, 1, Path::kTensorCores, false);
  check_fp8_act(33, 6144, 2048, 0, 0, 2, Path::kTensorCores);
  // A TP slice inside the first block (offsets) stays with the tiled kernel.
  check_fp8_act(33, 3072, 2048, 64, 0, 3);
}

TEST_F(CudaLinearFp8Act, NanRowAndErrors) {
  const LinearWeight w = make_weight(DType::F8_E4M3, 40, 300, 4);
  Tensor x = test::rand_tensor({3, 300}, 5);
  x.f32()[300 + 200] = NAN;
  Tensor cpu = Tensor::empty({3, 40}, DType::F32);
  ops::linear_fp8_act(x, w, cpu);
  test::Guarded g = test::guarded({3, 40}, DType::F32);
  const LinearWeight dw = to_gpu(w);
  ops::linear_fp8_act(dev(x), dw, g.view);
  // The guard check also flags NaN outputs as unwritten, so compare the special maps directly.
  const Tensor got = host(g.dbuf);
  const Tensor view = test::contiguous_view_in(got, {3, 40}, 37).contiguous();
  test::expect_same_specials(view, cpu, "linear_fp8_act NaN row");
  LinearWeight bf = make_weight(DType::BF16, 40, 300, 6);
  Tensor o2 = Tensor::empty({3, 40}, DType::F32);
  const std::string cpu_msg = test::error_of([&] { ops::linear_fp8_act(x, bf, o2); });
  Tensor go = Tensor::empty({3, 40}, DType::F32, gpu());
  const std::string gpu_msg = test::error_of([&] { ops::linear_fp8_act(dev(x), to_gpu(bf), go); });
  EXPECT_FALSE(cpu_msg.empty());
  EXPECT_EQ(gpu_msg, cpu_msg);
}

}  // namespace
}  // namespace dsi
