// Internals the sparse MLA decode kernels share (sm90_sparse_mla_decode.cu describes the design):
// the entry geometry, the split CTA's place in the grid, the index staging, the cp.async gather of
// a tile, the settled start of the tile pipeline, the e4m3 -> bf16 unpacking and the benchmarks'
// phase marks; and the launchers of the two split kernels (sm90_sparse_mla_mma.cu,
// sm90_sparse_mla_wgmma.cu).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/common.cuh"
#include "backends/cuda/kv_fp8/sm90_sparse_mla_decode.h"
#include "backends/cuda/ptx.cuh"
#include "ops/kv_fp8.h"

namespace dsi::cuda::sparse_mla {

constexpr int kLora = ops::kMlaFp8Lora;        // 512: value / latent dims
constexpr int kDk = kLora + ops::kMlaFp8Rope;  // 576: score dims
constexpr int kEntry = ops::kMlaFp8Bytes;      // 656
constexpr int kBK = kSparseMlaKeyTile;         // 64 keys per tile
constexpr int kThreads = 256;                  // 8 warps
constexpr int kPieces = kEntry / 16;           // 41 16-byte pieces per cache entry
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

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

// Launches one of the split kernels with `smem` bytes of dynamic shared memory (opted into per call:
// cheap, per device, allowed during stream capture).
template <typename Kernel>
void launch_split(Kernel kernel, size_t smem, const SparseMlaDecodeParams& p, const SplitArgs& a, unsigned blocks,
                  cudaStream_t s) {
  DSI_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  launch(kernel, blocks, kThreads, smem, s, p, a);
}

// The split kernels' launchers: `blocks` CTAs of a plan's tiling (plan_sparse_mla_decode).
void launch_mma_split(const SparseMlaDecodeParams& p, const SplitArgs& a, int m_tiles, unsigned blocks,
                      cudaStream_t s);  // m_tiles 1 or 2
void launch_wgmma_split(const SparseMlaDecodeParams& p, const SplitArgs& a, unsigned blocks, cudaStream_t s);

}  // namespace dsi::cuda::sparse_mla
