// Weight-streaming GEMV / skinny GEMM (1..8 rows of x); see gemv.h.
//
// Tiling: a block is 8 warps. A warp owns R output rows (rows_per_warp) and k_split warps share one
// row group, each streaming every k_split-th 512-byte stretch of those rows (32 lanes x 16 B). A
// lane reads 16 B of each of its R rows per stretch (on long rows through its warp's shared-memory
// ring, three stretches ahead of the math; else two stretches at a time into registers; see
// gemv_vec_kernel) and reuses every 16 B of x it loads across the R rows: x is read from L1 (R x
// fewer x bytes per weight byte), W bypasses L1 (read once, it would only evict x). Partial sums:
// a fixed xor-butterfly per warp, then the k_split warps in order through shared memory, so
// results are bitwise reproducible. The segment-sum GEMV (the MoE's down products and their
// weighted sum) is in gemv_seg.cu, the launch plan in gemv_plan.cu; the 16-byte chunk helpers
// the kernels share in gemv_chunk.cuh.

#include <algorithm>
#include <atomic>

#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/linear/gemv.h"
#include "backends/cuda/linear/gemv_chunk.cuh"
#include "backends/cuda/ptx.cuh"
#include "backends/cuda/rope/rope.cuh"

namespace dsi::cuda {

namespace {

using namespace gemv_chunk;

// acc[i][r] += x[i, c*E .. c*E+E) . W[row r, same columns] for one 16-byte chunk c of each row.
// srow[r]: the row's scale_inv row (fp8); the chunk lies inside one column block (gemv_vector_ok),
// so its 16 products are summed first and scaled once (one multiply per chunk, not per weight: the
// dequantisation arithmetic, not the memory, bounded the fp8 kernel).
template <FloatKind K, int N, int R>
__device__ __forceinline__ void accumulate_chunk(const GemvParams& p, const uint4 (&wv)[R],
                                                 const float* const (&srow)[R], int64_t c,
                                                 int block_in_log2, float (&acc)[N][R]) {
  constexpr int E = elems_per_16b<K>();
  constexpr bool kFp8 = K == FloatKind::kE4M3;
  float s[R];
  if constexpr (kFp8) {
    const int64_t sc = (p.col0 + c * E) >> block_in_log2;
    for (int r = 0; r < R; ++r) s[r] = __ldg(srow[r] + sc);
  }
  float part[N][R];
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int r = 0; r < R; ++r) part[i][r] = kFp8 ? 0.0f : acc[i][r];
  const float* xc = p.x + c * E;
#pragma unroll
  for (int sub = 0; sub < E / 4; ++sub) {
    float4 xv[N];
#pragma unroll
    for (int i = 0; i < N; ++i) xv[i] = __ldg(reinterpret_cast<const float4*>(xc + i * p.ldx) + sub);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float f[4];
      decode4<K>(wv[r], sub, f);
#pragma unroll
      for (int i = 0; i < N; ++i) {
        part[i][r] = fmaf(xv[i].x, f[0], part[i][r]);
        part[i][r] = fmaf(xv[i].y, f[1], part[i][r]);
        part[i][r] = fmaf(xv[i].z, f[2], part[i][r]);
        part[i][r] = fmaf(xv[i].w, f[3], part[i][r]);
      }
    }
  }
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int r = 0; r < R; ++r) acc[i][r] = kFp8 ? fmaf(part[i][r], s[r], acc[i][r]) : part[i][r];
}

// Reduces acc over the warp (xor butterfly), then over the k_split warps of the row group in warp
// order, and stores rows < out (p.swiglu: output r < R / 2 from gate row r and up row r + R / 2).
// Every thread of the block calls it.
template <int N, int R, bool kSwiglu = false>
__device__ __forceinline__ void reduce_store(const GemvParams& p, float (&acc)[N][R],
                                             int64_t row_base, int k_split) {
  __shared__ float red[kWarps][N * R];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float v = warp_sum(acc[i][r]);
      if (lane == 0) red[warp][i * R + r] = v;
    }
  __syncthreads();
  if (warp % k_split != 0) return;
  auto total = [&](int j) {
    float v = red[warp][j];
    for (int k = 1; k < k_split; ++k) v += red[warp + k][j];
    return v;
  };
  if constexpr (kSwiglu) {
    const int64_t row = row_base + lane;
    if (lane < R / 2 && row < p.out) p.y[row] = silu_mul_f(total(lane), total(lane + R / 2));
  } else if (lane < N * R) {
    const int i = lane / R, r = lane % R;
    const int64_t row = row_base + r;
    if (row < p.out) p.y[i * p.ldy + row] = total(lane);
  }
}

// The product of this block row: the params themselves, or (grouped) with its group's pointers
// (and, when w2 is given, its up projection's); false when the group is skipped.
__device__ __forceinline__ bool group_params(const GemvParams& p0, GemvParams& p, const void** w2 = nullptr,
                                             const float** s2 = nullptr) {
  p = p0;
  if (p0.groups == nullptr) {
    if (p0.n_groups > 1) {  // strided batch
      const int64_t g = blockIdx.y;
      p.x += g * p0.batch_x;
      p.y += g * p0.batch_y;
      p.w = static_cast<const char*>(p0.w) + g * p0.batch_rows * p0.in * elem_bytes(p0.kind);
      p.row0 += g * p0.batch_rows;
    }
    return true;
  }
  const GemvGroup g = p0.groups[blockIdx.y];
  p.x = g.x;
  p.w = g.w;
  p.scale_inv = g.scale_inv;
  p.y = g.y;
  p.out = g.out;
  p.in = g.in;
  p.scale_cols = g.scale_cols;
  p.row0 = g.row0;
  p.col0 = g.col0;
  if (w2 != nullptr) {
    *w2 = g.w2;
    *s2 = g.scale_inv2;
  }
  return g.w != nullptr;
}

