// Dispatch of the MLA ops; see mla.h.
#include "ops/mla.h"

#include "ops/dispatch.h"

namespace dsi::ops {

void mla_absorb_q(const Tensor& q_nope, const LinearWeight& kv_b, Tensor& out) {
  DSI_DISPATCH(q_nope.device(), mla_absorb_q, q_nope, kv_b, out);
}
void mla_absorbed_queries(const Tensor& q, int64_t nope, const LinearWeight& kv_b, const Tensor& positions,
                          const Tensor& inv_freq, float attention_factor, RopeStyle style, Tensor& out) {
  DSI_DISPATCH(q.device(), mla_absorbed_queries, q, nope, kv_b, positions, inv_freq, attention_factor, style, out);
}
MlaQueryParts mla_query_parts(const Tensor& q, int64_t nope, const Tensor& inv_freq, const Tensor& out) {
  DSI_CHECK(inv_freq.ndim() == 1, "mla_absorbed_queries: inv_freq must be [rot / 2], got {}", inv_freq.desc());
  const int64_t rot = 2 * inv_freq.dim(0);
  DSI_CHECK(q.ndim() == 3 && nope >= 0 && q.dim(2) == nope + rot,
            "mla_absorbed_queries: q {} is not [rows, heads, {} + {}]", q.desc(), nope, rot);
  DSI_CHECK(out.ndim() == 3 && out.dim(0) == q.dim(0) && out.dim(1) == q.dim(1) && out.dim(2) >= rot,
            "mla_absorbed_queries: out {} for q {} ({} rotated dims)", out.desc(), q.desc(), rot);
  return {out.dim(2) - rot, rot};
}
void mla_up_v(const Tensor& o_lat, const LinearWeight& kv_b, Tensor& out) {
  DSI_DISPATCH(o_lat.device(), mla_up_v, o_lat, kv_b, out);
}
int64_t mla_rows_per_head(const LinearWeight& kv_b, int64_t heads, int64_t lora, int64_t part,
                          const char* op) {
  DSI_CHECK(kv_b.defined() && kv_b.weight.ndim() == 2 && kv_b.weight.is_contiguous(),
            "{}: kv_b_proj must be a contiguous [heads * (nope + v), kv_lora] weight", op);
  const int64_t rows = kv_b.out_features();
  DSI_CHECK(heads > 0 && rows % heads == 0 && kv_b.in_features() == lora,
            "{}: kv_b_proj [{}, {}] does not hold {} heads of kv_lora {}", op, rows,
            kv_b.in_features(), heads, lora);
  DSI_CHECK(part >= 0 && part <= rows / heads, "{}: {} of a head's {} kv_b_proj rows", op, part,
            rows / heads);
  return rows / heads;
}
void sparse_mla(const Tensor& q, const Tensor& kv, const Tensor& indices, float softmax_scale,
                int dv, Tensor& out, Tensor& lse) {
  DSI_DISPATCH(q.device(), sparse_mla, q, kv, indices, softmax_scale, dv, out, lse);
}

}  // namespace dsi::ops
