// Weight-streaming GEMV / skinny GEMM for 1..8 input rows: y = x W^T with W in its checkpoint dtype
// (f32, bf16, f16, fp8 e4m3 with block scales). Decode is bound by reading W once, so every weight
// byte is loaded once, 16 B per lane, with the x rows reused from registers across several output
// rows (see gemv.cu for the tiling and its reasons).
// Numerics: every weight is decoded exactly; products and sums in fp32 (FMA), a fixed reduction tree
// (bitwise reproducible run to run). fp8 weights: the 16 products of a 16-byte chunk (inside one
// scale block) are summed unscaled and the sum is multiplied by the block's scale_inv, so the result
// is the CPU reference's (which dequantises each weight first) up to summation order and rounding.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/common.cuh"
#include "backends/cuda/rope/rope.h"

namespace dsi::cuda {

inline constexpr int kGemvMaxRows = 8;  // x rows handled by the GEMV path (ops::linear, n <= 8)
inline constexpr int kGemvTRows = 4;    // x rows per launch of the transposed GEMV

// One product of a grouped GEMV: its own input, weight, output and shape (dtype and scale blocks
// shared). Its shape may be smaller than the launch's (GemvParams::out, in): a shared expert split
// by tensor parallelism next to whole routed experts.
struct GemvGroup {
  const float* x;          // [1, in] (grouped GEMVs take one row per group)
  const void* w;           // [out, in]; null: the group is skipped and y left as it is
  const float* scale_inv;  // fp8 only
  float* y;                // [1, out]
  int64_t out, in;         // out <= GemvParams::out
  int64_t scale_cols, row0, col0;
  // GemvParams::swiglu: the up projection, the same shape, dtype and scale blocks as w.
  const void* w2 = nullptr;
  const float* scale_inv2 = nullptr;
};

struct GemvParams {
  const float* x;          // [n, in], row stride ldx; the vector path needs 16-byte aligned rows
  const void* w;           // [out, in] of `kind`, contiguous; weights: read before the kernel's
                           // dependency wait (common.cuh), so no kernel may still be writing them
  const float* scale_inv;  // fp8 only: [ceil((row0 + out) / block_out), scale_cols]; else null
  float* y;                // [n, out], row stride ldy
  int64_t ldx, ldy;
  int64_t in, out;
  int64_t scale_cols;
  int64_t row0, col0;      // fp8 slice offsets in the first scale block (LinearWeight)
  int block_out, block_in;
  int n;                   // 1..kGemvMaxRows
  FloatKind kind;
  // Grouped form (null: one product): block row blockIdx.y computes groups[blockIdx.y], whose
  // pointers and shape replace the ones above (those then size the grid and serve the alignment
  // checks, which every group must pass as well); n must be 1.
  const GemvGroup* groups = nullptr;
  int n_groups = 1;
  // Grouped SwiGLU (groups set, n = 1, the vector kernel): each group's y = silu(x w^T) * (x w2^T),
  // an MLP's gate and up products with its activation, so neither product reaches memory. Half of
  // a warp's rows are gate rows, half the up rows of the same outputs (rows_per_warp 2 or 4).
  bool swiglu = false;
  // Strided batch (groups null, n_groups > 1): product g reads x + g * batch_x, the out rows of w
  // from row g * batch_rows on (scale rows follow: row0 + g * batch_rows) and writes y + g * batch_y;
  // any n. The per-head matrices of MLA's absorbed form, read in place from kv_b_proj.
  int64_t batch_x = 0, batch_y = 0, batch_rows = 0;
  // An RMSNorm in front of the product (the tensor-map kernel only): x is used as
  // norm_w * (x / sqrt(mean(x^2) + norm_eps)), ops::rms_norm's numerics, its row of `in` columns.
  const float* norm_w = nullptr;
  float norm_eps = 0.0f;
};

// The one-row tensor-map kernel's plan (gemv_tma.cu): tiles of 16 rows of W, k_split warps per
// tile, warp_tiles tile groups per block (each warp streaming tiles_per_warp tiles in turn, k_split
// 1 only), W in pieces of `piece` (256 or 512) bytes per row through two ring stages per warp.
// warp_tiles 0: not this kernel.
struct GemvTmaPlan {
  int warp_tiles = 0;
  int k_split = 1;
  int tiles_per_warp = 1;
  int piece = 512;
};

// A launch plan: rows of W per warp, warps sharing one row group (split-K inside a block), and
// whether the 16-byte vector kernel applies (else the element-wise one).
struct GemvPlan {
  bool vec = false;
  int rows_per_warp = 1;  // 1, 2 or 4
  int k_split = 1;        // 1, 2, 4 or 8 warps per row group
  bool pipelined = false;  // W through a shared-memory ring (cp.async) instead of registers
  // Bytes of its rows each block asks the L2 for before it waits for the previous kernel (vector
  // kernel, ungrouped products; 0: none). A multiple of 16.
  int64_t prefetch = 0;
  bool mma = false;  // the tensor-core kernel (gemv_mma_ok), k_split warps per 32-row group
  // Row groups each warp streams one after the other (> 1: the ring kernel, k_split 1). A block
  // then covers rows_per_warp * 8 * row_groups_per_warp rows.
  int row_groups_per_warp = 1;
  GemvTmaPlan tma;  // warp_tiles > 0: the tensor-map kernel, and the fields above are unused
};

// The L2 bytes one GEMV launch prefetches in all (its blocks' shares of it): kGemvPrefetchMB MiB,
// or DSI_GEMV_PREFETCH_MB from the environment (0 turns the prefetch off; for comparisons).
constexpr int64_t kGemvPrefetchMB = 16;
// gemv_tma_balance()'s default, percent. Measured, one H200, one fp8 row (bench_linear --gemv-only
// --sweep --rows 1; the tensor-map plan's balance, its time against the FMA plan's, us): GLM-5's
// in_proj 67% 7.35 / 7.96 and its shared layers' 64% 7.19 / 7.94, DeepSeek-V3.2's o_proj 85%
// 34.09 / 34.69 and in_proj 55% 9.09 / 9.55; the indexer's weights_proj 2% 4.74 / 1.67. Whole
// layers (bench_decode --graphs --rows 1, two pairs, us): 90 -> 60, GLM-5.2 202.6 -> 200.2 and
// 202.9 -> 201.5, DeepSeek-V3.2 274.4 -> 272.7 and 274.3 -> 273.6; 60 -> 50 (DeepSeek-V3.2's
// in_proj), 271.1 -> 268.3 and 270.8 -> 270.4.
constexpr int kGemvTmaBalance = 50;
int64_t gemv_prefetch_budget();
// Rows of W (from row 0 of each product) that one block of plan's kernel streams: the vector
// kernel's row groups of all its warps, or the tensor-core kernel's 32-row groups.
int64_t gemv_block_rows(const GemvParams& p, const GemvPlan& plan);
// Whether plans may stream W through the shared-memory ring (for rows of at least
// kGemvPipeMinStretches 512-byte stretches per warp): yes, unless DSI_GEMV_PIPE=0 (comparisons).
bool gemv_pipelined_default();
constexpr int64_t kGemvPipeMinStretches = 12;
// Blocks of the ring kernel one SM holds at once (73 registers x 256 threads, 64 KiB of ring):
// products with more row groups than 8 warps x this x the SMs are streamed (row_groups_per_warp).
constexpr int kGemvStreamBlocksPerSm = 3;

// True when the vector kernel can read W and x with 16-byte loads: W 16-byte aligned with rows a
// multiple of 16 bytes, x 16-byte aligned with ldx a multiple of 4 floats, and (fp8) column blocks
// that never split a 16-element chunk.
bool gemv_vector_ok(const GemvParams& p);
GemvPlan gemv_plan(const GemvParams& p, int num_sms);
// Blocks of plan's FMA kernel (the vector or the element-wise one) that one SM of the current
// device holds at once (the occupancy calculator).
int gemv_fma_blocks_per_sm(const GemvParams& p, const GemvPlan& plan);
// Output rows of one warp's row group: rows_per_warp, half of them with swiglu.
inline int64_t gemv_outputs_per_row_group(const GemvParams& p, int rows_per_warp) {
  return p.swiglu ? rows_per_warp / 2 : rows_per_warp;
}
// The tensor-core kernel for 1..kGemvMaxRows rows of x (see gemv.cu): fp8 weights with 128-column
// scale blocks, a 128-aligned column slice, rows of whole blocks, ungrouped (strided batch
// allowed), vector-aligned operands. gemv_plan picks it only when gemv_tensor_cores() (cuda_ops.h)
// is on (the default), for 3..8 rows, and for 2 rows (1 with gemv_mma_one_row()) on products of
// >= 4096 rows.
bool gemv_mma_ok(const GemvParams& p);
GemvPlan gemv_mma_plan(const GemvParams& p, int num_sms);
// The one-row tensor-map kernel (gemv_tma.cu): one row of x, fp8 weights with 128-column scale
// blocks and row blocks of a multiple of 16 rows, a 128-aligned column slice and 16-aligned row
// slice, rows of a multiple of 256 bytes, 16-byte aligned W and x, ungrouped and unbatched.
// gemv_plan takes it (when gemv_tma() in cuda_ops.h is on, the default) where gemv_tma_plan finds
// a one-wave plan that keeps the average SM at least gemv_tma_balance() percent as busy as the busiest.
bool gemv_tma_ok(const GemvParams& p);
GemvTmaPlan gemv_tma_plan(const GemvParams& p, int num_sms);
// The dynamic shared memory a block of `plan` takes for p, 0 where it does not fit a block.
size_t gemv_tma_smem(const GemvParams& p, const GemvTmaPlan& plan);
void launch_gemv_tma(const GemvParams& p, const GemvTmaPlan& plan, cudaStream_t stream);
// Runs y = x W^T (p.n in 1..kGemvMaxRows, p.out > 0, p.in > 0) with the given plan.
void launch_gemv(const GemvParams& p, const GemvPlan& plan, cudaStream_t stream);

// The transposed product y = x W for W stored [in, out] row-major (the reduced dimension along W's
// rows; MLA's W_UK^T q): the same params, with in = W's rows and out = W's row length; fp8 scale
// rows follow W's rows (row0, block_out) and scale columns its columns (col0, block_in). Single or
// strided batch (batch_rows counts W's rows), 1..kGemvTRows x rows. gemv_t_ok: the transposed
// kernel applies (16-byte aligned W rows, fp8 column blocks that never split a 16-element chunk,
// x rows that fit in shared memory).
// With `rope` (p.n_groups = rope->heads), the same launch also runs ops::rope's rotation of
// rope->rows rows: one more block per batch item (head) rotates that head's pairs, so MLA's absorbed
// queries (W_UK^T q_nope and RoPE(q_pe)) take one launch.
bool gemv_t_ok(const GemvParams& p);
void launch_gemv_t(const GemvParams& p, cudaStream_t stream, const RopeParams* rope = nullptr);

// A weighted sum of products over one row of output: y[t] = add[t] + sum over segments s of
// coef_s * (x_s W_s^T), every W_s [out, in_s] of one dtype and scale blocks, out shared (the down
// projections of a token's experts with its routing weights: the MoE's down products and their
// combine in one pass, as one GEMV whose reduced dimension runs through the segments in turn).
// Segments are data (an earlier kernel may write them; see launch_gemv_seg for which).
struct GemvSegment {
  const float* x;          // [in] (16-byte aligned)
  const void* w;           // [out, in] contiguous; null: the segment is skipped
  const float* scale_inv;  // fp8 only
  const float* coef;       // the segment's weight (one float), null for 1
  int64_t in, scale_cols, row0, col0;
};
inline constexpr int kGemvMaxSegments = 32;
struct GemvSegParams {
  const GemvSegment* segs = nullptr;  // [n, n_seg]: token t's segments in summation order
  const float* add = nullptr;         // [n, out] with row stride ldy, or null
  float* y = nullptr;                 // [n, out] with row stride ldy
  int64_t ldy = 0, out = 0;
  int64_t max_in = 0;       // an upper bound of the segments' summed in (32-bit indexing checks)
  int n = 0, n_seg = 0;     // tokens (grid rows), segments per token (<= kGemvMaxSegments)
  FloatKind kind = FloatKind::kF32;
  int block_out = 128, block_in = 128;  // fp8: power-of-two blocks, block_in >= 16
};
struct GemvSegPlan {
  int k_split = 1;  // warps per row group (1, 2, 4, 8), each taking every k_split-th stretch
  int rows = 4;     // output rows per warp (2 or 4)
  bool ring = false;  // W through a shared-memory ring (cp.async) instead of registers
  // 16-byte chunks per lane and row in flight: through registers 2 or 4 (a batch loaded while the
  // previous one is summed), through the ring 2 or 3 rounds ahead of the math (3 or 4 stages).
  int depth = 2;
};
// True when the segment kernel can run a call of this kind: fp8 blocks that are powers of two with
// block_in >= 16 (every segment's in a multiple of 16 bytes and 16-byte aligned x and W are the
// caller's to ensure, as for the vector kernel).
bool gemv_seg_ok(const GemvSegParams& p);
bool gemv_seg_plan_ok(const GemvSegPlan& plan);
// The plan for p on a GPU of num_sms SMs (set_gemv_seg_plan in cuda_ops.h overrides it for tests
// and comparisons).
GemvSegPlan gemv_seg_plan(const GemvSegParams& p, int num_sms);
// The kernel reads the segment table (and the coefficients) before its programmatic wait, the
// weights' first bytes too: the caller must make sure that the kernel launched right before it
// writes none of them (common.cuh); x and add are read after the wait.
void launch_gemv_seg(const GemvSegParams& p, const GemvSegPlan& plan, cudaStream_t stream);

}  // namespace dsi::cuda
