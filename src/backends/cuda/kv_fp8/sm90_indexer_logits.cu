// Indexer decode logits over the paged fp8 key cache on the tensor cores (sm_90; mma.sync
// m16n8k32 e4m3, fp32 accumulate), after DeepGEMM's fp8_mqa_logits / paged_mqa_logits: the core is
// the fp8 GEMM [rows * heads, 128] x [128, keys], followed by relu, the head weights, the sum over
// heads and the key scale.
//
// Work split: a block owns a "row group" (up to 4 consecutive rows of one sequence: the MTP
// verification rows) and walks that sequence's pages (one 64-key page per tile) with a 4-stage
// cp.async pipeline whose page ids are read one tile ahead. Each page is read from HBM once per
// group and reused for every row and head. Each warp loads the e4m3 query bytes of 64 heads of one
// row (rotate_quant writes them) into registers once (4 m16 tiles x 4 k32 steps)
// and multiplies them by 8..64 keys of the page (n8 tiles read from shared memory); its partial
// head sums go through shared memory so the head chunks of one row (heads > 64) add in a fixed order.
//
// K order: a lane's A and B registers hold bytes tig*32 + 8j + [0, 8) of a query / key row for k
// step j (two 16-byte loads per row). The dot product's k order is a permutation of the reference's,
// identical for A and B, so each mma computes the same sum of exact e4m3 products.
//
// Numerics: every product of two e4m3 values is exact in fp32, but the tensor core adds the 32
// products of a k step in its own order and width (on Hopper the fp8 MMA aligns the products to the
// largest exponent and keeps a limited number of bits) and the heads are then summed lane-parallel,
// so logits agree with the CPU's sequential fp32 sums to a small relative error, not bitwise
// (tests/cuda/test_cuda_kv_fp8.cpp states the bound). Runs are deterministic: fixed orders only.
#include <algorithm>
#include <cstdint>

#include "backends/cuda/common.cuh"
#include "backends/cuda/kv_fp8/sm90_indexer_logits.h"
#include "ops/kv_fp8.h"

