// The segment-sum GEMV of gemv.h (launch_gemv_seg): the MoE's down products and their weighted
// sum in one pass.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <utility>

#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/linear/gemv.h"
#include "backends/cuda/linear/gemv_chunk.cuh"
#include "backends/cuda/ptx.cuh"

namespace dsi::cuda {

namespace {

using namespace gemv_chunk;

// ---- Segment sums (GemvSegParams): y[t] = add[t] + sum over s of coef_s x_s W_s^T ----
//
// The reduced dimension of an output row runs through token t's segments in turn (the MoE's down
// products: 9 x 2048 columns), so adding the experts' outputs costs no pass of its own and the rows
// are long enough for every warp to keep loads in flight. A warp owns R output rows and k_split
// warps share them, each taking every k_split-th stretch of 32 chunks of the concatenated columns;
// a stretch may run from one segment into the next, so each lane follows its own chunk cursor. Per
// chunk, the 16 products of a row are summed unscaled and added to the row's accumulator times the
// segment's scale_inv x coef. Partial sums: a fixed xor-butterfly per warp, then the k_split warps
// in order (bitwise reproducible). Two kernels move the weights:
// - registers (gemv_seg_kernel): each lane keeps `U` chunks of its rows in flight while it sums the
//   previous batch;
// - a ring (gemv_seg_ring_kernel): each lane copies its chunks into its warp's shared-memory ring
//   (cp.async) S - 1 rounds ahead of the math, as gemv_vec_kernel's ring does; the registers hold
//   one round, so three blocks fit an SM with four stages, four with three.
// Both ask for their first weights before the programmatic wait (weights and the segment table are
// no output of the kernel right before: launch_gemv_seg).

struct SegDesc {  // a segment as the kernel keeps it in shared memory
  const uint4* w;
  const float* x;
  const float* scale_inv;
  float coef;
  int chunks;  // 16-byte chunks per W row; 0 for a skipped segment
  int scale_cols, row0, col0;
};
struct SegCursor {
  int seg;  // n_seg once past the last segment
  int c;    // chunk inside the segment's rows
};
static_assert(sizeof(GemvSegment) == 64, "GemvSegment: four 16-byte loads");

// Token t's segments into shared memory (every thread of the block calls it).
__device__ __forceinline__ void load_segments(const GemvSegParams& p, int64_t t, SegDesc* sd) {
  if (threadIdx.x < p.n_seg) {
    // Written by an earlier kernel that has completed (launch_gemv_seg): read past the L1.
    const longlong2* src = reinterpret_cast<const longlong2*>(p.segs + t * p.n_seg + threadIdx.x);
    longlong2 v[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = __ldcg(src + i);
    GemvSegment g;
    memcpy(&g, v, sizeof(g));
    SegDesc d;
    d.w = static_cast<const uint4*>(g.w);
    d.x = g.x;
    d.scale_inv = g.scale_inv;
    d.coef = g.coef != nullptr ? __ldcg(g.coef) : 1.0f;
    d.chunks = g.w != nullptr ? int(g.in * elem_bytes(p.kind) / 16) : 0;
    d.scale_cols = int(g.scale_cols);
    d.row0 = int(g.row0);
    d.col0 = int(g.col0);
    sd[threadIdx.x] = d;
  }
  __syncthreads();
}

// Moves the cursor `by` chunks on, onto the segment that holds it (skipped segments hold none).
__device__ __forceinline__ void seg_advance(SegCursor& cur, const SegDesc* sd, int n_seg, int by) {
  cur.c += by;
  while (cur.seg < n_seg && cur.c >= sd[cur.seg].chunks) {
    cur.c -= sd[cur.seg].chunks;
    ++cur.seg;
  }
}

// acc[r] += coef scale_inv (x . W[rows[r]]) over chunk c of segment d.
template <FloatKind K, int R>
__device__ __forceinline__ void seg_chunk(const SegDesc& d, int c, const uint4 (&v)[R], const int (&rows)[R],
                                          int bo_log2, int bi_log2, float (&acc)[R]) {
  constexpr int E = elems_per_16b<K>();
  float sc[R];
  if constexpr (K == FloatKind::kE4M3) {
    const int col_block = (d.col0 + c * E) >> bi_log2;
#pragma unroll
    for (int r = 0; r < R; ++r)
      sc[r] = __ldg(d.scale_inv + int64_t((d.row0 + rows[r]) >> bo_log2) * d.scale_cols + col_block) * d.coef;
  } else {
#pragma unroll
    for (int r = 0; r < R; ++r) sc[r] = d.coef;
  }
  float part[R];
#pragma unroll
  for (int r = 0; r < R; ++r) part[r] = 0.0f;
  const float4* xc = reinterpret_cast<const float4*>(d.x + int64_t(c) * E);
#pragma unroll
  for (int sub = 0; sub < E / 4; ++sub) {
    const float4 xv = __ldg(xc + sub);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float f[4];
      decode4<K>(v[r], sub, f);
      part[r] = fmaf(xv.x, f[0], part[r]);
      part[r] = fmaf(xv.y, f[1], part[r]);
      part[r] = fmaf(xv.z, f[2], part[r]);
      part[r] = fmaf(xv.w, f[3], part[r]);
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = fmaf(part[r], sc[r], acc[r]);
}

// The warp's sums, then the row group's warps in order; stores y[t] (+ add[t]) for rows < out.
template <int R>
__device__ __forceinline__ void seg_store(const GemvSegParams& p, float (&acc)[R], int64_t t, int64_t row_base,
                                          int k_split) {
  __shared__ float red[kWarps][R];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const float v = warp_sum(acc[r]);
    if (lane == 0) red[warp][r] = v;
  }
  __syncthreads();
  if (warp % k_split != 0 || lane >= R) return;
  float v = red[warp][lane];
  for (int k = 1; k < k_split; ++k) v += red[warp + k][lane];
  const int64_t row = row_base + lane;
  if (row >= p.out) return;
  if (p.add != nullptr) v = __fadd_rn(v, p.add[t * p.ldy + row]);  // the CPU: routed sum, then + shared
  p.y[t * p.ldy + row] = v;
}

// Both kernels' start: token blockIdx.y's segments into shared memory, this warp's R rows (rows
// past the end, last block, re-read the last row; their results are not stored) and the lane's
// first chunk. Returns the warp's first row.
template <int R>
__device__ __forceinline__ int64_t seg_start(const GemvSegParams& p, int k_split, SegDesc* sd, int (&rows)[R],
                                             SegCursor& first) {
  load_segments(p, blockIdx.y, sd);
  const int warp = threadIdx.x >> 5, groups = kWarps / k_split;
  const int64_t row_base = (int64_t(blockIdx.x) * groups + warp / k_split) * R;
#pragma unroll
  for (int r = 0; r < R; ++r) rows[r] = int(min(row_base + r, p.out - 1));
  first = SegCursor{0, (warp % k_split) * 32 + int(threadIdx.x & 31)};
  seg_advance(first, sd, p.n_seg, 0);
  return row_base;
}

template <FloatKind K, int R, int U>
__global__ void __launch_bounds__(kThreads) gemv_seg_kernel(const GemvSegParams p, const int k_split,
                                                            const int bo_log2, const int bi_log2) {
  __shared__ SegDesc sd[kGemvMaxSegments];
  const int n_seg = p.n_seg, stride = k_split * 32;
  int rows[R];
  SegCursor cur;
  const int64_t row_base = seg_start<R>(p, k_split, sd, rows, cur);
  auto load = [&](uint4 (&v)[U][R], SegCursor (&at)[U]) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      at[u] = cur;
      if (cur.seg < n_seg) {
        const SegDesc& d = sd[cur.seg];
#pragma unroll
        for (int r = 0; r < R; ++r) v[u][r] = load_stream(d.w + int64_t(rows[r]) * d.chunks + cur.c);
        seg_advance(cur, sd, n_seg, stride);
      }
    }
  };
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.0f;
  auto sum = [&](const uint4 (&v)[U][R], const SegCursor (&at)[U]) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (at[u].seg >= n_seg) break;
      seg_chunk<K, R>(sd[at[u].seg], at[u].c, v[u], rows, bo_log2, bi_log2, acc);
    }
  };
  uint4 a[U][R], b[U][R];
  SegCursor at_a[U], at_b[U];
  load(a, at_a);
  pdl_enter();  // x (and add) are outputs of the kernels before
  while (at_a[0].seg < n_seg) {
    load(b, at_b);
    sum(a, at_a);
    if (at_b[0].seg >= n_seg) break;
    load(a, at_a);
    sum(b, at_b);
  }
  seg_store<R>(p, acc, blockIdx.y, row_base, k_split);
}

