// Normalisation ops of the CUDA backend; see norm.h and ops/norm.h (HF GlmMoeDsaRMSNorm, nn.LayerNorm).
#include <algorithm>

#include "backends/cuda/common.cuh"
#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/norm/norm.h"

namespace dsi::cuda {

namespace {

// A block per row, as many threads as the row has vectors (V floats each, up to 1024 threads).
// Decode normalises one row of a few thousand floats, so the kernel is one memory round trip
// long: every thread issues the loads of its kCached vectors of x and of the weights (and bias)
// before it adds anything, keeps them in registers for the second pass, and only rows longer
// than kCached vectors per thread loop over the rest (re-reading x).
constexpr int kNormMaxThreads = 1024;
constexpr int kCached = 4;

template <int V>
__device__ __forceinline__ void load_vec(const float* p, float (&v)[V]) {
  if constexpr (V == 4) {
    const float4 t = __ldg(reinterpret_cast<const float4*>(p));
    v[0] = t.x, v[1] = t.y, v[2] = t.z, v[3] = t.w;
  } else {
    v[0] = __ldg(p);
  }
}

template <int V>
__device__ __forceinline__ void load_vec_coherent(const float* p, float (&v)[V]) {
  if constexpr (V == 4) {
    const float4 t = *reinterpret_cast<const float4*>(p);
    v[0] = t.x, v[1] = t.y, v[2] = t.z, v[3] = t.w;
  } else {
    v[0] = *p;
  }
}

template <int V>
__device__ __forceinline__ void store_vec(float* p, const float (&v)[V]) {
  if constexpr (V == 4) *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
  else p[0] = v[0];
}

// The vectors of one row a thread owns: j = threadIdx.x + i * blockDim.x, the first kCached of
// them in registers.
template <int V>
struct RowSlice {
  float x[kCached][V], w[kCached][V], b[kCached][V];
  int64_t nv;  // vectors per row

  __device__ __forceinline__ int64_t index(int i) const { return threadIdx.x + int64_t(i) * blockDim.x; }
  // Row r: x (its cached vectors; in the residual form x + delta, written back).
  __device__ __forceinline__ void load(const NormParams& p, int64_t r) {
    const float* xr = p.x + r * p.x_stride;
    nv = p.d / V;
#pragma unroll
    for (int i = 0; i < kCached; ++i)
      if (index(i) < nv) {
        load_vec<V>(xr + index(i) * V, x[i]);
        load_vec<V>(p.weight + index(i) * V, w[i]);
        if (p.bias != nullptr) load_vec<V>(p.bias + index(i) * V, b[i]);
        if (p.delta != nullptr) add_delta(p, r, index(i), x[i]);
      }
  }
  // v += delta[r, vector j] (fp32 adds, as ops::add_inplace), stored to resid.
  __device__ __forceinline__ static void add_delta(const NormParams& p, int64_t r, int64_t j, float (&v)[V]) {
    float dv[V];
    load_vec<V>(p.delta + r * p.delta_stride + j * V, dv);
#pragma unroll
    for (int e = 0; e < V; ++e) v[e] = __fadd_rn(v[e], dv[e]);
    store_vec<V>(p.resid + r * p.x_stride + j * V, v);
  }
  // fn(values of x, weights, bias, element offset) over every vector of the row, the cached ones
  // first, then the rest re-read; `first` (the first pass of the residual form) adds delta to
  // those and writes them back, so later passes read the sum.
  template <typename Fn>
  __device__ __forceinline__ void each(const NormParams& p, int64_t r, bool first, Fn&& fn) const {
    const float* xr = p.x + r * p.x_stride;
#pragma unroll
    for (int i = 0; i < kCached; ++i)
      if (index(i) < nv) fn(x[i], w[i], b[i], index(i) * V);
    for (int64_t j = index(kCached); j < nv; j += blockDim.x) {
      float xv[V], wv[V], bv[V] = {};
      if (p.delta == nullptr) {
        load_vec<V>(xr + j * V, xv);
      } else {  // this thread wrote the sum in the first pass: a coherent load, not __ldg
        load_vec_coherent<V>(xr + j * V, xv);
        if (first) add_delta(p, r, j, xv);
      }
      load_vec<V>(p.weight + j * V, wv);
      if (p.bias != nullptr) load_vec<V>(p.bias + j * V, bv);
      fn(xv, wv, bv, j * V);
    }
  }
};

template <int V>
__global__ void __launch_bounds__(kNormMaxThreads) rms_norm_kernel(NormParams p) {
  pdl_enter();
  __shared__ float red[33];
  for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
    float* o = p.out + r * p.out_stride;
    RowSlice<V> row;
    row.load(p, r);
    float ss = 0.0f;
    row.each(p, r, true, [&](const float(&xv)[V], const float(&)[V], const float(&)[V], int64_t) {
#pragma unroll
      for (int e = 0; e < V; ++e) ss = __fadd_rn(ss, __fmul_rn(xv[e], xv[e]));
    });
    ss = block_sum(ss, red);
    // CPU: 1 / sqrt(ss / d + eps), then w * (x * inv)
    const float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, float(p.d)), p.eps)));
    row.each(p, r, false, [&](const float(&xv)[V], const float(&wv)[V], const float(&)[V], int64_t j) {
      float ov[V];
#pragma unroll
      for (int e = 0; e < V; ++e) ov[e] = __fmul_rn(wv[e], __fmul_rn(xv[e], inv));
      store_vec<V>(o + j, ov);
    });
  }
}

