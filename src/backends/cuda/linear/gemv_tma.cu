// The one-row tensor-map GEMV of gemv.h (launch_gemv_tma): y = W x for one fp32 row x and fp8
// weights with 128-column blocks, W streamed by the copy engine and summed on the tensor cores.
//
// Why: the FMA kernels (gemv.cu) hold their loads in registers, four rows of 512-byte stretches a
// warp, and stop at 66-83% of the HBM's 4.3 TB/s; the same bytes copied by one tensor-map copy of
// 16 rows x 256 or 512 bytes per stage read at 95-98% alone, and the tensor cores keep the math
// off the critical path (docs/decode-performance.md, "The one-row GEMV on a tensor-map kernel").
//
// Tiling: W is cut into tiles of 16 rows (one m16 MMA tile). A block has warp_tiles x k_split warps;
// k_split warps share a tile, each streaming a contiguous 1 / k_split of its columns, and add their
// sums in warp order through shared memory (bitwise reproducible); with k_split 1 a warp may stream
// tiles_per_warp tiles one after the other. Each warp has its own ring of kStages stages of 16 rows
// x S bytes, filled by one cp.async.bulk.tensor per stage (128-byte swizzle) that completes on the
// stage's barrier; the warp reads a stage into registers and hands it back to the copy engine before
// summing it, so both stages stay in flight while it computes. Copies are queued before the
// programmatic wait (W is no kernel's output); x is read after it.
//
// Numerics are gemv.cu's tensor-core kernel's: each 128-column block of x is scaled by a power of
// two s (its largest magnitude in [2^14, 2^15)) and split into f16 hi = f16(x s) and lo =
// f16(x s - hi), B columns 0 and 1 of mma.sync m16n8k16 (A = 16 rows of W, e4m3 -> f16 exact); a
// block's two column sums are added, scaled by the weight block's scale and 1 / s, into fp32.
// x's split sits in shared memory (4 bytes per column), made once per block.
//
// K order inside a 64-column half of a 128-column block: lane (g, t) of the MMA holds columns
// 16 t + 4 j + [0, 4) of rows g and g + 8 for k16 step j (the mma.sync layout's k = 2 t + [0, 2) and
// 2 t + 8 + [0, 2)); x's halves are read with the same map, so each step sums matching products.
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <map>
#include <mutex>
#include <tuple>

#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/linear/gemv.h"
#include "backends/cuda/linear/gemv_chunk.cuh"
#include "backends/cuda/ptx.cuh"
#include "backends/cuda/tensor_map.h"

