// Prototype, not used by the engine: a one-row fp8 GEMV (y = W x, 128x128 block
// scales) whose weights reach shared memory through tensor-map copies
// (cp.async.bulk.tensor, one per ring stage) and are summed on the tensor cores
// (mma.sync). Measured against the shipped GEMV in docs/decode-performance.md
// ("One-row GEMV on tensor cores fed by tensor-map copies").
//
// Each warp owns a tile of 16 rows and streams a contiguous K range of it
// (k_split warps share a tile and add their sums in warp order) through its own
// ring of `ST` stages of 16 rows x S bytes, written in the 128-byte swizzle; a
// stage is read into registers and handed back to the copy engine before it is
// summed. x is split once per block into shared memory, per 128-column block
// scaled by a power of two:
//   f16:  hi = f16(x s), lo = f16(x s - hi); B column 0 holds hi, column 1 lo
//   (mma m16n8k16,
//         weights e4m3 -> f16 with cvt), the gemv.cu tensor-core kernel's
//         numerics;
//   fp8:  x s = t0 + t1 / 16 + t2 / 256 + t3 / 4096 with every term e4m3; B
//   column i holds term i
//         (mma m16n8k32 on the raw weight bytes, no conversion);
//   loads: the copies alone (the ring drained without any math), the bound of
//   the scheme.
// The scales of the block's tiles are read into shared memory before the
// programmatic wait.
//   bench_gemv_tma [--reps N] [--only PRODUCT] [--variant "f16 256x3"] [--shape 3x4x1]
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "backends/cuda/common.cuh"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/ptx.cuh"
#include "bench_fill.cuh"
#include "bench_util.h"