// The 16-byte vector kernel (gemv_vector_ok holds). Grid: ceil(out / (R * kWarps / k_split)) x
// n_groups.
//
// W does not depend on the kernel before (pdl_wait): a product named by the params themselves first
// asks the L2 for the first `prefetch` bytes of this block's rows (one contiguous stretch), so they
// stream in while the previous kernel ends. Grouped products learn their pointers from memory an
// earlier kernel may write, so they wait first.
//
// kPipe: W goes through a per-warp ring of kPipeStages stages in shared memory (cp.async, 16 bytes
// of each of the R rows per lane and stage; a lane reads back only what it copied, so no barrier),
// kPipeStages - 1 stages ahead of the math, the first ones queued before the dependency wait. The
// registers then hold one stage, not two, so more warps fit an SM, and each keeps a steady stream
// in flight instead of two stretches at a time. Without it: two stretches in registers per round.
constexpr int kPipeStages = 4;

template <int R>
constexpr size_t pipe_smem_bytes() {
  return size_t(kWarps) * kPipeStages * R * 32 * sizeof(uint4);
}

// kSwiglu (p0.swiglu; N = 1, R even): a template parameter, so that the other instantiations keep
// their registers; one x row through the ring is held to the three blocks per SM that
// kGemvStreamBlocksPerSm plans for (<= 85 registers).
template <FloatKind K, int N, int R, bool kPipe, bool kSwiglu>
__global__ void __launch_bounds__(kThreads, kPipe && N == 1 ? kGemvStreamBlocksPerSm : 1)
    gemv_vec_kernel(const GemvParams p0, const int k_split, const int64_t prefetch, const int rgw) {
  constexpr int E = elems_per_16b<K>();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int groups = kWarps / k_split, group = warp / k_split, kw = warp % k_split;
  const bool grouped = p0.groups != nullptr;
  // Outputs per row group: R, or with swiglu R / 2 (rows [0, RH) of a warp read gate rows, rows
  // [RH, R) the up rows of the same outputs).
  constexpr int RH = kSwiglu ? R / 2 : R;
  const int64_t block_rows = int64_t(groups) * RH * rgw, first = int64_t(blockIdx.x) * block_rows;
  GemvParams p;
  const void* w2 = nullptr;
  const float* s2 = nullptr;
  if (!grouped) {
    group_params(p0, p);
    if (threadIdx.x == 0 && prefetch > 0 && first < p.out) {
      const int64_t row_bytes = p.in * elem_bytes(K);
      const int64_t rows = min(block_rows, p.out - first);
      prefetch_l2_bulk(static_cast<const char*>(p.w) + first * row_bytes, min(prefetch, rows * row_bytes));
    }
  } else {
    pdl_enter();
    if (!group_params(p0, p, &w2, &s2)) return;
  }
  if (first >= p.out) {  // past this group's rows (grouped form)
    if (!grouped) pdl_enter();
    return;
  }
  // Row group j of this warp (j < rgw) starts at row_of(j); the block's row groups are taken in
  // turn by its warps, so at each step the block streams contiguous rows.
  auto row_of = [&](int j) { return first + (int64_t(j) * groups + group) * RH; };
  const int64_t chunks = p.in / E;  // 16-byte chunks per row
  const uint4* const w0 = static_cast<const uint4*>(p.w);
  const uint4* wrow[R];
  const float* srow[R];
  auto point = [&](int j, bool scales) {
    // Rows past the end (last block) re-read the last row; their results are not stored.
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const bool up = r >= RH;  // swiglu's up rows
      const int64_t row = min(row_of(j) + (up ? r - RH : r), p.out - 1);
      if (scales)
        srow[r] = K == FloatKind::kE4M3
                      ? (up ? s2 : p.scale_inv) + ((p.row0 + row) / p.block_out) * p.scale_cols
                      : nullptr;
      else
        wrow[r] = (up ? static_cast<const uint4*>(w2) : w0) + row * chunks;
    }
  };
  point(0, false);
  point(0, true);
  const int block_in_log2 = K == FloatKind::kE4M3 ? __ffs(p.block_in) - 1 : 0;
  float acc[N][R];
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int r = 0; r < R; ++r) acc[i][r] = 0.0f;

  const int64_t stride = int64_t(k_split) * 32;
  if constexpr (kPipe) {
    // The ring runs on over this warp's row groups: the first stretches of the next row group are
    // in flight while the last ones of this one are summed. Rounds per row group are the same for
    // every lane (lanes past the row's end copy and sum nothing).
    extern __shared__ uint4 ring[];  // [kWarps][kPipeStages][R][32]
    uint4* mine = ring + warp * (kPipeStages * R * 32) + lane;
    const int64_t start = int64_t(kw) * 32 + lane;
    const int64_t rounds = chunks > kw * 32 ? (chunks - kw * 32 + stride - 1) / stride : 0;
    int n_rg = 0;  // this warp's row groups inside the product
    while (n_rg < rgw && row_of(n_rg) < p.out) ++n_rg;
    int qj = 0;  // the row group and round the next stage copies
    int64_t qr = 0;
    auto queue = [&](int stage) {
      if (qj < n_rg) {
        const int64_t c = start + qr * stride;
        if (c < chunks) {
#pragma unroll
          for (int r = 0; r < R; ++r) cp_async16(mine + (stage * R + r) * 32, wrow[r] + c);
        }
        if (++qr == rounds) {
          qr = 0;
          if (++qj < n_rg) point(qj, false);
        }
      }
      cp_async_commit();  // always a group, so the waits count stages
    };
#pragma unroll
    for (int st = 0; st < kPipeStages - 1; ++st) queue(st);
    if (!grouped) pdl_enter();  // x is the previous kernel's output
    int st = 0;
    for (int j = 0; j < n_rg; ++j) {
      if (j > 0) point(j, true);
      for (int64_t round = 0; round < rounds; ++round) {
        queue(st == 0 ? kPipeStages - 1 : st - 1);  // the stage the previous round read
        cp_async_wait<kPipeStages - 1>();           // this round's stage has landed
        const int64_t c = start + round * stride;
        if (c < chunks) {
          uint4 wv[R];
#pragma unroll
          for (int r = 0; r < R; ++r) wv[r] = mine[(st * R + r) * 32];
          accumulate_chunk<K, N, R>(p, wv, srow, c, block_in_log2, acc);
        }
        st = st + 1 == kPipeStages ? 0 : st + 1;
      }
      if (k_split == 1) {  // the warp holds whole rows: sum over its lanes and store
        const int64_t row_base = row_of(j);
        float v[N][R];
#pragma unroll
        for (int i = 0; i < N; ++i)
#pragma unroll
          for (int r = 0; r < R; ++r) {
            v[i][r] = warp_sum(acc[i][r]);
            acc[i][r] = 0.0f;
          }
        if constexpr (kSwiglu) {
#pragma unroll
          for (int r = 0; r < R / 2; ++r)
            if (lane == r && row_base + r < p.out) p.y[row_base + r] = silu_mul_f(v[0][r], v[0][r + R / 2]);
        } else {
#pragma unroll
          for (int i = 0; i < N; ++i)
#pragma unroll
            for (int r = 0; r < R; ++r)
              if (lane == i * R + r && row_base + r < p.out) p.y[i * p.ldy + row_base + r] = v[i][r];
        }
      }
    }
    cp_async_wait<0>();
    if (k_split == 1) return;
  } else {
    if (!grouped) pdl_enter();
    for (int64_t c = int64_t(kw) * 32 + lane; c < chunks; c += 2 * stride) {
      const int64_t c2 = c + stride;
      const bool second = c2 < chunks;
      uint4 a[R], b[R];
#pragma unroll
      for (int r = 0; r < R; ++r) a[r] = load_stream(wrow[r] + c);
      if (second) {
#pragma unroll
        for (int r = 0; r < R; ++r) b[r] = load_stream(wrow[r] + c2);
      }
      accumulate_chunk<K, N, R>(p, a, srow, c, block_in_log2, acc);
      if (second) accumulate_chunk<K, N, R>(p, b, srow, c2, block_in_log2, acc);
    }
  }
  reduce_store<N, R, kSwiglu>(p, acc, row_of(0), k_split);
}

