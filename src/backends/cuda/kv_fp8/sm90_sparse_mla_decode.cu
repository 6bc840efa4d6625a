// Sparse MLA decode over the fp8 MLA cache (ops::sparse_mla_fp8) for sm_90a: split-KV with bf16
// tensor cores, then an LSE-weighted combine (FlashMLA's decode structure; written here). Two split
// kernels share the combine: the mma.sync kernel described first (16 or 32 heads per CTA) and the
// warpgroup kernel further down (wgmma, 64 heads per CTA), which plan_sparse_mla_decode takes once a
// call has 128 (row, head) pairs or more.
//
// Why this shape. A decode row attends 64..128 heads to the same top-2048 cache rows (MLA has one
// latent "KV head"), so every key is loaded and dequantised once per CTA and reused by all the heads
// of the CTA's head group; the scores q.K^T and the output P.V are then GEMMs of M = heads, which is
// what tensor cores are for (64 heads x 2048 keys x (576 + 512) x 2 = 285 MFLOP per row: far too much
// for FFMA within a few microseconds). One row has too few heads to fill 132 SMs, so the 2048 keys are
// split over many CTAs (split-KV); each split keeps its own online softmax and writes a partial
// (o / l, lse), and a second small kernel combines the splits with LSE weights.
//
// One CTA = (row, group of 16 * MT heads, split of up to 32 tiles of 64 keys), 8 warps. Per tile:
//   1. the raw 656-byte entries were fetched with cp.async during the previous tile (zero-filled
//      for -1 slots); unpack them once into shared memory as bf16 [64 keys][576] (the e4m3 values
//      exactly, without their tile scales: integer ops, no slow cvt) and keep the 4 scales per key;
//   2. start fetching the next tile's entries (overlaps the rest of this tile);
//   3. scores [HG, 64] = q_bf16 . K^T: warp w takes key half (w & 1) and latent tile (w >> 1)
//      (128 dims, its partial multiplied by the keys' scale of that tile in fp32) plus 16 of the 64
//      RoPE dims; each q fragment feeds 4 n-tiles and each K fragment MT m-tiles; the 4 partial
//      sums meet in shared memory and are added in a fixed order (deterministic);
//   4. online softmax per head (one warp per head, base-2 exponentials); P is stored in bf16 four
//      times, once per latent tile, multiplied by the keys' scale of that tile (so V needs none);
//   5. out[HG, 512] += P . V: warp w owns 64 value columns of latent tile w / 2 (V = the first 512
//      dims of the same unpacked K tile; ldmatrix.trans gives the B fragments).
// Shared memory (~169 KB for MT = 1, ~214 KB for MT = 2) allows one CTA per SM; the plan sizes the
// grid to one wave.
//
// Both split kernels stage their indices and gather the first tile after the programmatic wait,
// or, for a settled call (SparseMlaDecodeParams::settled: the kernel before writes neither the
// indices nor the cache), before it: then tile 0 is also unpacked and tile 1's gather issued while
// the previous kernel still runs, and only q waits. A one-tile CTA's unpack (about 1.6 us) and its
// gather then leave the step's critical path.
//
// Numerics (compared with the fp32 CPU reference, which decodes the cache exactly):
//   - q is rounded to bf16 (round to nearest even) once; the CPU op test feeds bf16-representable q,
//     so this step is exact there;
//   - K and V hold the e4m3 values exactly; the scores apply each 128-dim tile's scale to the
//     tile's fp32 partial dot product (exact for the power-of-two scales dsinfer writes);
//   - products bf16 x bf16 are exact in fp32, sums in fp32 (tensor-core order);
//   - P = exp2(s * scale * log2 e - m) times the key's tile scale is rounded to bf16 for the P.V
//     product (2^-9 relative; for power-of-two scales exactly bf16(P) * scale; the dominant
//     difference to the reference: normalised MSE ~1e-6 on the output); the softmax sum l adds the
//     unrounded fp32 values, so the LSE is fp32-accurate;
//   - the combine weights splits by exp(lse_i - max) in fp32.
// Bitwise deterministic run to run (fixed reduction orders, no atomics on data).
#include "backends/cuda/kv_fp8/sm90_sparse_mla_decode.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>

#include "backends/cuda/common.cuh"
#include "backends/cuda/ptx.cuh"
#include "backends/cuda/wgmma.cuh"
#include "ops/kv_fp8.h"

