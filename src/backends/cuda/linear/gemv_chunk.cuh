// The 16-byte chunk helpers of the weight-streaming GEMV kernels (gemv.cu, gemv_seg.cu): block
// shape, element sizes, the L1-bypassing weight load and the exact decoding of a chunk to fp32;
// and the host side their plans share: a launch that can instead ask the occupancy calculator, and
// its answers cached per device.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <utility>

#include "backends/cuda/common.cuh"

namespace dsi::cuda::gemv_chunk {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;

// Launches a GEMV kernel of kThreads threads with `smem` bytes of dynamic shared memory, or
// (blocks_per_sm non-null) only says how many of its blocks one SM of the current device holds at
// once (the occupancy calculator), so that a plan asks about exactly the kernel its launch takes.
template <typename... Params, typename... Args>
void launch_or_occupancy(void (*kernel)(Params...), dim3 grid, size_t smem, cudaStream_t s, int* blocks_per_sm,
                         Args&&... args) {
  // Per call: cheap, per device, allowed during stream capture.
  if (smem > 0) DSI_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  if (blocks_per_sm != nullptr) {
    DSI_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks_per_sm, kernel, kThreads, smem));
    return;
  }
  launch(kernel, grid, kThreads, smem, s, std::forward<Args>(args)...);
}

// The answer of `ask` (blocks per SM of one kernel instantiation, at least 1) for the current
// device and `key` in [0, kKeys), asked once per device and key (devices past kCachedDevices ask
// every time).
constexpr int kCachedDevices = 64;
template <int kKeys, typename Ask>
int cached_blocks_per_sm(std::atomic<int> (&cache)[kCachedDevices][kKeys], int key, Ask ask) {
  int dev = 0;
  DSI_CUDA_CHECK(cudaGetDevice(&dev));
  std::atomic<int>* slot = dev < kCachedDevices ? &cache[dev][key] : nullptr;  // 0: not asked yet
  if (slot != nullptr)
    if (const int b = slot->load(std::memory_order_relaxed); b > 0) return b;
  const int b = std::max(ask(), 1);
  if (slot != nullptr) slot->store(b, std::memory_order_relaxed);
  return b;
}

__host__ __device__ inline int64_t elem_bytes(FloatKind k) {
  return k == FloatKind::kF32 ? 4 : k == FloatKind::kE4M3 ? 1 : 2;
}

template <FloatKind K>
constexpr int elems_per_16b() {
  return K == FloatKind::kF32 ? 4 : K == FloatKind::kE4M3 ? 16 : 8;
}

// 16 bytes of W, read once: not allocated in L1, which keeps the x rows.
__device__ __forceinline__ uint4 load_stream(const uint4* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

__device__ __forceinline__ float2 half2_bits_to_float2(uint32_t bits) {
  __half2_raw r;
  r.x = static_cast<unsigned short>(bits & 0xffffu);
  r.y = static_cast<unsigned short>(bits >> 16);
  return __half22float2(__half2(r));  // exact
}

// The tensor-core kernels' split of x (gemv.cu, gemv_tma.cu): each 128-column block scaled by a
// power of two (block_scale_exponent), then f16 hi and lo halves (f16x2_bits: f16x2 of (a, b), a in
// the low half, and its value back in fp32).
__device__ __forceinline__ uint32_t f16x2_bits(float a, float b, float& ra, float& rb) {
  const __half2 h = __floats2half2_rn(a, b);
  const float2 r = __half22float2(h);
  ra = r.x;
  rb = r.y;
  const __half2_raw raw = h;
  return uint32_t(raw.x) | (uint32_t(raw.y) << 16);
}

// The power of two that brings the block maximum m (>= 0) into [2^14, 2^15), as a biased fp32
// exponent in [1, 253] (so 1 / s is a normal number too); 127 (s = 1) for 0, inf or NaN.
__device__ __forceinline__ int block_scale_exponent(float m) {
  const int e = int((__float_as_uint(m) >> 23) & 0xffu);
  if (m == 0.0f || e == 255) return 127;
  return min(253, max(1, 268 - e));  // 127 + 14 - (e - 127)
}

// Elements 4 * sub .. 4 * sub + 3 of a 16-byte chunk of W as fp32, exactly (byte order: element 0
// in the lowest bytes, little-endian).
template <FloatKind K>
__device__ __forceinline__ void decode4(const uint4& v, int sub, float (&f)[4]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
  if constexpr (K == FloatKind::kF32) {
    for (int i = 0; i < 4; ++i) f[i] = __uint_as_float(w[i]);
  } else if constexpr (K == FloatKind::kBF16) {
    const uint32_t a = w[2 * sub], b = w[2 * sub + 1];
    f[0] = __uint_as_float(a << 16);
    f[1] = __uint_as_float(a & 0xffff0000u);
    f[2] = __uint_as_float(b << 16);
    f[3] = __uint_as_float(b & 0xffff0000u);
  } else if constexpr (K == FloatKind::kF16) {
    const float2 lo = half2_bits_to_float2(w[2 * sub]), hi = half2_bits_to_float2(w[2 * sub + 1]);
    f[0] = lo.x;
    f[1] = lo.y;
    f[2] = hi.x;
    f[3] = hi.y;
  } else {
    // e4m3 pairs -> f16 pairs (exact: e4m3 is a subset of f16, NaN stays NaN) -> fp32.
    const uint32_t a = w[sub];
    const __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2(
        static_cast<__nv_fp8x2_storage_t>(a & 0xffffu), __NV_E4M3);
    const __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2(
        static_cast<__nv_fp8x2_storage_t>(a >> 16), __NV_E4M3);
    const float2 l = __half22float2(__half2(lo)), h = __half22float2(__half2(hi));
    f[0] = l.x;
    f[1] = l.y;
    f[2] = h.x;
    f[3] = h.y;
  }
}

}  // namespace dsi::cuda::gemv_chunk