// The element-wise kernel for any shape and alignment: a warp per output row, lanes stride the
// columns. Grid: ceil(out / kWarps).
template <int N>
__global__ void __launch_bounds__(kThreads) gemv_any_kernel(const GemvParams p0) {
  pdl_enter();
  GemvParams p;
  if (!group_params(p0, p)) return;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (int64_t(blockIdx.x) * kWarps >= p.out) return;  // past this group's rows (grouped form)
  const int64_t row_base = int64_t(blockIdx.x) * kWarps + warp;
  const int64_t row = row_base < p.out ? row_base : p.out - 1;
  const bool fp8 = p.kind == FloatKind::kE4M3;
  const float* srow = fp8 ? p.scale_inv + ((p.row0 + row) / p.block_out) * p.scale_cols : nullptr;
  float acc[N][1];
#pragma unroll
  for (int i = 0; i < N; ++i) acc[i][0] = 0.0f;
  for (int64_t j = lane; j < p.in; j += 32) {
    float w = load_float(p.w, p.kind, row * p.in + j);
    if (fp8) w = __fmul_rn(w, srow[(p.col0 + j) / p.block_in]);
#pragma unroll
    for (int i = 0; i < N; ++i) acc[i][0] = fmaf(p.x[i * p.ldx + j], w, acc[i][0]);
  }
  reduce_store<N, 1>(p, acc, row_base, 1);
}