namespace dsi::cuda {

namespace {

constexpr int kLora = ops::kMlaFp8Lora;        // 512: value / latent dims
constexpr int kDk = kLora + ops::kMlaFp8Rope;  // 576: score dims
constexpr int kEntry = ops::kMlaFp8Bytes;      // 656
constexpr int kBK = kSparseMlaKeyTile;         // 64 keys per tile
constexpr int kThreads = 256;                  // 8 warps
constexpr int kPieces = kEntry / 16;           // 41 16-byte pieces per cache entry
constexpr int kKStride = kDk + 8;              // bf16 elements per K / q row: 1168 B = 73 x 16 B,
                                               // so the 8 rows of an ldmatrix hit distinct banks
constexpr int kPStride = kBK + 8;              // bf16 per P row (144 B = 9 x 16 B)
constexpr int kRedStride = kBK + 4;            // f32 per partial-score row
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

template <int MT>
struct Smem {
  static constexpr int kHG = 16 * MT;
  static constexpr size_t kQ = 0;                                            // bf16 [HG][kKStride]
  static constexpr size_t kK = kQ + size_t(kHG) * kKStride * 2;              // bf16 [64][kKStride]
  static constexpr size_t kRaw = kK + size_t(kBK) * kKStride * 2;            // u8 [64][656]
  static constexpr size_t kRed = kRaw + size_t(kBK) * kEntry;                // f32 [4][HG][kRedStride]
  static constexpr size_t kP = kRed + size_t(4) * kHG * kRedStride * 4;      // bf16 [4][HG][kPStride]
  static constexpr size_t kScale = kP + size_t(4) * kHG * kPStride * 2;      // f32 [64][4] tile scales
  static constexpr size_t kIdx = kScale + size_t(kBK) * 4 * 4;               // i32 [32 * 64]
  static constexpr size_t kStats = kIdx + size_t(kSparseMlaMaxSplitTiles) * kBK * 4;  // f32 m, l, alpha [HG]
  static constexpr size_t kBytes = kStats + 3 * size_t(kHG) * 4;
};

// ---- PTX wrappers (the shared ones: ptx.cuh) ----

__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
// c += a . b for one m16n8k16 tile (bf16 in, fp32 accumulate).
__device__ __forceinline__ void mma_bf16(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ unsigned pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const unsigned*>(&v);
}
// Two e4m3 bytes as bf16x2, exactly, with integer ops and one bf16 multiply (the cvt instructions
// through f16 and f32 run at 16 per clock per SM and cost more than the tensor-core work). `x` holds
// the two bytes in the high byte of each 16-bit lane (b << 8). Moving the 7 exponent/mantissa bits
// down by 4 gives a bf16 whose value is the e4m3 value times 2^-120 (exponent bias 127 instead of 7;
// e4m3 subnormals land on bf16 subnormals with the same factor), and the multiply by 2^120 restores
// it exactly. Zero stays zero; the e4m3 NaN byte (never stored: the quantiser saturates finite
// inputs) would decode as 480.
__device__ __forceinline__ unsigned e4m3x2_hi_to_bf16x2(unsigned x) {
  const unsigned bits = (x & 0x80008000u) | ((x >> 4) & 0x07f007f0u);
  __nv_bfloat162 v = *reinterpret_cast<const __nv_bfloat162*>(&bits);
  const __nv_bfloat162 k2p120 = __halves2bfloat162(__ushort_as_bfloat16(0x7b80), __ushort_as_bfloat16(0x7b80));
  v = __hmul2(v, k2p120);
  return *reinterpret_cast<const unsigned*>(&v);
}
// Four e4m3 bytes of w -> two bf16x2 words (bytes 0, 1 and bytes 2, 3).
__device__ __forceinline__ void e4m3x4_to_bf16(unsigned w, unsigned& lo, unsigned& hi) {
  lo = e4m3x2_hi_to_bf16x2(__byte_perm(w, 0u, 0x1404u));
  hi = e4m3x2_hi_to_bf16x2(__byte_perm(w, 0u, 0x3424u));
}

struct SplitArgs {
  int n_splits, tiles_per_split, head_groups;
  float* part_o;    // [rows, heads, n_splits, 512] o / l of each split (n_splits > 1)
  float* part_lse;  // [rows, heads, n_splits] natural-log LSE of each split, -inf if it saw no key
  unsigned long long* combine_trace;  // the combine kernel's marks (benchmarks), or null
};

// A split kernel's CTA: its row, head group and split, and the split's keys [key0, key0 + n_keys)
// of the row's top-k in n_tiles tiles. CTA order: the head groups of one (row, split) are
// neighbours, so they read the same keys from the L2.
struct SplitCta {
  int64_t row, key0;
  int hg, split, n_keys, n_tiles;
};
__device__ __forceinline__ SplitCta split_cta(const SparseMlaDecodeParams& p, const SplitArgs& a) {
  SplitCta c;
  const int64_t b = blockIdx.x;
  c.hg = int(b % a.head_groups);
  c.split = int((b / a.head_groups) % a.n_splits);
  c.row = b / (int64_t(a.head_groups) * a.n_splits);
  c.key0 = int64_t(c.split) * a.tiles_per_split * kBK;
  const int64_t left = p.topk - c.key0, span = int64_t(a.tiles_per_split) * kBK;
  c.n_keys = int(left < 0 ? 0 : (left < span ? left : span));
  c.n_tiles = (c.n_keys + kBK - 1) / kBK;
  return c;
}

// Benchmarks' phase marks (SparseMlaDecodeParams::trace): thread 0 writes %globaltimer.
__device__ __forceinline__ void trace_mark(unsigned long long* trace, int mark) {
  if (trace != nullptr && threadIdx.x == 0) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    trace[int64_t(blockIdx.x) * kSparseMlaTraceSlots + mark] = t;
  }
}

// Stages the split's indices in shared memory, padded with -1 to whole tiles. Through the L2
// (ld.global.cg): a settled call reads them before its programmatic wait.
__device__ __forceinline__ void stage_indices(const SparseMlaDecodeParams& p, const SplitCta& c, int32_t* idx_s) {
  const int32_t* idx_row = p.indices + c.row * p.topk + c.key0;
#pragma unroll 8  // independent loads in flight (a plain loop waits one memory round trip each)
  for (int i = threadIdx.x; i < c.n_tiles * kBK; i += blockDim.x) idx_s[i] = i < c.n_keys ? __ldcg(idx_row + i) : -1;
}

// Lowers p.bad to the first of the split's indices outside the pool (one head group reports; after
// the programmatic wait: the flag is written by every call). Such slots are gathered as empty ones.
__device__ __forceinline__ void report_bad_indices(const SparseMlaDecodeParams& p, const SplitCta& c,
                                                   const int32_t* idx_s) {
  if (c.hg != 0) return;
  for (int i = threadIdx.x; i < c.n_keys; i += blockDim.x)
    if (idx_s[i] >= p.n_slots) atomicMin(p.bad, static_cast<unsigned long long>(c.row * p.topk + c.key0 + i));
}

// The cp.async gather of one tile's entries (slots: its 64 staged indices) into raw, zero-filled for
// empty or out-of-pool slots, as one commit group. Every slot the thread needs is read first, so
// the copies go out back to back.
__device__ __forceinline__ void issue_gather(const SparseMlaDecodeParams& p, const int32_t* slots, uint8_t* raw) {
  constexpr int kIters = (kBK * kPieces + kThreads - 1) / kThreads;  // 11 (the last one partial)
  const int tid = threadIdx.x;
  int32_t slot[kIters];
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int i = tid + it * kThreads;
    slot[it] = i < kBK * kPieces ? slots[i / kPieces] : -1;
  }
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int i = tid + it * kThreads;
    if (i >= kBK * kPieces) break;
    const int k = i / kPieces, piece = i - k * kPieces;
    const bool ok = slot[it] >= 0 && slot[it] < p.n_slots;
    const uint8_t* src = p.pool + (ok ? int64_t(slot[it]) * kEntry : 0) + piece * 16;
    cp_async16_zfill(raw + k * kEntry + piece * 16, src, ok ? 16 : 0);
  }
  cp_async_commit();
}

// Marks of tiles 0 and 1: step 0 landed, 1 unpacked, 2 scores, 3 softmax, 4 P.V (benchmarks).
__device__ __forceinline__ void trace_tile(unsigned long long* trace, int t, int step) {
  if (t < 2) trace_mark(trace, (t == 0 ? 3 : 9) + step);
}

