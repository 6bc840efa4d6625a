// DCP top-k merge and attention combine; see dcp.h and docs/parallelism.md.
// Exactness of the merge: a member of the global top-k has at most k-1 better keys anywhere, so at
// most k-1 better keys on its owner, so it is in its owner's local top-k. The merge then picks
// the k best candidates by the same total order as a single rank would.
#include "runtime/dcp.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "ops/kv_fp8.h"
#include "ops/mla.h"
#include "ops/topk.h"

namespace dsi {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// log(sum_i exp(v_i)) over `n` values spaced `stride` apart; -inf when all are -inf.
float logsumexp(const float* v, int n, int64_t stride) {
  float m = kNegInf;
  for (int i = 0; i < n; ++i) m = std::max(m, v[i * stride]);
  if (m == kNegInf) return kNegInf;
  float s = 0.0f;
  for (int i = 0; i < n; ++i) s += std::exp(v[i * stride] - m);
  return m + std::log(s);
}

// Sparse attention over the latent pool, whichever way it stores its rows (f32 or fp8 entries).
void attend(const Tensor& q, const Tensor& kv, const Tensor& selected, float softmax_scale, int dv,
            Tensor& out, Tensor& lse) {
  if (kv.dtype() == DType::U8)
    ops::sparse_mla_fp8(q, kv, selected, softmax_scale, dv, out, lse);
  else
    ops::sparse_mla(q, kv, selected, softmax_scale, dv, out, lse);
}

// The weight of a partial result with log-sum-exp `lse` in a total with log-sum-exp `total`.
float lse_factor(float lse, float total) {
  return (lse == kNegInf || total == kNegInf) ? 0.0f : std::exp(lse - total);
}

}  // namespace

DcpTopk dcp_topk(const RankContext& rc, const Tensor& scores, const Tensor& bounds, int k) {
  const int64_t n = scores.dim(0);
  DSI_CHECK(rc.dcp.size == 1 || scores.device().is_cpu(),
            "decode context parallelism on {}: not supported yet", scores.device().str());
  const DcpLayout& L = rc.dcp;
  DcpTopk out;
  out.local = Tensor::empty({n, k}, DType::I32, scores.device());
  if (L.size == 1) {
    ops::topk(scores, bounds, k, out.local, nullptr);
    out.global = out.local;  // with one rank, local slots are global positions
    return out;
  }
  Tensor idx = Tensor::empty({n, k}, DType::I32);
  Tensor val = Tensor::empty({n, k}, DType::F32);
  ops::topk(scores, bounds, k, idx, &val);
  // Pack (score bits, global position) pairs: [n, k, 2] i32, (-inf, -1) for empty slots.
  Tensor packed = Tensor::empty({n, k, 2}, DType::I32);
  for (int64_t i = 0; i < n * k; ++i) {
    const int32_t l = idx.i32()[i];
    std::memcpy(&packed.i32()[2 * i], &val.f32()[i], 4);
    packed.i32()[2 * i + 1] = l < 0 ? -1 : int32_t(L.global(l));
  }
  Tensor gathered = Tensor::empty({L.size * n, k, 2}, DType::I32);
  rc.comm->all_gather(rc.dcp_group, packed, gathered);
  // Candidates of row i: the k pairs of every member, [n, W * k].
  Tensor cand_scores = Tensor::empty({n, L.size * int64_t(k)}, DType::F32);
  Tensor cand_pos = Tensor::empty({n, L.size * int64_t(k)}, DType::I32);
  for (int m = 0; m < L.size; ++m)
    for (int64_t i = 0; i < n; ++i)
      for (int j = 0; j < k; ++j) {
        const int32_t* src = gathered.i32() + ((m * n + i) * k + j) * 2;
        const int64_t dst = i * L.size * k + m * k + j;
        std::memcpy(&cand_scores.f32()[dst], &src[0], 4);
        cand_pos.i32()[dst] = src[1];
      }
  out.global = Tensor::empty({n, k}, DType::I32);
  ops::topk_merge(cand_scores, cand_pos, k, out.global);
  for (int64_t i = 0; i < n * k; ++i) {
    const int32_t p = out.global.i32()[i];
    out.local.i32()[i] = (p >= 0 && L.owns(p)) ? int32_t(L.local(p)) : -1;
  }
  return out;
}

