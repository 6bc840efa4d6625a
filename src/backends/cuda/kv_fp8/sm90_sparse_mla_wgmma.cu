// The warpgroup split kernel of sparse MLA decode (m_tiles 4: wgmma, 64 heads per CTA); the plan
// takes it once a call has 128 (row, head) pairs or more. Design, settled calls and numerics:
// sm90_sparse_mla_decode.cu.
#include <cuda_bf16.h>

#include "backends/cuda/kv_fp8/sm90_sparse_mla_common.cuh"
#include "backends/cuda/wgmma.cuh"

namespace dsi::cuda::sparse_mla {

namespace {

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
  uint8_t* smem = align_shared<kAlign>(smem_base);
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

static_assert(wgk::kAlloc <= 227 * 1024, "sparse MLA warpgroup kernel: shared memory over the sm_90 limit");

}  // namespace

void launch_wgmma_split(const SparseMlaDecodeParams& p, const SplitArgs& a, unsigned blocks, cudaStream_t s) {
  launch_split(sparse_mla_wgmma_kernel, wgk::kAlloc, p, a, blocks, s);
}

}  // namespace dsi::cuda::sparse_mla