// The start of a split CTA's tile pipeline: tile 0's gather and, for a settled call, before the
// programmatic wait also its unpack and tile 1's gather. Returns whether tile 0 is unpacked.
template <typename Issue, typename Unpack>
__device__ __forceinline__ bool start_tiles(const SparseMlaDecodeParams& p, int n_tiles, Issue issue_tile,
                                            Unpack unpack_tile) {
  if (n_tiles > 0) issue_tile(0);
  if (!p.settled || n_tiles == 0) return false;
  cp_async_wait<0>();
  __syncthreads();
  trace_tile(p.trace, 0, 0);
  unpack_tile();
  __syncthreads();  // raw is free
  trace_tile(p.trace, 0, 1);
  if (n_tiles > 1) issue_tile(1);
  return true;
}

template <int MT>
__global__ void __launch_bounds__(kThreads, 1) sparse_mla_split_kernel(SparseMlaDecodeParams p, SplitArgs a) {
  trace_mark(p.trace, 0);
  if (!p.settled) pdl_wait();
  using S = Smem<MT>;
  constexpr int HG = S::kHG;
  extern __shared__ __align__(16) uint8_t smem[];
  __nv_bfloat16* q_s = reinterpret_cast<__nv_bfloat16*>(smem + S::kQ);
  __nv_bfloat16* k_s = reinterpret_cast<__nv_bfloat16*>(smem + S::kK);
  uint8_t* raw = smem + S::kRaw;
  float* red = reinterpret_cast<float*>(smem + S::kRed);
  __nv_bfloat16* p_s = reinterpret_cast<__nv_bfloat16*>(smem + S::kP);
  float* scale_s = reinterpret_cast<float*>(smem + S::kScale);
  int32_t* idx_s = reinterpret_cast<int32_t*>(smem + S::kIdx);
  float* m_s = reinterpret_cast<float*>(smem + S::kStats);
  float* l_s = m_s + HG;
  float* alpha_s = l_s + HG;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const SplitCta cta = split_cta(p, a);
  const int hg = cta.hg, split = cta.split, n_tiles = cta.n_tiles;
  const int64_t row = cta.row, h0 = int64_t(hg) * HG;

  // q -> bf16 (heads past the end are zero rows): the loads are issued as early as the programmatic
  // wait allows, so they are in flight with the index loads or the first tile's gather; converted
  // once the gather is issued.
  constexpr int kQuads = HG * (kDk / 4) / kThreads;  // 9 MT per thread
  static_assert(HG * (kDk / 4) % kThreads == 0, "q quads split evenly over the threads");
  float4 x[kQuads];
  auto load_q = [&] {
    const float* qrow = p.q + row * p.q_s0;
    const bool vec = ((reinterpret_cast<uintptr_t>(qrow) | uintptr_t(p.q_s1) * 4) & 15) == 0;
#pragma unroll
    for (int u = 0; u < kQuads; ++u) {
      const int i = tid + u * kThreads, h = i / (kDk / 4), c = (i - h * (kDk / 4)) * 4;
      x[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (h0 + h < p.heads) {
        const float* src = qrow + (h0 + h) * p.q_s1 + c;
        x[u] = vec ? *reinterpret_cast<const float4*>(src) : make_float4(src[0], src[1], src[2], src[3]);
      }
    }
  };
  if (!p.settled) load_q();

  stage_indices(p, cta, idx_s);
  if (tid < HG) {
    m_s[tid] = -INFINITY;
    l_s[tid] = 0.0f;
  }
  __syncthreads();
  trace_mark(p.trace, 2);

  auto issue_tile = [&](int t) { issue_gather(p, idx_s + t * kBK, raw); };
  // Unpacks the tile in raw into k_s: per key 32 latent pieces (16 e4m3 -> 16 bf16, unscaled: the
  // tile scales are applied in fp32 to the scores and folded into P), 8 RoPE pieces (8 bf16) and
  // the 4 scales (to scale_s). Every shared-memory load of the thread goes out first.
  auto unpack_tile = [&] {
    constexpr int kLat = kBK * 32 / kThreads, kRope = kBK * 8 / kThreads;  // 8 and 2 per thread
    static_assert(kBK * 32 % kThreads == 0 && kBK * 8 % kThreads == 0 && kBK * 4 == kThreads, "unpack split");
    uint4 lat[kLat], rope[kRope];
#pragma unroll
    for (int j = 0; j < kLat; ++j) {
      const int i = tid + j * kThreads;
      lat[j] = *reinterpret_cast<const uint4*>(raw + (i >> 5) * kEntry + (i & 31) * 16);
    }
#pragma unroll
    for (int j = 0; j < kRope; ++j) {
      const int i = tid + j * kThreads;
      rope[j] = *reinterpret_cast<const uint4*>(raw + (i >> 3) * kEntry + ops::kMlaFp8RopeOffset + (i & 7) * 16);
    }
    const float sc = *reinterpret_cast<const float*>(raw + (tid >> 2) * kEntry + ops::kMlaFp8ScaleOffset + 4 * (tid & 3));
#pragma unroll
    for (int j = 0; j < kLat; ++j) {
      const int i = tid + j * kThreads;
      uint4 lo, hi;
      e4m3x4_to_bf16(lat[j].x, lo.x, lo.y);
      e4m3x4_to_bf16(lat[j].y, lo.z, lo.w);
      e4m3x4_to_bf16(lat[j].z, hi.x, hi.y);
      e4m3x4_to_bf16(lat[j].w, hi.z, hi.w);
      uint4* dst = reinterpret_cast<uint4*>(k_s + (i >> 5) * kKStride + (i & 31) * 16);
      dst[0] = lo;
      dst[1] = hi;
    }
#pragma unroll
    for (int j = 0; j < kRope; ++j) {
      const int i = tid + j * kThreads;
      *reinterpret_cast<uint4*>(k_s + (i >> 3) * kKStride + kLora + (i & 7) * 8) = rope[j];
    }
    scale_s[tid] = sc;
  };
  auto mark = [&](int t, int step) { trace_tile(p.trace, t, step); };
  const bool pre = start_tiles(p, n_tiles, issue_tile, unpack_tile);
  if (p.settled) {
    pdl_wait();
    load_q();
  }
  // Let the next kernel (the combine) get scheduled now: its blocks wait in griddepcontrol.wait for
  // this grid's completion, so its launch latency hides behind this kernel.
  pdl_trigger();
  trace_mark(p.trace, 1);
  report_bad_indices(p, cta, idx_s);
#pragma unroll
  for (int u = 0; u < kQuads; ++u) {
    const int i = tid + u * kThreads, h = i / (kDk / 4), c = (i - h * (kDk / 4)) * 4;
    *reinterpret_cast<uint2*>(q_s + h * kKStride + c) =
        make_uint2(pack_bf16x2(x[u].x, x[u].y), pack_bf16x2(x[u].z, x[u].w));
  }

  const float scale2 = p.softmax_scale * kLog2e;  // scores in base-2 units
  float acc[MT][8][4];                           // out[16 m + (g, g + 8)][64 warp + 8 n + 2 t4 + (0, 1)]
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int n = 0; n < 8; ++n) acc[m][n][0] = acc[m][n][1] = acc[m][n][2] = acc[m][n][3] = 0.0f;

  for (int t = 0; t < n_tiles; ++t) {
    // 1. Unpack (tile 0 of a settled call already is).
    const bool unpacked = pre && t == 0;
    if (!unpacked) {
      cp_async_wait<0>();
      __syncthreads();  // raw holds tile t; the previous tile's P.V is done with k_s and p_s
      mark(t, 0);
      unpack_tile();
    }
    __syncthreads();  // k_s (and q_s) ready; raw is free
    if (!unpacked) mark(t, 1);

    // 2. Prefetch the next tile while this one is computed.
    if (t + 1 < n_tiles && !unpacked) issue_tile(t + 1);

    // 3. Partial scores: warp (key half kh, latent tile kq): 32 keys x (128 latent dims of tile kq,
    //    scaled by the keys' tile-kq scale in fp32, + 16 RoPE dims) x HG heads.
    {
      const int kh = warp & 1, kq = warp >> 1;
      float sacc[MT][4][4], racc[MT][4][4];
#pragma unroll
      for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int n = 0; n < 4; ++n)
#pragma unroll
          for (int u = 0; u < 4; ++u) sacc[m][n][u] = racc[m][n][u] = 0.0f;
#pragma unroll
      for (int ks = 0; ks < 9; ++ks) {
        const int kk = ks < 8 ? kq * 128 + ks * 16 : kLora + kq * 16;  // 8 latent steps, 1 RoPE step
        unsigned af[MT][4];
#pragma unroll
        for (int m = 0; m < MT; ++m)
          ldmatrix_x4(af[m], q_s + (m * 16 + (lane & 15)) * kKStride + kk + (lane >> 4) * 8);
        unsigned bf[2][4];  // bf[nb] = {b0, b1 of n-tile 2 nb; b0, b1 of n-tile 2 nb + 1}
#pragma unroll
        for (int nb = 0; nb < 2; ++nb)
          ldmatrix_x4(bf[nb], k_s + (kh * 32 + nb * 16 + (lane >> 4) * 8 + (lane & 7)) * kKStride + kk +
                                  ((lane >> 3) & 1) * 8);
#pragma unroll
        for (int m = 0; m < MT; ++m)
#pragma unroll
          for (int n = 0; n < 4; ++n)
            mma_bf16(ks < 8 ? sacc[m][n] : racc[m][n], af[m], bf[n >> 1][(n & 1) * 2], bf[n >> 1][(n & 1) * 2 + 1]);
      }
#pragma unroll
      for (int n = 0; n < 4; ++n) {
        const int key = kh * 32 + n * 8 + 2 * t4;
        const float sc0 = scale_s[key * 4 + kq], sc1 = scale_s[(key + 1) * 4 + kq];
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          float* r0 = red + (kq * HG + m * 16 + g) * kRedStride + key;
          *reinterpret_cast<float2*>(r0) =
              make_float2(fmaf(sacc[m][n][0], sc0, racc[m][n][0]), fmaf(sacc[m][n][1], sc1, racc[m][n][1]));
          *reinterpret_cast<float2*>(r0 + 8 * kRedStride) =
              make_float2(fmaf(sacc[m][n][2], sc0, racc[m][n][2]), fmaf(sacc[m][n][3], sc1, racc[m][n][3]));
        }
      }
    }
    __syncthreads();
    mark(t, 2);

    // 4. Online softmax: warp w owns heads w, w + 8, ...; lane owns keys lane and lane + 32.
    {
      const int32_t* slots = idx_s + t * kBK;
      const bool v0 = slots[lane] >= 0 && slots[lane] < p.n_slots;
      const bool v1 = slots[lane + 32] >= 0 && slots[lane + 32] < p.n_slots;
#pragma unroll
      for (int hh = 0; hh < HG / 8; ++hh) {
        const int h = warp + 8 * hh;
        float s[2];
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const float* r = red + h * kRedStride + lane + 32 * j;
          const float dot = ((r[0] + r[HG * kRedStride]) + r[2 * HG * kRedStride]) + r[3 * HG * kRedStride];
          s[j] = dot * scale2;
        }
        if (!v0) s[0] = -INFINITY;
        if (!v1) s[1] = -INFINITY;
        const float m_old = m_s[h];
        const float m_new = fmaxf(m_old, warp_max(fmaxf(s[0], s[1])));
        float psum = 0.0f;
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int key = lane + 32 * j;
          const float pr = m_new == -INFINITY ? 0.0f : exp2f(s[j] - m_new);
          psum += pr;
          // P for the value columns of latent tile lt carries the key's tile scale (V is unscaled).
#pragma unroll
          for (int lt = 0; lt < 4; ++lt)
            p_s[(lt * HG + h) * kPStride + key] = __float2bfloat16_rn(pr * scale_s[key * 4 + lt]);
        }
        psum = warp_sum(psum);
        __syncwarp();  // every lane has read m_s[h] and l_s[h] before lane 0 rewrites them
        if (lane == 0) {
          const float alpha = m_old == -INFINITY ? 0.0f : exp2f(m_old - m_new);
          m_s[h] = m_new;
          l_s[h] = l_s[h] * alpha + psum;
          alpha_s[h] = alpha;
        }
      }
    }
    __syncthreads();
    mark(t, 3);

    // 5. out += P . V over this tile: warp w owns value columns [64 w, 64 w + 64).
    {
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        const float al0 = alpha_s[m * 16 + g], al1 = alpha_s[m * 16 + g + 8];
#pragma unroll
        for (int n = 0; n < 8; ++n) {
          acc[m][n][0] *= al0;
          acc[m][n][1] *= al0;
          acc[m][n][2] *= al1;
          acc[m][n][3] *= al1;
        }
      }