// The transposed kernel (gemv_t_ok holds): y = x W with W stored [in, out]. Block (column slice,
// batch item): thread (rg, chunk) owns one 16-byte column chunk of W and sums the rows
// d = rg (mod RG) of it for every x row; the RG partial sums of a column are then added in a fixed
// order (bitwise reproducible). x rows sit in shared memory. With rope.rows > 0 the grid has one
// more column of blocks: block (last, g) rotates head g's pairs of every row (launch_gemv_t).
template <FloatKind K, int N>
__global__ void __launch_bounds__(kThreads) gemv_t_kernel(const GemvParams p, const int cpb, const RopeParams rope) {
  if (rope.rows > 0 && blockIdx.x == gridDim.x - 1) {
    pdl_enter();
    for (int64_t t = threadIdx.x; t < rope.rows * rope.half; t += kThreads)
      rope_item(rope, t / rope.half, blockIdx.y, t % rope.half);
    return;
  }
  constexpr int E = elems_per_16b<K>();
  constexpr bool kFp8 = K == FloatKind::kE4M3;
  extern __shared__ float smem[];
  float* xs = smem;                 // [N][in]
  float* red = smem + N * p.in;     // [RG][cpb * E]
  const int64_t g = blockIdx.y;
  const float* x = p.x + g * p.batch_x;
  float* y = p.y + g * p.batch_y;
  const int64_t chunks = p.out / E;  // 16-byte chunks per W row
  const uint4* w = reinterpret_cast<const uint4*>(static_cast<const char*>(p.w) +
                                                  g * p.batch_rows * chunks * 16);
  const int64_t row0 = p.row0 + g * p.batch_rows;
  const int cl = threadIdx.x % cpb, rg = threadIdx.x / cpb, n_rg = kThreads / cpb;
  const int64_t chunk = int64_t(blockIdx.x) * cpb + cl;
  // W is no earlier kernel's output: this block's column slice (up to 128 bytes of each row) is
  // asked of the L2 before waiting for x.
  if (cl == 0 && chunk < chunks)
    for (int64_t d = rg; d < p.in; d += n_rg) prefetch_l2(w + d * chunks + chunk);
  pdl_enter();
  for (int i = 0; i < N; ++i)
    for (int64_t d = threadIdx.x; d < p.in; d += kThreads)
      xs[i * p.in + d] = i < p.n ? x[i * p.ldx + d] : 0.0f;
  __syncthreads();
  float acc[N][E];
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int e = 0; e < E; ++e) acc[i][e] = 0.0f;
  if (chunk < chunks) {
    const float* scol = nullptr;
    if constexpr (kFp8) scol = p.scale_inv + ((p.col0 + chunk * E) >> (__ffs(p.block_in) - 1));
#pragma unroll 4
    for (int64_t d = rg; d < p.in; d += n_rg) {
      const uint4 v = load_stream(w + d * chunks + chunk);
      const float s = kFp8 ? __ldg(scol + ((row0 + d) / p.block_out) * p.scale_cols) : 1.0f;
      float xd[N];
#pragma unroll
      for (int i = 0; i < N; ++i) xd[i] = kFp8 ? xs[i * p.in + d] * s : xs[i * p.in + d];
#pragma unroll
      for (int sub = 0; sub < E / 4; ++sub) {
        float f[4];
        decode4<K>(v, sub, f);
#pragma unroll
        for (int i = 0; i < N; ++i)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[i][sub * 4 + e] = fmaf(xd[i], f[e], acc[i][sub * 4 + e]);
      }
    }
  }
  const int width = cpb * E;  // columns of this block
  if constexpr (N == 1) {
    // One x row: the RG partial sums of a column first across the warp's row groups (lanes cpb
    // apart, a butterfly), then the warps' sums through shared memory, in warp order. Writing every
    // row group's partials to shared memory put each warp's stores on 2 banks (16-way conflicts):
    // GLM-5's W_UK^T q 5.54 -> 4.95 us. With 4 rows the butterflies lost (7.97 -> 9.71 us).
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int e = 0; e < E; ++e) {
#pragma unroll
      for (int o = 1; o < 32; o *= 2)
        if (o >= cpb) acc[0][e] += __shfl_xor_sync(0xffffffffu, acc[0][e], o);  // cpb: block-uniform
    }
    if (lane < cpb)  // lane == cl: the warp's sums of its chunk
#pragma unroll
      for (int e = 0; e < E; ++e) red[warp * width + cl * E + e] = acc[0][e];
    __syncthreads();
    for (int c = threadIdx.x; c < width; c += kThreads) {
      const int64_t col = int64_t(blockIdx.x) * width + c;
      if (p.n > 0 && col < p.out) {
        float v = 0.0f;
        for (int r = 0; r < kWarps; ++r) v += red[r * width + c];
        y[col] = v;
      }
    }
  } else {
    for (int i = 0; i < N; ++i) {
#pragma unroll
      for (int e = 0; e < E; ++e) red[rg * width + cl * E + e] = acc[i][e];
      __syncthreads();
      for (int c = threadIdx.x; c < width; c += kThreads) {
        const int64_t col = int64_t(blockIdx.x) * width + c;
        if (i < p.n && col < p.out) {
          float v = 0.0f;
          for (int r = 0; r < n_rg; ++r) v += red[r * width + c];
          y[i * p.ldy + col] = v;
        }
      }
      __syncthreads();
    }
  }
}

// Column chunks per block of the transposed kernel: up to 8, so each column is split over at least
// 32 row groups (measured on MLA's W_UK, 64 heads x [192, 512] fp8: 8.7 us under the profiler
// with 8 chunks per block, 10.3 us with 4).
int gemv_t_chunks_per_block(const GemvParams& p) {
  const int64_t chunks = p.out * elem_bytes(p.kind) / 16;
  int cpb = 1;
  while (cpb < 8 && cpb < chunks) cpb *= 2;
  return cpb;
}