namespace dsi::cuda {

namespace {

using gemv_chunk::block_scale_exponent;

constexpr int kStages = 2;          // ring stages per warp
constexpr int kMaxWarps = 12;       // per block (more did not pay: q_b with 16 warps 9.7 us, 8 warps 9.2)
constexpr int kScaleSlots = 1024;   // shared floats for the block's weight scales
constexpr int kBarrierBytes = 1024;  // the warps' stage barriers (kMaxWarps x kStages x 8 bytes)
// 227 KiB of shared memory a block, less the kernel's static arrays (scales, the k_split sums, the
// norm's block sum; 256 bytes as compiled).
constexpr size_t kMaxDynamicSmem = 232448 - kScaleSlots * 4 - kMaxWarps * 2 * 32 * 4 - 256;

// Bytes of x's split in shared memory: f16 hi and lo (16 bytes apart in banks) and 1 / s per block.
__host__ __device__ constexpr size_t x_split_bytes(int64_t in) {
  return (size_t(in) * 4 + 32 + size_t(in / 128) * 4 + 127) / 128 * 128;
}

// Barriers, x's split, the ring's alignment slack and the rings.
size_t dynamic_smem(int64_t in, int warps, int piece) {
  return kBarrierBytes + x_split_bytes(in) + 1024 + size_t(warps) * kStages * 16 * piece;
}

template <int S>
__global__ void __launch_bounds__(kMaxWarps * 32, 1)
    gemv_tma_kernel(const GemvParams p, const GemvTmaPlan plan, const __grid_constant__ CUtensorMap map) {
  extern __shared__ __align__(128) uint8_t smem[];
  constexpr int kLines = S / 128;  // 128-byte lines per row and stage
  const int warps = plan.warp_tiles * plan.k_split, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int64_t in = p.in, kb = in / 128, tiles = (p.out + 15) / 16;
  uint64_t* bar = reinterpret_cast<uint64_t*>(smem) + warp * kStages;
  uint16_t* xh = reinterpret_cast<uint16_t*>(smem + kBarrierBytes);
  uint16_t* xl = xh + in + 8;  // 16 bytes on: the hi and lo lanes of a step read other banks
  float* xinv = reinterpret_cast<float*>(xl + in + 8);
  uint8_t* ring = smem + kBarrierBytes + x_split_bytes(in);
  ring += (1024 - (smem_addr(ring) & 1023)) & 1023;  // the 128-byte swizzle's alignment
  uint8_t* mine = ring + size_t(warp) * kStages * 16 * S;
  const int kw = warp % plan.k_split;
  const int64_t kper = in / plan.k_split, pieces = kper / S;
  const int64_t tile0 = (int64_t(blockIdx.x) * plan.warp_tiles + warp / plan.k_split) * plan.tiles_per_warp;
  int n_tiles = 0;  // this warp's tiles inside W
  while (n_tiles < plan.tiles_per_warp && tile0 + n_tiles < tiles) ++n_tiles;
  const int64_t total = n_tiles * pieces;
  if (lane == 0) {
    for (int s = 0; s < kStages; ++s) mbarrier_init(bar + s, 1);
    fence_barrier_init();
  }
  __syncwarp();
  // Piece pc (tile pc / pieces, columns kw * kper + (pc % pieces) * S on) into stage s. Rows past
  // the end of W arrive as zeros.
  auto queue = [&](int64_t pc, int s) {
    if (lane == 0) {
      mbarrier_arrive_expect_tx(bar + s, 16 * S);
      tma_load_3d(mine + s * 16 * S, &map, 0, int((kw * kper + (pc % pieces) * S) / 128),
                  int((tile0 + pc / pieces) * 16), bar + s);
    }
  };
  for (int s = 0; s < kStages && s < total; ++s) queue(s, s);
  // The weight scales of the block's tiles: [tile of the block][column block].
  __shared__ float sscale[kScaleSlots];
  const int block_tiles = plan.warp_tiles * plan.tiles_per_warp;
  for (int i = threadIdx.x; i < block_tiles * kb; i += blockDim.x) {
    const int64_t row = min((int64_t(blockIdx.x) * block_tiles + i / kb) * 16, p.out - 1);
    sscale[i] = __ldg(p.scale_inv + ((p.row0 + row) / p.block_out) * p.scale_cols + p.col0 / 128 + i % kb);
  }
  pdl_enter();  // x is the previous kernel's output
  // The RMSNorm in front (GemvParams::norm_w): x's 1 / sqrt(mean(x^2) + eps), as the norm kernel
  // computes it (products and sums in fp32, then w * (x * inv) per column below).
  float inv = 1.0f;
  if (p.norm_w != nullptr) {
    __shared__ float red[33];
    float ss = 0.0f;
    for (int64_t j = threadIdx.x; j < in / 4; j += blockDim.x) {
      const float4 v = __ldg(reinterpret_cast<const float4*>(p.x) + j);
      ss = __fadd_rn(ss, __fmul_rn(v.x, v.x));
      ss = __fadd_rn(ss, __fmul_rn(v.y, v.y));
      ss = __fadd_rn(ss, __fmul_rn(v.z, v.z));
      ss = __fadd_rn(ss, __fmul_rn(v.w, v.w));
    }
    ss = block_sum(ss, red);
    inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, float(in)), p.norm_eps)));
  }
  // x's split, eight blocks' loads in flight per warp before any is split (one at a time, the
  // profiler's top stall: o_proj 30.2 us against 27.3).
  constexpr int kBatch = 8;
  for (int64_t b0 = warp; b0 < kb; b0 += int64_t(warps) * kBatch) {
    float4 v[kBatch];
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int64_t b = b0 + int64_t(i) * warps;
      v[i] = b < kb ? __ldg(reinterpret_cast<const float4*>(p.x + b * 128) + lane) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int64_t b = b0 + int64_t(i) * warps;
      if (b >= kb) break;
      if (p.norm_w != nullptr) {
        const float4 w = __ldg(reinterpret_cast<const float4*>(p.norm_w + b * 128) + lane);
        v[i] = make_float4(__fmul_rn(w.x, __fmul_rn(v[i].x, inv)), __fmul_rn(w.y, __fmul_rn(v[i].y, inv)),
                           __fmul_rn(w.z, __fmul_rn(v[i].z, inv)), __fmul_rn(w.w, __fmul_rn(v[i].w, inv)));
      }
      float m = fmaxf(fmaxf(fabsf(v[i].x), fabsf(v[i].y)), fmaxf(fabsf(v[i].z), fabsf(v[i].w)));
      for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
      const int se = block_scale_exponent(m);
      const float sc = __uint_as_float(uint32_t(se) << 23);
      const float a[4] = {v[i].x * sc, v[i].y * sc, v[i].z * sc, v[i].w * sc};  // exact
      uint32_t hi[2], lo[2];  // gemv_chunk's f16x2_bits written out: the form that was measured
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const __half2 x2 = __floats2half2_rn(a[2 * h], a[2 * h + 1]);
        const float2 back = __half22float2(x2);
        const __half2 r2 = __floats2half2_rn(a[2 * h] - back.x, a[2 * h + 1] - back.y);
        hi[h] = reinterpret_cast<const uint32_t&>(x2);
        lo[h] = reinterpret_cast<const uint32_t&>(r2);
      }
      *reinterpret_cast<uint2*>(xh + b * 128 + lane * 4) = make_uint2(hi[0], hi[1]);
      *reinterpret_cast<uint2*>(xl + b * 128 + lane * 4) = make_uint2(lo[0], lo[1]);
      if (lane == 0) xinv[b] = __uint_as_float(uint32_t(254 - se) << 23);
    }
  }
  __syncthreads();
  // B: lanes of row group 1 give x's lo halves (column 1), the others its hi halves (column 0; the
  // columns past 1 are never read).
  const uint16_t* xs = (g == 1 ? xl : xh) + 16 * t;
  float acc0 = 0.0f, acc1 = 0.0f;  // rows g and g + 8, columns 0 + 1 (lanes t = 0 hold the sums)
  for (int64_t pc = 0; pc < total; ++pc) {
    const int s = int(pc % kStages);
    const int64_t tl = pc / pieces, pi = pc % pieces;
    mbarrier_wait(bar + s, unsigned(pc / kStages) & 1u);
    const uint8_t* st = mine + s * 16 * S;
    uint4 w[kLines][2][2];  // [128-column block][64-column half][row g, g + 8]
#pragma unroll
    for (int cb = 0; cb < kLines; ++cb)
#pragma unroll
      for (int half = 0; half < 2; ++half)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int line = (g + 8 * h) * kLines + cb, unit = half * 4 + t;
          w[cb][half][h] = *reinterpret_cast<const uint4*>(st + line * 128 + ((unit ^ (line & 7)) << 4));
        }
    __syncwarp();
    if (pc + kStages < total) queue(pc + kStages, s);
    const float* srow = sscale + ((warp / plan.k_split) * plan.tiles_per_warp + tl) * kb;
