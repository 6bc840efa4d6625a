// Multi-head latent attention in the absorbed form (DeepSeek-V2/V3 MLA, dsa-reference.md section 2):
//   Q[h] = [W_UK[h]^T q_nope[h] ; q_pe[h]],  K_s = [c_kv,s ; k_pe,s],  V_s = c_kv,s
//   o_lat[h] = softmax_s(scale * Q[h].K_s) V,  o[h] = W_UV[h] o_lat[h]
// over the sparse key set chosen by the indexer.
#pragma once

#include "core/tensor.h"
#include "model/config.h"
#include "ops/linear.h"

namespace dsi::ops {

// The absorbed form reads its per-head matrices in place from kv_b_proj, in the checkpoint's dtype
// (fp8 with block scales, bf16, f32): kv_b [H * (nope + v), kv_lora], where head h's rows
// [h (nope + v), h (nope + v) + nope) are W_UK[h] ([nope, kv_lora]) and the next v rows W_UV[h]
// ([v, kv_lora]) (HF's kv_b_proj viewed [H, nope + v, kv_lora]; a tensor-parallel slice holds its
// rank's heads). Products and sums in fp32 over exactly dequantised weights.

// out[r, h, :] = W_UK[h]^T q_nope[r, h, :].
// q_nope: [rows, H, nope] f32 (strided ok, last dim contiguous); out: [rows, H, kv_lora] f32
// (strided ok, last dim contiguous); nope < kv_b rows per head.
void mla_absorb_q(const Tensor& q_nope, const LinearWeight& kv_b, Tensor& out);

// MLA's absorbed queries: out[r, h, :kv_lora] = W_UK[h]^T q[r, h, :nope] (mla_absorb_q) and
// out[r, h, kv_lora:] = the rotation of q[r, h, nope:] at positions[r] (rope with `out`), one
// launch on the GPU at decode sizes. q: [rows, H, nope + rot] f32 and out: [rows, H, kv_lora + rot]
// f32 (strided ok, last dims contiguous), rot = 2 inv_freq.dim(0).
void mla_absorbed_queries(const Tensor& q, int64_t nope, const LinearWeight& kv_b, const Tensor& positions,
                          const Tensor& inv_freq, float attention_factor, RopeStyle style, Tensor& out);

// The widths of mla_absorbed_queries' parts, checked: out's kv_lora and the rotated dims (rot).
struct MlaQueryParts {
  int64_t lora, rot;
};
MlaQueryParts mla_query_parts(const Tensor& q, int64_t nope, const Tensor& inv_freq, const Tensor& out);

// out[r, h, :] = W_UV[h] o_lat[r, h, :].
// o_lat: [rows, H, kv_lora] f32 (strided ok, last dim contiguous); out: [rows, H, v] f32 (strided
// ok, last dim contiguous); v <= kv_b rows per head (W_UV[h] is the last v rows of head h).
void mla_up_v(const Tensor& o_lat, const LinearWeight& kv_b, Tensor& out);

// kv_b's rows per head for `heads` heads, checked: kv_b is defined and [heads * per, lora], and
// part (nope or v) fits in a head; throws naming `op` otherwise.
int64_t mla_rows_per_head(const LinearWeight& kv_b, int64_t heads, int64_t lora, int64_t part,
                          const char* op);

// Sparse attention over selected cache entries, returning the natural-log LSE of each (row, head).
// q: [rows, H, dk] f32 (absorbed queries, dk = kv_lora + rope); kv: [n_keys, dk] f32 latent cache
// (the value is its first dv dims); indices: [rows, topk] i32 into kv, -1 = empty slot;
// out: [rows, H, dv] f32; lse: [rows, H] f32. A row with no key gets out = 0 and lse = -inf.
void sparse_mla(const Tensor& q, const Tensor& kv, const Tensor& indices, float softmax_scale,
                int dv, Tensor& out, Tensor& lse);

}  // namespace dsi::ops