#pragma unroll
      for (int ks = 0; ks < kBK / 16; ++ks) {
        unsigned af[MT][4];
#pragma unroll
        for (int m = 0; m < MT; ++m)
          ldmatrix_x4(af[m], p_s + ((warp >> 1) * HG + m * 16 + (lane & 15)) * kPStride + ks * 16 + (lane >> 4) * 8);
#pragma unroll
        for (int np = 0; np < 4; ++np) {
          unsigned bf[4];  // {b0, b1 of n-tile 2 np; b0, b1 of n-tile 2 np + 1}
          ldmatrix_x4_trans(bf, k_s + (ks * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * kKStride +
                                    warp * 64 + np * 16 + (lane >> 4) * 8);
#pragma unroll
          for (int m = 0; m < MT; ++m) {
            mma_bf16(acc[m][2 * np], af[m], bf[0], bf[1]);
            mma_bf16(acc[m][2 * np + 1], af[m], bf[2], bf[3]);
          }
        }
      }
    }
    mark(t, 4);
  }
  __syncthreads();  // m_s / l_s final

  // Epilogue: o / l (0 without a key) and the LSE, to the output (one split) or the split's partial.
  const bool direct = a.n_splits == 1;
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int hl = m * 16 + g + 8 * half;
      const int64_t h = h0 + hl;
      if (h >= p.heads) continue;
      const float l = l_s[hl];
      const float inv = l > 0.0f ? 1.0f / l : 0.0f;
      if (direct) {  // out may be any f32 view (4-byte aligned): scalar stores
        float* dst = p.out + (row * p.heads + h) * kLora + warp * 64 + 2 * t4;
#pragma unroll
        for (int n = 0; n < 8; ++n) {
          dst[n * 8] = acc[m][n][2 * half] * inv;
          dst[n * 8 + 1] = acc[m][n][2 * half + 1] * inv;
        }
      } else {
        float* dst = a.part_o + ((row * p.heads + h) * a.n_splits + split) * kLora + warp * 64 + 2 * t4;
#pragma unroll
        for (int n = 0; n < 8; ++n)
          *reinterpret_cast<float2*>(dst + n * 8) = make_float2(acc[m][n][2 * half] * inv, acc[m][n][2 * half + 1] * inv);
      }
    }
  if (tid < HG && h0 + tid < p.heads) {
    const float l = l_s[tid];
    const float lse = l > 0.0f ? (m_s[tid] + log2f(l)) * kLn2 : -INFINITY;
    const int64_t h = h0 + tid;
    if (direct)
      p.lse[row * p.heads + h] = lse;
    else
      a.part_lse[(row * p.heads + h) * a.n_splits + split] = lse;
  }
  trace_mark(p.trace, 8);
}