#pragma unroll
    for (int cb = 0; cb < kLines; ++cb) {
      const int64_t k = kw * kper + pi * S + cb * 128;
      float d[4][4] = {};  // one accumulator per step: four independent MMA chains
#pragma unroll
      for (int half = 0; half < 2; ++half)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const uint2 xv = *reinterpret_cast<const uint2*>(xs + k + half * 64 + 4 * j);
          const uint32_t wa = (&w[cb][half][0].x)[j], wb = (&w[cb][half][1].x)[j];
          const uint32_t a[4] = {e4m3x2_to_f16x2(wa), e4m3x2_to_f16x2(wb), e4m3x2_to_f16x2(wa >> 16),
                                 e4m3x2_to_f16x2(wb >> 16)};
          mma_f16(d[j], a, xv.x, xv.y);
        }
      const float f = srow[k / 128] * xinv[k / 128];
      acc0 = fmaf((d[0][0] + d[0][1]) + (d[1][0] + d[1][1]) + ((d[2][0] + d[2][1]) + (d[3][0] + d[3][1])), f, acc0);
      acc1 = fmaf((d[0][2] + d[0][3]) + (d[1][2] + d[1][3]) + ((d[2][2] + d[2][3]) + (d[3][2] + d[3][3])), f, acc1);
    }
    if (plan.tiles_per_warp > 1 && pi == pieces - 1) {  // k_split 1: this tile is complete
      const int64_t row = (tile0 + tl) * 16 + g;
      if (t == 0 && row < p.out) p.y[row] = acc0;
      if (t == 0 && row + 8 < p.out) p.y[row + 8] = acc1;
      acc0 = acc1 = 0.0f;
    }
  }
  if (plan.tiles_per_warp > 1) return;
  // One tile per warp: its k_split warps' sums, added in warp order.
  __shared__ float red[kMaxWarps][2][32];
  red[warp][0][lane] = acc0;
  red[warp][1][lane] = acc1;
  __syncthreads();
  if (kw != 0 || n_tiles == 0 || t != 0) return;
  float v0 = 0.0f, v1 = 0.0f;
  for (int k = 0; k < plan.k_split; ++k) {
    v0 += red[warp + k][0][lane];
    v1 += red[warp + k][1][lane];
  }
  const int64_t row = tile0 * 16 + g;
  if (row < p.out) p.y[row] = v0;
  if (row + 8 < p.out) p.y[row + 8] = v1;
}

