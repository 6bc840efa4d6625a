// Indexer decode logits over the paged fp8 key cache on the tensor cores (sm_90a: wgmma with e4m3
// operands from shared memory, f32 accumulators), after DeepGEMM's fp8_mqa_logits / paged_mqa_logits:
// the core is the GEMM [keys, 128] x [128, rows * heads] of e4m3 values, followed by relu, the head
// weights, the sum over heads and the key scale.
//
// Work split: a block is one warpgroup and owns a "row group" (up to 4 consecutive rows of one
// sequence: the MTP verification rows; fewer with more than 64 heads). It walks that sequence's
// pages (one 64-key page per tile) through a double buffer: thread 0 loads each page's keys with a
// tensor-map copy (the 128-byte swizzle the MMA reads) and its 64 scales with a bulk copy, both
// completing on the stage's barrier, one page ahead of the MMAs; page ids are read one tile ahead
// of that. Each page is read from HBM once per group and reused for every row and head.
//
// Why only one page ahead. With every block's pages in flight at once (a 6-stage ring: 17 MB at
// 128K keys), the HBM serves them all together and every block's first page lands only when nearly
// all of them do, so the MMAs and the epilogue start late and run after the copies instead of
// under them. One page ahead per block keeps the HBM busy and the pages landing in order, and the
// smaller ring lets more blocks share an SM: one row at 128K keys 11.6 -> 8.4 us, 4 x 4 rows 81.4
// -> 65.0 us (bench_kv_fp8 --only-indexer, the kernel alone). On the old ring, 1, 2 and 3 pages
// ahead gave 9.9, 10.5 and 11.2 us; on this one, at most 3 or 5 blocks per SM 9.4 and 9.1 us.
// Where each block walks many pages (4 x 4 rows at 128K keys, 32 heads) rings of 2, 3, 4 and 6
// stages gave 39.9, 40.3, 41.8 and 47.0 us: the double buffer is best there too.
//
// Per page the MMA is D[key, head] = K Q^T, M = the page's 64 keys, N = the group's query chunks
// (32 or 64 heads of one row each, up to 4 chunks: N <= 256; the queries sit in shared memory for
// the whole block, swizzled like the keys), K = 128 in four k32 steps of one instruction each.
// With keys as rows, a thread's accumulators cover 2 keys x N/4 heads: relu, the weights and the
// head sum stay in its registers and two shuffles finish the sum; no partial sums go through shared
// memory and one block barrier per page remains.
//
// Numerics: every product of two e4m3 values is exact, but Hopper's fp8 MMA adds the products of a
// k32 step in a narrower internal accumulator (products aligned to the largest exponent), so logits
// agree with the CPU's sequential fp32 sums to a stated relative error of their magnitude
// (tests/cuda/test_cuda_kv_fp8.cpp), not bitwise; the same as the deployed fp8 indexer kernels.
// Runs are deterministic: fixed orders only.
#include <cuda.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "backends/cuda/common.cuh"
#include "backends/cuda/kv_fp8/sm90_indexer_logits.h"
#include "backends/cuda/ptx.cuh"
#include "backends/cuda/tensor_map.h"
#include "backends/cuda/wgmma.cuh"
#include "ops/kv_fp8.h"