// ---- The warpgroup kernel (m_tiles = 4): 64 heads per CTA on wgmma ----
//
// One CTA = (row, block of 64 heads, split of up to 32 tiles of 64 keys), two warpgroups. The heads
// are the MMA's M (64: heads past the end are zero rows). Per tile:
//   1. the raw entries (cp.async, fetched during the previous tile) are unpacked into a bf16 K tile
//      [64 keys][576] in the 128-byte swizzle (9 chunks of 64 dims), each latent value multiplied by
//      its tile scale (exact for the power-of-two scales dsinfer writes);
//   2. S = q K^T: warpgroup w takes keys [32 w, 32 w + 32), 36 m64n32k16 steps over the 576 dims
//      (q in shared memory, bf16, the same swizzle); the next tile's entries are fetched while the
//      tensor cores run them;
//   3. online softmax in registers: the two warpgroups' row maxima meet in shared memory (read in a
//      fixed order, so both hold the same running maximum), P = exp2(s - m) is stored in bf16 as
//      one [64 heads][64 keys] operand tile, l and the output rescale stay per thread;
//   4. out[64, 512] += P V: warpgroup w owns value columns [256 w, 256 w + 256), four m64n256k16
//      steps with V = the first 512 dims of the same K tile read MN-major (no second copy).
// Each thread holds two head rows (16 warp + g, + 8) of S and of its output: the alpha rescale and
// the softmax need no shared memory beyond the maxima. Numerics as the mma.sync kernel's, except
// that the tile scales ride on K and V (bf16 products, exact for power-of-two scales) instead of
// the fp32 scores and P.
namespace wgk {
constexpr int kHeads = 64;                    // the MMA's M: heads per CTA
constexpr int kChunkBytes = 64 * 128;         // a [64 rows][64 bf16] swizzled chunk
constexpr int kChunks = kDk / 64;             // 9: 8 latent chunks and the RoPE chunk
constexpr size_t kQ = 0;                                          // bf16 [9][64 heads][128 B]
constexpr size_t kK = kQ + size_t(kChunks) * kChunkBytes;         // bf16 [9][64 keys][128 B]
constexpr size_t kP = kK + size_t(kChunks) * kChunkBytes;         // bf16 [64 heads][64 keys]
constexpr size_t kRaw = kP + kChunkBytes;                         // u8 [64][656]
constexpr size_t kIdx = kRaw + size_t(kBK) * kEntry;              // i32 [32 * 64]
constexpr size_t kMax = kIdx + size_t(kSparseMlaMaxSplitTiles) * kBK * 4;  // f32 [2][64] row maxima
constexpr size_t kL = kMax + 2 * kHeads * 4;                      // f32 [2][64] row sums
constexpr size_t kBytes = kL + 2 * kHeads * 4;
constexpr size_t kAlign = 1024;                                   // the swizzle's 8-row period
constexpr size_t kAlloc = kBytes + kAlign;                        // + slack to align the base
static_assert(kK % kAlign == 0 && kP % kAlign == 0 && kRaw % 16 == 0, "tile alignment");

// Byte offset of element (r, c < 64) in a [rows][64] bf16 chunk in the 128-byte swizzle.
__device__ __forceinline__ uint32_t sw128(int r, int c) { return sw128_offset(r, c >> 3) | (uint32_t(c & 7) << 1); }
}  // namespace wgk