size_t gemv_t_smem_bytes(const GemvParams& p) {
  const int64_t e = 16 / elem_bytes(p.kind);
  return size_t(kGemvTRows * p.in + int64_t(kThreads) * e) * sizeof(float);
}

template <FloatKind K>
void launch_t(const GemvParams& p, const RopeParams& rope, cudaStream_t s) {
  const int cpb = gemv_t_chunks_per_block(p);
  const int64_t chunks = p.out * elem_bytes(p.kind) / 16;
  const dim3 grid(unsigned((chunks + cpb - 1) / cpb + (rope.rows > 0 ? 1 : 0)), unsigned(p.n_groups));
  const size_t smem = gemv_t_smem_bytes(p);
  switch (p.n) {
    case 1: launch(gemv_t_kernel<K, 1>, grid, kThreads, smem, s, p, cpb, rope); break;
    case 2: launch(gemv_t_kernel<K, 2>, grid, kThreads, smem, s, p, cpb, rope); break;
    default: launch(gemv_t_kernel<K, 4>, grid, kThreads, smem, s, p, cpb, rope); break;
  }
}

// Launches the vector kernel, or (blocks_per_sm non-null) only says how many of its blocks one SM
// holds at once (the occupancy calculator on the instantiation the launch would take).
template <FloatKind K, int N, int R, bool kSwiglu = false>
void launch_vec(const GemvParams& p, const GemvPlan& plan, dim3 grid, cudaStream_t s, int* blocks_per_sm) {
  const auto kernel =
      plan.pipelined ? gemv_vec_kernel<K, N, R, true, kSwiglu> : gemv_vec_kernel<K, N, R, false, kSwiglu>;
  launch_or_occupancy(kernel, grid, plan.pipelined ? pipe_smem_bytes<R>() : 0, s, blocks_per_sm, p, plan.k_split,
                      plan.prefetch, plan.pipelined ? plan.row_groups_per_warp : 1);
}

template <FloatKind K, int N>
void launch_vec_r(const GemvParams& p, const GemvPlan& plan, cudaStream_t s, int* blocks_per_sm) {
  const int64_t rows_per_block = gemv_block_rows(p, plan);
  const dim3 grid(unsigned((p.out + rows_per_block - 1) / rows_per_block), unsigned(p.n_groups));
  if constexpr (N == 1) {
    if (p.swiglu) {  // rows_per_warp 2 or 4 (launch_gemv)
      if (plan.rows_per_warp == 2) launch_vec<K, 1, 2, true>(p, plan, grid, s, blocks_per_sm);
      else launch_vec<K, 1, 4, true>(p, plan, grid, s, blocks_per_sm);
      return;
    }
  }
  switch (plan.rows_per_warp) {
    case 1: launch_vec<K, N, 1>(p, plan, grid, s, blocks_per_sm); break;
    case 2: launch_vec<K, N, 2>(p, plan, grid, s, blocks_per_sm); break;
    default: launch_vec<K, N, 4>(p, plan, grid, s, blocks_per_sm); break;
  }
}

template <int N>
void launch_n(const GemvParams& p, const GemvPlan& plan, cudaStream_t s, int* blocks_per_sm) {
  if (!plan.vec) {
    const dim3 grid(unsigned((p.out + kWarps - 1) / kWarps), unsigned(p.n_groups));
    launch_or_occupancy(gemv_any_kernel<N>, grid, 0, s, blocks_per_sm, p);
    return;
  }
  switch (p.kind) {
    case FloatKind::kF32: launch_vec_r<FloatKind::kF32, N>(p, plan, s, blocks_per_sm); break;
    case FloatKind::kBF16: launch_vec_r<FloatKind::kBF16, N>(p, plan, s, blocks_per_sm); break;
    case FloatKind::kF16: launch_vec_r<FloatKind::kF16, N>(p, plan, s, blocks_per_sm); break;
    default: launch_vec_r<FloatKind::kE4M3, N>(p, plan, s, blocks_per_sm); break;
  }
}

// Runs plan's FMA kernel (not the tensor-core one) for p.n rows, or (blocks_per_sm non-null) only
// says how many of its blocks one SM holds at once.
void run_fma(const GemvParams& p, const GemvPlan& plan, cudaStream_t s, int* blocks_per_sm) {
  switch (p.n) {
    case 1: launch_n<1>(p, plan, s, blocks_per_sm); break;
    case 2: launch_n<2>(p, plan, s, blocks_per_sm); break;
    case 3: launch_n<3>(p, plan, s, blocks_per_sm); break;
    case 4: launch_n<4>(p, plan, s, blocks_per_sm); break;
    case 5: launch_n<5>(p, plan, s, blocks_per_sm); break;
    case 6: launch_n<6>(p, plan, s, blocks_per_sm); break;
    case 7: launch_n<7>(p, plan, s, blocks_per_sm); break;
    default: launch_n<8>(p, plan, s, blocks_per_sm); break;
  }
}

