// fp8 KV-cache kernels of the CUDA backend and their launches; see kv_fp8.h and ops/kv_fp8.h (the
// ops' entry points are in kv_fp8_ops.cu). Every rounding step mirrors the CPU reference
// (backends/cpu/kv_fp8.cpp): the stores write bitwise-equal caches and the indexer logits are
// bitwise equal; sparse MLA differs from the reference only in summation order.
#include <cuda_fp8.h>

#include <algorithm>
#include <atomic>
#include <cmath>

#include "backends/cuda/common.cuh"
#include "backends/cuda/cuda_kv_fp8.h"
#include "backends/cuda/kv_fp8/kv_fp8.h"
#include "backends/cuda/kv_fp8/sm90_indexer_logits.h"
#include "backends/cuda/kv_fp8/sm90_sparse_mla_decode.h"
#include "backends/cuda/switch_value.h"
#include "ops/kv_fp8.h"

namespace dsi::cuda {

namespace {

constexpr int kPage = ops::kKvPageTokens;
constexpr int kLora = ops::kMlaFp8Lora;
constexpr int kRope = ops::kMlaFp8Rope;
constexpr int kDk = kLora + kRope;
constexpr int kEntry = ops::kMlaFp8Bytes;

// ---- scalar numerics shared by the kernels (the CPU twins are in backends/cpu/kv_fp8.cpp) ----

// ceil(log2(max(amax, 1e-4) / 448)) from the bits of the IEEE fp32 quotient.
__device__ __forceinline__ int ue8m0_exponent(float amax) {
  const float ratio = __fdiv_rn(fmaxf(amax, ops::kFp8AmaxFloor), 448.0f);
  const unsigned bits = __float_as_uint(ratio);
  const int e = int((bits >> 23) & 0xffu) - 127;
  return (bits & 0x7fffffu) != 0u ? e + 1 : e;
}
// 2^e for e in [-126, 127] (the exponents above stay within [-22, 121]).
__device__ __forceinline__ float pow2f(int e) { return __uint_as_float(unsigned(e + 127) << 23); }

// e4m3 byte of x (|x| <= 448): hardware round to nearest even; -0 stored as +0 as on the CPU.
__device__ __forceinline__ uint8_t quantize_e4m3(float x) {
  const uint8_t b = static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
  return (b & 0x7fu) == 0u ? uint8_t(0) : b;
}

// f32 -> bf16 bits, round to nearest even, NaN kept quiet (dsi::f32_to_bf16).
__device__ __forceinline__ uint16_t f32_to_bf16_bits(float f) {
  unsigned u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
__device__ __forceinline__ float bf16_bits_to_f32(unsigned h) { return __uint_as_float(h << 16); }

// ---- rotate + quantise: one block per d-vector ----

constexpr int kRqThreads = 128;

// xs: [d] in shared memory, loaded by the caller (not yet synchronised). Rotates in place with the
// CPU's butterfly order, multiplies by the Hadamard constant, and returns the group's exponent; on
// return xs holds the rotated values and every thread has seen them (block_max synchronises).
__device__ int rotate_in_smem(float* xs, int d, float hscale, float* red) {
  __syncthreads();
  for (int h = 1; h < d; h *= 2) {
    for (int q = threadIdx.x; q < d / 2; q += blockDim.x) {
      const int i0 = (q / h) * 2 * h + q % h, i1 = i0 + h;
      const float a = xs[i0], b = xs[i1];
      xs[i0] = __fadd_rn(a, b);
      xs[i1] = __fsub_rn(a, b);
    }
    __syncthreads();
  }
  float amax = 0.0f;
  for (int c = threadIdx.x; c < d; c += blockDim.x) {
    const float y = __fmul_rn(xs[c], hscale);
    xs[c] = y;
    amax = fmaxf(amax, fabsf(y));
  }
  amax = block_max(amax, red);  // its barriers publish xs
  return ue8m0_exponent(amax);
}

// xs: [d] in shared memory, loaded by the caller (not yet synchronised). LayerNorm in place with
// layer_norm_kernel's arithmetic for the same row: the same values summed per thread in the same
// order (its float4 path: thread t holds values 4t..4t+3; else value t), the same block tree (the
// extra warps here add zeros, which leave the sums' bits alone), the same rounding steps.
__device__ void layer_norm_in_smem(float* xs, int d, const RotateQuantParams& p, float* red) {
  __syncthreads();
  const int t = threadIdx.x, per = p.norm_vec4 ? 4 : 1;
  const bool mine = t * per < d;
  float s = 0.0f;
  if (mine)
    for (int e = 0; e < per; ++e) s = __fadd_rn(s, xs[t * per + e]);
  const float mean = __fdiv_rn(block_sum(s, red), float(d));
  float v = 0.0f;
  if (mine)
    for (int e = 0; e < per; ++e) {
      const float c = __fsub_rn(xs[t * per + e], mean);
      v = __fadd_rn(v, __fmul_rn(c, c));
    }
  const float var = __fdiv_rn(block_sum(v, red), float(d));
  const float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(var, p.eps)));
  if (mine)
    for (int e = 0; e < per; ++e) {
      const int c = t * per + e;
      xs[c] = __fadd_rn(__fmul_rn(__fmul_rn(__fsub_rn(xs[c], mean), inv), p.norm_weight[c]), p.norm_bias[c]);
    }
}

// RoPE of xs[0, 2 * rope_half) in place at position `pos`, rope_kernel's arithmetic; a thread owns
// its pairs.
__device__ void rope_in_smem(float* xs, float pos, const RotateQuantParams& p) {
  __syncthreads();
  for (int j = threadIdx.x; j < p.rope_half; j += blockDim.x) {
    const int a = p.interleaved ? 2 * j : j, b = p.interleaved ? 2 * j + 1 : j + p.rope_half;
    const float x1 = xs[a], x2 = xs[b];
    rope_pair(x1, x2, pos, p.inv_freq[j], p.attention_factor, xs[a], xs[b]);
  }
}

// Query mode: vector i's head weight folded with its quantisation scale 2^e and the softmax scale.
__device__ __forceinline__ float folded_weight(const RotateQuantParams& p, int64_t i, int e) {
  return __fmul_rn(__fmul_rn(__fmul_rn(p.weights[i], p.weights_scale), pow2f(e)), p.softmax_scale);
}

__global__ void __launch_bounds__(kRqThreads) rotate_quant_kernel(RotateQuantParams p) {
  pdl_enter();
  __shared__ float xs[128];
  __shared__ float red[33];
  const int d = p.d;
  const int64_t page_bytes = int64_t(kPage) * (d + 4);
  for (int64_t i = blockIdx.x; i < p.n; i += gridDim.x) {
    int32_t slot = 0;
    if (p.pool != nullptr) {
      slot = p.slots[i];
      if (slot < -1 || int64_t(slot) >= p.n_pages * kPage) {
        if (threadIdx.x == 0) atomicMin(p.bad, static_cast<unsigned long long>(i));
        continue;  // block-uniform
      }
      if (slot < 0) continue;
    }
    for (int c = threadIdx.x; c < d; c += blockDim.x) xs[c] = p.x[i * p.x_stride + c];
    if (p.norm_weight != nullptr) layer_norm_in_smem(xs, d, p, red);
    if (p.positions != nullptr) rope_in_smem(xs, float(p.positions[i / p.heads]), p);
    const int e = rotate_in_smem(xs, d, p.hadamard_scale, red);
    const float inv = pow2f(-e);  // exact: x * inv is x / scale
    if (p.pool != nullptr) {
      uint8_t* page = p.pool + int64_t(slot / kPage) * page_bytes;
      const int off = slot % kPage;
      for (int c = threadIdx.x; c < d; c += blockDim.x)
        page[int64_t(off) * d + c] = quantize_e4m3(__fmul_rn(xs[c], inv));
      if (threadIdx.x == 0)
        *reinterpret_cast<float*>(page + int64_t(kPage) * d + off * 4) = pow2f(e);
    } else {
      for (int c = threadIdx.x; c < d; c += blockDim.x) {
        const uint8_t b = quantize_e4m3(__fmul_rn(xs[c], inv));
        if (p.q8 != nullptr) p.q8[i * d + c] = e4m3_to_float(b);
        if (p.q8_bytes != nullptr) p.q8_bytes[i * d + c] = b;
      }
      if (threadIdx.x == 0) p.wq[i] = folded_weight(p, i, e);
    }
    __syncthreads();  // xs is rewritten by the next vector
  }
}

// ---- rotate + quantise, d = 128 without LayerNorm: one warp per vector ----

constexpr int kRwWarps = 4;

// rotate_quant_kernel's results, bit for bit, with no block barriers: lane l holds values 4l..4l+3,
// the rotation's first two stages run in the lane and the other five across lanes (shuffles), each
// pair's sum and difference the same two roundings as the shared-memory butterfly; RoPE's pairs
// meet in the warp's slice of shared memory. A decode step's queries (one row: 32 or 64 vectors)
// used to wait on a block's 10 barriers per vector.
__global__ void __launch_bounds__(kRwWarps * 32) rotate_quant_warp_kernel(RotateQuantParams p) {
  pdl_enter();
  constexpr int d = 128;
  __shared__ float xs[kRwWarps][d];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t page_bytes = int64_t(kPage) * (d + 4);
  for (int64_t i = int64_t(blockIdx.x) * kRwWarps + warp; i < p.n; i += int64_t(gridDim.x) * kRwWarps) {
    int32_t slot = 0;
    if (p.pool != nullptr) {
      slot = p.slots[i];
      if (slot < -1 || int64_t(slot) >= p.n_pages * kPage) {
        if (lane == 0) atomicMin(p.bad, static_cast<unsigned long long>(i));
        continue;  // warp-uniform
      }
      if (slot < 0) continue;
    }
    float v[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) v[e] = p.x[i * p.x_stride + 4 * lane + e];
    if (p.positions != nullptr) {
      float* x = xs[warp];
#pragma unroll
      for (int e = 0; e < 4; ++e) x[4 * lane + e] = v[e];
      __syncwarp();
      const float pos = float(p.positions[i / p.heads]);
      for (int j = lane; j < p.rope_half; j += 32) {
        const int a = p.interleaved ? 2 * j : j, b = p.interleaved ? 2 * j + 1 : j + p.rope_half;
        const float x1 = x[a], x2 = x[b];
        rope_pair(x1, x2, pos, p.inv_freq[j], p.attention_factor, x[a], x[b]);
      }
      __syncwarp();
#pragma unroll
      for (int e = 0; e < 4; ++e) v[e] = x[4 * lane + e];
      __syncwarp();  // read before the next vector's values overwrite them
    }
    // Stages h = 1 and 2 (pairs inside the lane), then h = 4 .. 64 (lane l with lane l ^ h / 4: the
    // lower lane keeps a + b, the upper a - b, a the lower one's value).
#pragma unroll
    for (int h = 1; h <= 2; h *= 2)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if ((e & h) == 0) {
          const float a = v[e], b = v[e + h];
          v[e] = __fadd_rn(a, b);
          v[e + h] = __fsub_rn(a, b);
        }
#pragma unroll
    for (int m = 1; m < 32; m *= 2) {
      const bool upper = (lane & m) != 0;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float o = __shfl_xor_sync(0xffffffffu, v[e], m);
        v[e] = upper ? __fsub_rn(o, v[e]) : __fadd_rn(v[e], o);
      }
    }
    float amax = 0.0f;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      v[e] = __fmul_rn(v[e], p.hadamard_scale);
      amax = fmaxf(amax, fabsf(v[e]));
    }
    const int ex = ue8m0_exponent(warp_max(amax));
    const float inv = pow2f(-ex);
    uint32_t packed = 0;
#pragma unroll
    for (int e = 0; e < 4; ++e) packed |= uint32_t(quantize_e4m3(__fmul_rn(v[e], inv))) << (8 * e);
    if (p.pool != nullptr) {
      uint8_t* page = p.pool + int64_t(slot / kPage) * page_bytes;
      const int off = slot % kPage;
      *reinterpret_cast<uint32_t*>(page + int64_t(off) * d + 4 * lane) = packed;
      if (lane == 0) *reinterpret_cast<float*>(page + int64_t(kPage) * d + off * 4) = pow2f(ex);
    } else {
      if (p.q8 != nullptr)
#pragma unroll
        for (int e = 0; e < 4; ++e) p.q8[i * d + 4 * lane + e] = e4m3_to_float(uint8_t(packed >> (8 * e)));
      if (p.q8_bytes != nullptr) *reinterpret_cast<uint32_t*>(p.q8_bytes + i * d + 4 * lane) = packed;
      if (lane == 0) p.wq[i] = folded_weight(p, i, ex);
    }
  }
}