namespace {

using namespace dsi::cuda;

enum class Mode { kLoads, kF16, kFp8Terms };
constexpr int kTerms = 4;          // e4m3 terms of x (kFp8Terms)
constexpr int kScaleSlots = 1024;  // shared floats for the block's weight scales

struct Params {
  const float* sinv;  // [ceil(out / 128), K / 128]
  const float* x;     // [K]
  float* y;           // [out]
  int out, K;
  int tiles_per_warp, k_split,
      warp_tiles;  // warp_tiles: warps per block / k_split
};

__device__ __forceinline__ void mma_e4m3(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Bytes of shared memory for x: f16 hi and lo (or the kTerms e4m3 terms), and 1
// / s per block.
__host__ __device__ constexpr size_t x_bytes(int K) {
  return (size_t(K) * 4 + 32 + size_t(K / 128) * 4 + 127) / 128 * 128;
}

// The power of two s of a block whose largest magnitude is m: f16 puts m s in
// [2^14, 2^15), e4m3 in [2^7, 2^8). As a biased fp32 exponent; 127 (s = 1) for
// 0, inf or NaN.
__device__ __forceinline__ int scale_exponent(float m, int top) {
  const int e = int((__float_as_uint(m) >> 23) & 0xffu);
  if (m == 0.0f || e == 255) return 127;
  return min(253, max(1, 127 + top - (e - 127)));
}
__device__ __forceinline__ float pow2(int biased) { return __uint_as_float(uint32_t(biased) << 23); }

template <int S, int ST, Mode M>
__global__ void __launch_bounds__(512, 1) gemv_tma_kernel(const Params p, const __grid_constant__ CUtensorMap map) {
  extern __shared__ __align__(128) uint8_t smem[];
  constexpr int kChunks = S / 128;  // 128-byte lines per row and stage
  const int warps = p.warp_tiles * p.k_split, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3, K = p.K;
  uint64_t* bar = reinterpret_cast<uint64_t*>(smem) + warp * ST;
  uint16_t* xh = reinterpret_cast<uint16_t*>(smem + 1024);
  uint16_t* xl = xh + K + 8;  // 16 bytes on: hi and lo lanes read other banks
  float* xinv = reinterpret_cast<float*>(xl + K + 8);
  uint8_t* xt = reinterpret_cast<uint8_t*>(xh);  // kFp8Terms: [K / 64][kTerms][4][16]
  uint8_t* ring = smem + 1024 + (M == Mode::kLoads ? 0 : x_bytes(K));
  ring += (1024 - (smem_addr(ring) & 1023)) & 1023;  // the swizzle's alignment
  uint8_t* mine = ring + size_t(warp) * ST * 16 * S;
  const int kw = warp % p.k_split, kper = K / p.k_split, pieces = kper / S;
  const int tile0 = (blockIdx.x * p.warp_tiles + warp / p.k_split) * p.tiles_per_warp;
  int tiles = 0;
  while (tiles < p.tiles_per_warp && (tile0 + tiles) * 16 < p.out) ++tiles;
  const int total = tiles * pieces;
  if (lane == 0) {
    for (int s = 0; s < ST; ++s) mbarrier_init(bar + s, 1);
    fence_barrier_init();
  }
  __syncwarp();
  auto issue = [&](int pc, int s) {
    if (lane == 0) {
      mbarrier_arrive_expect_tx(bar + s, 16 * S);
      tma_load_3d(mine + s * 16 * S, &map, 0, (kw * kper + (pc % pieces) * S) / 128, (tile0 + pc / pieces) * 16,
                  bar + s);
    }
  };
  for (int s = 0; s < ST && s < total; ++s) issue(s, s);
  __shared__ float sscale[kScaleSlots];  // [tile of the block][K / 128]
  const int kb = K / 128, block_tiles = p.warp_tiles * p.tiles_per_warp;
  for (int i = threadIdx.x; i < block_tiles * kb; i += blockDim.x) {
    const int row = min((blockIdx.x * block_tiles + i / kb) * 16, p.out - 1);
    sscale[i] = p.sinv[(row / 128) * kb + i % kb];
  }
  pdl_enter();
  if (M != Mode::kLoads) {
    // Eight blocks' loads in flight per warp before any is split: one at a time, a 16K-column x
    // took a 12-warp block over a microsecond (the profiler's top stall).
    constexpr int kBatch = 8;
    for (int b0 = warp; b0 < kb; b0 += warps * kBatch) {
      float4 vb[kBatch];
#pragma unroll
      for (int i = 0; i < kBatch; ++i) {
        const int b = b0 + i * warps;
        vb[i] = b < kb ? reinterpret_cast<const float4*>(p.x + b * 128)[lane] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int b = b0 + j * warps;
        if (b >= kb) break;
        const float4 v = vb[j];
        float m = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
        for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        const int se = scale_exponent(m, M == Mode::kF16 ? 14 : 7);
        const float sc = pow2(se);
        float r[4] = {v.x * sc, v.y * sc, v.z * sc, v.w * sc};
        if (lane == 0) xinv[b] = pow2(254 - se);
        if (M == Mode::kF16) {
          uint32_t h[2], l[2];
          for (int i = 0; i < 2; ++i) {
            const __half2 hi = __floats2half2_rn(r[2 * i], r[2 * i + 1]);
            const float2 back = __half22float2(hi);
            const __half2 lo = __floats2half2_rn(r[2 * i] - back.x, r[2 * i + 1] - back.y);
            h[i] = reinterpret_cast<const uint32_t&>(hi);
            l[i] = reinterpret_cast<const uint32_t&>(lo);
          }
          *reinterpret_cast<uint2*>(xh + b * 128 + lane * 4) = make_uint2(h[0], h[1]);
          *reinterpret_cast<uint2*>(xl + b * 128 + lane * 4) = make_uint2(l[0], l[1]);
        } else {
          const int c = lane * 4, half = 2 * b + c / 64, tt = (c % 64) / 16, off = c % 16;
          for (int i = 0; i < kTerms; ++i) {
            const float up = pow2(127 + 4 * i), down = pow2(127 - 4 * i);
            uint32_t packed = 0;
            for (int e = 0; e < 4; ++e) {
              const __nv_fp8_storage_t q = __nv_cvt_float_to_fp8(r[e] * up, __NV_SATFINITE, __NV_E4M3);
              r[e] -= __half2float(__half(__nv_cvt_fp8_to_halfraw(q, __NV_E4M3))) * down;
              packed |= uint32_t(q) << (8 * e);
            }
            *reinterpret_cast<uint32_t*>(xt + (half * kTerms + i) * 64 + tt * 16 + off) = packed;
          }
        }
      }
    }
  }
  __syncthreads();
  // kFp8Terms: lane t holds B columns 2t and 2t + 1 (terms), each worth
  // 16^-term.
  const float ts0 = 2 * t < kTerms ? pow2(127 - 8 * t) : 0.0f;
  const float ts1 = 2 * t + 1 < kTerms ? pow2(127 - 8 * t - 4) : 0.0f;
  const uint16_t* xs = (g == 1 ? xl : xh) + 16 * t;
  float acc0 = 0.0f, acc1 = 0.0f;  // rows g and g + 8 (kF16: lanes t = 0;
                                   // kFp8Terms: summed over t)
  auto store = [&]() {
    float v0 = acc0, v1 = acc1;
    if (M == Mode::kFp8Terms) {
      v0 += __shfl_xor_sync(0xffffffffu, v0, 1);
      v0 += __shfl_xor_sync(0xffffffffu, v0, 2);
      v1 += __shfl_xor_sync(0xffffffffu, v1, 1);
      v1 += __shfl_xor_sync(0xffffffffu, v1, 2);
    }
    acc0 = acc1 = 0.0f;
    return make_float2(v0, v1);
  };
  for (int pc = 0; pc < total; ++pc) {
    const int s = pc % ST, tl = pc / pieces, pi = pc % pieces;
    mbarrier_wait(bar + s, (pc / ST) & 1);
    const uint8_t* st = mine + s * 16 * S;
    if constexpr (M == Mode::kLoads) {
      acc0 += float(st[lane * 16 + (pc & 15)]);
      __syncwarp();
      if (pc + ST < total) issue(pc + ST, s);
    } else {
      uint4 w[kChunks][2][2];  // [128-column block][64-column half][row g, g + 8]
#pragma unroll
      for (int cb = 0; cb < kChunks; ++cb)
#pragma unroll
        for (int half = 0; half < 2; ++half)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int line = (g + 8 * h) * kChunks + cb, unit = half * 4 + t;
            w[cb][half][h] = *reinterpret_cast<const uint4*>(st + line * 128 + ((unit ^ (line & 7)) << 4));
          }
      __syncwarp();
      if (pc + ST < total) issue(pc + ST, s);
      const int lt = (warp / p.k_split) * p.tiles_per_warp + tl;
#pragma unroll
      for (int cb = 0; cb < kChunks; ++cb) {
        const int kg = kw * kper + pi * S + cb * 128;
        const float f = sscale[lt * kb + kg / 128] * xinv[kg / 128];
        if (M == Mode::kF16) {
          float d[4][4] = {};
#pragma unroll
          for (int half = 0; half < 2; ++half)
#pragma unroll
            for (int j = 0; j < 4; ++j) {
              const uint2 xv = *reinterpret_cast<const uint2*>(xs + kg + half * 64 + 4 * j);
              const uint32_t a0 = (&w[cb][half][0].x)[j], b0 = (&w[cb][half][1].x)[j];
              const uint32_t a[4] = {e4m3x2_to_f16x2(a0), e4m3x2_to_f16x2(b0), e4m3x2_to_f16x2(a0 >> 16),
                                     e4m3x2_to_f16x2(b0 >> 16)};
              mma_f16(d[j], a, xv.x, xv.y);
            }
          float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            s0 += d[j][0] + d[j][1];
            s1 += d[j][2] + d[j][3];
          }
          acc0 = fmaf(s0, f, acc0);
          acc1 = fmaf(s1, f, acc1);
        } else {
          float d[2][4] = {};
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const uint4 wa = w[cb][half][0], wb = w[cb][half][1];
            uint4 xv = make_uint4(0, 0, 0, 0);
            if (g < kTerms) xv = *reinterpret_cast<const uint4*>(xt + ((kg / 64 + half) * kTerms + g) * 64 + 16 * t);
            const uint32_t a0[4] = {wa.x, wb.x, wa.y, wb.y}, a1[4] = {wa.z, wb.z, wa.w, wb.w};
            mma_e4m3(d[half], a0, xv.x, xv.y);
            mma_e4m3(d[half], a1, xv.z, xv.w);
          }
          acc0 = fmaf(d[0][0] + d[1][0], f * ts0, fmaf(d[0][1] + d[1][1], f * ts1, acc0));
          acc1 = fmaf(d[0][2] + d[1][2], f * ts0, fmaf(d[0][3] + d[1][3], f * ts1, acc1));
        }
      }
      if (p.tiles_per_warp > 1 && pi == pieces - 1) {  // k_split 1: the warp's tile is done
        const float2 v = store();
        if (t == 0) {
          p.y[(tile0 + tl) * 16 + g] = v.x;
          p.y[(tile0 + tl) * 16 + g + 8] = v.y;
        }
      }
    }
  }
  if (p.tiles_per_warp > 1) return;
  const float2 v = store();
  __shared__ float red[16][2][32];
  red[warp][0][lane] = v.x;
  red[warp][1][lane] = v.y;
  __syncthreads();
  if (kw != 0 || tiles == 0 || t != 0) return;
  float v0 = 0.0f, v1 = 0.0f;
  for (int k = 0; k < p.k_split; ++k) {
    v0 += red[warp + k][0][lane];
    v1 += red[warp + k][1][lane];
  }
  p.y[tile0 * 16 + g] = v0;
  p.y[tile0 * 16 + g + 8] = v1;
}