namespace dsi::cuda {

namespace {

constexpr int kPage = ops::kKvPageTokens;  // keys per tile: one page
constexpr int kD = 128;
constexpr int kThreads = 128;  // one warpgroup
constexpr int kStages = 2;     // a double buffer: one page in flight while the other is read (above)
constexpr int kKeyBytes = kPage * kD;                // a page: [64 keys, 128 B] of e4m3 ...
constexpr int kScaleBytes = kPage * 4;               // ... then [64] f32 key scales
constexpr int kPageBytes = kKeyBytes + kScaleBytes;  // 8448
constexpr int kMaxChunks = 4;     // (row, head chunk) MMAs per page: 4 x N/2 accumulator registers
constexpr int kMaxGroupRows = 4;  // rows per group (MTP: 1 + 3 drafts)
constexpr int kMaxHeads = 128;
constexpr int kAlign = 1024;  // the 128-byte swizzle repeats every 8 rows: tiles 1024-byte aligned
static_assert(kKeyBytes % kAlign == 0 && kScaleBytes % 16 == 0, "tile sizes");

// Heads per chunk (the MMA's N): 32 when all heads fit in one chunk, else 64.
__host__ __device__ constexpr int chunk_heads(int heads) { return heads <= 32 ? 32 : 64; }
__host__ __device__ constexpr int chunks_per_row(int heads) {
  return (heads + chunk_heads(heads) - 1) / chunk_heads(heads);
}
// Rows per group for this head count: every (row, chunk) of a group gets its own accumulators.
__host__ __device__ constexpr int group_rows(int heads) {
  return kMaxChunks / chunks_per_row(heads) < kMaxGroupRows ? kMaxChunks / chunks_per_row(heads) : kMaxGroupRows;
}
// Blocks per SM each kernel is compiled for (its registers: nvcc -Xptxas -v, none spilled). The
// accumulators take CAP * N / 2 registers a thread. Left to itself the compiler gave the 4-row
// 32-head kernel 102 registers, so 4 blocks shared an SM: too few pages in flight (ncu: DRAM 50%
// busy, 0.76 eligible warps a scheduler); bounded to 5 blocks it takes 96. The 64-head one takes 163
// (3 blocks); its bound keeps it there (a build that gave it 184 registers, 2 blocks, took 60.3 us
// against 50.2 at 4 x 4 rows of 128K keys). docs/decode-performance.md has the figures.
__host__ __device__ constexpr int min_blocks(int n, int cap) { return n * cap <= 128 ? 5 : 3; }

// Dynamic shared memory: [kStages] key tiles, [chunks] query tiles (N x 128 B each), [kStages][64]
// scales, [chunks][N] weights, and the slack that aligns the base to kAlign.
__host__ __device__ constexpr size_t smem_bytes(int chunks, int n) {
  return size_t(kAlign) + size_t(kStages) * kKeyBytes + size_t(chunks) * n * kD + size_t(kStages) * kScaleBytes +
         size_t(chunks) * n * 4;
}

// A row may start or extend a group when its sequence and bound are valid.
__device__ __forceinline__ bool row_valid(int64_t seq, int64_t bound, int64_t n_seqs, int64_t max_bound) {
  return seq >= 0 && seq < n_seqs && bound >= 0 && bound <= max_bound;
}

// acc[c] = the page's keys x query chunk c (every c < CAP), over K = 128 in four k32 steps, as one
// MMA of N = CAP x N per step: the chunks' query tiles are consecutive rows of one swizzled tile, and
// acc[c][4 j + e] is column block c N / 8 + j of the flat accumulator, the same registers in the
// same order. Chunks past a group's own (a group cut short by its sequence) have zero tiles and are
// never read. Waits for the MMAs.
template <int N, int CAP>
__device__ __forceinline__ void page_mma(float (&acc)[CAP][N / 2], const uint8_t* keys, const uint8_t* qs) {
  float(&flat)[CAP * N / 2] = reinterpret_cast<float(&)[CAP * N / 2]>(acc);
  const uint64_t ka = wgmma_desc_sw128(keys), qa = wgmma_desc_sw128(qs);
  wgmma_fence();
#pragma unroll
  for (int k = 0; k < kD / 32; ++k) wgmma_e4m3<CAP * N>(flat, ka + 2 * k, qa + 2 * k, k);
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_fence_operands(flat);
}

// N: heads per chunk (chunk_heads(p.heads)); CAP: the most (row, chunk) pairs of a group in this
// call (the accumulators and query tiles held: 1 for one decode row, so no registers go unused).
template <int N, int CAP>
__global__ void __launch_bounds__(kThreads, min_blocks(N, CAP))
    indexer_logits_wgmma_kernel(const __grid_constant__ CUtensorMap key_map, IndexerLogitsFp8Params p) {
  // Until pdl_enter() below the kernel reads only what the query rotation, the kernel launched
  // right before it (ops::indexer_logits_fp8), leaves alone: the rows' sequences and bounds, the
  // block tables and the key pages (common.cuh: only the previous kernel may still be running). So
  // the first pages are on their way while the rotation ends. The queries, the weights and every
  // global write come after the wait; the tables are read past the L1 (__ldcg).
  extern __shared__ uint8_t smem_raw[];
  uint8_t* const keys = align_shared<kAlign>(smem_raw);  // [kStages][64 keys][128 B], swizzled
  uint8_t* const qs = keys + kStages * kKeyBytes;                      // [CAP][N][128 B], swizzled
  float* const scales = reinterpret_cast<float*>(qs + size_t(CAP) * N * kD);  // [kStages][64]
  float* const ws = scales + kStages * kPage;                          // [CAP][N] folded weights
  __shared__ uint64_t full[kStages];  // a stage's page has landed
  __shared__ int s_bad[kStages];      // the stage's page id is invalid
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
    s_mseq[tid] = in ? __ldcg(p.row_seq + rr) : -1;
    s_mbound[tid] = in ? __ldcg(p.bounds + rr) : -1;
  }
  __syncthreads();
  if (tid == 0) {
    auto valid = [&](int i) { return row_valid(s_mseq[i], s_mbound[i], p.n_seqs, max_bound); };
    auto leads = [&](int i) {  // row r0 - 1 + i, i >= 1
      return (r0 - 1 + i) % G == 0 || !valid(i - 1) || s_mseq[i - 1] != s_mseq[i];
    };
    int rows = 0;
    if (!valid(1)) {
      rows = -1;  // reported after the wait
    } else if (leads(1)) {
      rows = 1;
      while (rows < G && r0 + rows < p.rows && valid(1 + rows) && !leads(1 + rows)) ++rows;
      for (int i = 0; i < rows; ++i) s_bound[i] = int(s_mbound[1 + i]);
      s_seq = s_mseq[1];
    }
    s_rows = rows;
  }
  __syncthreads();
  const int R = s_rows;
  // Block-uniform. A row that leads no group has nothing to do, and leaves without the programmatic
  // wait (common.cuh): its group's leader, an earlier row of the grid, waits. So its slot frees at
  // once, and the blocks of later groups start their first pages under the previous kernel's tail
  // (4 x 4 rows: 3 of 4 rows lead none).
  if (R == 0) {
    pdl_leave_unwaited();
    return;
  }
  if (R < 0) {  // an invalid row, reported after the wait
    pdl_enter();
    if (tid == 0 && blockIdx.x == 0) atomicMin(p.bad_row, static_cast<unsigned long long>(r0));
    return;
  }
  const int64_t seq = s_seq;
  int gmax = 0;
  for (int i = 0; i < R; ++i) gmax = max(gmax, s_bound[i]);
  const int cpr = chunks_per_row(p.heads);
  const int nch = R * cpr;  // <= CAP

