// The fp8-activation linear (ops::linear_fp8_act, DeepSeek V3's recipe) on the GPU: a kernel that
// quantises x per row per weight column block to e4m3 (scale amax / 448), and a block-scaled GEMM
// on the e4m3 operands. This first GEMM is a plain shared-memory tiled kernel on the CUDA cores: it
// sums each block's exact e4m3 products in fp32 in increasing column order and applies the two
// scales exactly as the CPU reference does, so it matches that reference bitwise by construction.
// The tensor-core GEMM is cuBLASLt's block-scaled fp8 matmul (1x128 activation scales, 128x128
// weight scales; Hopper, cuBLAS 12.9 or later): same operands and scales, fp32 accumulation
// promoted per 128-column block, in its own summation order (close to, not bitwise, the reference).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dsi::cuda {

struct ActQuantParams {
  const float* x;   // [n, in], row stride ldx
  uint8_t* q;       // [n, in] e4m3, contiguous
  float* scales;    // scale of (row i, group g) at i * scale_row + g * scale_group; group g =
                    // columns j with (col0 + j) / block == g
  int64_t scale_row, scale_group;  // (groups, 1): row-major; (1, n): group-major, as cuBLASLt wants
  int64_t ldx;
  int64_t n, in, groups;
  int64_t col0;
  int block;
};
void launch_act_quant_fp8(const ActQuantParams& p, cudaStream_t stream);

struct Fp8GemmParams {
  const uint8_t* xq;       // [n, in] e4m3, contiguous (from launch_act_quant_fp8)
  const float* sx;         // activation scales, (row i, group g) at i * sx_row + g * sx_group
  int64_t sx_row, sx_group;
  const uint8_t* w;        // [out, in] e4m3, contiguous
  const float* scale_inv;  // [ceil((row0 + out) / block_out), groups] weight block scales
  float* y;                // [n, out], row stride ldy
  int64_t ldy;
  int64_t n, in, out, groups;
  int64_t row0, col0;
  int block_out, block_in;
};
void launch_fp8_gemm(const Fp8GemmParams& p, cudaStream_t stream);

// cuBLASLt's path: 128x128 blocks, no slice offsets (row0 = col0 = 0), in % 16 == 0, groups % 4
// == 0 (the weight scales' row length is cuBLASLt's leading dimension), group-major activation
// scales (sx_row 1, sx_group n), ldy % 4 == 0, 16-byte aligned operands, sizes within int32.
bool fp8_gemm_lt_supported(const Fp8GemmParams& p);
// Whether cuBLASLt has an algorithm for the (supported) shape on this GPU; cached per shape.
bool fp8_gemm_lt_available(const Fp8GemmParams& p);
constexpr size_t kFp8GemmLtWorkspace = size_t(32) << 20;  // bytes of cuBLASLt workspace
// Runs the product on the tensor cores; returns false, having enqueued nothing, when cuBLASLt has
// no algorithm for it. `workspace`:
// kFp8GemmLtWorkspace bytes on the device, 256-byte aligned.
bool launch_fp8_gemm_lt(const Fp8GemmParams& p, void* workspace, cudaStream_t stream);
// Makes this thread's cuBLASLt handle for the current GPU now, not at its first product.
void prepare_fp8_gemm_lt();

}  // namespace dsi::cuda
