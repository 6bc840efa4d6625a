// Indexer decode logits over the paged fp8 key cache on the tensor cores (sm_90; mma.sync
// m16n8k16 f16, fp32 accumulate), after DeepGEMM's fp8_mqa_logits / paged_mqa_logits: the core is
// the GEMM [rows * heads, 128] x [128, keys] of e4m3 values, followed by relu, the head weights, the
// sum over heads and the key scale. Hopper's mma.sync has no fp8 path (an e4m3 mma.sync compiles to
// a conversion of both operands to f16 and two f16 MMAs, every time), so the kernel converts the
// queries to f16 once and each key fragment once per warp; e4m3 -> f16 is exact.
//
// Work split: a block owns a "row group" (up to 4 consecutive rows of one sequence: the MTP
// verification rows; 2 with more than 64 heads) and walks that sequence's pages (one 64-key page per
// tile) with an 8-stage pipeline of bulk copies: thread 0 copies each page (keys and scales, 8448
// contiguous bytes) into its stage in one cp.async.bulk that completes on the stage's barrier; page
// ids are read one tile ahead. Each page is read from HBM once per group and reused for every row
// and head. Each warp holds the queries of 32 heads
// of one row (rotate_quant writes them as e4m3 bytes) in registers (2 m16 tiles x 8 k16 steps) and
// multiplies them by 8..64 keys of the page (n8 tiles read from shared memory); its partial head
// sums go through shared memory so the head chunks of one row add in a fixed order.
//
// K order: for k16 step j a lane's A and B registers hold bytes tig*32 + 4j + [0, 4) of a query /
// key row (two 16-byte loads per row; lanes of odd g load their second 16 bytes first, which makes
// the unpadded 128-byte key rows of a stage conflict-free). The dot product's k order is a permutation of the
// reference's, identical for A and B, so each mma computes the same sum of exact products.
//
// Numerics: every product of two e4m3 values is exact in fp32, but the tensor core adds the
// products of a k step in its own order and width and the heads are then summed lane-parallel, so
// logits agree with the CPU's sequential fp32 sums to a small relative error, not bitwise
// (tests/cuda/test_cuda_kv_fp8.cpp states the bound). Runs are deterministic: fixed orders only.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "backends/cuda/common.cuh"
#include "backends/cuda/kv_fp8/sm90_indexer_logits.h"
#include "backends/cuda/ptx.cuh"
#include "ops/kv_fp8.h"