// ---- Tensor-core kernel: 2..8 rows of x, fp8 weights with 128-column scale blocks ----
//
// With several rows of x the FMA kernels turn compute-bound (each weight is converted once and
// multiplied once per row). Here y^T = W x^T runs on mma.sync m16n8k16 (f16 operands, fp32
// accumulation): A = 16 rows of W (e4m3 -> f16 is exact), B = the rows of x as the n8 operand
// (columns past p.n are zero). x is fp32: each 128-column block of an x row is scaled by a power of
// two s (its largest finite magnitude lands in [2^14, 2^15), inside f16's range) and split into
// hi = f16(x s) and lo = f16(x s - hi), one MMA each, so the products carry 22 bits of x where the
// FMA kernels' carry 24. A block's sum is multiplied by the weight block's scale and 1 / s (a power
// of two) before it joins the fp32 accumulator. NaN in x stays NaN (only in its own column).
//
// K order: for k16 step j of a 64-column half, lane (g, t) holds columns 16 t + 4 j + [0, 4) of its
// rows: bytes 0-1 where the m16n8k16 layout has k = 2 t + [0, 2), bytes 2-3 where it has
// k = 2 t + 8 + [0, 2); B uses the same map, so each step sums matching products. A lane reads
// 16 contiguous bytes of each of its rows per half (one 16-byte load).
//
// Work split: a warp owns 32 rows (two m16 tiles) and every k_split-th 128-column block of them;
// the k_split warps of a row group add their sums in warp order through shared memory.
constexpr int kMmaTiles = 2;
constexpr int kMmaRows = 16 * kMmaTiles;  // rows of W per warp

}  // namespace

int64_t gemv_block_rows(const GemvParams& p, const GemvPlan& plan) {
  if (plan.tma.warp_tiles > 0) return 16 * int64_t(plan.tma.warp_tiles) * plan.tma.tiles_per_warp;
  if (plan.mma) return int64_t(kMmaRows) * (kWarps / plan.k_split);
  return gemv_outputs_per_row_group(p, plan.rows_per_warp) * (kWarps / plan.k_split) * plan.row_groups_per_warp;
}

namespace {

template <int N>
__global__ void __launch_bounds__(kThreads) gemv_mma_kernel(const GemvParams p0, const int k_split) {
  GemvParams p;
  group_params(p0, p);  // ungrouped (strided batch at most): arithmetic on the params only
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int groups = kWarps / k_split, group = warp / k_split, kw = warp % k_split;
  const int64_t row_base = (int64_t(blockIdx.x) * groups + group) * kMmaRows;
  const int64_t kblocks = p.in / 128;
  const uint8_t* wr[kMmaTiles][2];  // [tile][row g, g + 8]: this lane's 16 bytes of each half
  const float* sr[kMmaTiles][2];    // the rows' scale rows, from the slice's first column block
#pragma unroll
  for (int mt = 0; mt < kMmaTiles; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      // Rows past the end (last block) re-read the last row; their results are not stored.
      const int64_t r = min(row_base + mt * 16 + g + 8 * h, p.out - 1);
      wr[mt][h] = static_cast<const uint8_t*>(p.w) + r * p.in + 16 * t;
      sr[mt][h] = p.scale_inv + ((p.row0 + r) / p.block_out) * p.scale_cols + p.col0 / 128;
    }
  pdl_enter();  // x is the previous kernel's output
  // One row of x: its hi halves are column 0 of the B operand, its lo halves column 1 (one MMA per
  // step instead of two); the two columns are added when scaled.
  constexpr bool kOne = N == 1;
  const bool has_x = g < (kOne ? 2 : N);
  const float* xr = p.x + (has_x && !kOne ? g : 0) * p.ldx + 16 * t;
  float acc[kMmaTiles][4];
#pragma unroll
  for (int mt = 0; mt < kMmaTiles; ++mt)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[mt][i] = 0.0f;

  for (int64_t kb = kw; kb < kblocks; kb += k_split) {
    uint4 w[kMmaTiles][2][2];  // [tile][row g, g + 8][64-column half]
#pragma unroll
    for (int mt = 0; mt < kMmaTiles; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int half = 0; half < 2; ++half)
          w[mt][h][half] = load_stream(reinterpret_cast<const uint4*>(wr[mt][h] + kb * 128 + half * 64));
    float4 xv[2][4];  // [half][step j]: columns 16 t + 4 j + [0, 4) of the half
    float m = 0.0f;
#pragma unroll
    for (int half = 0; half < 2; ++half)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        xv[half][j] = has_x ? __ldg(reinterpret_cast<const float4*>(xr + kb * 128 + half * 64) + j)
                            : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        m = fmaxf(m, fmaxf(fmaxf(fabsf(xv[half][j].x), fabsf(xv[half][j].y)),
                           fmaxf(fabsf(xv[half][j].z), fabsf(xv[half][j].w))));
      }
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));  // the 4 lanes of row g: 128 columns
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
    const int se = block_scale_exponent(m);
    const float sc = __uint_as_float(uint32_t(se) << 23), inv = __uint_as_float(uint32_t(254 - se) << 23);
    float d[kMmaTiles][4];
#pragma unroll
    for (int mt = 0; mt < kMmaTiles; ++mt)
#pragma unroll
      for (int i = 0; i < 4; ++i) d[mt][i] = 0.0f;
#pragma unroll
    for (int half = 0; half < 2; ++half)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float4 v = xv[half][j];
        const float a0 = v.x * sc, a1 = v.y * sc, a2 = v.z * sc, a3 = v.w * sc;  // exact
        float h0, h1, h2, h3, l0, l1, l2, l3;
        const uint32_t hi01 = f16x2_bits(a0, a1, h0, h1), hi23 = f16x2_bits(a2, a3, h2, h3);
        const uint32_t lo01 = f16x2_bits(a0 - h0, a1 - h1, l0, l1), lo23 = f16x2_bits(a2 - h2, a3 - h3, l2, l3);