namespace dsi::cuda {

namespace {

constexpr int kPage = ops::kKvPageTokens;  // keys per tile: one page
constexpr int kD = 128;
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kStages = 4;
constexpr int kRowBytes = kD + 16;  // 144: padded key rows, conflict-free 16-byte fragment loads
constexpr int kGroupRows = 4;       // rows per group (MTP: 1 + 3 drafts)
constexpr int kHeadsPerWarp = 64;   // 4 m16 tiles

static_assert(kGroupRows * kPage == kThreads, "the write phase maps one thread to (row, key)");

struct Stage {
  uint8_t keys[kPage * kRowBytes];  // [64 keys, 144 B]: 128 e4m3 values + 16 B of padding
  float scales[kPage];              // [64] key scales
};

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// d += a b: a 16x32 e4m3 (row), b 32x8 e4m3 (col), d 16x8 f32.
__device__ __forceinline__ void mma_e4m3(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Row r may start or extend a group when its sequence and bound are valid.
__device__ __forceinline__ bool row_valid(const IndexerLogitsFp8Params& p, int64_t r, int64_t max_bound) {
  const int64_t seq = p.row_seq[r], bound = p.bounds[r];
  return seq >= 0 && seq < p.n_seqs && bound >= 0 && bound <= max_bound;
}
// Group leaders: valid rows at a multiple of 4 or after a row of another sequence (or an invalid
// one). A group is its leader and the following valid rows of the same sequence up to the next leader.
__device__ __forceinline__ bool row_leads(const IndexerLogitsFp8Params& p, int64_t r, int64_t max_bound) {
  if (r % kGroupRows == 0) return true;
  return !row_valid(p, r - 1, max_bound) || p.row_seq[r - 1] != p.row_seq[r];
}

__global__ void __launch_bounds__(kThreads, 2) indexer_logits_mma_kernel(IndexerLogitsFp8Params p) {
  __shared__ __align__(16) Stage st[kStages];
  __shared__ float part[kWarps][kPage];  // [m slice = (row, head chunk)][key] partial head sums
  __shared__ int s_bad[kStages];         // the stage's page id is invalid
  __shared__ int s_bound[kGroupRows];
  __shared__ int s_rows;
  __shared__ int64_t s_seq;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, tig = lane & 3;
  const int64_t r0 = blockIdx.y;
  const int64_t max_bound = p.n_cols < p.max_pages * kPage ? p.n_cols : p.max_pages * kPage;
  if (tid == 0) {
    int rows = 0;
    if (!row_valid(p, r0, max_bound)) {
      if (blockIdx.x == 0) atomicMin(p.bad_row, static_cast<unsigned long long>(r0));
    } else if (row_leads(p, r0, max_bound)) {
      rows = 1;
      while (rows < kGroupRows && r0 + rows < p.rows && row_valid(p, r0 + rows, max_bound) &&
             !row_leads(p, r0 + rows, max_bound))
        ++rows;
      for (int i = 0; i < rows; ++i) s_bound[i] = p.bounds[r0 + i];
      s_seq = p.row_seq[r0];
    }
    s_rows = rows;
  }
  __syncthreads();
  const int R = s_rows;
  if (R == 0) return;  // block-uniform: not a leader, or an invalid row (reported)
  const int64_t seq = s_seq;
  int gmax = 0;
  for (int i = 0; i < R; ++i) gmax = max(gmax, s_bound[i]);

  // Warp roles: m slices (row, head chunk of 64) x k slices (keys of the page).
  const int hc_count = (p.heads + kHeadsPerWarp - 1) / kHeadsPerWarp;  // 1 or 2
  const int mslices = R * hc_count;                                     // 1..8
  const int kslices = kWarps / mslices;
  const int warp_keys = kPage / kslices;  // 8, 16, 32 or 64
  const bool active = warp < mslices * kslices;
  const int mslice = active ? warp / kslices : 0, kslice = warp % kslices;
  const int64_t r = r0 + mslice / hc_count;
  const int hc = mslice % hc_count;

  // This warp's queries (e4m3 bytes, in registers for the whole block) and head weights: two
  // 16-byte loads per m tile and half, all in flight together.
  uint32_t a[4][4][4];  // [m tile][k step][a0..a3]
  float wr[4][2];       // [m tile][head g, head g + 8]
#pragma unroll
  for (int mt = 0; mt < 4; ++mt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int h = hc * kHeadsPerWarp + mt * 16 + g + 8 * half;
      const bool on = active && h < p.heads;
      uint4 lo = make_uint4(0, 0, 0, 0), hi = lo;
      if (on) {
        const uint4* src = reinterpret_cast<const uint4*>(p.q8_bytes + (r * p.heads + h) * kD + tig * 32);
        lo = src[0];
        hi = src[1];
      }
      const uint32_t w[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};  // bytes tig*32 + 4m
#pragma unroll
      for (int m = 0; m < 8; ++m) a[mt][m / 2][half + 2 * (m % 2)] = w[m];
      wr[mt][half] = on ? p.wq[r * p.heads + h] : 0.0f;
    }
  }

  const int64_t page_bytes = int64_t(kPage) * (kD + 4);
  const int64_t n_tiles = (p.n_cols + kPage - 1) / kPage;
  const int64_t stride = gridDim.x;
  // Page id of tile t (page t of the sequence), or kNoTile past the keys any row of the group sees.
  // The id a stage's copies need is loaded one iteration before it is used, so the block-table
  // read's latency hides behind a tile instead of stalling every issue.
  constexpr int32_t kNoTile = INT32_MIN;
  auto page_id = [&](int64_t t) -> int32_t {
    return t < n_tiles && t * kPage < gmax ? p.block_tables[seq * p.max_pages + t] : kNoTile;
  };
  // Queues the loads of tile t, physical page `page`, into stage s; always commits a group.
  auto issue = [&](int64_t t, int32_t page, int s) {
    if (page != kNoTile) {
      const bool ok = page >= 0 && page < p.n_pages;
      if (tid == 0) {
        s_bad[s] = ok ? 0 : 1;
        if (!ok) atomicMin(p.bad_page, static_cast<unsigned long long>(seq * p.max_pages + t));
      }
      if (ok) {
        const uint8_t* pg = p.pool + int64_t(page) * page_bytes;
        for (int c = tid; c < kPage * (kD / 16); c += kThreads) {
          const int key = c / (kD / 16), piece = c % (kD / 16);
          cp_async16(st[s].keys + key * kRowBytes + piece * 16, pg + key * kD + piece * 16);
        }
        if (tid < kPage / 4) cp_async16(st[s].scales + tid * 4, pg + kPage * kD + tid * 16);
      }
    }
    cp_async_commit();
  };

  int32_t first[kStages];  // the ids of the first kStages tiles, loads in flight together
#pragma unroll
  for (int s = 0; s < kStages; ++s) first[s] = page_id(int64_t(blockIdx.x) + int64_t(s) * stride);
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) issue(int64_t(blockIdx.x) + int64_t(s) * stride, first[s], s);
  int32_t next = first[kStages - 1];  // id of the tile the next iteration issues
  int it = 0;
  for (int64_t t = blockIdx.x; t < n_tiles; t += stride, ++it) {
    const int s = it % kStages;
    cp_async_wait<kStages - 2>();
    __syncthreads();  // tile t landed for every thread; the stage issued below is no longer read
    issue(t + int64_t(kStages - 1) * stride, next, (it + kStages - 1) % kStages);
    next = page_id(t + int64_t(kStages) * stride);
    const bool has_keys = t * kPage < gmax;
    const bool bad = has_keys && s_bad[s] != 0;
    if (has_keys && !bad && active) {
      for (int n0 = kslice * warp_keys; n0 < (kslice + 1) * warp_keys; n0 += 8) {
        const uint8_t* krow = st[s].keys + (n0 + g) * kRowBytes + tig * 32;
        const uint4 lo = *reinterpret_cast<const uint4*>(krow);
        const uint4 hi = *reinterpret_cast<const uint4*>(krow + 16);
        const uint32_t bw[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
        float c[4][4];
#pragma unroll
        for (int mt = 0; mt < 4; ++mt) c[mt][0] = c[mt][1] = c[mt][2] = c[mt][3] = 0.0f;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
#pragma unroll
          for (int mt = 0; mt < 4; ++mt) mma_e4m3(c[mt], a[mt][j], bw[2 * j], bw[2 * j + 1]);
        }
        // c[mt]: heads (mt*16 + g, + 8) x keys (n0 + 2 tig, + 1). relu, weight, sum the heads.
        float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
        for (int mt = 0; mt < 4; ++mt) {
          s0 = fmaf(wr[mt][0], fmaxf(c[mt][0], 0.0f), s0);
          s1 = fmaf(wr[mt][0], fmaxf(c[mt][1], 0.0f), s1);
          s0 = fmaf(wr[mt][1], fmaxf(c[mt][2], 0.0f), s0);
          s1 = fmaf(wr[mt][1], fmaxf(c[mt][3], 0.0f), s1);
        }
#pragma unroll
        for (int o = 4; o < 32; o <<= 1) {
          s0 += __shfl_xor_sync(0xffffffffu, s0, o);
          s1 += __shfl_xor_sync(0xffffffffu, s1, o);
        }
        if (g == 0) {
          part[mslice][n0 + 2 * tig] = s0;
          part[mslice][n0 + 2 * tig + 1] = s1;
        }
      }
    }
    __syncthreads();  // partial sums complete
    if (tid < R * kPage) {
      const int rl = tid / kPage, kk = tid % kPage;
      const int64_t col = t * kPage + kk;
      if (col < p.n_cols) {
        float v;
        if (col >= s_bound[rl]) {
          v = -INFINITY;
        } else if (bad) {
          v = NAN;
        } else {
          float acc = part[rl * hc_count][kk];
          for (int h = 1; h < hc_count; ++h) acc += part[rl * hc_count + h][kk];
          v = st[s].scales[kk] * acc;
        }
        p.logits[(r0 + rl) * p.n_cols + col] = v;
      }
    }
  }
  cp_async_wait<0>();
}

int device_sm_count() {
  int dev = 0, n = 0;
  DSI_CUDA_CHECK(cudaGetDevice(&dev));
  DSI_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
  return n;
}

}  // namespace

