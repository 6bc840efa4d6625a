// Decode context parallelism: the two places where the ranks of a DCP group, each holding 1/W of
// every request's keys, act as one. (1) The exact global top-k of the lightning indexer: local
// top-k, all-gather of (score, global position), the same merge on every rank. (2) Sparse attention
// over each rank's own selected keys for the group's queries, combined across the group with LSE
// correction, by all-gather + reduce-scatter ("ag_rs") or all-to-all ("a2a"). With W = 1 both are
// the plain single-rank ops.
//
// A layer runs them as dcp_exchange (one all-gather carrying the queries and, on layers with their
// own indexer, the top-k candidates) then dcp_attend (the combine: 2 collectives for ag_rs, 1 for
// a2a), so a layer makes 2 or 3 DCP collectives (1 or 2 on layers sharing a selection).
#pragma once

#include "core/tensor.h"
#include "runtime/parallel.h"

namespace dsi {

struct DcpTopk {
  Tensor local;   // [n, k] i32: this rank's winners as its local token indices, -1 elsewhere
  Tensor global;  // [n, k] i32: every winner as a global position, ascending, -1 padded
  Tensor slots;   // [n, k] i32: `local` as pool slots (every layer's pool pages alike), made by the
                  // first layer that attends with this selection and reused by the "shared" ones
};

// scores: [n, n_local_keys] f32 indexer logits over this rank's keys; bounds: [n] i32, each row's
// causal bound localised (keys [0, bounds[i]) are visible). Every member of the DCP group must call
// this with the same n and k, also when it owns no key (then it contributes only empty candidates).
DcpTopk dcp_topk(const RankContext& rc, const Tensor& scores, const Tensor& bounds, int k);

// The exchange before attention, one all-gather over the DCP group: this member's absorbed queries
// q [n, hl, dk] and, when `scores` is given, its local top-k candidates over them (as dcp_topk;
// `topk` receives the merged selection). Returns the group's queries [n, W * hl, dk], member m's
// heads at [m * hl, (m + 1) * hl); with W = 1, q (and a plain top-k).
Tensor dcp_exchange(const RankContext& rc, const Tensor& q, const Tensor* scores,
                    const Tensor& bounds, int k, DcpTopk* topk);

// Attention of the group's queries q_all [n, W * hl, dk] over this rank's selected keys, combined
// across the group: o_lat [n, hl, dv] for this rank's heads. settled: the op issued right before
// writes neither kv nor selected (ops::sparse_mla_fp8's scheduling hint).
Tensor dcp_attend(const RankContext& rc, const Tensor& q_all, const Tensor& kv,
                  const Tensor& selected, float softmax_scale, int dv, bool settled = false);

// q: [n, Hl, dk] absorbed queries of this rank's heads; kv: [n_slots, dk] this rank's latent
// pool; selected: [n, k] i32 pool slots of the row's winners this rank owns (-1 = none). Returns o_lat [n, Hl, dv] for this rank's
// heads: softmax attention over the union of the group's selected keys (dcp_exchange of the
// queries alone, then dcp_attend).
Tensor dcp_sparse_attention(const RankContext& rc, const Tensor& q, const Tensor& kv,
                            const Tensor& selected, float softmax_scale, int dv);

}  // namespace dsi
