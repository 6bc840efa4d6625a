// CPU reference of the DCP exchange ops; see ops/dcp_exchange.h. The combine arithmetic is fixed
// (partial * factor, summed from member 0) so ag_rs and a2a give bitwise-equal results.
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backends/cpu/cpu_dcp.h"

namespace dsi::cpu {

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

// The weight of a partial result with log-sum-exp `lse` in a total with log-sum-exp `total`.
float lse_factor(float lse, float total) {
  return (lse == kNegInf || total == kNegInf) ? 0.0f : std::exp(lse - total);
}

void need(bool ok, const char* op, const Tensor& t) {
  DSI_CHECK(ok, "{}: unexpected tensor {}", op, t.desc());
}

int64_t global_of(const ops::DcpPlace& L, int64_t l) {
  return (l / L.interleave) * L.size * L.interleave + int64_t(L.rank) * L.interleave + l % L.interleave;
}

}  // namespace

DcpDims check_pack(const Tensor& idx, const Tensor& val, const Tensor& packed) {
  need(idx.ndim() == 2 && idx.is_contiguous() && idx.dtype() == DType::I32, "dcp_pack_candidates", idx);
  check_shape(val, idx.shape(), "dcp_pack_candidates val");
  check_dtype(val, DType::F32, "dcp_pack_candidates val");
  check_shape(packed, {idx.dim(0), idx.dim(1), 2}, "dcp_pack_candidates packed");
  check_dtype(packed, DType::I32, "dcp_pack_candidates packed");
  need(val.is_contiguous() && packed.is_contiguous(), "dcp_pack_candidates", packed);
  return {idx.dim(0), idx.dim(1), 0, 0};
}

DcpDims check_unpack(const Tensor& gathered, int W, const Tensor& scores, const Tensor& positions) {
  need(gathered.ndim() == 3 && gathered.dim(2) == 2 && gathered.is_contiguous() && W >= 1 &&
           gathered.dim(0) % W == 0 && gathered.dtype() == DType::I32,
       "dcp_unpack_candidates", gathered);
  const int64_t n = gathered.dim(0) / W, k = gathered.dim(1);
  check_shape(scores, {n, W * k}, "dcp_unpack_candidates scores");
  check_shape(positions, {n, W * k}, "dcp_unpack_candidates positions");
  check_dtype(scores, DType::F32, "dcp_unpack_candidates scores");
  check_dtype(positions, DType::I32, "dcp_unpack_candidates positions");
  need(scores.is_contiguous() && positions.is_contiguous(), "dcp_unpack_candidates", scores);
  return {n, k, 0, 0};
}

DcpDims check_member_heads(const Tensor& in, int W, const Tensor& out) {
  need(in.ndim() == 3 && in.is_contiguous() && W >= 1 && in.dim(0) % W == 0 && in.dtype() == DType::F32,
       "dcp_member_heads", in);
  const int64_t n = in.dim(0) / W;
  check_shape(out, {n, W * in.dim(1), in.dim(2)}, "dcp_member_heads out");
  need(out.is_contiguous() && out.dtype() == DType::F32, "dcp_member_heads", out);
  return {n, 0, in.dim(1), in.dim(2)};
}

DcpDims check_scale(const Tensor& part, const Tensor& lse, const Tensor& lse_all, int W,
                    const Tensor& chunks) {
  need(part.ndim() == 3 && part.is_contiguous() && part.dtype() == DType::F32 && W >= 1 &&
           part.dim(1) % W == 0,
       "dcp_scale_partials", part);
  const int64_t n = part.dim(0), H = part.dim(1), dv = part.dim(2);
  check_shape(lse, {n, H}, "dcp_scale_partials lse");
  check_shape(lse_all, {W * n, H}, "dcp_scale_partials lse_all");
  check_shape(chunks, {W * n, H / W, dv}, "dcp_scale_partials chunks");
  need(lse.is_contiguous() && lse_all.is_contiguous() && chunks.is_contiguous(), "dcp_scale_partials",
       chunks);
  return {n, 0, H / W, dv};
}

DcpDims check_a2a_pack(const Tensor& part, const Tensor& lse, int W, const Tensor& send) {
  need(part.ndim() == 3 && part.is_contiguous() && part.dtype() == DType::F32 && W >= 1 &&
           part.dim(1) % W == 0,
       "dcp_a2a_pack", part);
  const int64_t n = part.dim(0), H = part.dim(1), dv = part.dim(2);
  check_shape(lse, {n, H}, "dcp_a2a_pack lse");
  check_shape(send, {W * n, H / W, dv + 1}, "dcp_a2a_pack send");
  need(lse.is_contiguous() && send.is_contiguous(), "dcp_a2a_pack", send);
  return {n, 0, H / W, dv};
}

DcpDims check_a2a_combine(const Tensor& recv, int W, const Tensor& out) {
  need(recv.ndim() == 3 && recv.is_contiguous() && recv.dtype() == DType::F32 && W >= 1 &&
           recv.dim(0) % W == 0 && recv.dim(2) >= 1,
       "dcp_a2a_combine", recv);
  const int64_t n = recv.dim(0) / W, hl = recv.dim(1), dv = recv.dim(2) - 1;
  check_shape(out, {n, hl, dv}, "dcp_a2a_combine out");
  need(out.is_contiguous() && out.dtype() == DType::F32, "dcp_a2a_combine", out);
  return {n, 0, hl, dv};
}