template <int R, int S>
constexpr size_t seg_ring_smem_bytes() {
  return size_t(kWarps) * S * R * 32 * sizeof(uint4);
}

// S stages (3 or 4). Two cursors walk the same chunks: the copy cursor S - 1 rounds ahead of the sum
// cursor. A lane reads back only what it copied itself, so no barrier.
template <FloatKind K, int R, int S>
__global__ void __launch_bounds__(kThreads, S == 3 ? 4 : 3)
    gemv_seg_ring_kernel(const GemvSegParams p, const int k_split, const int bo_log2, const int bi_log2) {
  constexpr int kSegStages = S;
  __shared__ SegDesc sd[kGemvMaxSegments];
  extern __shared__ uint4 ring[];  // [kWarps][S][R][32]
  const int n_seg = p.n_seg, stride = k_split * 32;
  int rows[R];
  SegCursor copy;
  const int64_t row_base = seg_start<R>(p, k_split, sd, rows, copy);
  SegCursor at = copy;
  uint4* mine = ring + (threadIdx.x >> 5) * (kSegStages * R * 32) + (threadIdx.x & 31);
  auto queue = [&](int stage) {
    if (copy.seg < n_seg) {
      const SegDesc& d = sd[copy.seg];
#pragma unroll
      for (int r = 0; r < R; ++r) cp_async16(mine + (stage * R + r) * 32, d.w + int64_t(rows[r]) * d.chunks + copy.c);
      seg_advance(copy, sd, n_seg, stride);
    }
    cp_async_commit();  // always a group, so the waits count stages
  };
#pragma unroll
  for (int st = 0; st < kSegStages - 1; ++st) queue(st);
  pdl_enter();  // x (and add) are outputs of the kernels before
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.0f;
  int st = 0;
  while (at.seg < n_seg) {
    queue(st == 0 ? kSegStages - 1 : st - 1);  // the stage the previous round read
    cp_async_wait<kSegStages - 1>();           // this round's stage has landed
    uint4 v[R];
#pragma unroll
    for (int r = 0; r < R; ++r) v[r] = mine[(st * R + r) * 32];
    seg_chunk<K, R>(sd[at.seg], at.c, v, rows, bo_log2, bi_log2, acc);
    seg_advance(at, sd, n_seg, stride);
    st = st + 1 == kSegStages ? 0 : st + 1;
  }
  cp_async_wait<0>();
  seg_store<R>(p, acc, blockIdx.y, row_base, k_split);
}