// ---- indexer logits: one thread per key, keys of one row in tiles of 128 per block ----

constexpr int kLgThreads = 128;

// Each thread decodes its key's D e4m3 values into registers once and runs the CPU's loops over the
// heads: dot in c order (products of e4m3 values are exact, so fmaf rounds as the CPU's add does),
// then acc += w'_j * relu(dot) with the product and the sum rounded separately.
template <int D>
__global__ void __launch_bounds__(kLgThreads) indexer_logits_fp8_kernel(IndexerLogitsFp8Params p) {
  pdl_enter();
  extern __shared__ float4 smem4[];
  float* qs = reinterpret_cast<float*>(smem4);  // [heads, D]
  float* ws = qs + p.heads * D;                 // [heads]
  const int64_t r = blockIdx.y;
  const int64_t seq = p.row_seq[r], bound = p.bounds[r];
  const int64_t max_bound = p.n_cols < p.max_pages * kPage ? p.n_cols : p.max_pages * kPage;
  if (seq < 0 || seq >= p.n_seqs || bound < 0 || bound > max_bound) {
    if (blockIdx.x == 0 && threadIdx.x == 0) atomicMin(p.bad_row, static_cast<unsigned long long>(r));
    return;  // block-uniform
  }
  const float4* qrow = reinterpret_cast<const float4*>(p.q8 + r * p.heads * D);
  for (int i = threadIdx.x; i < p.heads * D / 4; i += blockDim.x) smem4[i] = qrow[i];
  for (int j = threadIdx.x; j < p.heads; j += blockDim.x) ws[j] = p.wq[r * p.heads + j];
  __syncthreads();
  const int64_t page_bytes = int64_t(kPage) * (D + 4);
  const int64_t n_tiles = (p.n_cols + kLgThreads - 1) / kLgThreads;
  for (int64_t tile = blockIdx.x; tile < n_tiles; tile += gridDim.x) {
    const int64_t s = tile * kLgThreads + threadIdx.x;
    if (s >= p.n_cols) continue;
    float* out = p.logits + r * p.n_cols + s;
    if (s >= bound) {
      *out = -INFINITY;
      continue;
    }
    const int64_t pi = seq * p.max_pages + s / kPage;
    const int32_t page = p.block_tables[pi];
    if (page < 0 || page >= p.n_pages) {
      atomicMin(p.bad_page, static_cast<unsigned long long>(pi));
      *out = NAN;
      continue;
    }
    const uint8_t* pg = p.pool + int64_t(page) * page_bytes;
    const int off = int(s % kPage);
    float k[D];
    const uint4* kv = reinterpret_cast<const uint4*>(pg + int64_t(off) * D);  // 16-byte aligned
#pragma unroll
    for (int v = 0; v < D / 16; ++v) {
      const uint4 raw = kv[v];
      const unsigned w4[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
      for (int b = 0; b < 16; ++b) k[v * 16 + b] = e4m3_to_float(uint8_t(w4[b / 4] >> (8 * (b % 4))));
    }
    const float k_scale = *reinterpret_cast<const float*>(pg + int64_t(kPage) * D + off * 4);
    float acc = 0.0f;
    for (int j = 0; j < p.heads; ++j) {
      const float4* qj = reinterpret_cast<const float4*>(qs + j * D);
      float dot = 0.0f;
#pragma unroll
      for (int c = 0; c < D / 4; ++c) {
        const float4 qv = qj[c];  // the same address in every lane: a broadcast
        dot = fmaf(qv.x, k[4 * c + 0], dot);
        dot = fmaf(qv.y, k[4 * c + 1], dot);
        dot = fmaf(qv.z, k[4 * c + 2], dot);
        dot = fmaf(qv.w, k[4 * c + 3], dot);
      }
      acc = __fadd_rn(acc, __fmul_rn(ws[j], fmaxf(dot, 0.0f)));
    }
    *out = __fmul_rn(k_scale, acc);
  }
}

// ---- MLA cache store / load ----

constexpr int kMsThreads = 128;  // thread t: latent values 4t..4t+3 (warp w = tile w); t < 32: RoPE

__global__ void __launch_bounds__(kMsThreads) mla_store_fp8_kernel(MlaStoreFp8Params p) {
  pdl_enter();
  __shared__ float red[33];
  __shared__ float rot[kRope];
  const int t = threadIdx.x, lane = t & 31, tile = t >> 5;
  for (int64_t i = blockIdx.x; i < p.m; i += gridDim.x) {
    const int32_t slot = p.slots[i];
    if (slot < -1 || slot >= p.n_slots) {
      if (t == 0) atomicMin(p.bad, static_cast<unsigned long long>(i));
      continue;
    }
    if (slot < 0) continue;
    const float* x = p.rows + i * p.row_stride;
    uint8_t* e = p.pool + int64_t(slot) * kEntry;
    float v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) v[u] = x[4 * t + u];
    float pe[2] = {0.0f, 0.0f};  // thread t < 32: k_pe values 2t, 2t + 1 as stored
    if (t < kRope / 2) {
      pe[0] = x[kLora + 2 * t];
      pe[1] = x[kLora + 2 * t + 1];
    }
    if (p.norm_weight != nullptr) {
      // rms_norm_kernel's arithmetic for a 512-float row (128 threads, float4 each: the same
      // per-thread sum and block tree), so the stored bits match ops::rms_norm then the store.
      float ss = 0.0f;
#pragma unroll
      for (int u = 0; u < 4; ++u) ss = __fadd_rn(ss, __fmul_rn(v[u], v[u]));
      ss = block_sum(ss, red);
      const float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, float(kLora)), p.eps)));
