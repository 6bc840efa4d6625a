// The fp8-activation linear (ops::linear_fp8_act, DeepSeek V3's recipe) on the GPU: a kernel that
// quantises x per row per weight column block to e4m3 (scale amax / 448), and a block-scaled GEMM
// on the e4m3 operands. This first GEMM is a plain shared-memory tiled kernel on the CUDA cores: it
// sums each block's exact e4m3 products in fp32 in increasing column order and applies the two
// scales exactly as the CPU reference does, so it matches that reference bitwise by construction.
// A tensor-core (mma / wgmma) version is the next step; it keeps this kernel's interface.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dsi::cuda {

struct ActQuantParams {
  const float* x;   // [n, in], row stride ldx
  uint8_t* q;       // [n, in] e4m3, contiguous
  float* scales;    // [n, groups] contiguous; group g = columns j with (col0 + j) / block == g
  int64_t ldx;
  int64_t n, in, groups;
  int64_t col0;
  int block;
};
void launch_act_quant_fp8(const ActQuantParams& p, cudaStream_t stream);

struct Fp8GemmParams {
  const uint8_t* xq;       // [n, in] e4m3, contiguous (from launch_act_quant_fp8)
  const float* sx;         // [n, groups] activation scales
  const uint8_t* w;        // [out, in] e4m3, contiguous
  const float* scale_inv;  // [ceil((row0 + out) / block_out), groups] weight block scales
  float* y;                // [n, out], row stride ldy
  int64_t ldy;
  int64_t n, in, out, groups;
  int64_t row0, col0;
  int block_out, block_in;
};
void launch_fp8_gemm(const Fp8GemmParams& p, cudaStream_t stream);

}  // namespace dsi::cuda