  const int64_t n_tiles = (p.n_cols + kPage - 1) / kPage;
  const int64_t stride = gridDim.x;
  // Page id of tile t (page t of the sequence), or kNoTile past the keys any row of the group sees.
  // Thread 0 alone issues the copies. The id a stage's copy needs is loaded one iteration before
  // it is used, so the block-table read's latency hides behind a tile instead of stalling the issue.
  constexpr int32_t kNoTile = INT32_MIN;
  auto page_id = [&](int64_t t) -> int32_t {
    return t < n_tiles && t * kPage < gmax ? __ldcg(p.block_tables + seq * p.max_pages + t) : kNoTile;
  };
  // Thread 0: the copies of tile t, physical page `page`, into stage s. Every use of a stage's
  // barrier gets exactly one arrival (with no bytes when there is nothing to copy), so its phases
  // stay in step with the loop's uses of the stage. An invalid page lowers bad_page (the first
  // (sequence, page) flat index at fault; reported by thread 0 after the wait).
  unsigned long long bad_page = ErrorFlag::kNone;
  auto issue = [&](int64_t t, int32_t page, int s) {
    const bool ok = page != kNoTile && page >= 0 && page < p.n_pages;
    if (page != kNoTile) {
      s_bad[s] = ok ? 0 : 1;
      if (!ok) bad_page = min(bad_page, static_cast<unsigned long long>(seq * p.max_pages + t));
    }
    mbarrier_arrive_expect_tx(&full[s], ok ? unsigned(kPageBytes) : 0u);
    if (ok) {
      tma_load_3d(keys + s * kKeyBytes, &key_map, 0, 0, page, &full[s]);
      bulk_copy_g2s(scales + s * kPage, p.pool + int64_t(page) * kPageBytes + kKeyBytes, kScaleBytes, &full[s]);
    }
  };

  int32_t next = 0;  // thread 0: id of the tile the next iteration issues
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) mbarrier_init(&full[s], 1);
    fence_barrier_init();
    int32_t first[kStages];  // the ids of the first kStages tiles, loads in flight together (kStages - 1 copies)
#pragma unroll
    for (int s = 0; s < kStages; ++s) first[s] = page_id(int64_t(blockIdx.x) + int64_t(s) * stride);
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) issue(int64_t(blockIdx.x) + int64_t(s) * stride, first[s], s);
    next = first[kStages - 1];
  }
  pdl_enter();
  // The group's queries (e4m3 bytes from rotate_quant) and folded weights, chunk c = (row c / cpr,
  // heads (c % cpr) N ..): 16-byte piece j of head i at i * 128 + ((j ^ (i % 8)) * 16). Heads past
  // p.heads and chunks past the group's get zero queries and weights.
  // All of a thread's pieces are loaded before any is stored, so the loads are in flight together.
  static_assert(kD == 128 && N % 8 == 0, "query rows are the swizzle's 128-byte rows, chunks whole 8-row groups");
  constexpr int kQPieces = CAP * N * (kD / 16) / kThreads;  // 16-byte pieces per thread
  static_assert(kQPieces * kThreads == CAP * N * (kD / 16), "whole pieces per thread");
  uint4 qv[kQPieces];
