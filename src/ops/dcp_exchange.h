// The data movement around decode context parallelism's collectives (runtime/dcp.cpp), as ops so
// that it runs where the tensors live: packing and unpacking the top-k candidates of the exact
// global top-k, mapping winners back to a rank's own keys, regrouping the members' query heads, and
// the LSE-corrected combine of partial attention (ag_rs and a2a forms). Layout of a DCP group:
// W members; owner(p) = (p / I) % W, local(p) = (p / (W I)) I + p % I (runtime/parallel.h).
#pragma once

#include "core/tensor.h"

namespace dsi::ops {

struct DcpPlace {
  int size = 1;        // W
  int rank = 0;        // this member
  int interleave = 1;  // I
};

// packed[i, j] = (bits of val[i, j], global position of this member's local key idx[i, j]);
// idx = -1 gives (bits of -inf, -1). idx: [n, k] i32; val: [n, k] f32; packed: [n, k, 2] i32.
void dcp_pack_candidates(const Tensor& idx, const Tensor& val, const DcpPlace& place, Tensor& packed);
// gathered: [W * n, k, 2] i32, member-major (member m's rows [m n, (m + 1) n)) -> scores [n, W k]
// f32 and positions [n, W k] i32 (member m's candidates at columns [m k, (m + 1) k)).
void dcp_unpack_candidates(const Tensor& gathered, int W, Tensor& scores, Tensor& positions);
// local = this member's local index of each global position it owns, -1 elsewhere (and for -1).
// global, local: [n, k] i32.
void dcp_localize(const Tensor& global, const DcpPlace& place, Tensor& local);
// out[i, m * hl + h, :] = in[m * n + i, h, :]. in: [W * n, hl, d] f32; out: [n, W * hl, d] f32.
void dcp_member_heads(const Tensor& in, int W, Tensor& out);
// ag_rs: each member's partial output scaled by its share of the total softmax mass, laid out by
// the member that owns the heads: chunks[m * n + i, h, :] = part[i, m * hl + h, :] *
// exp(lse[i, m * hl + h] - logsumexp over members w of lse_all[w * n + i, m * hl + h]).
// part: [n, H, dv]; lse: [n, H]; lse_all: [W * n, H]; chunks: [W * n, H / W, dv], all f32.
void dcp_scale_partials(const Tensor& part, const Tensor& lse, const Tensor& lse_all, int W,
                        Tensor& chunks);
// a2a: send[m * n + i, h, :dv] = part[i, m * hl + h, :], send[m * n + i, h, dv] = lse[i, m hl + h].
// part: [n, H, dv]; lse: [n, H]; send: [W * n, H / W, dv + 1] f32.
void dcp_a2a_pack(const Tensor& part, const Tensor& lse, int W, Tensor& send);
// out[i, h, :] = sum over members m (from 0) of recv[m n + i, h, :dv] * exp(recv[m n + i, h, dv]
// - logsumexp over members). recv: [W * n, hl, dv + 1]; out: [n, hl, dv] f32.
void dcp_a2a_combine(const Tensor& recv, int W, Tensor& out);

}  // namespace dsi::ops