namespace dsi::cuda {

namespace {

constexpr int kPage = ops::kKvPageTokens;  // keys per tile: one page
constexpr int kD = 128;
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kStages = 8;          // at 128K keys, all of a block's pages in flight at once
constexpr int kKeyBytes = kPage * kD;                        // a page: [64 keys, 128 B] of e4m3 ...
constexpr int kStageBytes = kKeyBytes + kPage * 4;           // ... then [64] fp32 key scales: 8448 B
constexpr size_t kSmemBytes = size_t(kStages) * kStageBytes;  // dynamic shared memory
static_assert(kStageBytes % 16 == 0, "bulk copies move multiples of 16 bytes");
constexpr int kMaxGroupRows = 4;    // rows per group (MTP: 1 + 3 drafts)
constexpr int kHeadsPerWarp = 32;   // 2 m16 tiles
constexpr int kMaxHeads = kWarps / 2 * kHeadsPerWarp;  // 128: a group of 2 rows fills the warps
constexpr int kSteps = kD / 16;     // k16 steps

static_assert(kMaxGroupRows * kPage == kThreads, "the write phase maps one thread to (row, key)");

// Rows per group for this head count: every (row, 32-head chunk) of a group gets its own warp.
__host__ __device__ constexpr int group_rows(int heads) {
  const int chunks = (heads + kHeadsPerWarp - 1) / kHeadsPerWarp;
  return kWarps / chunks < kMaxGroupRows ? kWarps / chunks : kMaxGroupRows;
}

// A row may start or extend a group when its sequence and bound are valid.
__device__ __forceinline__ bool row_valid(int64_t seq, int64_t bound, int64_t n_seqs, int64_t max_bound) {
  return seq >= 0 && seq < n_seqs && bound >= 0 && bound <= max_bound;
}

__global__ void __launch_bounds__(kThreads, 2) indexer_logits_mma_kernel(IndexerLogitsFp8Params p) {
  pdl_enter();
  extern __shared__ __align__(128) uint8_t stages[];  // [kStages][kStageBytes]: pages as in the pool
  __shared__ uint64_t full[kStages];                   // a stage's page has landed
  __shared__ float part[kWarps][kPage];  // [m slice = (row, head chunk)][key] partial head sums
  __shared__ int s_bad[kStages];         // the stage's page id is invalid
  __shared__ int s_bound[kMaxGroupRows];
  __shared__ int64_t s_mseq[kMaxGroupRows + 1], s_mbound[kMaxGroupRows + 1];
  __shared__ int s_rows;
  __shared__ int64_t s_seq;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, tig = lane & 3;
  const int64_t r0 = blockIdx.y;
  const int64_t max_bound = p.n_cols < p.max_pages * kPage ? p.n_cols : p.max_pages * kPage;
  const int G = group_rows(p.heads);
  // Rows r0 - 1 .. r0 + G - 1 (sequence, bound), loaded in parallel. Group leaders: valid rows at a
  // multiple of G or after a row of another sequence (or an invalid one). A group is its leader and
  // the following valid rows of the same sequence up to the next leader.
  if (tid <= G) {
    const int64_t rr = r0 - 1 + tid;
    const bool in = rr >= 0 && rr < p.rows;
    s_mseq[tid] = in ? p.row_seq[rr] : -1;
    s_mbound[tid] = in ? p.bounds[rr] : -1;
  }
  __syncthreads();
  if (tid == 0) {
    auto valid = [&](int i) { return row_valid(s_mseq[i], s_mbound[i], p.n_seqs, max_bound); };
    auto leads = [&](int i) {  // row r0 - 1 + i, i >= 1
      return (r0 - 1 + i) % G == 0 || !valid(i - 1) || s_mseq[i - 1] != s_mseq[i];
    };
    int rows = 0;
    if (!valid(1)) {
      if (blockIdx.x == 0) atomicMin(p.bad_row, static_cast<unsigned long long>(r0));
    } else if (leads(1)) {
      rows = 1;
      while (rows < G && r0 + rows < p.rows && valid(1 + rows) && !leads(1 + rows)) ++rows;
      for (int i = 0; i < rows; ++i) s_bound[i] = s_mbound[1 + i];
      s_seq = s_mseq[1];
    }
    s_rows = rows;
  }
  __syncthreads();
  const int R = s_rows;
  if (R == 0) return;  // block-uniform: not a leader, or an invalid row (reported)
  const int64_t seq = s_seq;
  int gmax = 0;
  for (int i = 0; i < R; ++i) gmax = max(gmax, s_bound[i]);

  // Warp roles: m slices (row, head chunk of 32) x k slices (keys of the page).
  const int hc_count = (p.heads + kHeadsPerWarp - 1) / kHeadsPerWarp;  // 1..4
  const int mslices = R * hc_count;                                     // 1..8
  const int kslices = kWarps / mslices;
  const int warp_keys = kPage / kslices;  // 8, 16, 32 or 64
  const bool active = warp < mslices * kslices;
  const int mslice = active ? warp / kslices : 0, kslice = warp % kslices;
  const int64_t r = r0 + mslice / hc_count;
  const int hc = mslice % hc_count;

  // This warp's queries, in registers for the whole block as f16 (exact): two 16-byte loads of
  // e4m3 bytes per m tile and half, all in flight together, converted once.
  // K order: the lane with tig holds bytes tig*32 + 4j + [0, 4) of a row for k16 step j (bytes 0-1
  // where the m16n8k16 layout has k = 2 tig + [0, 2), bytes 2-3 where it has k = 2 tig + 8 + [0, 2)).
  // A and B use the same map, so each step sums exact products of matching elements.
  uint32_t a[2][kSteps][4];  // [m tile][k step][a0..a3] f16x2
  float wr[2][2];            // [m tile][head g, head g + 8]
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
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
      const uint32_t w[kSteps] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};  // bytes tig*32 + 4j
#pragma unroll
      for (int j = 0; j < kSteps; ++j) {
        a[mt][j][half] = e4m3x2_to_f16x2(w[j]);            // a0 / a1: k = 2 tig + [0, 2)
        a[mt][j][half + 2] = e4m3x2_to_f16x2(w[j] >> 16);  // a2 / a3: k = 2 tig + 8 + [0, 2)
      }
      wr[mt][half] = on ? p.wq[r * p.heads + h] : 0.0f;
    }
  }

  const int64_t n_tiles = (p.n_cols + kPage - 1) / kPage;
  const int64_t stride = gridDim.x;
  // Page id of tile t (page t of the sequence), or kNoTile past the keys any row of the group sees.
  // Thread 0 alone issues the copies. The id a stage's copy needs is loaded one iteration before
  // it is used, so the block-table read's latency hides behind a tile instead of stalling the issue.
  constexpr int32_t kNoTile = INT32_MIN;
  auto page_id = [&](int64_t t) -> int32_t {
    return t < n_tiles && t * kPage < gmax ? p.block_tables[seq * p.max_pages + t] : kNoTile;
  };
  // Thread 0: the copy of tile t, physical page `page`, into stage s. Every use of a stage's barrier
  // gets exactly one arrival (with no bytes when there is nothing to copy), so its phases stay in
  // step with the loop's uses of the stage.
  auto issue = [&](int64_t t, int32_t page, int s) {
    const bool ok = page != kNoTile && page >= 0 && page < p.n_pages;
    if (page != kNoTile) {
      s_bad[s] = ok ? 0 : 1;
      if (!ok) atomicMin(p.bad_page, static_cast<unsigned long long>(seq * p.max_pages + t));
    }
    mbarrier_arrive_expect_tx(&full[s], ok ? unsigned(kStageBytes) : 0u);
    if (ok) bulk_copy_g2s(stages + s * kStageBytes, p.pool + int64_t(page) * kStageBytes, kStageBytes, &full[s]);
  };

  int32_t next = 0;  // thread 0: id of the tile the next iteration issues
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) mbarrier_init(&full[s], 1);
    fence_barrier_init();
    int32_t first[kStages];  // the ids of the first kStages tiles, loads in flight together