__global__ void __launch_bounds__(kThreads, 1) sparse_mla_wgmma_kernel(SparseMlaDecodeParams p, SplitArgs a) {
  trace_mark(p.trace, 0);
  if (!p.settled) pdl_wait();
  using namespace wgk;
  extern __shared__ uint8_t smem_base[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_base) + kAlign - 1) & ~(kAlign - 1));
  uint8_t* q_s = smem + kQ;
  uint8_t* k_s = smem + kK;
  uint8_t* p_s = smem + kP;
  uint8_t* raw = smem + kRaw;
  int32_t* idx_s = reinterpret_cast<int32_t*>(smem + kIdx);
  float* max_s = reinterpret_cast<float*>(smem + kMax);
  float* sum_s = reinterpret_cast<float*>(smem + kL);

  const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
  const int g = lane >> 2, t4 = lane & 3;
  const int r0 = 16 * warp + g, r1 = r0 + 8;  // this thread's two head rows (of 64)
  const SplitCta cta = split_cta(p, a);
  const int hb = cta.hg, split = cta.split, n_tiles = cta.n_tiles;
  const int64_t row = cta.row, h0 = int64_t(hb) * kHeads;

  stage_indices(p, cta, idx_s);
  __syncthreads();
  trace_mark(p.trace, 2);

  auto issue_tile = [&](int t) { issue_gather(p, idx_s + t * kBK, raw); };
  // Unpacks the tile in raw into the swizzled K tile, 16 bytes (8 dims) per item: 16 latent items per
  // thread (a warp: 32 consecutive 8-byte pieces of one key), in batches whose loads go out first,
  // then 2 RoPE items (16 bytes copied).
  auto unpack_tile = [&] {
    constexpr int kLat = kBK * (kLora / 8) / kThreads, kBatch = 4;  // 16 items per thread
#pragma unroll
    for (int b0 = 0; b0 < kLat; b0 += kBatch) {
      uint2 v[kBatch];
      float sc[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int i = tid + (b0 + j) * kThreads, k = i >> 6, u = i & 63;
        v[j] = *reinterpret_cast<const uint2*>(raw + k * kEntry + 8 * u);
        sc[j] = *reinterpret_cast<const float*>(raw + k * kEntry + ops::kMlaFp8ScaleOffset + 4 * (u >> 4));
      }
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int i = tid + (b0 + j) * kThreads, k = i >> 6, u = i & 63;
        const __nv_bfloat162 sc2 = __float2bfloat162_rn(sc[j]);
        unsigned w[4];
        e4m3x4_to_bf16(v[j].x, w[0], w[1]);
        e4m3x4_to_bf16(v[j].y, w[2], w[3]);
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const __nv_bfloat162 x = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&w[q]), sc2);
          w[q] = *reinterpret_cast<const unsigned*>(&x);
        }
        *reinterpret_cast<uint4*>(k_s + (u >> 3) * kChunkBytes + sw128(k, (8 * u) & 63)) =
            make_uint4(w[0], w[1], w[2], w[3]);
      }
    }
#pragma unroll
    for (int j = 0; j < kBK * (ops::kMlaFp8Rope / 8) / kThreads; ++j) {  // 2 per thread
      const int i = tid + j * kThreads, k = i >> 3, r = i & 7;
      *reinterpret_cast<uint4*>(k_s + (kLora / 64) * kChunkBytes + sw128(k, 8 * r)) =
          *reinterpret_cast<const uint4*>(raw + k * kEntry + ops::kMlaFp8RopeOffset + 16 * r);
    }
  };
  auto mark = [&](int t, int step) { trace_tile(p.trace, t, step); };
  const bool pre = start_tiles(p, n_tiles, issue_tile, unpack_tile);  // the fence for the tensor
                                                                      // cores comes with q's
  if (p.settled) pdl_wait();
  pdl_trigger();  // the combine's launch latency hides behind this kernel
  trace_mark(p.trace, 1);
  report_bad_indices(p, cta, idx_s);

  // q -> bf16 in the swizzle, 4 dims per item (heads past the end: zeros), 18 loads in flight.
  {
    const float* qrow = p.q + row * p.q_s0;
    const bool vec = ((reinterpret_cast<uintptr_t>(qrow) | uintptr_t(p.q_s1) * 4) & 15) == 0;
    constexpr int kItems = kHeads * kDk / 4, kBatch = 18;
    static_assert(kItems % (kThreads * kBatch) == 0, "q items split evenly");
    for (int base = 0; base < kItems; base += kThreads * kBatch) {
      float4 v[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int i = base + u * kThreads + tid, h = i / (kDk / 4), c = (i - h * (kDk / 4)) * 4;
        v[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (h0 + h < p.heads) {
          const float* src = qrow + (h0 + h) * p.q_s1 + c;
          v[u] = vec ? *reinterpret_cast<const float4*>(src) : make_float4(src[0], src[1], src[2], src[3]);
        }
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int i = base + u * kThreads + tid, h = i / (kDk / 4), c = (i - h * (kDk / 4)) * 4;
        *reinterpret_cast<uint2*>(q_s + (c >> 6) * kChunkBytes + sw128(h, c & 63)) =
            make_uint2(pack_bf16x2(v[u].x, v[u].y), pack_bf16x2(v[u].z, v[u].w));
      }
    }
  }

  const float scale2 = p.softmax_scale * kLog2e;  // scores in base-2 units
  float o[128];  // out[16 warp + g + 8 (e / 2)][256 wg + 8 j + 2 t4 + e % 2] = o[4 j + e]
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};

  for (int t = 0; t < n_tiles; ++t) {
    // 1. Unpack (tile 0 of a settled call already is).
    const bool unpacked = pre && t == 0;
    if (!unpacked) {
      cp_async_wait<0>();
      __syncthreads();  // raw holds tile t; both warpgroups' products of tile t - 1 are done
      mark(t, 0);
      unpack_tile();
    }
    fence_async_shared();
    __syncthreads();  // K (and, first time, q) visible to the tensor cores; raw is free
    if (!unpacked) mark(t, 1);

    // 2. S = q K^T over this warpgroup's 32 keys, and while the tensor cores run it, the next
    //    tile's gather (raw is free: the unpack above was its last reader).
    float s[16];  // S[16 warp + g + 8 (e / 2)][32 wg + 8 j + 2 t4 + e % 2] = s[4 j + e]
    wgmma_fence();
#pragma unroll
    for (int kc = 0; kc < kDk / 16; ++kc) {
      const int off = (kc >> 2) * kChunkBytes + (kc & 3) * 32;
      wgmma_bf16_n32<0>(s, wgmma_desc_sw128(q_s + off), wgmma_desc_sw128(k_s + off + wg * 32 * 128), kc > 0);
    }
    wgmma_commit();
    if (t + 1 < n_tiles && !unpacked) issue_tile(t + 1);
    wgmma_wait<0>();
    wgmma_fence_operands(s);

    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int32_t slot = idx_s[t * kBK + wg * 32 + 8 * j + 2 * t4 + (e & 1)];
        s[4 * j + e] = (slot >= 0 && slot < p.n_slots) ? s[4 * j + e] * scale2 : -INFINITY;
        mx[e >> 1] = fmaxf(mx[e >> 1], s[4 * j + e]);
      }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
    }
    if (t4 == 0) {
      max_s[wg * kHeads + r0] = mx[0];
      max_s[wg * kHeads + r1] = mx[1];
    }
    __syncthreads();  // both warpgroups' maxima
    mark(t, 2);

    // 3. The running maximum (the same in both warpgroups), P, l, the output rescale.
    float alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int hr = r ? r1 : r0;
      const float m_new = fmaxf(m_run[r], fmaxf(max_s[hr], max_s[kHeads + hr]));
      alpha[r] = m_run[r] == -INFINITY ? 0.0f : exp2f(m_run[r] - m_new);
      m_run[r] = m_new;
    }
    float ps[2] = {0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float m = m_run[e >> 1];
        const float pr = m == -INFINITY ? 0.0f : exp2f(s[4 * j + e] - m);
        s[4 * j + e] = pr;
        ps[e >> 1] += pr;
      }
      const int key = wg * 32 + 8 * j + 2 * t4;
      *reinterpret_cast<unsigned*>(p_s + sw128(r0, key)) = pack_bf16x2(s[4 * j], s[4 * j + 1]);
      *reinterpret_cast<unsigned*>(p_s + sw128(r1, key)) = pack_bf16x2(s[4 * j + 2], s[4 * j + 3]);
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      ps[r] += __shfl_xor_sync(0xffffffffu, ps[r], 1);
      ps[r] += __shfl_xor_sync(0xffffffffu, ps[r], 2);
      l_run[r] = l_run[r] * alpha[r] + ps[r];
    }
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] *= alpha[(i >> 1) & 1];
    fence_async_shared();
    __syncthreads();  // P complete (both halves of the keys)
    mark(t, 3);

    // 4. out += P V over this warpgroup's 256 value columns (V: the K tile, MN-major).
    wgmma_fence_operands(o);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kBK / 16; ++ks)
      wgmma_bf16_n256<1>(o, wgmma_desc_sw128(p_s + ks * 32),
                         wgmma_desc_sw128_mn(k_s + ks * 16 * 128 + wg * 4 * kChunkBytes, kChunkBytes), 1);
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_fence_operands(o);
    mark(t, 4);
  }

  // Epilogue: l = the two warpgroups' sums (fixed order); o / l (0 without a key) and the LSE.
  if (t4 == 0) {
    sum_s[wg * kHeads + r0] = l_run[0];
    sum_s[wg * kHeads + r1] = l_run[1];
  }
  __syncthreads();
  const bool direct = a.n_splits == 1;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int hr = r ? r1 : r0;
    const int64_t h = h0 + hr;
    if (h >= p.heads) continue;
    const float l = sum_s[hr] + sum_s[kHeads + hr];
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    if (direct) {  // out may be any f32 view (4-byte aligned): scalar stores
      float* dst = p.out + (row * p.heads + h) * kLora + wg * 256 + 2 * t4;
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        dst[8 * j] = o[4 * j + 2 * r] * inv;
        dst[8 * j + 1] = o[4 * j + 2 * r + 1] * inv;
      }
    } else {
      float* dst = a.part_o + ((row * p.heads + h) * a.n_splits + split) * kLora + wg * 256 + 2 * t4;
#pragma unroll
      for (int j = 0; j < 32; ++j)
        *reinterpret_cast<float2*>(dst + 8 * j) = make_float2(o[4 * j + 2 * r] * inv, o[4 * j + 2 * r + 1] * inv);
    }
    if (wg == 0 && t4 == 0) {
      const float lse = l > 0.0f ? (m_run[r] + log2f(l)) * kLn2 : -INFINITY;
      if (direct)
        p.lse[row * p.heads + h] = lse;
      else
        a.part_lse[(row * p.heads + h) * a.n_splits + split] = lse;
    }
  }
  trace_mark(p.trace, 8);
}

