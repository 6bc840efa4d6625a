// The fp8-activation linear on the GPU (see fp8_gemm.h and backends/cpu/linear_fp8.cpp, the
// reference it mirrors step for step).
#include <cuda_fp8.h>

#include <algorithm>

#include "backends/cuda/common.cuh"
#include "backends/cuda/cuda_linear_fp8.h"
#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/linear/fp8_gemm.h"
#include "ops/linear.h"

namespace dsi::cuda {

namespace {

// One warp per (row, group): amax over the group, scale amax / 448 (1 when 0, NaN when the group
// holds a NaN), q = e4m3(x / scale) rounded to nearest even, saturated: the CPU's f32_to_e4m3.
__global__ void act_quant_kernel(const ActQuantParams p) {
  pdl_enter();
  const int lane = threadIdx.x & 31, wpb = blockDim.x >> 5;
  const int64_t items = p.n * p.groups, step = int64_t(gridDim.x) * wpb;
  for (int64_t item = int64_t(blockIdx.x) * wpb + (threadIdx.x >> 5); item < items; item += step) {
    const int64_t i = item / p.groups, g = item % p.groups;
    const int64_t j0 = max(int64_t(0), g * p.block - p.col0);
    const int64_t j1 = min(p.in, (g + 1) * p.block - p.col0);
    const float* xr = p.x + i * p.ldx;
    float amax = 0.0f;
    bool nan = false;
    for (int64_t j = j0 + lane; j < j1; j += 32) {
      const float v = xr[j];
      nan |= isnan(v);
      amax = fmaxf(amax, fabsf(v));
    }
    amax = warp_max(amax);
    nan = __any_sync(0xffffffffu, nan);
    float s = nan ? __uint_as_float(0x7fc00000u) : __fdiv_rn(amax, 448.0f);
    if (s == 0.0f) s = 1.0f;
    if (lane == 0) p.scales[i * p.scale_row + g * p.scale_group] = s;
    for (int64_t j = j0 + lane; j < j1; j += 32)
      p.q[i * p.in + j] = __nv_cvt_float_to_fp8(__fdiv_rn(xr[j], s), __NV_SATFINITE, __NV_E4M3);
  }
}

constexpr int kTileM = 64;  // rows of x per block
constexpr int kTileN = 64;  // output features per block
constexpr int kTileK = 32;  // columns per shared-memory stage
constexpr int kGemmThreads = 256;  // 16 x 16 threads, 4 x 4 outputs each

// y tile [64 x 64]; per weight column block g: part = sum of exact e4m3 products in increasing
// column order (an FMA of an exact product rounds like the CPU's add), then
// acc += part * (sx * sw) with each step rounded as on the CPU.
__global__ void __launch_bounds__(kGemmThreads) fp8_gemm_kernel(const Fp8GemmParams p) {
  pdl_enter();
  __shared__ float xs[kTileK][kTileM + 1];
  __shared__ float ws[kTileK][kTileN + 1];
  const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
  const int64_t m0 = int64_t(blockIdx.y) * kTileM, o0 = int64_t(blockIdx.x) * kTileN;
  const float* swr[4];
  for (int j = 0; j < 4; ++j) {
    const int64_t o = min(o0 + tx + 16 * j, p.out - 1);
    swr[j] = p.scale_inv + ((p.row0 + o) / p.block_out) * p.groups;
  }
  float acc[4][4];
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;

  for (int64_t g = 0; g < p.groups; ++g) {
    const int64_t j0 = max(int64_t(0), g * p.block_in - p.col0);
    const int64_t j1 = min(p.in, (g + 1) * p.block_in - p.col0);
    float part[4][4];
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 4; ++j) part[i][j] = 0.0f;
    for (int64_t kb = j0; kb < j1; kb += kTileK) {
      __syncthreads();  // the previous stage is read
      for (int e = threadIdx.x; e < kTileM * kTileK; e += kGemmThreads) {
        const int r = e / kTileK, k = e % kTileK;
        const int64_t col = kb + k;
        const bool in_k = col < j1;
        xs[k][r] = in_k && m0 + r < p.n ? e4m3_to_float(p.xq[(m0 + r) * p.in + col]) : 0.0f;
        ws[k][r] = in_k && o0 + r < p.out ? e4m3_to_float(p.w[(o0 + r) * p.in + col]) : 0.0f;
      }
      __syncthreads();
#pragma unroll 8
      for (int kk = 0; kk < kTileK; ++kk) {
        float a[4], b[4];
        for (int i = 0; i < 4; ++i) a[i] = xs[kk][ty + 16 * i];
        for (int j = 0; j < 4; ++j) b[j] = ws[kk][tx + 16 * j];
        for (int i = 0; i < 4; ++i)
          for (int j = 0; j < 4; ++j) part[i][j] = fmaf(a[i], b[j], part[i][j]);
      }
    }
    for (int i = 0; i < 4; ++i) {
      const int64_t m = m0 + ty + 16 * i;
      const float sxv = m < p.n ? p.sx[m * p.sx_row + g * p.sx_group] : 0.0f;
      for (int j = 0; j < 4; ++j)
        acc[i][j] = __fadd_rn(acc[i][j], __fmul_rn(part[i][j], __fmul_rn(sxv, swr[j][g])));
    }
  }
  for (int i = 0; i < 4; ++i) {
    const int64_t m = m0 + ty + 16 * i;
    if (m >= p.n) continue;
    for (int j = 0; j < 4; ++j) {
      const int64_t o = o0 + tx + 16 * j;
      if (o < p.out) p.y[m * p.ldy + o] = acc[i][j];
    }
  }
}


}  // namespace

