// Normalisation ops: RMSNorm (all MLA/decoder norms) and LayerNorm (the indexer's k_norm).
// Both compute in fp32 (HF GlmMoeDsaRMSNorm / nn.LayerNorm semantics).
#pragma once

#include "core/tensor.h"

namespace dsi::ops {

// out[i] = x[i] / sqrt(mean(x[i]^2) + eps) * weight.
// x: [n, d] f32, rows may be strided (last dim contiguous); weight: [d] f32; out: [n, d] f32.
void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out);

// The residual add and the norm that follows it (one kernel on the GPU): h += delta, then
// out = rms_norm(h) — the same bits as ops::add_inplace then ops::rms_norm. h, delta: [n, d] f32
// (strided rows ok); out: [n, d] f32, may be h itself.
void add_rms_norm(Tensor& h, const Tensor& delta, const Tensor& weight, float eps, Tensor& out);

// out[i] = (x[i] - mean) / sqrt(var + eps) * weight + bias (biased variance, as nn.LayerNorm).
// x: [n, d] f32 (strided rows ok); weight, bias: [d] f32; out: [n, d] f32.
void layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps, Tensor& out);

}  // namespace dsi::ops