// W [out, K] as (128 bytes, K / 128 lines, out rows); one copy = 16 rows x S
// bytes, 128-byte swizzle.
CUtensorMap weight_map(const uint8_t* w, int out, int K, int S) {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    DSI_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found));
    DSI_CHECK(found == cudaDriverEntryPointSuccess && fn != nullptr, "the driver has no cuTensorMapEncodeTiled");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  CUtensorMap map{};
  const cuuint64_t dims[3] = {128, cuuint64_t(K / 128), cuuint64_t(out)};
  const cuuint64_t strides[2] = {128, cuuint64_t(K)};
  const cuuint32_t box[3] = {128, cuuint32_t(S / 128), 16};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  const CUresult r = encode(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 3, const_cast<uint8_t*>(w), dims, strides, box,
                            elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  DSI_CHECK(r == CUDA_SUCCESS, "cannot describe the weights to the copy engine (error {})", int(r));
  return map;
}

struct Case {
  std::vector<uint8_t*> copies;  // device weights, the same bytes in each
  float* sinv;
  float* x;
  float* y;
  int out, K;
  std::vector<double> ref;  // fp64 W x of the dequantised weights
};

struct Shape {
  int warp_tiles, k_split, tiles_per_warp;
};

// Which variants run: names like "f16 256x3" containing `variant`, shapes like "3x4x1" (warp tiles
// x k_split x tiles per warp) containing `shape`; empty: all.
struct Filter {
  std::string product, variant, shape;
  int reps = 15;
};