// One block per (row, head): out = sum_i exp(lse_i - L) o_i, lse = L = log sum_i exp(lse_i).
// Splits that saw no key have lse_i = -inf and weigh 0; all -inf gives out = 0, lse = -inf.
// The partials are L2-resident and the kernel is latency-bound, so every load goes out at once:
// G groups of 128 threads (G = ceil(splits / kCombineBatch), at most 4: few splits, small blocks,
// many per SM) take every G-th split (4 columns per thread), each thread loads its first
// kCombineBatch partials with their LSEs, and every warp the LSEs of all splits for the maximum and
// the sum (warp shuffles in a fixed order: the same in every warp, no shared memory). The group sums
// are added in group order (deterministic).
constexpr int kCombineGroups = 4;
constexpr int kCombineBatch = 8;  // partials per thread in flight with the LSE loads
__global__ void __launch_bounds__(128 * kCombineGroups) sparse_mla_combine_kernel(SparseMlaDecodeParams p, SplitArgs a) {
  trace_mark(a.combine_trace, 0);
  pdl_wait();  // the split kernel's writes are visible
  pdl_trigger();
  trace_mark(a.combine_trace, 1);
  __shared__ float4 part[kCombineGroups - 1][128];
  const int64_t rh = blockIdx.x;  // row * heads + head
  const int n = a.n_splits, c4 = threadIdx.x & 127, grp = threadIdx.x >> 7, lane = threadIdx.x & 31;
  const int ng = blockDim.x >> 7;  // groups
  const float* ls = a.part_lse + rh * n;
  const float4* po = reinterpret_cast<const float4*>(a.part_o + rh * n * kLora) + c4;
  float4 v[kCombineBatch];
  float lv[kCombineBatch];
#pragma unroll
  for (int u = 0; u < kCombineBatch; ++u) {
    const int i = grp + ng * u;
    v[u] = i < n ? po[int64_t(i) * (kLora / 4)] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    lv[u] = i < n ? ls[i] : -INFINITY;
  }
  float mx = -INFINITY;
  for (int i = lane; i < n; i += 32) mx = fmaxf(mx, ls[i]);
  mx = warp_max(mx);
  float* o = p.out + rh * kLora;  // any f32 view: scalar stores
  if (mx == -INFINITY) {  // no split saw a key (block-uniform)
    if (grp == 0) {
#pragma unroll
      for (int u = 0; u < 4; ++u) o[4 * c4 + u] = 0.0f;
      if (c4 == 0) p.lse[rh] = -INFINITY;
    }
    return;
  }
  trace_mark(a.combine_trace, 2);
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  auto add = [&](float w, const float4& x) {
    acc.x += w * x.x;
    acc.y += w * x.y;
    acc.z += w * x.z;
    acc.w += w * x.w;
  };
#pragma unroll
  for (int u = 0; u < kCombineBatch; ++u) add(expf(lv[u] - mx), v[u]);  // 0 past n and without keys
#pragma unroll 8
  for (int i = grp + ng * kCombineBatch; i < n; i += ng)
    add(expf(ls[i] - mx), po[int64_t(i) * (kLora / 4)]);
  if (grp > 0) part[grp - 1][c4] = acc;
  __syncthreads();
  if (grp != 0) return;
  float sum = 0.0f;
  for (int i = lane; i < n; i += 32) sum += expf(ls[i] - mx);
  sum = warp_sum(sum);  // >= 1: the maximum's own weight
#pragma unroll
  for (int gi = 0; gi < ng - 1; ++gi) {
    const float4 x = part[gi][c4];
    acc.x += x.x;
    acc.y += x.y;
    acc.z += x.z;
    acc.w += x.w;
  }
  const float inv = 1.0f / sum;
  o[4 * c4 + 0] = acc.x * inv;
  o[4 * c4 + 1] = acc.y * inv;
  o[4 * c4 + 2] = acc.z * inv;
  o[4 * c4 + 3] = acc.w * inv;
  if (c4 == 0) p.lse[rh] = mx + logf(sum);
  trace_mark(a.combine_trace, 3);
}