#pragma unroll
      for (int u = 0; u < 4; ++u) v[u] = __fmul_rn(p.norm_weight[4 * t + u], __fmul_rn(v[u], inv));
      // rope_kernel's arithmetic; the pair of thread t is (2t, 2t + 1) interleaved, else pair j
      // (j, j + 32) spread over threads: each thread rotates the pair it owns the first half of.
      if (t < kRope / 2) {
        const int j = t;
        const int a = p.interleaved ? 2 * j : j, b = p.interleaved ? 2 * j + 1 : j + kRope / 2;
        rope_pair(x[kLora + a], x[kLora + b], float(p.positions[i]), p.inv_freq[j], p.attention_factor, rot[a],
                  rot[b]);
      }
      __syncthreads();
      if (t < kRope / 2) {
        pe[0] = rot[2 * t];
        pe[1] = rot[2 * t + 1];
      }
      __syncthreads();  // rot is rewritten for the next row
    }
    float amax = 0.0f;
#pragma unroll
    for (int u = 0; u < 4; ++u) amax = fmaxf(amax, fabsf(v[u]));
    amax = warp_max(amax);  // the warp is the tile of 128 values
    const int ex = ue8m0_exponent(amax);
    const float inv = pow2f(-ex);
    unsigned packed = 0;