// W as (128 bytes, in / 128 lines, out rows); one copy = 16 rows x `piece` bytes. Encoded once
// per device, weight and piece (weights live as long as the model), not on every eager call.
CUtensorMap weight_map(const GemvParams& p, int piece) {
  static std::mutex mu;
  static std::map<std::tuple<int, const void*, int64_t, int64_t, int>, CUtensorMap> maps;
  const auto key = std::make_tuple(current_device(), p.w, p.out, p.in, piece);
  std::lock_guard<std::mutex> lock(mu);
  if (const auto it = maps.find(key); it != maps.end()) return it->second;
  const uint64_t dims[3] = {128, uint64_t(p.in / 128), uint64_t(p.out)};
  const uint64_t strides[2] = {128, uint64_t(p.in)};
  const uint32_t box[3] = {128, uint32_t(piece / 128), 16};
  const CUtensorMap map = byte_tensor_map(p.w, 3, dims, strides, box, CU_TENSOR_MAP_SWIZZLE_128B, "gemv_tma: W");
  maps.emplace(key, map);
  return map;
}

std::atomic<uint64_t> g_tma_launches{0};

}  // namespace

uint64_t gemv_tma_launches() { return g_tma_launches.load(); }

bool gemv_tma_ok(const GemvParams& p) {
  // The mma kernel's operands (fp8, 128-column blocks and slices, aligned, ungrouped), one row of
  // one product, rows of whole pieces, tiles inside one scale row, coordinates in 32 bits.
  return p.n == 1 && p.n_groups == 1 && !p.swiglu && gemv_mma_ok(p) && p.in % 256 == 0 &&
         p.block_out % 16 == 0 && p.row0 % 16 == 0 && p.in <= INT_MAX / 2 && p.out <= INT_MAX / 2 &&
         dynamic_smem(p.in, 1, 256) <= kMaxDynamicSmem;
}

