// The DCP exchange ops on CUDA tensors (ops/dcp_exchange.h); no CUDA includes (plain C++ users).
#pragma once

#include "ops/dcp_exchange.h"

namespace dsi::cuda {

void dcp_pack_candidates(const Tensor& idx, const Tensor& val, const ops::DcpPlace& place,
                         Tensor& packed);
void dcp_unpack_candidates(const Tensor& gathered, int W, Tensor& scores, Tensor& positions);
void dcp_localize(const Tensor& global, const ops::DcpPlace& place, Tensor& local);
void dcp_member_heads(const Tensor& in, int W, Tensor& out);
void dcp_scale_partials(const Tensor& part, const Tensor& lse, const Tensor& lse_all, int W,
                        Tensor& chunks);
void dcp_a2a_pack(const Tensor& part, const Tensor& lse, int W, Tensor& send);
void dcp_a2a_combine(const Tensor& recv, int W, Tensor& out);

}  // namespace dsi::cuda
