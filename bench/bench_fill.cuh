// Device-side fills of the CUDA benchmarks' synthetic operands (weights, scales, inputs).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

// Fills bytes with a hash of their index: fp8 bytes other than NaN, bf16 values in
// [-scale, scale), fp32 values in [lo, hi).
static __device__ uint32_t mix(uint64_t i, uint32_t seed) {
  uint64_t z = i * 0x9e3779b97f4a7c15ull + seed;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return uint32_t(z >> 32);
}
static __global__ void fill_fp8(uint8_t* p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint8_t b = uint8_t(mix(uint64_t(i), seed));
    if ((b & 0x7f) == 0x7f) b = 0x30;
    p[i] = b;
  }
}
static __global__ void fill_bf16(uint16_t* p, int64_t n, uint32_t seed, float scale) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float v = (float(mix(uint64_t(i), seed) >> 8) * 0x1.0p-23f - 1.0f) * scale;
    p[i] = uint16_t(__float_as_uint(v) >> 16);
  }
}
static __global__ void fill_f32(float* p, int64_t n, uint32_t seed, float lo, float hi) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    p[i] = lo + (hi - lo) * float(mix(uint64_t(i), seed) >> 8) * 0x1.0p-24f;
}