#pragma unroll
  for (int u = 0; u < kQPieces; ++u) {
    const int i = tid + u * kThreads;
    const int c = i / (N * (kD / 16)), h = (c % cpr) * N + i / (kD / 16) % N;
    qv[u] = c < nch && h < p.heads
                ? reinterpret_cast<const uint4*>(p.q8_bytes + ((r0 + c / cpr) * p.heads + h) * kD)[i % (kD / 16)]
                : make_uint4(0, 0, 0, 0);
  }
#pragma unroll
  for (int u = 0; u < kQPieces; ++u) {
    const int i = tid + u * kThreads;
    *reinterpret_cast<uint4*>(qs + sw128_offset(i / (kD / 16), i % (kD / 16))) = qv[u];  // row c N + head
  }
  for (int i = tid; i < CAP * N; i += kThreads) {
    const int c = i / N, h = (c % cpr) * N + i % N;
    ws[i] = c < nch && h < p.heads ? p.wq[(r0 + c / cpr) * p.heads + h] : 0.0f;
  }
  fence_async_shared();  // the query tiles, written by threads, are read by the MMAs
  __syncthreads();       // ... and the barriers are initialised

  float acc[CAP][N / 2] = {};
  int it = 0;
  for (int64_t t = blockIdx.x; t < n_tiles; t += stride, ++it) {
    const int s = it % kStages;
    // The stage issued below was last read in the previous iteration (MMAs and scales included).
    __syncthreads();
    if (tid == 0) {
      issue(t + int64_t(kStages - 1) * stride, next, (it + kStages - 1) % kStages);
      next = page_id(t + int64_t(kStages) * stride);
      if (bad_page != ErrorFlag::kNone) {
        atomicMin(p.bad_page, bad_page);
        bad_page = ErrorFlag::kNone;
      }
    }
    mbarrier_wait(&full[s], unsigned(it / kStages) & 1u);  // tile t landed (or had nothing to copy)
    const bool has_keys = t * kPage < gmax;
    const bool bad = has_keys && s_bad[s] != 0;
    float sum[CAP][2] = {};  // [chunk][key 16 warp + g, + 8]: weighted relu sums over its heads
    if (has_keys && !bad) {
      const uint8_t* kt = keys + s * kKeyBytes;
      page_mma<N, CAP>(acc, kt, qs);
      // Every chunk, the group's or not (those past it have zero queries and weights, so their
      // sums are 0 and never stored): no branch between chunks, so their 2 CAP dependent chains of
      // multiply-adds interleave.
#pragma unroll
      for (int c = 0; c < CAP; ++c) {
        float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
        for (int j = 0; j < N / 8; ++j) {
          const float2 w = *reinterpret_cast<const float2*>(ws + c * N + 8 * j + 2 * tig);
          s0 = fmaf(w.x, fmaxf(acc[c][4 * j], 0.0f), s0);
          s0 = fmaf(w.y, fmaxf(acc[c][4 * j + 1], 0.0f), s0);
          s1 = fmaf(w.x, fmaxf(acc[c][4 * j + 2], 0.0f), s1);
          s1 = fmaf(w.y, fmaxf(acc[c][4 * j + 3], 0.0f), s1);
        }
#pragma unroll
        for (int o = 1; o < 4; o <<= 1) {
          s0 += __shfl_xor_sync(0xffffffffu, s0, o);
          s1 += __shfl_xor_sync(0xffffffffu, s1, o);
        }
        sum[c][0] = s0;
        sum[c][1] = s1;
      }
    }
    // Lane t of each quad writes row t's logits of its two keys (rows past R: none).
    if (tig < R) {
      float v[2] = {0.0f, 0.0f};
#pragma unroll
      for (int c = 0; c < CAP; ++c)  // row tig's chunks: tig cpr .. (tig + 1) cpr - 1
        if (c >= tig * cpr && c < (tig + 1) * cpr && c < nch) v[0] += sum[c][0], v[1] += sum[c][1];
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int kk = 16 * warp + g + 8 * e;
        const int64_t col = t * kPage + kk;
        if (col < p.n_cols) {
          float out;
          if (col >= s_bound[tig]) {
            out = -INFINITY;
          } else if (bad) {
            out = NAN;
          } else {
            out = scales[s * kPage + kk] * v[e];
          }
          p.logits[(r0 + tig) * p.n_cols + col] = out;
        }
      }
    }
  }
}

