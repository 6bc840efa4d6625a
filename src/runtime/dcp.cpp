// DCP top-k merge and attention combine; see dcp.h and docs/parallelism.md.
// Exactness of the merge: a member of the global top-k has at most k-1 better keys anywhere, so at
// most k-1 better keys on its owner, so it is in its owner's local top-k. The merge then picks
// the k best candidates by the same total order as a single rank would.
#include "runtime/dcp.h"

#include "ops/dcp_exchange.h"
#include "ops/kv_fp8.h"
#include "ops/mla.h"
#include "ops/topk.h"

namespace dsi {

namespace {

// Sparse attention over the latent pool, whichever way it stores its rows (f32, bf16 or fp8).
void attend(const Tensor& q, const Tensor& kv, const Tensor& selected, float softmax_scale, int dv,
            Tensor& out, Tensor& lse, bool settled) {
  if (kv.dtype() == DType::U8)
    ops::sparse_mla_fp8(q, kv, selected, softmax_scale, dv, out, lse, settled);
  else
    ops::sparse_mla(q, kv, selected, softmax_scale, dv, out, lse);
}

ops::DcpPlace place_of(const DcpLayout& L) { return {L.size, L.rank, L.interleave}; }

// A contiguous tensor's words as i32 (the exchange moves f32 and i32 parts in one buffer).
Tensor words_of(const Tensor& t) {
  return Tensor::wrap(t.raw(), {t.numel()}, DType::I32, t.device(), t.storage());
}

}  // namespace

Tensor dcp_exchange(const RankContext& rc, const Tensor& q, const Tensor* scores,
                    const Tensor& bounds, int k, DcpTopk* topk) {
  DSI_CHECK((scores == nullptr) == (topk == nullptr), "dcp_exchange: scores and topk go together");
  const DcpLayout& L = rc.dcp;
  const int W = L.size;
  const Device dev = q.device();
  const int64_t n = q.dim(0), hl = q.dim(1), dk = q.dim(2);
  if (topk != nullptr) *topk = DcpTopk{};  // a new selection: its slots are made afresh
  if (W == 1) {
    if (scores != nullptr) {
      topk->local = Tensor::empty({n, k}, DType::I32, dev);
      ops::topk(*scores, bounds, k, topk->local, nullptr);
      topk->global = topk->local;  // with one rank, local slots are global positions
    }
    return q;
  }
  // This member's words: [candidates (n k 2 i32) | queries (n hl dk f32)].
  const int64_t A = scores != nullptr ? n * k * 2 : 0, Q = n * hl * dk;
  Tensor send = Tensor::empty({A + Q}, DType::I32, dev);
  if (scores != nullptr) {
    Tensor idx = Tensor::empty({n, k}, DType::I32, dev);
    Tensor val = Tensor::empty({n, k}, DType::F32, dev);
    ops::topk(*scores, bounds, k, idx, &val);
    Tensor packed = Tensor::empty({n, k, 2}, DType::I32, dev);
    ops::dcp_pack_candidates(idx, val, place_of(L), packed);
    Tensor dst = send.narrow(0, 0, A);
    dst.copy_from(packed.view({A}));
  }
  if (Q > 0) {
    Tensor qc = q;
    if (!q.is_contiguous()) {
      qc = Tensor::empty(q.shape(), DType::F32, dev);
      qc.copy_from(q);
    }
    Tensor qdst = send.narrow(0, A, Q);
    qdst.copy_from(words_of(qc));
  }
  Tensor recv = Tensor::empty({W * (A + Q)}, DType::I32, dev);
  rc.comm->all_gather(rc.dcp_group, send, recv);
  const Tensor per_member = recv.view({W, A + Q});
  if (scores != nullptr) {
    // (score bits, global position) pairs of every member; the same merge on every member.
    Tensor gathered = Tensor::empty({W * n, k, 2}, DType::I32, dev);
    Tensor g2 = gathered.view({W, A});
    g2.copy_from(per_member.narrow(1, 0, A));
    Tensor cand_scores = Tensor::empty({n, W * int64_t(k)}, DType::F32, dev);
    Tensor cand_pos = Tensor::empty({n, W * int64_t(k)}, DType::I32, dev);
    ops::dcp_unpack_candidates(gathered, W, cand_scores, cand_pos);
    topk->global = Tensor::empty({n, k}, DType::I32, dev);
    ops::topk_merge(cand_scores, cand_pos, k, topk->global);
    topk->local = Tensor::empty({n, k}, DType::I32, dev);
    ops::dcp_localize(topk->global, place_of(L), topk->local);
  }
  Tensor q_all = Tensor::empty({n, W * hl, dk}, DType::F32, dev);
  if (Q > 0) {
    Tensor q_members = Tensor::empty({W * n, hl, dk}, DType::F32, dev);
    Tensor q2 = words_of(q_members).view({W, Q});
    q2.copy_from(per_member.narrow(1, A, Q));
    ops::dcp_member_heads(q_members, W, q_all);
  }
  return q_all;
}

DcpTopk dcp_topk(const RankContext& rc, const Tensor& scores, const Tensor& bounds, int k) {
  // The candidates alone: an exchange with no query rows.
  DcpTopk out;
  const Tensor none = Tensor::empty({scores.dim(0), 0, 0}, DType::F32, scores.device());
  (void)dcp_exchange(rc, none, &scores, bounds, k, &out);
  return out;
}

Tensor dcp_attend(const RankContext& rc, const Tensor& q_all, const Tensor& kv,
                  const Tensor& selected, float softmax_scale, int dv, bool settled) {
  const int W = rc.dcp.size;
  const int64_t n = q_all.dim(0), H = q_all.dim(1), hl = H / W;
  const Device dev = q_all.device();
  DSI_CHECK(H % W == 0, "dcp_attend: {} heads over {} members", H, W);
  Tensor o_lat = Tensor::empty({n, hl, dv}, DType::F32, dev);
  if (W == 1) {
    Tensor lse = Tensor::empty({n, hl}, DType::F32, dev);
    attend(q_all, kv, selected, softmax_scale, dv, o_lat, lse, settled);
    return o_lat;
  }
  // Attend over this rank's own selected keys for all H heads: partial out and LSE.
  Tensor part = Tensor::empty({n, H, dv}, DType::F32, dev);
  Tensor lse = Tensor::empty({n, H}, DType::F32, dev);
  attend(q_all, kv, selected, softmax_scale, dv, part, lse, settled);
  if (rc.cfg.combine == DcpCombine::kAgRs) {
    // All-gather the LSEs; scale this rank's partials by exp(lse - logsumexp over members), then
    // reduce-scatter by head group: chunk m = [n, hl, dv] of member m's heads.
    Tensor lse_all = Tensor::empty({W * n, H}, DType::F32, dev);
    rc.comm->all_gather(rc.dcp_group, lse, lse_all);
    Tensor chunks = Tensor::empty({W * n, hl, dv}, DType::F32, dev);
    ops::dcp_scale_partials(part, lse, lse_all, W, chunks);
    rc.comm->reduce_scatter(rc.dcp_group, chunks, o_lat);
    return o_lat;
  }
  // a2a: send member m its heads' partials with their LSE appended; combine what comes back.
  Tensor send = Tensor::empty({W * n, hl, dv + 1}, DType::F32, dev);
  ops::dcp_a2a_pack(part, lse, W, send);
  Tensor recv = Tensor::empty({W * n, hl, dv + 1}, DType::F32, dev);
  rc.comm->all_to_all(rc.dcp_group, send, recv);
  ops::dcp_a2a_combine(recv, W, o_lat);
  return o_lat;
}

Tensor dcp_sparse_attention(const RankContext& rc, const Tensor& q, const Tensor& kv,
                            const Tensor& selected, float softmax_scale, int dv) {
  return dcp_attend(rc, dcp_exchange(rc, q, nullptr, Tensor(), 0, nullptr), kv, selected,
                    softmax_scale, dv);
}

}  // namespace dsi