#pragma unroll
    for (int s = 0; s < kStages; ++s) first[s] = page_id(int64_t(blockIdx.x) + int64_t(s) * stride);
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) issue(int64_t(blockIdx.x) + int64_t(s) * stride, first[s], s);
    next = first[kStages - 1];
  }
  __syncthreads();  // barriers initialised
  int it = 0;
  for (int64_t t = blockIdx.x; t < n_tiles; t += stride, ++it) {
    const int s = it % kStages;
    const uint8_t* keys = stages + s * kStageBytes;
    const float* scales = reinterpret_cast<const float*>(keys + kKeyBytes);
    // The stage issued below was last read in the previous iteration (its write phase included).
    __syncthreads();
    if (tid == 0) {
      issue(t + int64_t(kStages - 1) * stride, next, (it + kStages - 1) % kStages);
      next = page_id(t + int64_t(kStages) * stride);
    }
    mbarrier_wait(&full[s], unsigned(it / kStages) & 1u);  // tile t landed (or had nothing to copy)
    const bool has_keys = t * kPage < gmax;
    const bool bad = has_keys && s_bad[s] != 0;
    // NT n8 tiles of keys from n0, their MMA chains interleaved (2 x NT independent accumulators).
    auto keys_tiles = [&](int n0, auto nt_count) {
      constexpr int NT = decltype(nt_count)::value;
      uint32_t bw[NT][kSteps];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const uint8_t* krow = keys + (n0 + 8 * nt + g) * kD + tig * 32;
        const int sw = (g & 1) * 16;  // odd rows: the second 16 bytes first (no bank conflicts)
        const uint4 x = *reinterpret_cast<const uint4*>(krow + sw);
        const uint4 y = *reinterpret_cast<const uint4*>(krow + (16 - sw));
        const uint4 lo = sw ? y : x, hi = sw ? x : y;
        bw[nt][0] = lo.x, bw[nt][1] = lo.y, bw[nt][2] = lo.z, bw[nt][3] = lo.w;
        bw[nt][4] = hi.x, bw[nt][5] = hi.y, bw[nt][6] = hi.z, bw[nt][7] = hi.w;
      }
      float c[NT][2][4] = {};
#pragma unroll
      for (int j = 0; j < kSteps; ++j) {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const uint32_t b0 = e4m3x2_to_f16x2(bw[nt][j]), b1 = e4m3x2_to_f16x2(bw[nt][j] >> 16);
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) mma_f16(c[nt][mt], a[mt][j], b0, b1);
        }
      }
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        // c[nt][mt]: heads (mt*16 + g, + 8) x keys (n0 + 8 nt + 2 tig, + 1). relu, weight, sum the heads.
        float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          s0 = fmaf(wr[mt][0], fmaxf(c[nt][mt][0], 0.0f), s0);
          s1 = fmaf(wr[mt][0], fmaxf(c[nt][mt][1], 0.0f), s1);
          s0 = fmaf(wr[mt][1], fmaxf(c[nt][mt][2], 0.0f), s0);
          s1 = fmaf(wr[mt][1], fmaxf(c[nt][mt][3], 0.0f), s1);
        }