bool indexer_logits_fp8_mma_supported(int heads, int d) {
  if (d != kD || heads < 1 || heads > 2 * kHeadsPerWarp) return false;
  int dev = 0, major = 0;
  DSI_CUDA_CHECK(cudaGetDevice(&dev));
  DSI_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  return major >= 9;
}

void launch_indexer_logits_fp8_mma(const IndexerLogitsFp8Params& p, cudaStream_t s) {
  if (p.rows == 0) return;
  DSI_CHECK(p.d == kD && p.heads >= 1 && p.heads <= 2 * kHeadsPerWarp,
            "indexer_logits_fp8: the tensor-core kernel takes d = 128 and 1..128 heads, got d = {}, {} heads",
            p.d, p.heads);
  DSI_CHECK(p.rows <= 65535, "indexer_logits_fp8: {} rows, at most 65535 per call", p.rows);
  const int64_t n_tiles = (p.n_cols + kPage - 1) / kPage;
  // About two resident blocks per SM over all groups (a group is up to 4 rows of one sequence).
  const int64_t groups = (p.rows + kGroupRows - 1) / kGroupRows;
  const int64_t want = std::max<int64_t>(1, 2 * int64_t(device_sm_count()) / groups);
  const unsigned gx = unsigned(std::max<int64_t>(1, std::min(n_tiles, want)));
  indexer_logits_mma_kernel<<<dim3(gx, unsigned(p.rows)), kThreads, 0, s>>>(p);
  DSI_CUDA_CHECK_LAUNCH();
}

}  // namespace dsi::cuda
