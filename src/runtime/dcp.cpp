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
            Tensor& out, Tensor& lse) {
  if (kv.dtype() == DType::U8)
    ops::sparse_mla_fp8(q, kv, selected, softmax_scale, dv, out, lse);
  else
    ops::sparse_mla(q, kv, selected, softmax_scale, dv, out, lse);
}

ops::DcpPlace place_of(const DcpLayout& L) { return {L.size, L.rank, L.interleave}; }

}  // namespace

DcpTopk dcp_topk(const RankContext& rc, const Tensor& scores, const Tensor& bounds, int k) {
  const int64_t n = scores.dim(0);
  const DcpLayout& L = rc.dcp;
  const Device dev = scores.device();
  DcpTopk out;
  out.local = Tensor::empty({n, k}, DType::I32, dev);
  if (L.size == 1) {
    ops::topk(scores, bounds, k, out.local, nullptr);
    out.global = out.local;  // with one rank, local slots are global positions
    return out;
  }
  Tensor idx = Tensor::empty({n, k}, DType::I32, dev);
  Tensor val = Tensor::empty({n, k}, DType::F32, dev);
  ops::topk(scores, bounds, k, idx, &val);
  // (score bits, global position) pairs of every member, gathered; the same merge on every member.
  Tensor packed = Tensor::empty({n, k, 2}, DType::I32, dev);
  ops::dcp_pack_candidates(idx, val, place_of(L), packed);
  Tensor gathered = Tensor::empty({L.size * n, k, 2}, DType::I32, dev);
  rc.comm->all_gather(rc.dcp_group, packed, gathered);
  Tensor cand_scores = Tensor::empty({n, L.size * int64_t(k)}, DType::F32, dev);
  Tensor cand_pos = Tensor::empty({n, L.size * int64_t(k)}, DType::I32, dev);
  ops::dcp_unpack_candidates(gathered, L.size, cand_scores, cand_pos);
  out.global = Tensor::empty({n, k}, DType::I32, dev);
  ops::topk_merge(cand_scores, cand_pos, k, out.global);
  ops::dcp_localize(out.global, place_of(L), out.local);
  return out;
}

Tensor dcp_sparse_attention(const RankContext& rc, const Tensor& q, const Tensor& kv,
                            const Tensor& selected, float softmax_scale, int dv) {
  const int64_t n = q.dim(0), hl = q.dim(1), dk = q.dim(2);
  const int W = rc.dcp.size;
  const Device dev = q.device();
  Tensor o_lat = Tensor::empty({n, hl, dv}, DType::F32, dev);
  if (W == 1) {
    Tensor lse = Tensor::empty({n, hl}, DType::F32, dev);
    attend(q, kv, selected, softmax_scale, dv, o_lat, lse);
    return o_lat;
  }
  // 1. All-gather the group's queries along heads: member m's heads become [m*hl, (m+1)*hl).
  Tensor qc = q;
  if (!q.is_contiguous()) {
    qc = Tensor::empty(q.shape(), DType::F32, dev);
    qc.copy_from(q);
  }
  Tensor gathered = Tensor::empty({W * n, hl, dk}, DType::F32, dev);
  rc.comm->all_gather(rc.dcp_group, qc, gathered);
  const int64_t H = W * hl;
  Tensor q_all = Tensor::empty({n, H, dk}, DType::F32, dev);
  ops::dcp_member_heads(gathered, W, q_all);
  // 2. Attend over this rank's own selected keys for all H heads: partial out and LSE.
  Tensor part = Tensor::empty({n, H, dv}, DType::F32, dev);
  Tensor lse = Tensor::empty({n, H}, DType::F32, dev);
  attend(q_all, kv, selected, softmax_scale, dv, part, lse);

  if (rc.cfg.combine == DcpCombine::kAgRs) {
    // 3. All-gather the LSEs; scale this rank's partials by exp(lse - logsumexp over members).
    Tensor lse_all = Tensor::empty({W * n, H}, DType::F32, dev);
    rc.comm->all_gather(rc.dcp_group, lse, lse_all);
    // 4. Reduce-scatter by head group: chunk m = [n, hl, dv] of member m's heads.
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

}  // namespace dsi