size_t align16(size_t n) { return (n + 15) / 16 * 16; }

// Launches one of the split kernels with `smem` bytes of dynamic shared memory (opted into per call:
// cheap, per device, allowed during stream capture).
template <typename Kernel>
void launch_split(Kernel kernel, size_t smem, const SparseMlaDecodeParams& p, const SplitArgs& a, unsigned blocks,
                  cudaStream_t s) {
  DSI_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  launch(kernel, blocks, kThreads, smem, s, p, a);
}
static_assert(Smem<1>::kBytes <= 227 * 1024 && Smem<2>::kBytes <= 227 * 1024 && wgk::kAlloc <= 227 * 1024,
              "sparse MLA split kernels: shared memory over the sm_90 limit");

}  // namespace

SparseMlaDecodePlan plan_sparse_mla_decode(int64_t rows, int64_t heads, int64_t topk, int sm_count,
                                           int force_m_tiles, int force_splits) {
  SparseMlaDecodePlan pl;
  pl.rows = rows;
  pl.heads = heads;
  pl.topk = topk;
  const int64_t n_tiles = (topk + kBK - 1) / kBK;
  const int64_t sms = std::max(1, sm_count);
  // The warpgroup kernel once a call has 128 (row, head) pairs or more. Measured on an H200 (top-2048,
  // bench_kv_fp8 --sweep, each kernel's best tiling): 16 rows x 64 heads 37.6 us against 63.3 us on
  // mma.sync, 4 rows x 64 heads 22.3 against 24.0, one row of 128 heads 16.5 against 18.0; but one row
  // of 64 heads (32 CTAs of one tile) 16.0 against 13.2, and of 8 heads 12.7 against 11.0. Below that,
  // two m-tiles per CTA halve the K fragment loads per mma (better tensor-core use) but halve the
  // CTAs: worth it once one-tile CTAs of 16 heads would need more than one wave.
  if (force_m_tiles == 1 || force_m_tiles == 2 || force_m_tiles == 4)
    pl.m_tiles = force_m_tiles;
  else if (rows * heads >= 128)
    pl.m_tiles = 4;
  else
    pl.m_tiles = (heads <= 16 || rows * ((heads + 15) / 16) * n_tiles <= sms) ? 1 : 2;
  pl.head_groups = int((heads + 16 * pl.m_tiles - 1) / (16 * pl.m_tiles));
  const int64_t base = rows * pl.head_groups;
  int64_t splits = force_splits > 0 ? force_splits : std::max<int64_t>(1, sms / std::max<int64_t>(1, base));
  splits = std::clamp<int64_t>(splits, 1, std::max<int64_t>(1, n_tiles));
  int64_t tps = (n_tiles + splits - 1) / splits;
  tps = std::min<int64_t>(tps, kSparseMlaMaxSplitTiles);
  pl.tiles_per_split = int(tps);
  pl.n_splits = tps > 0 ? int((n_tiles + tps - 1) / tps) : 1;
  if (pl.n_splits > 1) {
    const size_t parts = size_t(rows * heads) * size_t(pl.n_splits);
    pl.workspace_bytes = align16(parts * kLora * sizeof(float)) + align16(parts * sizeof(float));
  }
  return pl;
}

void launch_sparse_mla_decode(const SparseMlaDecodeParams& p, const SparseMlaDecodePlan& plan,
                              cudaStream_t s) {
  if (p.rows == 0 || p.heads == 0) return;
  DSI_CHECK(plan.rows == p.rows && plan.heads == p.heads && plan.topk == p.topk,
            "sparse_mla_decode: plan for [{}, {}, topk {}] used for [{}, {}, topk {}]", plan.rows,
            plan.heads, plan.topk, p.rows, p.heads, p.topk);
  DSI_CHECK(plan.n_splits == 1 || p.workspace != nullptr, "sparse_mla_decode: {} splits need a workspace",
            plan.n_splits);
  SplitArgs a{};
  a.n_splits = plan.n_splits;
  a.tiles_per_split = plan.tiles_per_split;
  a.head_groups = plan.head_groups;
  if (plan.n_splits > 1) {
    const size_t parts = size_t(p.rows * p.heads) * size_t(plan.n_splits);
    a.part_o = static_cast<float*>(p.workspace);
    a.part_lse = reinterpret_cast<float*>(static_cast<uint8_t*>(p.workspace) +
                                          align16(parts * kLora * sizeof(float)));
  }
  const int64_t blocks = p.rows * plan.head_groups * plan.n_splits;
  DSI_CHECK(blocks < (int64_t(1) << 31), "sparse_mla_decode: {} blocks", blocks);
  if (p.trace != nullptr) a.combine_trace = p.trace + blocks * kSparseMlaTraceSlots;
  if (plan.m_tiles == 4)
    launch_split(sparse_mla_wgmma_kernel, wgk::kAlloc, p, a, unsigned(blocks), s);
  else if (plan.m_tiles == 1)
    launch_split(sparse_mla_split_kernel<1>, Smem<1>::kBytes, p, a, unsigned(blocks), s);
  else
    launch_split(sparse_mla_split_kernel<2>, Smem<2>::kBytes, p, a, unsigned(blocks), s);
  if (plan.n_splits > 1) {
    DSI_CHECK(p.rows * p.heads < (int64_t(1) << 31), "sparse_mla_decode: {} rows x heads", p.rows * p.heads);
    const int groups = std::clamp((plan.n_splits + kCombineBatch - 1) / kCombineBatch, 1, kCombineGroups);
    launch(sparse_mla_combine_kernel, dim3(unsigned(p.rows * p.heads)), dim3(128 * groups), 0, s, p, a);
  }
}

}  // namespace dsi::cuda
