// Multi-head latent attention in the absorbed form (DeepSeek-V2/V3 MLA, dsa-reference.md section 2):
//   Q[h] = [W_UK[h]^T q_nope[h] ; q_pe[h]],  K_s = [c_kv,s ; k_pe,s],  V_s = c_kv,s
//   o_lat[h] = softmax_s(scale * Q[h].K_s) V,  o[h] = W_UV[h] o_lat[h]
// over the sparse key set chosen by the indexer.
#pragma once

#include "core/tensor.h"

namespace dsi::ops {

// out[r, h, :] = W_UK[h]^T q_nope[r, h, :].
// q_nope: [rows, H, nope] f32 (strided ok, last dim contiguous); w_uk: [H, nope, kv_lora] f32;
// out: [rows, H, kv_lora] f32 (strided ok, last dim contiguous).
void mla_absorb_q(const Tensor& q_nope, const Tensor& w_uk, Tensor& out);

// out[r, h, :] = W_UV[h] o_lat[r, h, :].
// o_lat: [rows, H, kv_lora] f32; w_uv: [H, v_head_dim, kv_lora] f32; out: [rows, H, v_head_dim] f32.
void mla_up_v(const Tensor& o_lat, const Tensor& w_uv, Tensor& out);

// Sparse attention over selected cache entries, returning the natural-log LSE of each (row, head).
// q: [rows, H, dk] f32 (absorbed queries, dk = kv_lora + rope); kv: [n_keys, dk] f32 latent cache
// (the value is its first dv dims); indices: [rows, topk] i32 into kv, -1 = empty slot;
// out: [rows, H, dv] f32; lse: [rows, H] f32. A row with no key gets out = 0 and lse = -inf.
void sparse_mla(const Tensor& q, const Tensor& kv, const Tensor& indices, float softmax_scale,
                int dv, Tensor& out, Tensor& lse);

}  // namespace dsi::ops