#pragma unroll
        for (int mt = 0; mt < kMmaTiles; ++mt) {
          const uint32_t wa = (&w[mt][0][half].x)[j], wb = (&w[mt][1][half].x)[j];
          const uint32_t a[4] = {e4m3x2_to_f16x2(wa), e4m3x2_to_f16x2(wb), e4m3x2_to_f16x2(wa >> 16),
                                 e4m3x2_to_f16x2(wb >> 16)};
          if constexpr (kOne) {
            mma_f16(d[mt], a, g == 1 ? lo01 : hi01, g == 1 ? lo23 : hi23);
          } else {
            mma_f16(d[mt], a, hi01, hi23);
            mma_f16(d[mt], a, lo01, lo23);
          }
        }
      }
    // d[mt]: (row g, column 2t), (row g, 2t + 1), (row g + 8, 2t), (row g + 8, 2t + 1); column n's
    // 1 / s sits in the lanes of row group n (lane 4 n).
    const float inv0 = __shfl_sync(0xffffffffu, inv, 8 * t), inv1 = __shfl_sync(0xffffffffu, inv, 8 * t + 4);
#pragma unroll
    for (int mt = 0; mt < kMmaTiles; ++mt) {
      const float s0 = __ldg(sr[mt][0] + kb), s1 = __ldg(sr[mt][1] + kb);
      if constexpr (kOne) {  // columns 0 and 1: the hi and lo sums of the one row (lanes t = 0)
        acc[mt][0] = fmaf(d[mt][1], s0 * inv1, fmaf(d[mt][0], s0 * inv0, acc[mt][0]));
        acc[mt][2] = fmaf(d[mt][3], s1 * inv1, fmaf(d[mt][2], s1 * inv0, acc[mt][2]));
        continue;
      }
      acc[mt][0] = fmaf(d[mt][0], s0 * inv0, acc[mt][0]);
      acc[mt][1] = fmaf(d[mt][1], s0 * inv1, acc[mt][1]);
      acc[mt][2] = fmaf(d[mt][2], s1 * inv0, acc[mt][2]);
      acc[mt][3] = fmaf(d[mt][3], s1 * inv1, acc[mt][3]);
    }
  }
  // The k_split warps of a row group, added in warp order.
  __shared__ float red[kWarps][kMmaTiles * 4][32];
#pragma unroll
  for (int mt = 0; mt < kMmaTiles; ++mt)
#pragma unroll
    for (int i = 0; i < 4; ++i) red[warp][mt * 4 + i][lane] = acc[mt][i];
  __syncthreads();
  if (kw != 0) return;
#pragma unroll
  for (int mt = 0; mt < kMmaTiles; ++mt)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float v = red[warp][mt * 4 + i][lane];
      for (int k = 1; k < k_split; ++k) v += red[warp + k][mt * 4 + i][lane];
      const int64_t row = row_base + mt * 16 + g + (i >= 2 ? 8 : 0);
      const int n = 2 * t + (i & 1);
      if (n < N && row < p.out) p.y[n * p.ldy + row] = v;
    }
}

template <int N>
void launch_mma_n(const GemvParams& p, const GemvPlan& plan, cudaStream_t s) {
  const int64_t rows_per_block = gemv_block_rows(p, plan);
  const dim3 grid(unsigned((p.out + rows_per_block - 1) / rows_per_block), unsigned(p.n_groups));
  launch(gemv_mma_kernel<N>, grid, kThreads, 0, s, p, plan.k_split);
}

void launch_mma(const GemvParams& p, const GemvPlan& plan, cudaStream_t s) {
  switch (p.n) {
    case 1: launch_mma_n<1>(p, plan, s); break;
    case 2: launch_mma_n<2>(p, plan, s); break;
    case 3: launch_mma_n<3>(p, plan, s); break;
    case 4: launch_mma_n<4>(p, plan, s); break;
    case 5: launch_mma_n<5>(p, plan, s); break;
    case 6: launch_mma_n<6>(p, plan, s); break;
    case 7: launch_mma_n<7>(p, plan, s); break;
    default: launch_mma_n<8>(p, plan, s); break;
  }
}

}  // namespace

int gemv_fma_blocks_per_sm(const GemvParams& p, const GemvPlan& plan) {
  int b = 0;
  run_fma(p, plan, nullptr, &b);
  return b;
}

bool gemv_vector_ok(const GemvParams& p) {
  const int64_t eb = elem_bytes(p.kind);
  if (reinterpret_cast<uintptr_t>(p.w) % 16 != 0 || (p.in * eb) % 16 != 0) return false;
  if (reinterpret_cast<uintptr_t>(p.x) % 16 != 0 || (p.n > 1 && p.ldx % 4 != 0)) return false;
  if (p.groups == nullptr && p.n_groups > 1 && p.batch_x % 4 != 0) return false;
  if (p.kind == FloatKind::kE4M3) {
    // A 16-element chunk must sit in one column block: power-of-two blocks of >= 16 columns and a
    // slice offset that is a multiple of 16.
    const int b = p.block_in;
    if (b < 16 || (b & (b - 1)) != 0 || p.col0 % 16 != 0) return false;
  }
  return true;
}

