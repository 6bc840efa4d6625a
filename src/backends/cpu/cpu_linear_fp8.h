// CPU reference of the fp8-activation linear (DeepSeek V3's fp8 GEMM recipe): activations quantised
// per token per weight column block to e4m3 with an fp32 scale amax / 448, then x8 W8^T with both
// scales applied in fp32 per block. Declared apart from cpu_ops.h; dispatched by ops/linear.cpp.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace dsi {
struct LinearWeight;
}

namespace dsi::cpu {

// Quantises x [n, in] f32 (strided rows ok) per row in column groups aligned with a weight's column
// blocks: group g holds the columns j with (col0 + j) / block == g (the first group is partial when
// col0 > 0). q: [n, in] F8_E4M3 contiguous; scales: [n, ceil((col0 + in) / block)] F32 contiguous.
// scale = amax / 448 (fp32 division; 1 when that is 0), q = e4m3(x / scale) rounded to nearest
// even and saturated. A NaN in a group makes its scale NaN, an infinity makes it +inf.
void quantize_act_fp8(const Tensor& x, int64_t col0, int block, Tensor& q, Tensor& scales);

// y = x W^T with x quantised as above against w's column blocks (w: F8_E4M3 with scale_inv):
// y[i, o] = sum_g (sum_{j in g} q[i, j] * w8[o, j]) * (sx[i, g] * sw[(row0 + o) / block_out, g]),
// the inner sums over exact e4m3 products in fp32, in increasing j. x: [n, in] f32 (strided rows
// ok); out: [n, out] f32 (strided rows ok).
void linear_fp8_act(const Tensor& x, const LinearWeight& w, Tensor& out);

}  // namespace dsi::cpu