template <int V>
__global__ void __launch_bounds__(kNormMaxThreads) layer_norm_kernel(NormParams p) {
  pdl_enter();
  __shared__ float red[33];
  for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
    float* o = p.out + r * p.out_stride;
    RowSlice<V> row;
    row.load(p, r);
    float s = 0.0f;
    row.each(p, r, false, [&](const float(&xv)[V], const float(&)[V], const float(&)[V], int64_t) {
#pragma unroll
      for (int e = 0; e < V; ++e) s = __fadd_rn(s, xv[e]);
    });
    const float mean = __fdiv_rn(block_sum(s, red), float(p.d));
    float v = 0.0f;
    row.each(p, r, false, [&](const float(&xv)[V], const float(&)[V], const float(&)[V], int64_t) {
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const float c = __fsub_rn(xv[e], mean);
        v = __fadd_rn(v, __fmul_rn(c, c));
      }
    });
    const float var = __fdiv_rn(block_sum(v, red), float(p.d));
    const float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(var, p.eps)));
    // CPU: (x - mean) * inv * w + b
    row.each(p, r, false, [&](const float(&xv)[V], const float(&wv)[V], const float(&bv)[V], int64_t j) {
      float ov[V];
#pragma unroll
      for (int e = 0; e < V; ++e)
        ov[e] = __fadd_rn(__fmul_rn(__fmul_rn(__fsub_rn(xv[e], mean), inv), wv[e]), bv[e]);
      store_vec<V>(o + j, ov);
    });
  }
}

// Rows of float4s when every row start and the weights are 16-byte aligned.
bool vectorizable(const NormParams& p) {
  const auto aligned = [](const void* q) { return q == nullptr || reinterpret_cast<uintptr_t>(q) % 16 == 0; };
  return p.d % 4 == 0 && p.x_stride % 4 == 0 && p.out_stride % 4 == 0 && p.delta_stride % 4 == 0 &&
         aligned(p.x) && aligned(p.out) && aligned(p.weight) && aligned(p.bias) && aligned(p.delta);
}

template <template <int> class Kernel>
void launch_norm(const NormParams& p, cudaStream_t s) {
  if (p.rows == 0) return;
  const bool vec = vectorizable(p);
  const int64_t nv = vec ? p.d / 4 : p.d;
  const int threads = int(std::clamp<int64_t>((nv + 31) / 32 * 32, 32, kNormMaxThreads));
  if (vec) Kernel<4>::run(grid_items(p.rows), threads, s, p);
  else Kernel<1>::run(grid_items(p.rows), threads, s, p);
}

template <int V>
struct RmsNorm {
  static void run(unsigned g, int t, cudaStream_t s, const NormParams& p) { launch(rms_norm_kernel<V>, g, t, 0, s, p); }
};
template <int V>
struct LayerNorm {
  static void run(unsigned g, int t, cudaStream_t s, const NormParams& p) { launch(layer_norm_kernel<V>, g, t, 0, s, p); }
};

void check_rows(const Tensor& x, const Tensor& weight, const Tensor& out, const char* op) {
  DSI_CHECK(x.ndim() == 2 && x.stride(1) == 1, "{}: x must be [n, d] with contiguous rows, got {}",
            op, x.desc());
  check_dtype(x, DType::F32, op);
  check_shape(weight, {x.dim(1)}, op);
  check_dtype(weight, DType::F32, op);
  DSI_CHECK(out.shape() == x.shape() && out.stride(1) == 1, "{}: out {} for x {}", op, out.desc(),
            x.desc());
  check_dtype(out, DType::F32, op);
  check_on(weight, x.device(), op, "weight");
  check_on(out, x.device(), op, "out");
}

NormParams params(const Tensor& x, const Tensor& weight, const Tensor& out, float eps) {
  NormParams p{};
  p.x = x.f32();
  p.weight = weight.f32();
  p.out = out.f32();
  p.x_stride = x.stride(0);
  p.out_stride = out.stride(0);
  p.rows = x.dim(0);
  p.d = x.dim(1);
  p.eps = eps;
  return p;
}

}  // namespace

void launch_rms_norm(const NormParams& p, cudaStream_t s) { launch_norm<RmsNorm>(p, s); }

void launch_layer_norm(const NormParams& p, cudaStream_t s) { launch_norm<LayerNorm>(p, s); }

void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) {
  check_rows(x, weight, out, "rms_norm");
  DeviceGuard guard(x.device());
  launch_rms_norm(params(x, weight, out, eps), stream());
}

void add_rms_norm(Tensor& h, const Tensor& delta, const Tensor& weight, float eps, Tensor& out) {
  check_rows(h, weight, out, "add_rms_norm");
  DSI_CHECK(delta.ndim() == 2 && delta.stride(1) == 1, "add_rms_norm: delta {} needs contiguous rows",
            delta.desc());
  check_dtype(delta, DType::F32, "add_rms_norm delta");
  check_on(delta, h.device(), "add_rms_norm", "delta");
  DeviceGuard guard(h.device());
  NormParams p = params(h, weight, out, eps);
  p.delta = delta.f32();
  p.delta_stride = delta.stride(0);
  p.resid = h.f32();
  launch_rms_norm(p, stream());
}

void layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps, Tensor& out) {
  check_rows(x, weight, out, "layer_norm");
  check_shape(bias, {x.dim(1)}, "layer_norm bias");
  check_dtype(bias, DType::F32, "layer_norm bias");
  check_on(bias, x.device(), "layer_norm", "bias");
  DeviceGuard guard(x.device());
  NormParams p = params(x, weight, out, eps);
  p.bias = bias.f32();
  launch_layer_norm(p, stream());
}

}  // namespace dsi::cuda
