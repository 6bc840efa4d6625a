// Dispatch of the DCP exchange ops; see dcp_exchange.h.
#include "ops/dcp_exchange.h"

#include "backends/cpu/cpu_dcp.h"
#include "ops/dispatch.h"

#ifdef DSI_WITH_CUDA
#include "backends/cuda/cuda_dcp.h"
#endif

namespace dsi::ops {

void dcp_pack_candidates(const Tensor& idx, const Tensor& val, const DcpPlace& place, Tensor& packed) {
  DSI_DISPATCH(packed.device(), dcp_pack_candidates, idx, val, place, packed);
}
void dcp_unpack_candidates(const Tensor& gathered, int W, Tensor& scores, Tensor& positions) {
  DSI_DISPATCH(scores.device(), dcp_unpack_candidates, gathered, W, scores, positions);
}
void dcp_localize(const Tensor& global, const DcpPlace& place, Tensor& local) {
  DSI_DISPATCH(local.device(), dcp_localize, global, place, local);
}
void dcp_member_heads(const Tensor& in, int W, Tensor& out) {
  DSI_DISPATCH(out.device(), dcp_member_heads, in, W, out);
}
void dcp_scale_partials(const Tensor& part, const Tensor& lse, const Tensor& lse_all, int W,
                        Tensor& chunks) {
  DSI_DISPATCH(chunks.device(), dcp_scale_partials, part, lse, lse_all, W, chunks);
}
void dcp_a2a_pack(const Tensor& part, const Tensor& lse, int W, Tensor& send) {
  DSI_DISPATCH(send.device(), dcp_a2a_pack, part, lse, W, send);
}
void dcp_a2a_combine(const Tensor& recv, int W, Tensor& out) {
  DSI_DISPATCH(out.device(), dcp_a2a_combine, recv, W, out);
}

}  // namespace dsi::ops
