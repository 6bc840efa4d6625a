// Dispatch of the MLA ops; see mla.h.
#include "ops/mla.h"

#include "ops/dispatch.h"

namespace dsi::ops {

void mla_absorb_q(const Tensor& q_nope, const Tensor& w_uk, Tensor& out) {
  DSI_DISPATCH(q_nope.device(), mla_absorb_q, q_nope, w_uk, out);
}
void mla_up_v(const Tensor& o_lat, const Tensor& w_uv, Tensor& out) {
  DSI_DISPATCH(o_lat.device(), mla_up_v, o_lat, w_uv, out);
}
void sparse_mla(const Tensor& q, const Tensor& kv, const Tensor& indices, float softmax_scale,
                int dv, Tensor& out, Tensor& lse) {
  DSI_DISPATCH(q.device(), sparse_mla, q, kv, indices, softmax_scale, dv, out, lse);
}

}  // namespace dsi::ops
