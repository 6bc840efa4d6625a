// Sparse MLA decode over the fp8 MLA cache (ops::sparse_mla_fp8) for sm_90a: split-KV with bf16
// tensor cores, then an LSE-weighted combine (FlashMLA's decode structure; written here). Two split
// kernels share the combine: the mma.sync kernel (sm90_sparse_mla_mma.cu: 16 or 32 heads per CTA)
// and the warpgroup kernel (sm90_sparse_mla_wgmma.cu: wgmma, 64 heads per CTA), which
// plan_sparse_mla_decode takes once a call has 128 (row, head) pairs or more. What they share (the
// gather, the index staging, the unpacking of e4m3): sm90_sparse_mla_common.cuh. This file: the
// combine, the plan and the launch.
//
// Why this shape. A decode row attends 64..128 heads to the same top-2048 cache rows (MLA has one
// latent "KV head"), so every key is loaded and dequantised once per CTA and reused by all the heads
// of the CTA's head group; the scores q.K^T and the output P.V are then GEMMs of M = heads, which is
// what tensor cores are for (64 heads x 2048 keys x (576 + 512) x 2 = 285 MFLOP per row: far too much
// for FFMA within a few microseconds). One row has too few heads to fill 132 SMs, so the 2048 keys are
// split over many CTAs (split-KV); each split keeps its own online softmax and writes a partial
// (o / l, lse), and a second small kernel combines the splits with LSE weights.
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

#include <algorithm>

#include "backends/cuda/kv_fp8/sm90_sparse_mla_common.cuh"

namespace dsi::cuda {

namespace {

using namespace sparse_mla;

// One block per (row, head): out = sum_i exp(lse_i - L) o_i, lse = L = log sum_i exp(lse_i).
// Splits that saw no key have lse_i = -inf and weigh 0; all -inf gives out = 0, lse = -inf.
// The split LSEs are staged in shared memory (one parallel load) and turned into weights there.
// The partials are L2-resident and the loop is latency-bound, so 4 groups of 128 threads take every
// 4th split (4 columns per thread, unrolled: many loads in flight) and their sums are added in group
// order (deterministic).
//
// Kept small on purpose: 32 registers a thread, so four of its blocks share an SM. A version that
// loaded a batch of partials per thread with the LSEs (64 registers, blocks sized by the split
// count) was as fast or faster alone, but its blocks, resident early under the programmatic launch,
// held twice the registers, and the 4-row GLM-5.2 layer took 518.6 us against 495.9 with this one
// (bench_decode --rows 4, same run; docs/decode-performance.md).
constexpr int kCombineGroups = 4;
__global__ void __launch_bounds__(128 * kCombineGroups) sparse_mla_combine_kernel(SparseMlaDecodeParams p, SplitArgs a) {
  trace_mark(a.combine_trace, 0);
  pdl_enter();  // the split kernel's writes are visible
  trace_mark(a.combine_trace, 1);
  extern __shared__ float w_s[];  // [n_splits] weights exp(lse_i - max)
  __shared__ float red[33];
  __shared__ float4 part[kCombineGroups - 1][128];
  const int64_t rh = blockIdx.x;  // row * heads + head
  const int n = a.n_splits, c4 = threadIdx.x & 127, grp = threadIdx.x >> 7;
  const float* ls = a.part_lse + rh * n;
  float mx = -INFINITY;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    w_s[i] = ls[i];
    mx = fmaxf(mx, w_s[i]);
  }
  mx = block_max(mx, red);  // its barriers publish w_s
  float* o = p.out + rh * kLora;  // any f32 view: scalar stores
  if (mx == -INFINITY) {  // no split saw a key (block-uniform)
    if (grp == 0) {
#pragma unroll
      for (int u = 0; u < 4; ++u) o[4 * c4 + u] = 0.0f;
      if (c4 == 0) p.lse[rh] = -INFINITY;
    }
    return;
  }
  for (int i = threadIdx.x; i < n; i += blockDim.x) w_s[i] = expf(w_s[i] - mx);  // 0 without keys
  __syncthreads();
  trace_mark(a.combine_trace, 2);
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  const float4* po = reinterpret_cast<const float4*>(a.part_o + rh * n * kLora) + c4;
#pragma unroll 8
  for (int i = grp; i < n; i += kCombineGroups) {
    const float w = w_s[i];
    const float4 v = po[int64_t(i) * (kLora / 4)];
    acc.x += w * v.x;
    acc.y += w * v.y;
    acc.z += w * v.z;
    acc.w += w * v.w;
  }
  if (grp > 0) part[grp - 1][c4] = acc;
  __syncthreads();
  if (grp != 0) return;
  float sum = 0.0f;
  for (int i = 0; i < n; ++i) sum += w_s[i];  // >= 1: the maximum's own weight
#pragma unroll
  for (int gi = 0; gi < kCombineGroups - 1; ++gi) {
    const float4 v = part[gi][c4];
    acc.x += v.x;
    acc.y += v.y;
    acc.z += v.z;
    acc.w += v.w;
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
    sparse_mla::launch_wgmma_split(p, a, unsigned(blocks), s);
  else
    sparse_mla::launch_mma_split(p, a, plan.m_tiles, unsigned(blocks), s);
  if (plan.n_splits > 1) {
    DSI_CHECK(p.rows * p.heads < (int64_t(1) << 31), "sparse_mla_decode: {} rows x heads", p.rows * p.heads);
    const size_t smem = sizeof(float) * size_t(plan.n_splits);
    DSI_CHECK(smem <= 48 * 1024, "sparse_mla_decode: {} splits", plan.n_splits);
    launch(sparse_mla_combine_kernel, dim3(unsigned(p.rows * p.heads)), dim3(128 * kCombineGroups), smem, s, p, a);
  }
}

}  // namespace dsi::cuda
