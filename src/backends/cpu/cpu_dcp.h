// CPU reference of the DCP exchange ops (ops/dcp_exchange.h).
#pragma once

#include "ops/dcp_exchange.h"

namespace dsi::cpu {

void dcp_pack_candidates(const Tensor& idx, const Tensor& val, const ops::DcpPlace& place,
                         Tensor& packed);
void dcp_unpack_candidates(const Tensor& gathered, int W, Tensor& scores, Tensor& positions);
void dcp_localize(const Tensor& global, const ops::DcpPlace& place, Tensor& local);
void dcp_member_heads(const Tensor& in, int W, Tensor& out);
void dcp_scale_partials(const Tensor& part, const Tensor& lse, const Tensor& lse_all, int W,
                        Tensor& chunks);
void dcp_a2a_pack(const Tensor& part, const Tensor& lse, int W, Tensor& send);
void dcp_a2a_combine(const Tensor& recv, int W, Tensor& out);

// Shape checks shared with the CUDA backend; return the sizes the ops loop over.
struct DcpDims {
  int64_t n = 0, k = 0, hl = 0, d = 0;
};
DcpDims check_pack(const Tensor& idx, const Tensor& val, const Tensor& packed);
DcpDims check_unpack(const Tensor& gathered, int W, const Tensor& scores, const Tensor& positions);
DcpDims check_member_heads(const Tensor& in, int W, const Tensor& out);
DcpDims check_scale(const Tensor& part, const Tensor& lse, const Tensor& lse_all, int W,
                    const Tensor& chunks);
DcpDims check_a2a_pack(const Tensor& part, const Tensor& lse, int W, const Tensor& send);
DcpDims check_a2a_combine(const Tensor& recv, int W, const Tensor& out);

}  // namespace dsi::cpu
