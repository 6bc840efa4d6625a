// Shared pieces of the CUDA backend: the device guard, the stream ops run on, stream-ordered scratch
// memory, an error flag kernels report bad inputs through, launch sizing, argument checks, block
// reductions and the float helpers that keep kernels bitwise close to the CPU reference.
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <memory>
#include <utility>

#include "backends/cuda/cuda_check.h"
#include "core/tensor.h"

namespace dsi::cuda {

// The stream every op runs on: one per (logical, device.h) device, created on first use and shared
// by every thread (ops, copies and the caching allocator's reuse of freed blocks are ordered by it
// without events). It is a blocking stream, so work left on the legacy default stream (NCCL's, a
// benchmark's) is ordered with it too; except with GPU sharing, where the streams of the logical
// devices of one GPU must never wait for one another (a peer collective of one waits for the
// others' kernels). Step graphs (graph/step_graph.h) are captured on it.
cudaStream_t stream();
// The device's second stream, for work beside the main one (run_beside): while this thread runs
// such work, stream() returns it.
bool on_side_stream();
// The (logical) device ops of this thread run on now: the innermost DeviceGuard's, else the CUDA
// runtime's current GPU.
int current_device();
// Streaming multiprocessors of the current device.
int sm_count();
// Waits for the current device's stream (a host read of its results follows).
void sync_stream();

// Makes `device` (logical) current for the guard's lifetime (ops run on their tensors' device): its
// GPU becomes the runtime's current one, and stream() and the allocator use its own stream and pool.
class DeviceGuard {
 public:
  explicit DeviceGuard(Device device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_gpu_ = -1;      // the GPU to restore (-1: unchanged)
  int prev_logical_ = -1;  // the enclosing guard's logical device (-1: none)
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

// ---- Programmatic dependent launch (sm_90+) ----
// Every kernel of the backend is launched through launch() / launch_cluster(): where the device
// supports it, the launch lets the kernel start while the one before it on the stream still runs,
// so its blocks are resident, its parameters loaded and (the GEMVs) its weights on the way to the L2
// when the previous kernel ends. The contract, for every kernel launched this way:
//   - pdl_wait() comes before the kernel reads anything an earlier kernel writes, writes anything
//     an earlier kernel reads or writes, and before it can return. It waits for the previous grid
//     to complete with its memory visible (and so, transitively, for every grid before it). A
//     block with nothing to do may return without it, through pdl_leave_unwaited(), where another
//     block of the same grid always waits (the indexer logits kernel's rows that lead no group):
//     the grid still completes, and lets the next one launch, only after the previous grid.
//   - pdl_trigger() (after pdl_wait, or in pdl_leave_unwaited) lets the next kernel launch once
//     every block of the grid has called it or exited; a kernel that never calls it triggers when
//     it exits.
// So when a kernel starts, every grid before the previous one has completed: before its wait a
// kernel may also read what the kernel launched right before it does not write, if its launcher
// fixes which kernel that is (the indexer logits kernel: its tables and key pages, behind the
// query rotation), reading past the L1 (ld.global.cg, or copies through the L2).
// Without the attribute (older GPUs, DSI_PDL=0) both are no-ops and launches serialise as usual.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
// Said by a block that returns without waiting (the contract above allows it where another block
// of the grid always waits; tests/test_cuda_sources.cpp looks for it before such a return): lets
// the next kernel launch as far as this block goes, as its exit would.
__device__ __forceinline__ void pdl_leave_unwaited() { pdl_trigger(); }
// Both, at the top of a kernel that prefetches nothing.
__device__ __forceinline__ void pdl_enter() {
  pdl_wait();
  pdl_trigger();
}

// Asks the L2 for the line holding p / for `bytes` bytes from p (16-byte aligned, a multiple of 16
// bytes; issued in 64 KiB requests). Hints: no result, no fault for what they never touch.
__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p));
}
__device__ __forceinline__ void prefetch_l2_bulk(const void* p, int64_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  for (int64_t off = 0; off < bytes; off += 65536) {
    const unsigned n = unsigned(bytes - off < 65536 ? bytes - off : 65536);
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(static_cast<const char*>(p) + off), "r"(n)
                 : "memory");
  }
#endif
}

// Whether the environment switches a default-on path off: the variable `name` set to "0" (the
// DSI_* switches that keep a slower path for comparisons).
bool env_switched_off(const char* name);
// Whether the environment switches a default-off path on: `name` set to a positive number.
bool env_switched_on(const char* name);

// Whether launches use programmatic dependent launch: compute capability 9.0 or newer on the current
// device, unless the environment sets DSI_PDL=0 (for comparisons).
bool pdl_enabled();

// kernel<<<grid, block, smem, s>>>(args...), as a programmatic dependent launch where enabled, in a
// thread-block cluster of `cluster_x` CTAs along x when cluster_x > 0. Launch errors throw.
template <typename... Params, typename... Args>
void launch_cluster(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, unsigned cluster_x,
                    cudaStream_t s, Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr[2];
  unsigned n = 0;
  if (pdl_enabled()) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  if (cluster_x > 0) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = cluster_x;
    attr[n].val.clusterDim.y = 1;
    attr[n].val.clusterDim.z = 1;
    ++n;
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  DSI_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
  DSI_CUDA_CHECK_LAUNCH();
}
template <typename... Params, typename... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, Args&&... args) {
  launch_cluster(kernel, grid, block, smem, 0, s, std::forward<Args>(args)...);
}

// dst (host) = bytes of device memory at src, after the work queued on this device's stream
// (memory/memory.cu; with GPU sharing through a pinned buffer of the device: see pinned_copy).
void copy_to_host(void* dst, const void* src, size_t bytes);
// dst (device) = bytes of host memory at src, queued on this device's stream (the source may be
// reused when it returns; with GPU sharing it also waits for the stream).
void copy_from_host(void* dst, const void* src, size_t bytes);
// Makes the current device's pinned buffer of those copies now (with GPU sharing), not at the
// first copy: device.h's prepare_thread.
void prepare_host_copies();

// Reads one T from device memory (synchronises).
template <typename T>
T read_device(const T* p) {
  T v{};
  copy_to_host(&v, p, sizeof(T));
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
// SwiGLU's activation as the CPU computes it: g / (1 + exp(-g)) * u, each step rounded in fp32.
__device__ __forceinline__ float silu_mul_f(float g, float u) {
  return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, exp_f(-g))), u);
}
__device__ __forceinline__ float log_f(float x) { return float(log(double(x))); }

// RoPE of one pair (x1, x2) at angle pos * inv_freq, as the CPU reference rotates it: cos / sin
// taken in double and rounded once (glibc's cosf / sinf are within 0.56 ulp, the CUDA fp32 ones
// 2 ulp), both times attention_factor, then the rotation with _rn steps in the reference's order.
__device__ __forceinline__ void rope_pair(float x1, float x2, float pos, float inv_freq, float attention_factor,
                                          float& o1, float& o2) {
  const float angle = __fmul_rn(pos, inv_freq);
  double s, c;  // one argument reduction for both
  sincos(double(angle), &s, &c);
  const float cs = __fmul_rn(float(c), attention_factor);
  const float sn = __fmul_rn(float(s), attention_factor);
  o1 = __fsub_rn(__fmul_rn(x1, cs), __fmul_rn(x2, sn));
  o2 = __fadd_rn(__fmul_rn(x2, cs), __fmul_rn(x1, sn));
}

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