#pragma unroll
    for (int u = 0; u < 4; ++u) packed |= unsigned(quantize_e4m3(__fmul_rn(v[u], inv))) << (8 * u);
    *reinterpret_cast<unsigned*>(e + 4 * t) = packed;
    if (lane == 0) *reinterpret_cast<float*>(e + ops::kMlaFp8ScaleOffset + 4 * tile) = pow2f(ex);
    if (t < kRope / 2) {
      const unsigned lo = f32_to_bf16_bits(pe[0]), hi = f32_to_bf16_bits(pe[1]);
      *reinterpret_cast<unsigned*>(e + ops::kMlaFp8RopeOffset + 4 * t) = lo | (hi << 16);
    }
  }
}

// Decodes entry value c (0..575) of a cache entry.
__device__ __forceinline__ float decode_entry_value(const uint8_t* e, int c) {
  if (c < kLora) {
    const float scale = *reinterpret_cast<const float*>(e + ops::kMlaFp8ScaleOffset + 4 * (c / ops::kMlaFp8Tile));
    return __fmul_rn(e4m3_to_float(e[c]), scale);
  }
  const uint16_t h = *reinterpret_cast<const uint16_t*>(e + ops::kMlaFp8RopeOffset + 2 * (c - kLora));
  return bf16_bits_to_f32(h);
}

