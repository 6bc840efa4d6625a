// Shared pieces of the CUDA backend: the device guard, the stream ops run on, stream-ordered scratch
// memory, an error flag kernels report bad inputs through, launch sizing, argument checks, block
// reductions and the float helpers that keep kernels bitwise close to the CPU reference.
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <memory>

#include "backends/cuda/cuda_check.h"
#include "core/tensor.h"

namespace dsi::cuda {

// The stream every op runs on: one per device, created on first use and shared by every thread (ops,
// copies and the caching allocator's reuse of freed blocks are ordered by it without events). It is a
// blocking stream, so work left on the legacy default stream (NCCL's, a benchmark's) is ordered
// with it too. Step graphs (graph/step_graph.h) are captured on it.
cudaStream_t stream();
// Streaming multiprocessors of the current device.
int sm_count();
// Waits for the current device's stream (a host read of its results follows).
void sync_stream();

// Makes `device` current for the guard's lifetime (ops run on their tensors' device).
class DeviceGuard {
 public:
  explicit DeviceGuard(Device device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = -1;
};

// Scratch memory of one op from the caching allocator (memory/memory.h): given back when the owner
// dies; the stream orders its reuse after the work queued so far.
class Scratch {
 public:
  Scratch() = default;
  explicit Scratch(size_t bytes);
  ~Scratch();
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  Scratch(Scratch&& o) noexcept;
  Scratch& operator=(Scratch&& o) noexcept;
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t size() const { return size_; }

 private:
  void* ptr_ = nullptr;
  size_t size_ = 0;
  std::shared_ptr<struct BlockPool> pool_;
};

// A device word kernels lower (atomicMin) to the first bad item they meet; kNone when none.
// Eagerly, read() synchronises and returns it, so a bad id throws the CPU's error. While this thread
// captures a step graph, the flag is a slot of the graph's check array instead: read() returns kNone
// and the graph reports `what` (with the item) after each replay (graph/step_graph.h).
class ErrorFlag {
 public:
  static constexpr unsigned long long kNone = ~0ull;
  explicit ErrorFlag(const char* what);
  unsigned long long* ptr() const { return ptr_; }
  unsigned long long read() const;

 private:
  Scratch mem_;
  unsigned long long* ptr_ = nullptr;
  bool deferred_ = false;
};

// Reads one T from device memory (synchronises).
template <typename T>
T read_device(const T* p) {
  T v{};
  DSI_CUDA_CHECK(cudaMemcpyAsync(&v, p, sizeof(T), cudaMemcpyDeviceToHost, stream()));
  sync_stream();
  return v;
}

// Blocks for a grid-stride loop over n items (n > 0).
inline unsigned grid_for(int64_t n, int threads) {
  const int64_t b = (n + threads - 1) / threads;
  return unsigned(b < 65536 * 16 ? b : 65536 * 16);
}
// Blocks for a block-per-item grid-stride loop (n > 0).
inline unsigned grid_items(int64_t n) { return unsigned(n < (1 << 20) ? n : (1 << 20)); }

// Throws unless t is defined and on `device`; "op" and "what" name it in the message.
void check_on(const Tensor& t, Device device, const char* op, const char* what);

// ---- Device helpers ----

// exp / log of a float through double, rounded once: agrees with glibc's expf / logf (the CPU
// reference) except in rare double-rounding cases, where the CUDA single-precision functions are
// off by up to 2 ulp.
__device__ __forceinline__ float exp_f(float x) { return float(exp(double(x))); }
__device__ __forceinline__ float log_f(float x) { return float(log(double(x))); }

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Block-wide sum / max; every thread gets the result. blockDim.x is a multiple of 32; every thread
// of the block calls it; smem holds 33 floats. Fixed reduction tree: deterministic run to run.
__device__ __forceinline__ float block_sum(float v, float* smem) {
  const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // smem[32] of a previous call may still be being read
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float t = lane < nwarps ? smem[lane] : 0.0f;
    t = warp_sum(t);
    if (lane == 0) smem[32] = t;
  }
  __syncthreads();
  return smem[32];
}
__device__ __forceinline__ float block_max(float v, float* smem) {
  const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float t = lane < nwarps ? smem[lane] : -INFINITY;
    t = warp_max(t);
    if (lane == 0) smem[32] = t;
  }
  __syncthreads();
  return smem[32];
}

// Loads element i of a float-typed array (F32, BF16, F16, F8_E4M3) as fp32, exactly.
enum class FloatKind : int { kF32 = 0, kBF16 = 1, kF16 = 2, kE4M3 = 3 };
// The FloatKind of a DType; throws for other dtypes ("what" names the tensor).
FloatKind float_kind(DType dtype, const char* what);

__device__ __forceinline__ float e4m3_to_float(uint8_t v) {
  const unsigned sign = (v >> 7) & 1u, e = (v >> 3) & 0xfu, m = v & 7u;
  float f;
  if (e == 0xfu && m == 7u)
    f = __uint_as_float(0x7fc00000u);
  else if (e == 0)
    f = float(m) * 0.001953125f;  // m * 2^-9, exact
  else
    f = __uint_as_float(((e + 120u) << 23) | (m << 20));  // (1 + m/8) * 2^(e-7)
  return sign ? -f : f;
}
__device__ __forceinline__ float half_bits_to_float(uint16_t h) {
  // IEEE binary16 -> binary32, exact (written out to avoid depending on cuda_fp16 in every file).
  const unsigned sign = (h >> 15) & 1u, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  unsigned bits;
  if (e == 0x1fu) {
    bits = 0x7f800000u | (m << 13);
  } else if (e != 0) {
    bits = ((e + 112u) << 23) | (m << 13);
  } else if (m == 0) {
    bits = 0;
  } else {  // subnormal: m * 2^-24, exact in fp32
    return sign ? -float(m) * 5.9604644775390625e-8f : float(m) * 5.9604644775390625e-8f;
  }
  return __uint_as_float(bits | (sign << 31));
}
// fp32 -> bf16 bits, rounded to nearest even, NaN kept (quiet): bitwise core/dtype.h's f32_to_bf16.
__device__ __forceinline__ uint16_t f32_to_bf16_bits(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

__device__ __forceinline__ float load_float(const void* base, FloatKind kind, int64_t i) {
  switch (kind) {
    case FloatKind::kF32: return static_cast<const float*>(base)[i];
    case FloatKind::kBF16:
      return __uint_as_float(unsigned(static_cast<const uint16_t*>(base)[i]) << 16);
    case FloatKind::kF16: return half_bits_to_float(static_cast<const uint16_t*>(base)[i]);
    default: return e4m3_to_float(static_cast<const uint8_t*>(base)[i]);
  }
}

// The total order of ops/topk.h as one 64-bit key, larger = earlier: the score's bits mapped to an
// unsigned order (-0 folded onto +0, which the CPU treats as equal), then the position inverted so
// that lower positions win ties. Selectable scores (> -inf, so not NaN) never map to 0, the key of
// an entry that cannot be selected.
__device__ __forceinline__ unsigned long long topk_key(float score, uint32_t position) {
  const unsigned u = __float_as_uint(score == 0.0f ? 0.0f : score);
  const unsigned ord = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return (static_cast<unsigned long long>(ord) << 32) | (0xffffffffu - position);
}
__device__ __forceinline__ uint32_t topk_key_position(unsigned long long key) {
  return 0xffffffffu - static_cast<uint32_t>(key & 0xffffffffull);
}

}  // namespace dsi::cuda