int64_t seg_blocks_per_token(const GemvSegParams& p, const GemvSegPlan& plan) {
  const int64_t rows_per_block = int64_t(plan.rows) * (kWarps / plan.k_split);
  return (p.out + rows_per_block - 1) / rows_per_block;
}

template <FloatKind K, int R>
void launch_seg_r(const GemvSegParams& p, const GemvSegPlan& plan, cudaStream_t s, int* blocks_per_sm) {
  const dim3 grid(unsigned(seg_blocks_per_token(p, plan)), unsigned(p.n));
  const int bo = K == FloatKind::kE4M3 ? __builtin_ctz(unsigned(p.block_out)) : 0;
  const int bi = K == FloatKind::kE4M3 ? __builtin_ctz(unsigned(p.block_in)) : 0;
  if (plan.ring && plan.depth == 3)
    launch_or_occupancy(gemv_seg_ring_kernel<K, R, 4>, grid, seg_ring_smem_bytes<R, 4>(), s, blocks_per_sm, p,
                        plan.k_split, bo, bi);
  else if (plan.ring)
    launch_or_occupancy(gemv_seg_ring_kernel<K, R, 3>, grid, seg_ring_smem_bytes<R, 3>(), s, blocks_per_sm, p,
                        plan.k_split, bo, bi);
  else if (plan.depth == 4)
    launch_or_occupancy(gemv_seg_kernel<K, R, 4>, grid, 0, s, blocks_per_sm, p, plan.k_split, bo, bi);
  else
    launch_or_occupancy(gemv_seg_kernel<K, R, 2>, grid, 0, s, blocks_per_sm, p, plan.k_split, bo, bi);
}

template <FloatKind K>
void launch_seg(const GemvSegParams& p, const GemvSegPlan& plan, cudaStream_t s, int* blocks_per_sm) {
  if (plan.rows == 2) launch_seg_r<K, 2>(p, plan, s, blocks_per_sm);
  else launch_seg_r<K, 4>(p, plan, s, blocks_per_sm);
}

void run_seg(const GemvSegParams& p, const GemvSegPlan& plan, cudaStream_t s, int* blocks_per_sm) {
  switch (p.kind) {
    case FloatKind::kF32: launch_seg<FloatKind::kF32>(p, plan, s, blocks_per_sm); break;
    case FloatKind::kBF16: launch_seg<FloatKind::kBF16>(p, plan, s, blocks_per_sm); break;
    case FloatKind::kF16: launch_seg<FloatKind::kF16>(p, plan, s, blocks_per_sm); break;
    default: launch_seg<FloatKind::kE4M3>(p, plan, s, blocks_per_sm); break;
  }
}

// Blocks of the plan's kernel one SM of the current device holds, cached per instantiation (kind,
// rows per warp, kernel and depth).
int seg_blocks_per_sm(const GemvSegParams& p, const GemvSegPlan& plan) {
  static std::atomic<int> cache[kCachedDevices][4 * 2 * 2 * 5];
  const int key = ((int(p.kind) * 2 + (plan.rows == 4)) * 2 + plan.ring) * 5 + plan.depth;
  return cached_blocks_per_sm(cache, key, [&] {
    int b = 0;
    run_seg(p, plan, nullptr, &b);
    return b;
  });
}

}  // namespace