void launch_act_quant_fp8(const ActQuantParams& p, cudaStream_t stream) {
  const int64_t items = p.n * p.groups;
  if (items == 0) return;
  const int64_t blocks = std::min<int64_t>((items + 7) / 8, 65536);
  launch(act_quant_kernel, unsigned(blocks), 256, 0, stream, p);
}

void launch_fp8_gemm(const Fp8GemmParams& p, cudaStream_t stream) {
  if (p.n == 0 || p.out == 0) return;
  DSI_CHECK((p.n + kTileM - 1) / kTileM <= 65535, "fp8 GEMM: {} rows beyond the grid", p.n);
  const dim3 grid(unsigned((p.out + kTileN - 1) / kTileN), unsigned((p.n + kTileM - 1) / kTileM));
  launch(fp8_gemm_kernel, grid, kGemmThreads, 0, stream, p);
}

void quantize_act_fp8(const Tensor& x, int64_t col0, int block, Tensor& q, Tensor& scales) {
  // Arguments checked by ops::quantize_act_fp8.
  const int64_t n = x.dim(0), in = x.dim(1), groups = (col0 + in + block - 1) / block;
  check_on(q, x.device(), "quantize_act_fp8", "q");
  check_on(scales, x.device(), "quantize_act_fp8", "scales");
  DeviceGuard guard(x.device());
  ActQuantParams p{};
  p.x = x.f32();
  p.q = static_cast<uint8_t*>(q.raw());
  p.scales = scales.f32();
  p.scale_row = groups;
  p.scale_group = 1;
  p.ldx = x.stride(0);
  p.n = n;
  p.in = in;
  p.groups = groups;
  p.col0 = col0;
  p.block = block;
  launch_act_quant_fp8(p, stream());
}