__global__ void mla_load_fp8_kernel(MlaLoadFp8Params p) {
  pdl_enter();
  const int64_t total = p.m * kDk, step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < total; t += step) {
    const int64_t i = t / kDk;
    const int c = int(t % kDk);
    const int32_t slot = p.slots[i];
    if (slot < -1 || slot >= p.n_slots) {
      if (c == 0) atomicMin(p.bad, static_cast<unsigned long long>(i));
      continue;
    }
    p.rows[t] = slot < 0 ? 0.0f : decode_entry_value(p.pool + int64_t(slot) * kEntry, c);
  }
}

// ---- sparse MLA over the fp8 cache ----
// One block per (row, group of HG heads). Per tile of kTk = 32 selected keys: decode the entries to
// fp32 in shared memory, scores [HG, 32] (one thread per (head, key), a sequential 576-dot), an
// online-softmax update per head (one warp per head, one lane per key), then out += p V with each
// thread owning 4 value columns of HG/2 heads in registers.

constexpr int kSmThreads = 256;
constexpr int kTk = 32;            // keys per tile (= warp size: the softmax step is one lane per key)
constexpr int kKStride = kDk + 4;  // 580 floats: float4 rows, conflict-free across lanes
constexpr int kPieces = kLora / 16 + 1 + kRope / 8;  // 16-byte pieces per entry: 32 latent, 1 flag, 8 RoPE