template <int S, int ST, Mode M>
void run(const Case& c, const Shape& sh, const Filter& f) {
  const char* mode = M == Mode::kLoads ? "loads" : M == Mode::kF16 ? "f16" : "fp8";
  const std::string variant = std::string(mode) + " " + std::to_string(S) + "x" + std::to_string(ST);
  const std::string shape =
      std::to_string(sh.warp_tiles) + "x" + std::to_string(sh.k_split) + "x" + std::to_string(sh.tiles_per_warp);
  if (variant.find(f.variant) == std::string::npos || shape.find(f.shape) == std::string::npos) return;
  const size_t smem = 2048 + (M == Mode::kLoads ? 0 : x_bytes(c.K)) + size_t(sh.warp_tiles * sh.k_split) * ST * 16 * S;
  const int tiles = (c.out + 15) / 16, per_block = sh.warp_tiles * sh.tiles_per_warp;
  // 227 KiB a block, less the static arrays (sscale, red)
  if (smem > 232448 - 8192 - 256 || (c.K / sh.k_split) % S != 0 || per_block * (c.K / 128) > kScaleSlots ||
      (sh.tiles_per_warp > 1 && sh.k_split != 1) || c.out % 16 != 0)
    return;
  const auto kernel = gemv_tma_kernel<S, ST, M>;
  DSI_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  std::vector<CUtensorMap> maps;
  for (uint8_t* w : c.copies) maps.push_back(weight_map(w, c.out, c.K, S));
  const Params p{c.sinv, c.x, c.y, c.out, c.K, sh.tiles_per_warp, sh.k_split, sh.warp_tiles};
  const dim3 grid((tiles + per_block - 1) / per_block), block(32 * sh.warp_tiles * sh.k_split);
  const double us = time_graph(int(c.copies.size()), f.reps,
                               [&](int i, cudaStream_t s) { launch(kernel, grid, block, smem, s, p, maps[i]); });
  char what[128];
  std::snprintf(what, sizeof what,
                "  %-5s S %4d x %d stages, %2d warps (%d x k_split %d, %d "
                "tiles/warp), %u blocks",
                mode, S, ST, sh.warp_tiles * sh.k_split, sh.warp_tiles, sh.k_split, sh.tiles_per_warp, grid.x);
  report(what, us, double(c.out) * c.K);
  if (M == Mode::kLoads) return;
  std::vector<float> y(c.out);
  DSI_CUDA_CHECK(cudaDeviceSynchronize());
  DSI_CUDA_CHECK(cudaMemcpy(y.data(), c.y, y.size() * sizeof(float), cudaMemcpyDeviceToHost));
  double err = 0.0, mag = 0.0;
  for (int r = 0; r < c.out; ++r) {
    err = std::max(err, std::fabs(y[r] - c.ref[r]));
    mag = std::max(mag, std::fabs(c.ref[r]));
  }
  std::printf("        max |y - fp64 reference| %.3g (max |y| %.3g)\n", err, mag);
}

float e4m3_value(uint8_t b) {
  const int e = (b >> 3) & 15, m = b & 7;
  const float v = e == 0 ? std::ldexp(float(m), -9) : std::ldexp(1.0f + m / 8.0f, e - 7);
  return (b & 0x80) ? -v : v;
}

}  // namespace