namespace {

// The GEMM's operands, x's scales in the tiled kernel's row-major layout.
Fp8GemmParams gemm_params(const Tensor& x, const LinearWeight& w, Tensor& out) {
  Fp8GemmParams gp{};
  gp.w = static_cast<const uint8_t*>(w.weight.raw());
  gp.scale_inv = w.scale_inv.f32();
  gp.y = out.f32();
  gp.ldy = out.stride(0);
  gp.n = x.dim(0);
  gp.in = w.in_features();
  gp.out = w.out_features();
  gp.block_out = w.block_out;
  gp.block_in = w.block_in;
  gp.groups = (w.col0 + gp.in + gp.block_in - 1) / gp.block_in;
  gp.row0 = w.row0;
  gp.col0 = w.col0;
  gp.sx_row = gp.groups;
  gp.sx_group = 1;
  return gp;
}

// cuBLASLt's form of the product: x padded to a multiple of 8 rows (zero bytes, scale 0; its
// scales are group-major with one 16-byte aligned run per group), and y written in place when
// aligned, else into a packed scratch copied out after.
struct LtForm {
  Fp8GemmParams gp;
  bool direct = true;  // D is y itself
};

LtForm lt_form(const Fp8GemmParams& base, const uint8_t* xq, const float* sx, float* packed_y) {
  LtForm f;
  f.gp = base;
  f.gp.n = (base.n + 7) / 8 * 8;
  f.gp.xq = xq;
  f.gp.sx = sx;
  f.gp.sx_row = 1;
  f.gp.sx_group = f.gp.n;
  f.direct = f.gp.n == base.n && base.ldy % 4 == 0 &&
             (reinterpret_cast<uintptr_t>(base.y) & 15u) == 0;
  if (!f.direct) {
    f.gp.y = packed_y;
    f.gp.ldy = (base.out + 3) / 4 * 4;
  }
  return f;
}

bool lt_ok(const LtForm& f) { return fp8_gemm_lt_supported(f.gp) && fp8_gemm_lt_available(f.gp); }

void run_linear_fp8_act(const Tensor& x, const LinearWeight& w, Tensor& out, bool allow_lt) {
  const Tensor& wt = w.weight;
  const int64_t out_f = w.out_features(), in_f = w.in_features(), n = x.dim(0);
  check_on(wt, x.device(), "linear_fp8_act", "weight");
  check_on(out, x.device(), "linear_fp8_act", "output");
  if (n == 0 || out_f == 0) return;
  DeviceGuard guard(x.device());
  Fp8GemmParams gp = gemm_params(x, w, out);
  const int64_t n_pad = (n + 7) / 8 * 8;
  Scratch q(std::max<size_t>(1, size_t(n_pad * in_f)));
  Scratch sx(std::max<size_t>(1, size_t(n_pad * gp.groups) * sizeof(float)));
  Scratch stand_in(256);  // an aligned address for the check before the packed output exists
  LtForm lt = lt_form(gp, q.as<uint8_t>(), sx.as<float>(), stand_in.as<float>());
  const bool use_lt = allow_lt && lt_ok(lt);
  Scratch packed;
  if (use_lt) {
    if (!lt.direct) {
      packed = Scratch(size_t(lt.gp.n * lt.gp.ldy) * sizeof(float));
      lt.gp.y = packed.as<float>();
    }
    if (lt.gp.n > n) {  // padding rows: zero bytes and zero scales
      DSI_CUDA_CHECK(cudaMemsetAsync(q.as<uint8_t>() + n * in_f, 0, size_t((lt.gp.n - n) * in_f),
                                     stream()));
      DSI_CUDA_CHECK(cudaMemsetAsync(sx.as<float>(), 0, size_t(lt.gp.n * gp.groups) * sizeof(float),
                                     stream()));
    }
    gp = lt.gp;
  } else {
    gp.xq = q.as<uint8_t>();
    gp.sx = sx.as<float>();
  }
  ActQuantParams qp{};
  qp.x = x.f32();
  qp.q = q.as<uint8_t>();
  qp.scales = sx.as<float>();
  qp.scale_row = gp.sx_row;
  qp.scale_group = gp.sx_group;
  qp.ldx = x.stride(0);
  qp.n = n;
  qp.in = in_f;
  qp.groups = gp.groups;
  qp.col0 = w.col0;
  qp.block = w.block_in;
  launch_act_quant_fp8(qp, stream());
  if (!use_lt) {
    launch_fp8_gemm(gp, stream());
    return;
  }
  Scratch ws(kFp8GemmLtWorkspace);
  DSI_CHECK(launch_fp8_gemm_lt(gp, ws.as<void>(), stream()),
            "linear_fp8_act: cuBLASLt refused a shape it had an algorithm for");
  if (!lt.direct)
    DSI_CUDA_CHECK(cudaMemcpy2DAsync(out.f32(), size_t(out.stride(0)) * sizeof(float), gp.y,
                                     size_t(gp.ldy) * sizeof(float), size_t(out_f) * sizeof(float),
                                     size_t(n), cudaMemcpyDeviceToDevice, stream()));
}

}  // namespace

void linear_fp8_act(const Tensor& x, const LinearWeight& w, Tensor& out) {
  // Arguments checked by ops::linear_fp8_act.
  run_linear_fp8_act(x, w, out, /*allow_lt=*/true);
}

void linear_fp8_act_tiled(const Tensor& x, const LinearWeight& w, Tensor& out) {
  run_linear_fp8_act(x, w, out, /*allow_lt=*/false);
}

bool linear_fp8_act_uses_tensor_cores(const Tensor& x, const LinearWeight& w, Tensor& out) {
  if (x.dim(0) == 0 || w.out_features() == 0) return false;
  DeviceGuard guard(x.device());
  Scratch buf(256);  // aligned stand-ins for the buffers the op would allocate
  return lt_ok(lt_form(gemm_params(x, w, out), buf.as<uint8_t>(), buf.as<float>(), buf.as<float>()));
}

}  // namespace dsi::cuda