Tensor dcp_sparse_attention(const RankContext& rc, const Tensor& q, const Tensor& kv,
                            const Tensor& selected, float softmax_scale, int dv) {
  const int64_t n = q.dim(0), hl = q.dim(1), dk = q.dim(2);
  const int W = rc.dcp.size;
  Tensor o_lat = Tensor::empty({n, hl, dv}, DType::F32, q.device());
  if (W == 1) {
    Tensor lse = Tensor::empty({n, hl}, DType::F32, q.device());
    attend(q, kv, selected, softmax_scale, dv, o_lat, lse);
    return o_lat;
  }
  // 1. All-gather the group's queries along heads: member m's heads become [m*hl, (m+1)*hl).
  Tensor qc = q.is_contiguous() ? q : q.contiguous();
  Tensor gathered = Tensor::empty({W * n, hl, dk}, DType::F32);
  rc.comm->all_gather(rc.dcp_group, qc, gathered);
  const int64_t H = W * hl;
  Tensor q_all = Tensor::empty({n, H, dk}, DType::F32);
  for (int m = 0; m < W; ++m)
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(q_all.f32() + (i * H + m * hl) * dk, gathered.f32() + (m * n + i) * hl * dk,
                  sizeof(float) * size_t(hl * dk));
  // 2. Attend over this rank's own selected keys for all H heads: partial out and LSE.
  Tensor part = Tensor::empty({n, H, dv}, DType::F32);
  Tensor lse = Tensor::empty({n, H}, DType::F32);
  attend(q_all, kv, selected, softmax_scale, dv, part, lse);

  if (rc.cfg.combine == DcpCombine::kAgRs) {
    // 3. All-gather the LSEs; scale this rank's partials by exp(lse - logsumexp over members).
    Tensor lse_all = Tensor::empty({W * n, H}, DType::F32);
    rc.comm->all_gather(rc.dcp_group, lse, lse_all);
    // 4. Reduce-scatter by head group: chunk m = [n, hl, dv] of member m's heads.
    Tensor chunks = Tensor::empty({W, n, hl, dv}, DType::F32);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t h = 0; h < H; ++h) {
        const float total = logsumexp(lse_all.f32() + i * H + h, W, n * H);
        const float f = lse_factor(lse.f32()[i * H + h], total);
        const float* src = part.f32() + (i * H + h) * dv;
        float* dst = chunks.f32() + (((h / hl) * n + i) * hl + h % hl) * dv;
        for (int c = 0; c < dv; ++c) dst[c] = src[c] * f;
      }
    Tensor flat = chunks.view({W * n, hl, dv});
    rc.comm->reduce_scatter(rc.dcp_group, flat, o_lat);
    return o_lat;
  }
  // a2a: send member m its heads' partials with their LSE appended; combine what comes back.
  const int64_t row = dv + 1;
  Tensor send = Tensor::empty({W * n, hl, row}, DType::F32);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t h = 0; h < H; ++h) {
      float* dst = send.f32() + (((h / hl) * n + i) * hl + h % hl) * row;
      std::memcpy(dst, part.f32() + (i * H + h) * dv, sizeof(float) * size_t(dv));
      dst[dv] = lse.f32()[i * H + h];
    }
  Tensor recv = Tensor::empty({W * n, hl, row}, DType::F32);
  rc.comm->all_to_all(rc.dcp_group, send, recv);
  std::vector<float> lses(static_cast<size_t>(W));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t h = 0; h < hl; ++h) {
      const auto at = [&](int m) { return recv.f32() + ((m * n + i) * hl + h) * row; };
      for (int m = 0; m < W; ++m) lses[size_t(m)] = at(m)[dv];
      const float total = logsumexp(lses.data(), W, 1);
      float* o = o_lat.f32() + (i * hl + h) * dv;
      // Same arithmetic and member order as ag_rs: (partial * factor), summed from member 0.
      for (int c = 0; c < dv; ++c) o[c] = at(0)[c] * lse_factor(lses[0], total);
      for (int m = 1; m < W; ++m) {
        const float f = lse_factor(lses[size_t(m)], total);
        for (int c = 0; c < dv; ++c) o[c] += at(m)[c] * f;
      }
    }
  return o_lat;
}

}  // namespace dsi