int main(int argc, char** argv) {
  Filter f;
  parse_options(argc, argv, [&](const std::string& k, auto value) {
    if (k == "--reps")
      f.reps = std::max(3, std::stoi(value()));
    else if (k == "--only")
      f.product = value();
    else if (k == "--variant")
      f.variant = value();
    else if (k == "--shape")
      f.shape = value();
    else
      return false;
    return true;
  });
  struct Product {
    const char* name;
    int out, K;
    std::vector<Shape> shapes;
  };
  // GLM-5 one-row products; "down" and "gate+up" stand for the nine experts'
  // rows as one matrix.
  const std::vector<Product> products = {
      {"o_proj", 6144, 16384, {{3, 4, 1}, {3, 2, 1}}},
      {"q_b_proj", 16384, 2048, {{8, 1, 1}, {8, 2, 1}}},
      {"down x 9", 6144, 18432, {{3, 4, 1}}},
      {"gate+up x 9", 36864, 6144, {{9, 1, 2}, {6, 1, 3}}},
  };
  for (const Product& pr : products) {
    if (std::string(pr.name).find(f.product) == std::string::npos) continue;
    Case c;
    c.out = pr.out;
    c.K = pr.K;
    const size_t bytes = size_t(pr.out) * pr.K, scales = size_t((pr.out + 127) / 128) * (pr.K / 128);
    const int copies = std::max(4, int((800ull << 20) / bytes));
    for (int i = 0; i < copies; ++i) {
      uint8_t* w = nullptr;
      DSI_CUDA_CHECK(cudaMalloc(&w, bytes));
      if (i == 0)
        fill_fp8<<<1024, 256>>>(w, int64_t(bytes), 1);
      else
        DSI_CUDA_CHECK(cudaMemcpy(w, c.copies[0], bytes, cudaMemcpyDeviceToDevice));
      c.copies.push_back(w);
    }
    DSI_CUDA_CHECK(cudaMalloc(&c.sinv, scales * sizeof(float)));
    DSI_CUDA_CHECK(cudaMalloc(&c.x, size_t(pr.K) * sizeof(float)));
    DSI_CUDA_CHECK(cudaMalloc(&c.y, size_t(pr.out) * sizeof(float)));
    fill_f32<<<256, 256>>>(c.sinv, int64_t(scales), 2, 0.001f, 0.003f);
    fill_f32<<<64, 256>>>(c.x, pr.K, 3, -2.0f, 2.0f);
    DSI_CUDA_CHECK(cudaGetLastError());
    std::vector<uint8_t> w(bytes);
    std::vector<float> s(scales), x(pr.K);
    DSI_CUDA_CHECK(cudaMemcpy(w.data(), c.copies[0], bytes, cudaMemcpyDeviceToHost));
    DSI_CUDA_CHECK(cudaMemcpy(s.data(), c.sinv, scales * sizeof(float), cudaMemcpyDeviceToHost));
    DSI_CUDA_CHECK(cudaMemcpy(x.data(), c.x, x.size() * sizeof(float), cudaMemcpyDeviceToHost));
    float lut[256];
    for (int i = 0; i < 256; ++i) lut[i] = e4m3_value(uint8_t(i));
    c.ref.resize(pr.out);
    for (int r = 0; r < pr.out; ++r) {
      double acc = 0.0;
      for (int k = 0; k < pr.K; ++k)
        acc += double(lut[w[size_t(r) * pr.K + k]]) * s[size_t(r / 128) * (pr.K / 128) + k / 128] * x[k];
      c.ref[r] = acc;
    }
    std::printf("%s [%d, %d] fp8, one row: %.1f MB, floor %.2f us at %.1f TB/s\n", pr.name, pr.out, pr.K, bytes / 1e6,
                bytes / (kPeakGBs * 1e3), kPeakGBs / 1e3);
    for (const Shape& sh : pr.shapes) {
      run<512, 3, Mode::kLoads>(c, sh, f);
      run<256, 3, Mode::kF16>(c, sh, f);
      run<256, 2, Mode::kF16>(c, sh, f);
      run<512, 2, Mode::kF16>(c, sh, f);
      run<512, 3, Mode::kF16>(c, sh, f);
      run<256, 3, Mode::kFp8Terms>(c, sh, f);
      run<512, 2, Mode::kFp8Terms>(c, sh, f);
    }
    for (uint8_t* p : c.copies) cudaFree(p);
    cudaFree(c.sinv);
    cudaFree(c.x);
    cudaFree(c.y);
  }
  return 0;
}
