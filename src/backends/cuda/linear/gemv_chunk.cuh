// The 16-byte chunk helpers of the weight-streaming GEMV kernels (gemv.cu, gemv_seg.cu): block
// shape, element sizes, the L1-bypassing weight load and the exact decoding of a chunk to fp32.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "backends/cuda/common.cuh"

namespace dsi::cuda::gemv_chunk {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;

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