bool gemv_seg_ok(const GemvSegParams& p) {
  if (p.n < 1 || p.n > 65535 || p.n_seg < 1 || p.n_seg > kGemvMaxSegments || p.out <= 0 ||
      p.out >= (int64_t(1) << 31) || p.max_in * elem_bytes(p.kind) >= (int64_t(1) << 31))
    return false;
  if (p.kind == FloatKind::kE4M3) {
    const auto pow2 = [](int b) { return b > 0 && (b & (b - 1)) == 0; };
    return pow2(p.block_out) && pow2(p.block_in) && p.block_in >= 16;
  }
  return true;
}

namespace {
// Forced plan fields, 0: the plan chooses (g_seg_ring holds the kernel + 1: 1 registers, 2 the ring).
std::atomic<int> g_seg_k_split{0}, g_seg_depth{0}, g_seg_rows{0}, g_seg_ring{0};
}  // namespace

void set_gemv_seg_plan(int k_split, int depth, int rows, int ring) {
  g_seg_k_split.store(k_split);
  g_seg_depth.store(depth);
  g_seg_rows.store(rows);
  g_seg_ring.store(std::clamp(ring, -1, 1) + 1);
}

GemvSegPlan gemv_seg_plan(const GemvSegParams& p, int num_sms) {
  // The ring with 4 rows per warp and 2 warps per row group when all its blocks fit the GPU at once
  // (four stages first, else three, which fit four blocks per SM), else whole rows per warp with two
  // chunks per lane and row in flight through registers. Measured on the MoE's down launch of one
  // token (bench_linear --moe-only --sweep, one H200, us): GLM-5 [6144, 9 x 2048] registers 41.2,
  // the ring at 2 warps per row group 33.3 (384 blocks, one wave at three per SM), at 1 warp 43.4
  // (192 blocks: a third of the SMs hold two, the rest one), at 4 warps 36.4 (two waves);
  // DeepSeek-V3.2 [7168, 9 x 2048] registers 42.0, the four-stage ring at 2 warps 53.6 (448
  // blocks: two waves). 2 rows per warp lost everywhere (44-84 us), as did four chunks in flight
  // through registers (199 registers, one block per SM; 50-71 us).
  // Where the four-stage ring takes more than one wave, the three-stage ring at 4 warps per row
  // group within two waves beat it at 2 warps in one (bench_moe --rows 1, DeepSeek-V3.2, us per MoE
  // layer: 896 blocks 122.3 / 122.7, 448 blocks 125.5 / 125.9); GLM-5 keeps 2 warps (one wave of
  // the four-stage ring: 33.1 us against 35.4 at 4 warps for its down launch alone).
  // DSI_GEMV_SEG_RING=0 keeps the register kernel (for comparisons).
  static const bool ring_ok = !env_switched_off("DSI_GEMV_SEG_RING");
  GemvSegPlan plan;
  for (const auto& [c, waves] : {std::pair{GemvSegPlan{2, 4, true, 3}, 1}, std::pair{GemvSegPlan{4, 4, true, 2}, 2}})
    if (ring_ok && seg_blocks_per_token(p, c) * p.n <= int64_t(waves) * seg_blocks_per_sm(p, c) * num_sms) {
      plan = c;
      break;
    }
  if (const int k = g_seg_k_split.load(); k > 0) plan.k_split = k;
  if (const int r = g_seg_rows.load(); r > 0) plan.rows = r;
  if (const int ring = g_seg_ring.load(); ring > 0) {
    plan.ring = ring == 2;
    plan.depth = plan.ring ? 3 : 2;
  }
  if (const int d = g_seg_depth.load(); d > 0) plan.depth = d;
  return plan;
}

bool gemv_seg_plan_ok(const GemvSegPlan& plan) {
  return (plan.k_split == 1 || plan.k_split == 2 || plan.k_split == 4 || plan.k_split == 8) &&
         (plan.rows == 2 || plan.rows == 4) &&
         (plan.ring ? plan.depth == 2 || plan.depth == 3 : plan.depth == 2 || plan.depth == 4);
}

void launch_gemv_seg(const GemvSegParams& p, const GemvSegPlan& plan, cudaStream_t stream) {
  DSI_CHECK(gemv_seg_ok(p), "gemv_seg: {} tokens x {} segments of [{}, *] outside the segment kernel", p.n,
            p.n_seg, p.out);
  DSI_CHECK(gemv_seg_plan_ok(plan), "gemv_seg: plan k_split {}, rows {}, ring {}, depth {}", plan.k_split, plan.rows,
            plan.ring, plan.depth);
  run_seg(p, plan, stream, nullptr);
}

}  // namespace dsi::cuda
