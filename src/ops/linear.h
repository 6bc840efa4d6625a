// Linear layers y = x W^T with weights in their checkpoint dtype: f32, bf16, f16, or fp8 e4m3 with
// 128x128 block scales (W = W8 * scale_inv[i / block_out, j / block_in], DeepSeek's recipe).
#pragma once

#include "core/tensor.h"

namespace dsi {

struct LinearWeight {
  Tensor weight;     // [out, in]: F32, BF16, F16 or F8_E4M3
  Tensor scale_inv;  // [ceil(out / block_out), ceil(in / block_in)] F32; only with F8_E4M3
  int block_out = 128;
  int block_in = 128;
  // When `weight` is a tensor-parallel slice that starts inside a scale block: the slice's offset
  // in its first block (0 <= row0 < block_out), so row r uses scale row (row0 + r) / block_out.
  int64_t row0 = 0;
  int64_t col0 = 0;

  bool defined() const { return weight.defined(); }
  int64_t out_features() const { return weight.dim(0); }
  int64_t in_features() const { return weight.dim(1); }
};

namespace ops {

// y = x W^T. x: [n, in] f32 (strided rows ok); out: [n, out] f32 contiguous.
void linear(const Tensor& x, const LinearWeight& w, Tensor& out);

// y = rms_norm(x, norm_w, eps) W^T (ops/norm.h's RMSNorm, then linear): x itself is left as it is.
// On the GPU one kernel where the one-row tensor-map GEMV takes the product (the norm in its
// prologue, the same numerics up to the order of the sum of squares); else the two ops.
// x: [n, in] f32 (strided rows ok); norm_w: [in] f32; out: [n, out] f32 contiguous.
void rms_norm_linear(const Tensor& x, const Tensor& norm_w, float eps, const LinearWeight& w, Tensor& out);
// Whether rms_norm_linear runs as one kernel for these operands (and a contiguous output): where it
// does not, a caller with several products of the same normed x normalises it once instead.
bool rms_norm_linear_fuses(const Tensor& x, const Tensor& norm_w, const LinearWeight& w);

// The weight's own checks, the same on every backend (a backend adds where its tensors live):
// a contiguous [out, in]; an F8_E4M3 weight has contiguous F32 block scales of the shape its
// blocks and slice offsets give, and offsets inside the first block.
void check_linear_weight(const LinearWeight& w);

// Dequantises rows [row_begin, row_end) of W to fp32 (host); out: [row_end - row_begin, in].
Tensor dequantize_rows(const LinearWeight& w, int64_t row_begin, int64_t row_end);

// The host's products of many rows run on one pool of BLAS threads per process (up to 8 rows, a
// decode step's or an MTP verification's, stay on their rank's thread: cpu/linear.cpp). When
// ranks_on_host ranks share this host's cores (thread ranks, or mpirun processes on one node),
// each rank's products take cores / ranks_on_host threads of it (at least one): more would spin
// against the other ranks'. OPENBLAS_NUM_THREADS, when set, is left to rule.
void share_host_cores(int ranks_on_host);

// y = x W^T in DeepSeek V3's fp8 recipe, for F8_E4M3 weights with block scales: each row of x is
// quantised to e4m3 per weight column block (block_in columns aligned with the weight's blocks, so
// the first is partial when col0 > 0) with the fp32 scale amax / 448 (DeepSeek's act_quant; an
// all-zero group gets scale 1, a NaN gives a NaN scale), then
//   y[i, o] = sum_g (sum_{j in g} x8[i, j] w8[o, j]) * (sx[i, g] * scale_inv[(row0 + o) / block_out, g]).
// The quantisation costs about 1e-3 normalised MSE against linear(). x: [n, in] f32 (strided rows
// ok); out: [n, out] f32 (strided rows ok).
void linear_fp8_act(const Tensor& x, const LinearWeight& w, Tensor& out);

// The activation quantisation of linear_fp8_act on its own. x: [n, in] f32; q: [n, in] F8_E4M3
// contiguous; scales: [n, ceil((col0 + in) / block)] F32 contiguous.
void quantize_act_fp8(const Tensor& x, int64_t col0, int block, Tensor& q, Tensor& scales);

}  // namespace ops
}  // namespace dsi