template <int HG>
constexpr size_t sparse_mla_fp8_smem() {
  return sizeof(float) * (size_t(HG) * kDk + size_t(kTk) * kKStride + size_t(HG) * kTk + 3 * HG) +
         sizeof(int) * kTk;
}

template <int HG>
__global__ void __launch_bounds__(kSmThreads) sparse_mla_fp8_kernel(SparseMlaFp8Params p) {
  pdl_enter();
  static_assert(HG % 2 == 0 && kSmThreads == 2 * (kLora / 4), "thread layout: 128 column groups x 2");
  extern __shared__ float4 smem4[];
  float* qs = reinterpret_cast<float*>(smem4);  // [HG, 576]
  float* ks = qs + HG * kDk;                    // [kTk, kKStride]
  float* sc = ks + kTk * kKStride;              // [HG, kTk] scores, then probabilities
  float* m_s = sc + HG * kTk;                   // [HG] running max
  float* l_s = m_s + HG;                        // [HG] running sum
  float* a_s = l_s + HG;                        // [HG] this tile's rescale factor
  int* valid = reinterpret_cast<int*>(a_s + HG);  // [kTk]
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int hs = tid / (kLora / 4), c0 = (tid % (kLora / 4)) * 4;
  const int64_t n_groups = (p.heads + HG - 1) / HG;
  for (int64_t item = blockIdx.x; item < p.rows * n_groups; item += gridDim.x) {
    const int64_t r = item / n_groups, h0 = (item % n_groups) * HG;
    for (int i = tid; i < HG * kDk; i += kSmThreads) {
      const int h = i / kDk, c = i % kDk;
      qs[i] = h0 + h < p.heads ? p.q[r * p.q_s0 + (h0 + h) * p.q_s1 + c] : 0.0f;
    }
    for (int h = tid; h < HG; h += kSmThreads) {
      m_s[h] = -INFINITY;
      l_s[h] = 0.0f;
    }
    float acc[HG / 2][4];
#pragma unroll
    for (int a = 0; a < HG / 2; ++a) acc[a][0] = acc[a][1] = acc[a][2] = acc[a][3] = 0.0f;
    __syncthreads();
    for (int64_t t0 = 0; t0 < p.topk; t0 += kTk) {
      // Decode the tile: piece < 32: 16 latent bytes; piece 32: the key's validity; else 8 RoPE values.
      for (int i = tid; i < kTk * kPieces; i += kSmThreads) {
        const int k = i / kPieces, piece = i % kPieces;
        const int64_t j = t0 + k;
        int32_t slot = j < p.topk ? p.indices[r * p.topk + j] : -1;
        if (slot >= p.n_slots) {
          if (piece == 0 && h0 == 0) atomicMin(p.bad, static_cast<unsigned long long>(r * p.topk + j));
          slot = -1;
        }
        const uint8_t* e = p.pool + int64_t(slot < 0 ? 0 : slot) * kEntry;
        float* dst = ks + k * kKStride;
        if (piece < kLora / 16) {
          const int c = piece * 16;
          if (slot < 0) {
            for (int u = 0; u < 16; ++u) dst[c + u] = 0.0f;
          } else {
            const uint4 raw = *reinterpret_cast<const uint4*>(e + c);
            const float scale =
                *reinterpret_cast<const float*>(e + ops::kMlaFp8ScaleOffset + 4 * (c / ops::kMlaFp8Tile));
            const unsigned w4[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
            for (int u = 0; u < 16; ++u)
              dst[c + u] = __fmul_rn(e4m3_to_float(uint8_t(w4[u / 4] >> (8 * (u % 4)))), scale);
          }
        } else if (piece == kLora / 16) {
          valid[k] = slot >= 0 ? 1 : 0;
        } else {
          const int c = (piece - kLora / 16 - 1) * 8;
          if (slot < 0) {
            for (int u = 0; u < 8; ++u) dst[kLora + c + u] = 0.0f;
          } else {
            const uint4 raw = *reinterpret_cast<const uint4*>(e + ops::kMlaFp8RopeOffset + 2 * c);
            const unsigned w4[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
            for (int u = 0; u < 8; ++u) dst[kLora + c + u] = bf16_bits_to_f32((w4[u / 2] >> (16 * (u % 2))) & 0xffffu);
          }
        }
      }
      __syncthreads();
      // Scores: lanes of a warp take 32 keys of one head (q broadcast, key rows conflict-free).
      for (int i = tid; i < HG * kTk; i += kSmThreads) {
        const int h = i / kTk, k = i % kTk;
        float s = -INFINITY;
        if (valid[k]) {
          const float4* qh = reinterpret_cast<const float4*>(qs + h * kDk);
          const float4* kk = reinterpret_cast<const float4*>(ks + k * kKStride);
          float dot = 0.0f;
#pragma unroll 4
          for (int c = 0; c < kDk / 4; ++c) {
            const float4 a = qh[c], b = kk[c];
            dot = fmaf(a.x, b.x, dot);
            dot = fmaf(a.y, b.y, dot);
            dot = fmaf(a.z, b.z, dot);
            dot = fmaf(a.w, b.w, dot);
          }
          s = __fmul_rn(dot, p.softmax_scale);
        }
        sc[i] = s;
      }
      __syncthreads();
      // Online softmax: one warp per head, one lane per key of the tile.
      for (int h = warp; h < HG; h += kSmThreads / 32) {
        const float s = sc[h * kTk + lane];
        const float m_old = m_s[h];
        const float m_new = fmaxf(m_old, warp_max(s));
        const float pr = s == -INFINITY ? 0.0f : exp_f(__fsub_rn(s, m_new));
        const float alpha = m_old == -INFINITY ? 0.0f : exp_f(__fsub_rn(m_old, m_new));
        const float psum = warp_sum(pr);
        sc[h * kTk + lane] = pr;
        __syncwarp();
        if (lane == 0) {
          m_s[h] = m_new;
          l_s[h] = __fadd_rn(__fmul_rn(l_s[h], alpha), psum);
          a_s[h] = alpha;
        }
      }
      __syncthreads();
      // out += p V: this thread's 4 columns of its HG/2 heads.
#pragma unroll
      for (int a = 0; a < HG / 2; ++a) {
        const float al = a_s[hs * (HG / 2) + a];
        acc[a][0] *= al;
        acc[a][1] *= al;
        acc[a][2] *= al;
        acc[a][3] *= al;
      }
      for (int k = 0; k < kTk; ++k) {
        const float4 v = *reinterpret_cast<const float4*>(ks + k * kKStride + c0);
#pragma unroll
        for (int a = 0; a < HG / 2; ++a) {
          const float pr = sc[(hs * (HG / 2) + a) * kTk + k];
          acc[a][0] = fmaf(pr, v.x, acc[a][0]);
          acc[a][1] = fmaf(pr, v.y, acc[a][1]);
          acc[a][2] = fmaf(pr, v.z, acc[a][2]);
          acc[a][3] = fmaf(pr, v.w, acc[a][3]);
        }
      }
      __syncthreads();  // ks, sc, a_s and valid are rewritten by the next tile
    }
#pragma unroll
    for (int a = 0; a < HG / 2; ++a) {
      const int h = hs * (HG / 2) + a;
      if (h0 + h >= p.heads) continue;
      const float l = l_s[h];
      float* o = p.out + ((r * p.heads + h0 + h) * kLora + c0);
#pragma unroll
      for (int u = 0; u < 4; ++u) o[u] = l > 0.0f ? __fdiv_rn(acc[a][u], l) : 0.0f;
    }
    for (int h = tid; h < HG; h += kSmThreads) {
      if (h0 + h >= p.heads) continue;
      const float l = l_s[h];
      p.lse[r * p.heads + h0 + h] = l > 0.0f ? __fadd_rn(m_s[h], log_f(l)) : -INFINITY;
    }
    __syncthreads();  // qs, m_s and l_s are rewritten by the next item
  }
}

// Opts a kernel into `smem` bytes of dynamic shared memory (checked against the device's limit).
template <typename Kernel>
void allow_smem(Kernel kernel, size_t smem, const char* op) {
  int dev = 0, max_smem = 0;
  DSI_CUDA_CHECK(cudaGetDevice(&dev));
  DSI_CUDA_CHECK(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  DSI_CHECK(smem <= size_t(max_smem), "{}: needs {} bytes of shared memory per block, the device has {}",
            op, smem, max_smem);
  DSI_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
}

template <int HG>
void launch_sparse_mla_fp8_hg(const SparseMlaFp8Params& p, cudaStream_t s) {
  const int64_t items = p.rows * ((p.heads + HG - 1) / HG);
  if (items == 0) return;
  constexpr size_t smem = sparse_mla_fp8_smem<HG>();
  allow_smem(sparse_mla_fp8_kernel<HG>, smem, "sparse_mla_fp8");
  launch(sparse_mla_fp8_kernel<HG>, grid_items(items), kSmThreads, smem, s, p);
}

template <int D>
void launch_logits_d(const IndexerLogitsFp8Params& p, unsigned gx, size_t smem, cudaStream_t s) {
  allow_smem(indexer_logits_fp8_kernel<D>, smem, "indexer_logits_fp8");
  launch(indexer_logits_fp8_kernel<D>, dim3(gx, unsigned(p.rows)), kLgThreads, smem, s, p);
}

}  // namespace

namespace {
std::atomic<int> g_rotate_warp{-1};
}  // namespace

bool rotate_quant_warp() {
  return switch_value(g_rotate_warp, [] { return env_switched_off("DSI_ROTATE_WARP") ? 0 : 1; }) == 1;
}

void set_rotate_quant_warp(bool on) { g_rotate_warp.store(on ? 1 : 0); }

void launch_rotate_quant(const RotateQuantParams& p, cudaStream_t s) {
  if (p.n == 0) return;
  // The pool's rows and the query bytes are written 4 bytes a lane.
  const bool aligned = reinterpret_cast<uintptr_t>(p.pool) % 4 == 0 && reinterpret_cast<uintptr_t>(p.q8_bytes) % 4 == 0;
  if (p.d == 128 && p.norm_weight == nullptr && aligned && rotate_quant_warp())
    launch(rotate_quant_warp_kernel, grid_items((p.n + kRwWarps - 1) / kRwWarps), kRwWarps * 32, 0, s, p);
  else
    launch(rotate_quant_kernel, grid_items(p.n), kRqThreads, 0, s, p);
}

size_t indexer_logits_fp8_smem_bytes(int heads, int d) {
  return sizeof(float) * (size_t(heads) * d + size_t(heads));
}

void launch_indexer_logits_fp8(const IndexerLogitsFp8Params& p, cudaStream_t s) {
  if (p.rows == 0) return;
  DSI_CHECK(p.rows <= 65535, "indexer_logits_fp8: {} rows, at most 65535 per call", p.rows);
  const int64_t n_tiles = (p.n_cols + kLgThreads - 1) / kLgThreads;
  // Enough blocks for a few waves over the device; each block stages its row's query once.
  const int64_t want = std::max<int64_t>(1, (8 * int64_t(sm_count()) + p.rows - 1) / p.rows);
  const unsigned gx = unsigned(std::max<int64_t>(1, std::min<int64_t>(n_tiles, want)));
  const size_t smem = indexer_logits_fp8_smem_bytes(p.heads, p.d);
  switch (p.d) {
    case 16: launch_logits_d<16>(p, gx, smem, s); break;
    case 32: launch_logits_d<32>(p, gx, smem, s); break;
    case 64: launch_logits_d<64>(p, gx, smem, s); break;
    case 128: launch_logits_d<128>(p, gx, smem, s); break;
    default: fail("indexer_logits_fp8: head dim {} has no CUDA kernel (16, 32, 64, 128)", p.d);
  }
}

void launch_mla_store_fp8(const MlaStoreFp8Params& p, cudaStream_t s) {
  if (p.m == 0) return;
  launch(mla_store_fp8_kernel, grid_items(p.m), kMsThreads, 0, s, p);
}

void launch_mla_load_fp8(const MlaLoadFp8Params& p, cudaStream_t s) {
  if (p.m == 0) return;
  launch(mla_load_fp8_kernel, grid_for(p.m * kDk, 256), 256, 0, s, p);
}

void launch_sparse_mla_fp8(const SparseMlaFp8Params& p, cudaStream_t s) {
  // Head groups: 16 for the real models, smaller groups waste less work for few heads.
  if (p.heads > 8)
    launch_sparse_mla_fp8_hg<16>(p, s);
  else if (p.heads > 2)
    launch_sparse_mla_fp8_hg<8>(p, s);
  else
    launch_sparse_mla_fp8_hg<2>(p, s);
}

}  // namespace dsi::cuda