GemvTmaPlan gemv_tma_plan(const GemvParams& p, int num_sms) {
  const int64_t tiles = (p.out + 15) / 16, kb = p.in / 128;
  GemvTmaPlan best;
  int64_t best_tiles = 0;
  auto better = [&](int64_t block_tiles, int warps, int piece) {
    if (best.warp_tiles == 0 || block_tiles != best_tiles) return best.warp_tiles == 0 || block_tiles < best_tiles;
    const int best_warps = best.warp_tiles * best.k_split;
    return warps != best_warps ? warps > best_warps : piece > best.piece;
  };
  // One block per SM, all in one wave: the fewest tiles per block (the busiest SM's bytes), then the
  // most warps (latency hidden), then 512-byte pieces (fewer stages to wait for).
  for (int k_split = 1; k_split <= 8; k_split *= 2) {
    if (p.in % (256 * k_split) != 0) continue;
    for (int warp_tiles = 1; warp_tiles * k_split <= kMaxWarps; ++warp_tiles)
      for (int tpw = 1; tpw <= (k_split == 1 ? 16 : 1); ++tpw) {
        const int64_t block_tiles = int64_t(warp_tiles) * tpw;
        if ((tiles + block_tiles - 1) / block_tiles > num_sms || block_tiles * kb > kScaleSlots) continue;
        const int warps = warp_tiles * k_split;
        int piece = 0;
        for (int s : {512, 256})
          if (piece == 0 && (p.in / k_split) % s == 0 && dynamic_smem(p.in, warps, s) <= kMaxDynamicSmem) piece = s;
        if (piece == 0 || !better(block_tiles, warps, piece)) continue;
        best = GemvTmaPlan{warp_tiles, k_split, tpw, piece};
        best_tiles = block_tiles;
      }
  }
  // Only where the SMs' work is balanced: the busiest SM streams best_tiles tiles, the average SM at
  // least gemv_tma_balance() percent of that (a product of a few tiles per SM that leaves many SMs
  // idle stays on the FMA kernels, which spread it over all of them).
  if (best.warp_tiles == 0 || tiles * 100 < best_tiles * num_sms * gemv_tma_balance()) return GemvTmaPlan{};
  return best;
}

std::array<int, 4> gemv_tma_plan_for(int64_t out, int64_t in, int num_sms) {
  GemvParams p{};
  p.kind = FloatKind::kE4M3;
  p.n = 1;
  p.out = out;
  p.in = in;
  p.block_out = p.block_in = 128;
  const GemvTmaPlan t = gemv_tma_plan(p, num_sms);
  return t.warp_tiles > 0 ? std::array<int, 4>{t.warp_tiles, t.k_split, t.tiles_per_warp, t.piece}
                          : std::array<int, 4>{0, 0, 0, 0};
}

size_t gemv_tma_smem(const GemvParams& p, const GemvTmaPlan& plan) {
  const size_t smem = dynamic_smem(p.in, plan.warp_tiles * plan.k_split, plan.piece);
  return smem <= kMaxDynamicSmem ? smem : 0;
}

void launch_gemv_tma(const GemvParams& p, const GemvTmaPlan& plan, cudaStream_t stream) {
  DSI_CHECK(gemv_tma_ok(p), "gemv_tma: [{}, {}] x 1 row is outside the tensor-map kernel", p.out, p.in);
  const int warps = plan.warp_tiles * plan.k_split;
  const int64_t tiles = (p.out + 15) / 16, block_tiles = int64_t(plan.warp_tiles) * plan.tiles_per_warp;
  DSI_CHECK(plan.warp_tiles >= 1 && warps <= kMaxWarps && plan.tiles_per_warp >= 1 &&
                (plan.k_split == 1 || plan.tiles_per_warp == 1) && (plan.piece == 256 || plan.piece == 512) &&
                (p.in / plan.k_split) % plan.piece == 0 && p.in % plan.k_split == 0 &&
                block_tiles * (p.in / 128) <= kScaleSlots,
            "gemv_tma: plan of {} x {} warps, {} tiles per warp, {}-byte pieces for [{}, {}]", plan.warp_tiles,
            plan.k_split, plan.tiles_per_warp, plan.piece, p.out, p.in);
  const size_t smem = dynamic_smem(p.in, warps, plan.piece);
  DSI_CHECK(smem <= kMaxDynamicSmem, "gemv_tma: {} bytes of shared memory", smem);
  const dim3 grid(unsigned((tiles + block_tiles - 1) / block_tiles));
  const CUtensorMap map = weight_map(p, plan.piece);
  const auto kernel = plan.piece == 512 ? gemv_tma_kernel<512> : gemv_tma_kernel<256>;
  DSI_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  launch(kernel, grid, dim3(32 * warps), smem, stream, p, plan, map);
  g_tma_launches.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace dsi::cuda
