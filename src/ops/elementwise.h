// Small element-wise ops: residual add, SiLU-and-multiply, embedding gather.
#pragma once

#include "core/tensor.h"

namespace dsi::ops {

// dst = src (same shape and dtype; any strides). Used to place values into cache rows and buffers.
void copy(const Tensor& src, Tensor& dst);
// a *= scale. a: [n, d] f32.
void scale_inplace(Tensor& a, float scale);

// a += b. a, b: [n, d] f32 (same shape).
void add_inplace(Tensor& a, const Tensor& b);
// a += scale * b (used for weighted expert outputs). a, b: [n, d] f32.
void axpy_inplace(Tensor& a, const Tensor& b, float scale);

// out = silu(gate) * up. gate, up: [n, f] f32 (strided rows ok); out: [n, f] f32.
void silu_mul(const Tensor& gate, const Tensor& up, Tensor& out);

// out[i] = table[ids[i]]. table: [vocab, d] F32/BF16/F16; ids: [n] i32 (checked < vocab);
// out: [n, d] f32.
void embedding(const Tensor& table, const Tensor& ids, Tensor& out);

}  // namespace dsi::ops