// The tensor map of the pool's key tiles: dimensions (128 bytes of a key, 64 keys, n_pages pages),
// pages kPageBytes apart, one page per copy, written in the 128-byte swizzle.
CUtensorMap key_tensor_map(const uint8_t* pool, int64_t n_pages) {
  const uint64_t dims[3] = {uint64_t(kD), uint64_t(kPage), uint64_t(n_pages)};
  const uint64_t strides[2] = {uint64_t(kD), uint64_t(kPageBytes)};  // bytes, of dims 1 and 2
  const uint32_t box[3] = {uint32_t(kD), uint32_t(kPage), 1};
  return byte_tensor_map(pool, 3, dims, strides, box, CU_TENSOR_MAP_SWIZZLE_128B, "indexer_logits_fp8: the key pool");
}

// Blocks per row group forced on every call (0: the plan chooses); set_indexer_logits_blocks.
std::atomic<int> g_forced_blocks{0};

template <int N, int CAP>
void launch_wgmma(const IndexerLogitsFp8Params& p, cudaStream_t s) {
  const auto kernel = indexer_logits_wgmma_kernel<N, CAP>;
  const int G = group_rows(p.heads);
  const size_t smem = smem_bytes(CAP, N);
  // Per call (cheap, per device, allowed during stream capture).
  DSI_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  // Blocks one SM holds: the same on every device that runs the kernel (sm_90a), so asked once.
  static const int per_sm = [&] {
    int n = 0;
    DSI_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kThreads, smem));
    return std::max(n, 1);
  }();
  // Every resident block slot over all groups (a group is up to 4 rows of one sequence).
  const int64_t n_tiles = (p.n_cols + kPage - 1) / kPage;
  const int64_t groups = (p.rows + G - 1) / G;
  const int64_t want = std::max<int64_t>(1, int64_t(per_sm) * sm_count() / groups);
  const int forced = g_forced_blocks.load(std::memory_order_relaxed);
  const unsigned gx = unsigned(forced > 0 ? forced : std::max<int64_t>(1, std::min(n_tiles, want)));
  launch(kernel, dim3(gx, unsigned(p.rows)), kThreads, smem, s, key_tensor_map(p.pool, p.n_pages), p);
}

// The kernel for this call's chunk size and most chunks per group.
template <int N>
void launch_wgmma(const IndexerLogitsFp8Params& p, cudaStream_t s) {
  const int cap = int(std::min<int64_t>(group_rows(p.heads), p.rows)) * chunks_per_row(p.heads);
  switch (cap) {
    case 1: launch_wgmma<N, 1>(p, s); break;
    case 2: launch_wgmma<N, 2>(p, s); break;
    case 3: launch_wgmma<N, 3>(p, s); break;
    default: launch_wgmma<N, 4>(p, s); break;
  }
}

}  // namespace

void set_indexer_logits_blocks(int blocks) {
  DSI_CHECK(blocks >= 0 && blocks <= 65535, "indexer_logits_fp8: {} blocks per row group", blocks);
  g_forced_blocks.store(blocks);
}

bool indexer_logits_fp8_mma_supported(int heads, int d) {
  if (d != kD || heads < 1 || heads > kMaxHeads) return false;
  int dev = 0, major = 0, minor = 0;
  DSI_CUDA_CHECK(cudaGetDevice(&dev));
  DSI_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  DSI_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  return major == 9 && minor == 0;  // wgmma: sm_90a
}

void launch_indexer_logits_fp8_mma(const IndexerLogitsFp8Params& p, cudaStream_t s) {
  if (p.rows == 0) return;
  DSI_CHECK(p.d == kD && p.heads >= 1 && p.heads <= kMaxHeads,
            "indexer_logits_fp8: the tensor-core kernel takes d = 128 and 1..128 heads, got d = {}, {} heads",
            p.d, p.heads);
  DSI_CHECK(p.rows <= 65535, "indexer_logits_fp8: {} rows, at most 65535 per call", p.rows);
  DSI_CHECK(p.n_pages > 0, "indexer_logits_fp8: the tensor-core kernel needs a pool of at least one page");
  if (chunk_heads(p.heads) == 32)
    launch_wgmma<32>(p, s);
  else
    launch_wgmma<64>(p, s);
}

}  // namespace dsi::cuda
