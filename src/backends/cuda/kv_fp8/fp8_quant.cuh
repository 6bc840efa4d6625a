// The scalar steps of the caches' power-of-two e4m3 quantisation, shared by the fp8 KV kernels
// (kv_fp8.cu, sm90_indexer_logits.cu). The CPU twins are in backends/cpu/kv_fp8.cpp; every step
// rounds as they do.
#pragma once

#include <cuda_fp8.h>

#include <cstdint>

#include "ops/kv_fp8.h"

namespace dsi::cuda {

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

}  // namespace dsi::cuda
