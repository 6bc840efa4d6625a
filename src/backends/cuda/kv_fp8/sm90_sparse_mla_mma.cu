// The mma.sync split kernel of sparse MLA decode (m_tiles 1 or 2: 16 or 32 heads per CTA); the
// plan takes it for few (row, head) pairs. Design, settled calls and numerics:
// sm90_sparse_mla_decode.cu.
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
#include <cuda_bf16.h>

#include "backends/cuda/kv_fp8/sm90_sparse_mla_common.cuh"

namespace dsi::cuda::sparse_mla {

namespace {

constexpr int kKStride = kDk + 8;   // bf16 elements per K / q row: 1168 B = 73 x 16 B,
                                    // so the 8 rows of an ldmatrix hit distinct banks
constexpr int kPStride = kBK + 8;   // bf16 per P row (144 B = 9 x 16 B)
constexpr int kRedStride = kBK + 4;  // f32 per partial-score row

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

static_assert(Smem<1>::kBytes <= 227 * 1024 && Smem<2>::kBytes <= 227 * 1024,
              "sparse MLA mma.sync kernel: shared memory over the sm_90 limit");

}  // namespace

void launch_mma_split(const SparseMlaDecodeParams& p, const SplitArgs& a, int m_tiles, unsigned blocks,
                      cudaStream_t s) {
  if (m_tiles == 1)
    launch_split(sparse_mla_split_kernel<1>, Smem<1>::kBytes, p, a, blocks, s);
  else
    launch_split(sparse_mla_split_kernel<2>, Smem<2>::kBytes, p, a, blocks, s);
}

}  // namespace dsi::cuda::sparse_mla