void dcp_pack_candidates(const Tensor& idx, const Tensor& val, const ops::DcpPlace& place,
                         Tensor& packed) {
  const DcpDims s = check_pack(idx, val, packed);
  for (int64_t i = 0; i < s.n * s.k; ++i) {
    const int32_t l = idx.i32()[i];
    const float v = l < 0 ? kNegInf : val.f32()[i];
    std::memcpy(&packed.i32()[2 * i], &v, 4);
    packed.i32()[2 * i + 1] = l < 0 ? -1 : int32_t(global_of(place, l));
  }
}

void dcp_unpack_candidates(const Tensor& gathered, int W, Tensor& scores, Tensor& positions) {
  const DcpDims s = check_unpack(gathered, W, scores, positions);
  for (int m = 0; m < W; ++m)
    for (int64_t i = 0; i < s.n; ++i)
      for (int64_t j = 0; j < s.k; ++j) {
        const int32_t* src = gathered.i32() + ((m * s.n + i) * s.k + j) * 2;
        const int64_t dst = i * W * s.k + m * s.k + j;
        std::memcpy(&scores.f32()[dst], &src[0], 4);
        positions.i32()[dst] = src[1];
      }
}

void dcp_localize(const Tensor& global, const ops::DcpPlace& place, Tensor& local) {
  need(global.is_contiguous() && global.dtype() == DType::I32, "dcp_localize", global);
  check_shape(local, global.shape(), "dcp_localize local");
  const int64_t W = place.size, I = place.interleave;
  for (int64_t i = 0; i < global.numel(); ++i) {
    const int64_t p = global.i32()[i];
    const bool mine = p >= 0 && (p / I) % W == place.rank;
    local.i32()[i] = mine ? int32_t((p / (W * I)) * I + p % I) : -1;
  }
}

void dcp_member_heads(const Tensor& in, int W, Tensor& out) {
  const DcpDims s = check_member_heads(in, W, out);
  const int64_t H = W * s.hl;
  for (int m = 0; m < W; ++m)
    for (int64_t i = 0; i < s.n; ++i)
      std::memcpy(out.f32() + (i * H + m * s.hl) * s.d, in.f32() + (m * s.n + i) * s.hl * s.d,
                  sizeof(float) * size_t(s.hl * s.d));
}

void dcp_scale_partials(const Tensor& part, const Tensor& lse, const Tensor& lse_all, int W,
                        Tensor& chunks) {
  const DcpDims s = check_scale(part, lse, lse_all, W, chunks);
  const int64_t H = W * s.hl, n = s.n, dv = s.d;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t h = 0; h < H; ++h) {
      const float total = logsumexp(lse_all.f32() + i * H + h, W, n * H);
      const float f = lse_factor(lse.f32()[i * H + h], total);
      const float* src = part.f32() + (i * H + h) * dv;
      float* dst = chunks.f32() + (((h / s.hl) * n + i) * s.hl + h % s.hl) * dv;
      for (int64_t c = 0; c < dv; ++c) dst[c] = src[c] * f;
    }
}

void dcp_a2a_pack(const Tensor& part, const Tensor& lse, int W, Tensor& send) {
  const DcpDims s = check_a2a_pack(part, lse, W, send);
  const int64_t H = W * s.hl, row = s.d + 1;
  for (int64_t i = 0; i < s.n; ++i)
    for (int64_t h = 0; h < H; ++h) {
      float* dst = send.f32() + (((h / s.hl) * s.n + i) * s.hl + h % s.hl) * row;
      std::memcpy(dst, part.f32() + (i * H + h) * s.d, sizeof(float) * size_t(s.d));
      dst[s.d] = lse.f32()[i * H + h];
    }
}

void dcp_a2a_combine(const Tensor& recv, int W, Tensor& out) {
  const DcpDims s = check_a2a_combine(recv, W, out);
  const int64_t row = s.d + 1;
  std::vector<float> lses(static_cast<size_t>(W));
  for (int64_t i = 0; i < s.n; ++i)
    for (int64_t h = 0; h < s.hl; ++h) {
      const auto at = [&](int m) { return recv.f32() + ((m * s.n + i) * s.hl + h) * row; };
      for (int m = 0; m < W; ++m) lses[size_t(m)] = at(m)[s.d];
      const float total = logsumexp(lses.data(), W, 1);
      float* o = out.f32() + (i * s.hl + h) * s.d;
      // Same arithmetic and member order as ag_rs: (partial * factor), summed from member 0.
      for (int64_t c = 0; c < s.d; ++c) o[c] = at(0)[c] * lse_factor(lses[0], total);
      for (int m = 1; m < W; ++m) {
        const float f = lse_factor(lses[size_t(m)], total);
        for (int64_t c = 0; c < s.d; ++c) o[c] += at(m)[c] * f;
      }
    }
}

}  // namespace dsi::cpu
