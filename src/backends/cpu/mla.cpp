// CPU reference: absorbed MLA pieces. Per-head GEMMs through OpenBLAS; the sparse attention is a
// plain two-pass softmax in fp32 over each row's selected keys, returning the natural-log LSE.
#include <cblas.h>

#include <cmath>
#include <limits>
#include <vector>

#include "backends/cpu/cpu_ops.h"
#include "backends/cpu/paging.h"
#include "ops/mla.h"

namespace dsi::cpu {

namespace {

// Rows [begin, begin + count) of kv_b as fp32 [count, lora]: the weight itself when it is fp32,
// else dequantised.
Tensor head_rows(const LinearWeight& kv_b, int64_t begin, int64_t count) {
  if (kv_b.weight.dtype() == DType::F32) return kv_b.weight.narrow(0, begin, count);
  return dequantize_rows(kv_b, begin, begin + count);
}

}  // namespace

void mla_absorb_q(const Tensor& q_nope, const LinearWeight& kv_b, Tensor& out) {
  DSI_CHECK(q_nope.ndim() == 3 && q_nope.stride(2) == 1, "mla_absorb_q: q_nope {}", q_nope.desc());
  const int64_t rows = q_nope.dim(0), heads = q_nope.dim(1), nope = q_nope.dim(2);
  DSI_CHECK(out.ndim() == 3 && out.dim(0) == rows && out.dim(1) == heads && out.stride(2) == 1,
            "mla_absorb_q: out {} for q_nope {}", out.desc(), q_nope.desc());
  const int64_t lora = out.dim(2);
  const int64_t per = ops::mla_rows_per_head(kv_b, heads, lora, nope, "mla_absorb_q");
  if (rows == 0) return;
  for (int64_t h = 0; h < heads; ++h) {
    // out[:, h, :] (rows x lora) = q_nope[:, h, :] (rows x nope) * W_UK[h] (nope x lora)
    const Tensor w_uk = head_rows(kv_b, h * per, nope);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(rows), int(lora), int(nope), 1.0f,
                q_nope.f32() + h * q_nope.stride(1), int(q_nope.stride(0)), w_uk.f32(), int(lora),
                0.0f, out.f32() + h * out.stride(1), int(out.stride(0)));
  }
}

void mla_absorbed_queries(const Tensor& q, int64_t nope, const LinearWeight& kv_b, const Tensor& positions,
                          const Tensor& inv_freq, float attention_factor, RopeStyle style, Tensor& out) {
  const ops::MlaQueryParts parts = ops::mla_query_parts(q, nope, inv_freq, out);
  Tensor lat = out.narrow(2, 0, parts.lora), pe = out.narrow(2, parts.lora, parts.rot);
  mla_absorb_q(q.narrow(2, 0, nope), kv_b, lat);
  Tensor qv = q;
  rope(qv, positions, inv_freq, attention_factor, style, int(nope), &pe);
}

void mla_up_v(const Tensor& o_lat, const LinearWeight& kv_b, Tensor& out) {
  DSI_CHECK(o_lat.ndim() == 3 && o_lat.stride(2) == 1, "mla_up_v: o_lat {}", o_lat.desc());
  const int64_t rows = o_lat.dim(0), heads = o_lat.dim(1), lora = o_lat.dim(2);
  DSI_CHECK(out.ndim() == 3 && out.dim(0) == rows && out.dim(1) == heads && out.stride(2) == 1,
            "mla_up_v: out {} for o_lat {}", out.desc(), o_lat.desc());
  const int64_t dv = out.dim(2);
  const int64_t per = ops::mla_rows_per_head(kv_b, heads, lora, dv, "mla_up_v");
  if (rows == 0) return;
  for (int64_t h = 0; h < heads; ++h) {
    // out[:, h, :] (rows x dv) = o_lat[:, h, :] (rows x lora) * W_UV[h]^T (lora x dv)
    const Tensor w_uv = head_rows(kv_b, h * per + per - dv, dv);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(rows), int(dv), int(lora), 1.0f,
                o_lat.f32() + h * o_lat.stride(1), int(o_lat.stride(0)), w_uv.f32(), int(lora),
                0.0f, out.f32() + h * out.stride(1), int(out.stride(0)));
  }
}

void sparse_mla(const Tensor& q, const Tensor& kv, const Tensor& indices, float softmax_scale,
                int dv, Tensor& out, Tensor& lse) {
  DSI_CHECK(q.ndim() == 3 && q.stride(2) == 1, "sparse_mla: q must be [rows, heads, dk], got {}",
            q.desc());
  const int64_t rows = q.dim(0), heads = q.dim(1), dk = q.dim(2);
  DSI_CHECK(kv.ndim() == 2 && kv.dim(1) == dk && kv.stride(1) == 1, "sparse_mla: kv {} for q {}",
            kv.desc(), q.desc());
  DSI_CHECK(dv > 0 && dv <= dk, "sparse_mla: dv = {} outside (0, {}]", dv, dk);
  DSI_CHECK(indices.ndim() == 2 && indices.dim(0) == rows, "sparse_mla: indices {}", indices.desc());
  check_shape(out, {rows, heads, dv}, "sparse_mla out");
  check_shape(lse, {rows, heads}, "sparse_mla lse");
  DSI_CHECK(indices.is_contiguous() && out.is_contiguous() && lse.is_contiguous(),
            "sparse_mla: indices, out and lse must be contiguous");
  const int64_t topk = indices.dim(1), n_keys = kv.dim(0);
  std::vector<int32_t> sel;
  std::vector<float> score;
  std::vector<const float*> rows_of;  // each selected key's row as f32
  std::vector<float> widened;         // a bf16 cache's selected rows, widened exactly
  for (int64_t r = 0; r < rows; ++r) {
    sel.clear();
    for (int64_t j = 0; j < topk; ++j) {
      const int32_t s = indices.i32()[r * topk + j];
      if (s < 0) continue;
      DSI_CHECK(s < n_keys, "sparse_mla: index {} outside the {} cached keys", s, n_keys);
      sel.push_back(s);
    }
    score.resize(sel.size());
    rows_of.resize(sel.size());
    const bool bf16 = kv.dtype() == DType::BF16;
    if (bf16) widened.resize(sel.size() * size_t(dk));
    for (size_t j = 0; j < sel.size(); ++j)
      rows_of[j] = key_row_f32(kv, sel[j], bf16 ? widened.data() + j * size_t(dk) : nullptr);
    for (int64_t h = 0; h < heads; ++h) {
      const float* qh = q.f32() + r * q.stride(0) + h * q.stride(1);
      float* o = out.f32() + (r * heads + h) * dv;
      std::fill_n(o, dv, 0.0f);
      if (sel.empty()) {
        lse.f32()[r * heads + h] = -std::numeric_limits<float>::infinity();
        continue;
      }
      float m = -std::numeric_limits<float>::infinity();
      for (size_t j = 0; j < sel.size(); ++j) {
        const float* k = rows_of[j];
        float dot = 0.0f;
        for (int64_t c = 0; c < dk; ++c) dot += qh[c] * k[c];
        score[j] = dot * softmax_scale;
        m = std::max(m, score[j]);
      }
      float sum = 0.0f;
      for (size_t j = 0; j < sel.size(); ++j) {
        const float p = std::exp(score[j] - m);
        sum += p;
        const float* v = rows_of[j];
        for (int64_t c = 0; c < dv; ++c) o[c] += p * v[c];
      }
      for (int64_t c = 0; c < dv; ++c) o[c] /= sum;
      lse.f32()[r * heads + h] = m + std::log(sum);
    }
  }
}

}  // namespace dsi::cpu
