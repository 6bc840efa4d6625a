// The segment-sum GEMV of gemv.h (launch_gemv_seg): the MoE's down products and their weighted
// sum in one pass.
#include <atomic>
#include <cstring>

#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/linear/gemv.h"
#include "backends/cuda/linear/gemv_chunk.cuh"

namespace dsi::cuda {

namespace {

using namespace gemv_chunk;

// ---- Segment sums (GemvSegParams): y[t] = add[t] + sum over s of coef_s x_s W_s^T ----
//
// The reduced dimension of an output row runs through token t's segments in turn (the MoE's down
// products: 9 x 2048 columns), so adding the experts' outputs costs no pass of its own and the rows
// are long enough for every warp to keep loads in flight. A warp owns kSegRows output rows and
// k_split warps share them, each taking every k_split-th stretch of 32 chunks of the concatenated
// columns; a stretch may run from one segment into the next, so each lane follows its own chunk
// cursor. Per chunk, the 16 products of a row are summed unscaled and added to the row's
// accumulator times the segment's scale_inv x coef. Each lane keeps `U` chunks of its rows in flight
// while it sums the previous batch; the first batch is asked for before the programmatic wait
// (weights and the segment table are no output of the kernel right before: launch_gemv_seg).
// Partial sums: a fixed xor-butterfly per warp, then the k_split warps in order (bitwise
// reproducible).
constexpr int kSegRows = 4;

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

template <FloatKind K, int U>
__global__ void __launch_bounds__(kThreads) gemv_seg_kernel(const GemvSegParams p, const int k_split,
                                                            const int bo_log2, const int bi_log2) {
  constexpr int E = elems_per_16b<K>();
  constexpr int R = kSegRows;
  constexpr bool kFp8 = K == FloatKind::kE4M3;
  __shared__ SegDesc sd[kGemvMaxSegments];
  __shared__ float red[kWarps][R];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int groups = kWarps / k_split, group = warp / k_split, kw = warp % k_split;
  const int64_t t = blockIdx.y;
  const int64_t row_base = (int64_t(blockIdx.x) * groups + group) * R;
  const int n_seg = p.n_seg;
  if (threadIdx.x < n_seg) {
    // Written by an earlier kernel that has completed (launch_gemv_seg): read past the L1.
    const longlong2* src = reinterpret_cast<const longlong2*>(p.segs + t * n_seg + threadIdx.x);
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
    d.chunks = g.w != nullptr ? int(g.in / E) : 0;
    d.scale_cols = int(g.scale_cols);
    d.row0 = int(g.row0);
    d.col0 = int(g.col0);
    sd[threadIdx.x] = d;
  }
  __syncthreads();
  int rows[R];  // rows past the end (last block) re-read the last row; not stored
#pragma unroll
  for (int r = 0; r < R; ++r) rows[r] = int(min(row_base + r, p.out - 1));
  const int stride = k_split * 32;
  SegCursor cur{0, kw * 32 + lane};
  auto settle = [&]() {  // onto the segment that holds chunk c (skipped segments hold none)
    while (cur.seg < n_seg && cur.c >= sd[cur.seg].chunks) {
      cur.c -= sd[cur.seg].chunks;
      ++cur.seg;
    }
  };
  settle();
  auto load = [&](uint4 (&v)[U][R], SegCursor (&at)[U]) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      at[u] = cur;
      if (cur.seg < n_seg) {
        const SegDesc& d = sd[cur.seg];
#pragma unroll
        for (int r = 0; r < R; ++r) v[u][r] = load_stream(d.w + int64_t(rows[r]) * d.chunks + cur.c);
        cur.c += stride;
        settle();
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
      const SegDesc& d = sd[at[u].seg];
      float sc[R];
      if constexpr (kFp8) {
        const int col_block = (d.col0 + at[u].c * E) >> bi_log2;
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
      const float4* xc = reinterpret_cast<const float4*>(d.x + int64_t(at[u].c) * E);
#pragma unroll
      for (int sub = 0; sub < E / 4; ++sub) {
        const float4 xv = __ldg(xc + sub);
#pragma unroll
        for (int r = 0; r < R; ++r) {
          float f[4];
          decode4<K>(v[u][r], sub, f);
          part[r] = fmaf(xv.x, f[0], part[r]);
          part[r] = fmaf(xv.y, f[1], part[r]);
          part[r] = fmaf(xv.z, f[2], part[r]);
          part[r] = fmaf(xv.w, f[3], part[r]);
        }
      }
#pragma unroll
      for (int r = 0; r < R; ++r) acc[r] = fmaf(part[r], sc[r], acc[r]);
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
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const float v = warp_sum(acc[r]);
    if (lane == 0) red[warp][r] = v;
  }
  __syncthreads();
  if (kw != 0 || lane >= R) return;
  float v = red[warp][lane];
  for (int k = 1; k < k_split; ++k) v += red[warp + k][lane];
  const int64_t row = row_base + lane;
  if (row >= p.out) return;
  if (p.add != nullptr) v = __fadd_rn(v, p.add[t * p.ldy + row]);  // the CPU: routed sum, then + shared
  p.y[t * p.ldy + row] = v;
}

template <FloatKind K>
void launch_seg(const GemvSegParams& p, const GemvSegPlan& plan, cudaStream_t s) {
  const int64_t rows_per_block = int64_t(kSegRows) * (kWarps / plan.k_split);
  const dim3 grid(unsigned((p.out + rows_per_block - 1) / rows_per_block), unsigned(p.n));
  const int bo = K == FloatKind::kE4M3 ? __builtin_ctz(unsigned(p.block_out)) : 0;
  const int bi = K == FloatKind::kE4M3 ? __builtin_ctz(unsigned(p.block_in)) : 0;
  if (plan.unroll == 4)
    launch(gemv_seg_kernel<K, 4>, grid, kThreads, 0, s, p, plan.k_split, bo, bi);
  else
    launch(gemv_seg_kernel<K, 2>, grid, kThreads, 0, s, p, plan.k_split, bo, bi);
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
std::atomic<int> g_seg_k_split{0}, g_seg_unroll{0};  // 0: the plan chooses
}  // namespace

void set_gemv_seg_plan(int k_split, int unroll) {
  g_seg_k_split.store(k_split);
  g_seg_unroll.store(unroll);
}

GemvSegPlan gemv_seg_plan() {
  // Whole rows per warp (k_split 1) and two chunks in flight per lane and row. Measured on the MoE's
  // down launch of one token (bench_moe, one H200, us per MoE layer, warps per row group 1 / 2 / 4 /
  // 8): GLM-5.2 113.8 / 120.2 / 113.3 / 119.3, DeepSeek-V3.2 125.4 / - / 133.8 / -; four chunks in
  // flight take 199 registers (one block per SM) and lost everywhere (GLM-5.2 132-146 us). Every
  // measured shape agreed, so the plan does not depend on the shape.
  GemvSegPlan plan;
  if (const int k = g_seg_k_split.load(); k > 0) plan.k_split = k;
  if (const int u = g_seg_unroll.load(); u > 0) plan.unroll = u;
  return plan;
}

void launch_gemv_seg(const GemvSegParams& p, const GemvSegPlan& plan, cudaStream_t stream) {
  DSI_CHECK(gemv_seg_ok(p), "gemv_seg: {} tokens x {} segments of [{}, *] outside the segment kernel", p.n,
            p.n_seg, p.out);
  DSI_CHECK(plan.k_split == 1 || plan.k_split == 2 || plan.k_split == 4 || plan.k_split == 8,
            "gemv_seg: k_split {}", plan.k_split);
  DSI_CHECK(plan.unroll == 2 || plan.unroll == 4, "gemv_seg: unroll {}", plan.unroll);
  switch (p.kind) {
    case FloatKind::kF32: launch_seg<FloatKind::kF32>(p, plan, stream); break;
    case FloatKind::kBF16: launch_seg<FloatKind::kBF16>(p, plan, stream); break;
    case FloatKind::kF16: launch_seg<FloatKind::kF16>(p, plan, stream); break;
    default: launch_seg<FloatKind::kE4M3>(p, plan, stream); break;
  }
}

}  // namespace dsi::cuda