bool gemv_mma_ok(const GemvParams& p) {
  return p.kind == FloatKind::kE4M3 && p.groups == nullptr && p.n >= 1 && p.n <= kGemvMaxRows &&
         p.block_in == 128 && p.col0 % 128 == 0 && p.in % 128 == 0 && gemv_vector_ok(p);
}

GemvPlan gemv_mma_plan(const GemvParams& p, int num_sms) {
  GemvPlan plan;
  plan.vec = true;
  plan.mma = true;
  // Warps per row group: more while the GPU has under 16 warps per SM and each warp keeps at least
  // two 128-column blocks per row.
  const int64_t row_groups = (p.out + kMmaRows - 1) / kMmaRows * p.n_groups, kblocks = p.in / 128;
  while (plan.k_split < kWarps && row_groups * plan.k_split < int64_t(num_sms) * 16 &&
         kblocks / (2 * plan.k_split) >= 2)
    plan.k_split *= 2;
  return plan;
}

namespace {
std::atomic<uint64_t> g_tensor_core_launches{0};
}  // namespace

uint64_t gemv_tensor_core_launches() { return g_tensor_core_launches.load(); }

void launch_gemv(const GemvParams& p, const GemvPlan& plan, cudaStream_t stream) {
  DSI_CHECK(p.n >= 1 && p.n <= kGemvMaxRows && p.out > 0 && p.in > 0,
            "gemv: {} rows x [{}, {}] outside the GEMV path", p.n, p.out, p.in);
  DSI_CHECK(p.n_groups >= 1 && p.n_groups <= 65535 && (p.groups == nullptr || p.n == 1),
            "gemv: {} groups of {} rows", p.n_groups, p.n);
  if (plan.tma.warp_tiles > 0) {  // its own checks (gemv_tma.cu); the fields below are the FMA kernels'
    launch_gemv_tma(p, plan.tma, stream);
    return;
  }
  DSI_CHECK(p.norm_w == nullptr, "gemv: an RMSNorm in front needs the tensor-map kernel");
  DSI_CHECK(!plan.vec || gemv_vector_ok(p), "gemv: the vector kernel needs 16-byte aligned operands");
  DSI_CHECK(plan.k_split == 1 || plan.k_split == 2 || plan.k_split == 4 || plan.k_split == 8,
            "gemv: k_split {}", plan.k_split);
  DSI_CHECK(plan.rows_per_warp == 1 || plan.rows_per_warp == 2 || plan.rows_per_warp == 4,
            "gemv: rows_per_warp {}", plan.rows_per_warp);
  DSI_CHECK(plan.row_groups_per_warp == 1 || (plan.row_groups_per_warp > 1 && plan.pipelined &&
                                              plan.k_split == 1 && plan.vec && !plan.mma),
            "gemv: {} row groups per warp (the ring kernel without split-K only)",
            plan.row_groups_per_warp);
  DSI_CHECK(!p.swiglu || (p.groups != nullptr && plan.vec && !plan.mma &&
                           (plan.rows_per_warp == 2 || plan.rows_per_warp == 4)),
            "gemv: swiglu takes the grouped vector kernel with 2 or 4 rows per warp");
  if (plan.mma) {
    DSI_CHECK(gemv_mma_ok(p), "gemv: the tensor-core kernel takes 1..{} rows of fp8 weights with "
              "128-column blocks, got {} rows", kGemvMaxRows, p.n);
    launch_mma(p, plan, stream);
    g_tensor_core_launches.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  run_fma(p, plan, stream, nullptr);
}

bool gemv_t_ok(const GemvParams& p) {
  const int64_t eb = elem_bytes(p.kind);
  if (p.groups != nullptr || p.n < 1 || p.n > kGemvTRows || p.in <= 0 || p.out <= 0) return false;
  if (reinterpret_cast<uintptr_t>(p.w) % 16 != 0 || (p.out * eb) % 16 != 0) return false;
  if (p.kind == FloatKind::kE4M3) {
    const int b = p.block_in;
    if (b < 16 || (b & (b - 1)) != 0 || p.col0 % 16 != 0) return false;
  }
  return gemv_t_smem_bytes(p) <= 48 * 1024;
}

void launch_gemv_t(const GemvParams& p, cudaStream_t stream, const RopeParams* rope) {
  DSI_CHECK(gemv_t_ok(p), "gemv_t: {} rows x [{}, {}] outside the transposed kernel", p.n, p.in, p.out);
  DSI_CHECK(p.n_groups >= 1 && p.n_groups <= 65535, "gemv_t: {} batch items", p.n_groups);
  RopeParams r{};  // rows 0: no rotation
  if (rope != nullptr && rope->rows * rope->half > 0) {
    DSI_CHECK(rope->heads == p.n_groups, "gemv_t: a rotation of {} heads with {} batch items", rope->heads,
              p.n_groups);
    r = *rope;
  }
  switch (p.kind) {
    case FloatKind::kF32: launch_t<FloatKind::kF32>(p, r, stream); break;
    case FloatKind::kBF16: launch_t<FloatKind::kBF16>(p, r, stream); break;
    case FloatKind::kF16: launch_t<FloatKind::kF16>(p, r, stream); break;
    default: launch_t<FloatKind::kE4M3>(p, r, stream); break;
  }
}

}  // namespace dsi::cuda