#pragma unroll
        for (int o = 4; o < 32; o <<= 1) {
          s0 += __shfl_xor_sync(0xffffffffu, s0, o);
          s1 += __shfl_xor_sync(0xffffffffu, s1, o);
        }
        if (g == 0) {
          part[mslice][n0 + 8 * nt + 2 * tig] = s0;
          part[mslice][n0 + 8 * nt + 2 * tig + 1] = s1;
        }
      }
    };
    if (has_keys && !bad && active) {
      const int k0 = kslice * warp_keys;
      if (warp_keys == 8) {
        keys_tiles(k0, std::integral_constant<int, 1>{});
      } else {
        for (int n0 = k0; n0 < k0 + warp_keys; n0 += 16) keys_tiles(n0, std::integral_constant<int, 2>{});
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
          v = scales[kk] * acc;
        }
        p.logits[(r0 + rl) * p.n_cols + col] = v;
      }
    }
  }
}

int device_sm_count() {
  int dev = 0, n = 0;
  DSI_CUDA_CHECK(cudaGetDevice(&dev));
  DSI_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
  return n;
}

}  // namespace

bool indexer_logits_fp8_mma_supported(int heads, int d) {
  if (d != kD || heads < 1 || heads > kMaxHeads) return false;
  int dev = 0, major = 0;
  DSI_CUDA_CHECK(cudaGetDevice(&dev));
  DSI_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  return major >= 9;
}

void launch_indexer_logits_fp8_mma(const IndexerLogitsFp8Params& p, cudaStream_t s) {
  if (p.rows == 0) return;
  DSI_CHECK(p.d == kD && p.heads >= 1 && p.heads <= kMaxHeads,
            "indexer_logits_fp8: the tensor-core kernel takes d = 128 and 1..128 heads, got d = {}, {} heads",
            p.d, p.heads);
  DSI_CHECK(p.rows <= 65535, "indexer_logits_fp8: {} rows, at most 65535 per call", p.rows);
  const int64_t n_tiles = (p.n_cols + kPage - 1) / kPage;
  // About two resident blocks per SM over all groups (a group is up to 4 rows of one sequence).
  const int G = group_rows(p.heads);
  const int64_t groups = (p.rows + G - 1) / G;
  const int64_t want = std::max<int64_t>(1, 2 * int64_t(device_sm_count()) / groups);
  const unsigned gx = unsigned(std::max<int64_t>(1, std::min(n_tiles, want)));
  // Per call (cheap, per device, allowed during stream capture).
  DSI_CUDA_CHECK(cudaFuncSetAttribute(indexer_logits_mma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      int(kSmemBytes)));
  launch(indexer_logits_mma_kernel, dim3(gx, unsigned(p.rows)), kThreads, kSmemBytes, s, p);
}

}  // namespace dsi::cuda
