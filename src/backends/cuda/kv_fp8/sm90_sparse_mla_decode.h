// Sparse MLA decode over the 656-byte fp8 MLA cache on Hopper (sm_90a): split-KV over the selected
// keys, bf16 tensor cores with fp32 accumulation (mma.sync m16n8k16 for few rows and heads, the
// warpgroup MMA with 64 heads per CTA above), one LSE-weighted combine. Plays the
// role of FlashMLA's sparse fp8 decode (split-KV + combine); the design and numerics are described
// in sm90_sparse_mla_decode.cu. Plan/run split: plan_sparse_mla_decode() fixes the tiling and the
// workspace size for a shape, so a caller can allocate the workspace once and capture the launch.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "backends/cuda/kv_fp8/kv_fp8.h"

namespace dsi::cuda {

// Tiling of one call. A CTA handles one (row, head group, key split): 16 * m_tiles heads and
// tiles_per_split tiles of 64 selected keys; grid = rows * head_groups * n_splits CTAs. Two kernels:
// m_tiles 1 or 2 run mma.sync (16 or 32 heads per CTA), m_tiles 4 the warpgroup kernel (wgmma, 64
// heads per CTA, the MMA's M).
struct SparseMlaDecodePlan {
  int64_t rows = 0, heads = 0, topk = 0;
  int m_tiles = 1;          // 16-head tiles per CTA: 1, 2 (mma.sync) or 4 (wgmma)
  int head_groups = 1;      // ceil(heads / (16 * m_tiles))
  int n_splits = 1;         // key splits per (row, head group); 1 = no combine
  int tiles_per_split = 0;  // 64-key tiles per split (<= kSparseMlaMaxSplitTiles)
  size_t workspace_bytes = 0;  // partial outputs + LSEs; 0 when n_splits == 1
};
inline constexpr int kSparseMlaKeyTile = 64;
inline constexpr int kSparseMlaMaxSplitTiles = 32;  // a split's indices are staged in shared memory

// Chooses the tiling for a shape on a device with sm_count SMs: one wave of CTAs (one CTA per SM,
// the kernels' shared memory allows no more), as many key splits as fill it. force_m_tiles /
// force_splits (0 = choose) override the choice for benchmark sweeps and tests; force_splits is
// rounded to a whole number of tiles per split.
SparseMlaDecodePlan plan_sparse_mla_decode(int64_t rows, int64_t heads, int64_t topk, int sm_count,
                                           int force_m_tiles = 0, int force_splits = 0);

// The operands of kv_fp8.h's SparseMlaFp8Params, plus the split partials' workspace.
struct SparseMlaDecodeParams : SparseMlaFp8Params {
  void* workspace = nullptr;  // plan.workspace_bytes, 16-byte aligned (unused when n_splits == 1)
  // The launcher's promise that the kernel launched right before this call writes neither `indices`
  // nor `pool` (common.cuh's programmatic-launch contract): the split kernels then stage the indices
  // and start the first tile's gather before their programmatic wait, under the previous kernel's
  // tail. Only q (and the outputs) wait for it.
  bool settled = false;
  // Benchmarks only: when set, thread 0 of every CTA writes %globaltimer at the phases of
  // kSparseMlaTraceMarks (kSparseMlaTraceSlots per CTA; split kernel CTAs first, then the combine's).
  unsigned long long* trace = nullptr;
};
inline constexpr int kSparseMlaTraceSlots = 16;
// The marks (slot numbers): split kernels: 0 entry, 1 past the programmatic wait, 2 indices staged,
// 3..7 tile 0 landed, unpacked, scores, softmax, P.V, 8 done, 9..13 the same for tile 1; combine:
// 0 entry, 1 past the wait, 2 weights known, 3 done.

// Launches the split kernel and, when plan.n_splits > 1, the combine kernel on `stream` (no host
// synchronisation: capturable). The plan must come from plan_sparse_mla_decode for p's shape.
void launch_sparse_mla_decode(const SparseMlaDecodeParams& p, const SparseMlaDecodePlan& plan,
                              cudaStream_t stream);

}  // namespace dsi::cuda
