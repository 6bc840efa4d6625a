// Op tests, absorbed MLA: mla_absorb_q, mla_absorbed_queries (with the queries' RoPE) and mla_up_v
// against float64 per-head matrix products on the strided views the model uses, and sparse_mla
// against a float64 softmax over each row's selected slots (-1 slots, duplicates, one key, no key),
// with natural-log LSE and guard regions.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "ops/linear.h"
#include "ops/mla.h"
#include "ops/rope.h"
#include "test_ops_common.h"
#include "test_util.h"

namespace dsi {
namespace {

using test::to_f64;

struct Ref {
  std::vector<double> v, abs_sum;
};

// out[r, h, c] = sum_n q_nope[r, h, n] * w_uk[h, n, c]   (W_UK[h]^T q_nope[h]).
Ref ref_absorb_q(const Tensor& q_nope, const Tensor& w_uk) {
  const std::vector<double> q = to_f64(q_nope), w = to_f64(w_uk);
  const int64_t rows = q_nope.dim(0), H = q_nope.dim(1), nope = q_nope.dim(2), lora = w_uk.dim(2);
  Ref r{std::vector<double>(size_t(rows * H * lora)), std::vector<double>(size_t(rows * H * lora))};
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t c = 0; c < lora; ++c) {
        double s = 0, a = 0;
        for (int64_t n = 0; n < nope; ++n) {
          const double term =
              q[size_t((t * H + h) * nope + n)] * w[size_t((h * nope + n) * lora + c)];
          s += term;
          a += std::fabs(term);
        }
        r.v[size_t((t * H + h) * lora + c)] = s;
        r.abs_sum[size_t((t * H + h) * lora + c)] = a;
      }
  return r;
}

// out[r, h, v] = sum_c w_uv[h, v, c] * o_lat[r, h, c]   (W_UV[h] o_lat[h]).
Ref ref_up_v(const Tensor& o_lat, const Tensor& w_uv) {
  const std::vector<double> o = to_f64(o_lat), w = to_f64(w_uv);
  const int64_t rows = o_lat.dim(0), H = o_lat.dim(1), lora = o_lat.dim(2), dv = w_uv.dim(1);
  Ref r{std::vector<double>(size_t(rows * H * dv)), std::vector<double>(size_t(rows * H * dv))};
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t v = 0; v < dv; ++v) {
        double s = 0, a = 0;
        for (int64_t c = 0; c < lora; ++c) {
          const double term =
              w[size_t((h * dv + v) * lora + c)] * o[size_t((t * H + h) * lora + c)];
          s += term;
          a += std::fabs(term);
        }
        r.v[size_t((t * H + h) * dv + v)] = s;
        r.abs_sum[size_t((t * H + h) * dv + v)] = a;
      }
  return r;
}

// Float64 sparse attention: for each (row, head), softmax over the slots with index >= 0 (a
// duplicated index is two slots) of scale * q . kv[idx], output the weighted sum of kv[idx][:dv]
// and lse = ln sum exp(score); a row without slots gives out = 0, lse = -inf. Error scales: for
// out, sum_j p_j |v_j| (1 + 2 max_j |scale| sum|q k_j|); for lse, 1 + max_j |scale| sum|q k_j|.
struct RefAttn {
  Ref out, lse;
};
RefAttn ref_sparse_mla(const Tensor& q, const Tensor& kv, const std::vector<int32_t>& idx,
                       int64_t topk, double scale, int64_t dv) {
  const std::vector<double> qv = to_f64(q), k = to_f64(kv);
  const int64_t rows = q.dim(0), H = q.dim(1), dk = q.dim(2);
  RefAttn r;
  r.out = {std::vector<double>(size_t(rows * H * dv), 0.0),
           std::vector<double>(size_t(rows * H * dv), 0.0)};
  r.lse = {std::vector<double>(size_t(rows * H)), std::vector<double>(size_t(rows * H), 0.0)};
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t h = 0; h < H; ++h) {
      std::vector<int32_t> sel;
      for (int64_t j = 0; j < topk; ++j)
        if (idx[size_t(t * topk + j)] >= 0) sel.push_back(idx[size_t(t * topk + j)]);
      const size_t oh = size_t((t * H + h) * dv);
      if (sel.empty()) {
        r.lse.v[size_t(t * H + h)] = -test::kInf;
        continue;
      }
      std::vector<double> score;
      double m = -test::kInf, max_abs = 0;
      for (int32_t s : sel) {
        double dot = 0, a = 0;
        for (int64_t c = 0; c < dk; ++c) {
          dot += qv[size_t((t * H + h) * dk + c)] * k[size_t(s * dk + c)];
          a += std::fabs(qv[size_t((t * H + h) * dk + c)] * k[size_t(s * dk + c)]);
        }
        score.push_back(scale * dot);
        m = std::max(m, scale * dot);
        max_abs = std::max(max_abs, std::fabs(scale) * a);
      }
      double sum = 0;
      for (double sc : score) sum += std::exp(sc - m);
      for (size_t j = 0; j < sel.size(); ++j) {
        const double p = std::exp(score[j] - m) / sum;
        for (int64_t c = 0; c < dv; ++c) {
          r.out.v[oh + size_t(c)] += p * k[size_t(sel[j] * dk + c)];
          r.out.abs_sum[oh + size_t(c)] +=
              p * std::fabs(k[size_t(sel[j] * dk + c)]) * (1 + 2 * max_abs);
        }
      }
      r.lse.v[size_t(t * H + h)] = m + std::log(sum);
      r.lse.abs_sum[size_t(t * H + h)] = 1 + max_abs;
    }
  return r;
}

// kv_b_proj [H * per, lora] as fp32 (dequantised when fp8) and rows [begin, begin + count) of each
// head as [H, count, lora]: W_UK (begin 0, count nope) or W_UV (begin per - v, count v).
Tensor head_part(const LinearWeight& kv_b, int64_t H, int64_t begin, int64_t count) {
  const Tensor w = ops::dequantize_rows(kv_b, 0, kv_b.out_features());
  const int64_t per = kv_b.out_features() / H, lora = kv_b.in_features();
  Tensor part = Tensor::empty({H, count, lora}, DType::F32);
  for (int64_t h = 0; h < H; ++h)
    std::copy_n(w.f32() + (h * per + begin) * lora, count * lora, part.f32() + h * count * lora);
  return part;
}

LinearWeight f32_kv_b(int64_t rows, int64_t lora, uint64_t seed) {
  LinearWeight w;
  w.weight = test::rand_tensor({rows, lora}, seed);
  return w;
}

// fp8 e4m3fn bytes (no NaN patterns) with 16x16 block scales in [0.5, 2) * 2^-6.
LinearWeight fp8_kv_b(int64_t rows, int64_t lora, uint64_t seed) {
  std::vector<float> r = test::random_floats(size_t(rows * lora + (rows / 16 + 1) * (lora / 16 + 1)), seed);
  Tensor w = Tensor::empty({rows, lora}, DType::F8_E4M3);
  for (int64_t i = 0; i < rows * lora; ++i) {
    uint8_t b = uint8_t(int(std::fabs(r[size_t(i)]) * 255.0f) & 0xff);
    if ((b & 0x7f) == 0x7f) b = 0x3f;
    static_cast<uint8_t*>(w.raw())[i] = b;
  }
  const int64_t so = (rows + 15) / 16, si = (lora + 15) / 16;
  std::vector<float> sc(size_t(so * si));
  for (int64_t i = 0; i < so * si; ++i)
    sc[size_t(i)] = (1.25f + 0.75f * r[size_t(rows * lora + i)]) * 0x1.0p-6f;
  LinearWeight lw;
  lw.weight = w;
  lw.scale_inv = Tensor::from_f32(sc, {so, si});
  lw.block_out = lw.block_in = 16;
  return lw;
}

// absorb_q on the model's views: q_nope = q.narrow(2, 0, nope) of [rows, H, nope + rope], written
// into q_abs.narrow(2, 0, lora) of a NaN-filled [rows, H, lora + rope]: the rope slots of q_abs
// stay untouched, every latent slot is written and matches float64. W_UK[h] is read in place from
// kv_b_proj (fp32, and fp8 with block scales).
TEST(OpMla, AbsorbQOnStridedViews) {
  const int64_t H = 3, nope = 24, v = 16, rope = 8, lora = 48;
  for (bool fp8 : {false, true})
    for (int64_t rows : {1, 5}) {
      const LinearWeight kv_b = fp8 ? fp8_kv_b(H * (nope + v), lora, 811)
                                    : f32_kv_b(H * (nope + v), lora, 810);
      const Tensor q = test::rand_tensor({rows, H, nope + rope}, 800 + uint64_t(rows));
      const Tensor q_nope = q.narrow(2, 0, nope);
      Tensor q_abs = test::guard_filled({rows, H, lora + rope}, DType::F32);
      Tensor out = q_abs.narrow(2, 0, lora);
      ops::mla_absorb_q(q_nope, kv_b, out);
      const std::string what = std::string("mla_absorb_q ") + (fp8 ? "fp8" : "f32") + " rows=" +
                               std::to_string(rows);
      test::expect_guard_intact(q_abs, out, what);
      const Ref want = ref_absorb_q(q_nope, head_part(kv_b, H, 0, nope));
      test::expect_reduction_near(out, want.v, want.abs_sum, what);
    }
}

// The absorbed queries in one op: the latent part is W_UK^T q_nope (float64), the rope part the
// rotation of q's rope dims at each row's position, bitwise what rope in place writes there; out is
// a view inside a NaN-filled buffer whose other slots stay untouched. Shapes that do not add up are
// an error naming the op.
TEST(OpMla, AbsorbedQueriesAreAbsorbAndRope) {
  const int64_t H = 3, nope = 24, v = 16, rope = 8, lora = 48;
  const ops::RopeFreqs f = ops::compute_rope_freqs(RopeConfig{}, int(rope));
  const Tensor inv_freq = Tensor::from_f32(f.inv_freq, {rope / 2});
  for (bool fp8 : {false, true})
    for (int64_t rows : {1, 5}) {
      const LinearWeight kv_b = fp8 ? fp8_kv_b(H * (nope + v), lora, 851) : f32_kv_b(H * (nope + v), lora, 850);
      const Tensor q = test::rand_tensor({rows, H, nope + rope}, 860 + uint64_t(rows));
      std::vector<int32_t> pos;
      for (int64_t r = 0; r < rows; ++r) pos.push_back(int32_t(7 + 1000 * r));
      const Tensor positions = Tensor::from_i32(pos, {rows});
      Tensor buf = test::guard_filled({rows, H, lora + rope + 5}, DType::F32);
      Tensor out = buf.narrow(2, 2, lora + rope);
      ops::mla_absorbed_queries(q, nope, kv_b, positions, inv_freq, 0.75f, RopeStyle::kInterleaved, out);
      const std::string what = std::string("mla_absorbed_queries ") + (fp8 ? "fp8" : "f32") + " rows=" +
                               std::to_string(rows);
      test::expect_guard_intact(buf, out, what);
      const Ref want = ref_absorb_q(q.narrow(2, 0, nope), head_part(kv_b, H, 0, nope));
      test::expect_reduction_near(out.narrow(2, 0, lora), want.v, want.abs_sum, what);
      Tensor rotated = q.contiguous();
      ops::rope(rotated, positions, inv_freq, 0.75f, RopeStyle::kInterleaved, int(nope));
      const Tensor pe = out.narrow(2, lora, rope).contiguous(), want_pe = rotated.narrow(2, nope, rope).contiguous();
      EXPECT_EQ(0, std::memcmp(pe.raw(), want_pe.raw(), pe.nbytes())) << what << ": rope part";
    }
  const LinearWeight kv_b = f32_kv_b(H * (nope + v), lora, 852);
  const Tensor positions = Tensor::from_i32({3}, {1});
  Tensor out = Tensor::empty({1, H, lora + rope}, DType::F32);
  test::expect_error(
      [&] {
        ops::mla_absorbed_queries(test::rand_tensor({1, H, nope + rope + 2}, 853), nope, kv_b, positions, inv_freq,
                                  1.0f, RopeStyle::kInterleaved, out);
      },
      {"mla_absorbed_queries", "q"});
}

// up_v: out[h] = W_UV[h] o_lat[h] with o_lat a strided view (the latent part of a wider buffer);
// W_UV[h] is the last v rows of head h in kv_b_proj (fp32, and fp8 with block scales).
TEST(OpMla, UpVMatchesFloat64) {
  const int64_t H = 4, lora = 32, nope = 12, dv = 20;
  for (bool fp8 : {false, true})
    for (int64_t rows : {1, 7}) {
      const LinearWeight kv_b = fp8 ? fp8_kv_b(H * (nope + dv), lora, 831)
                                    : f32_kv_b(H * (nope + dv), lora, 830);
      const Tensor wide = test::rand_tensor({rows, H, lora + 6}, 820 + uint64_t(rows));
      const Tensor o_lat = wide.narrow(2, 3, lora);
      Tensor buf = test::guard_filled({rows, H, dv + 4}, DType::F32);
      Tensor out = buf.narrow(2, 4, dv);
      ops::mla_up_v(o_lat, kv_b, out);
      const std::string what =
          std::string("mla_up_v ") + (fp8 ? "fp8" : "f32") + " rows=" + std::to_string(rows);
      test::expect_guard_intact(buf, out, what);
      const Ref want = ref_up_v(o_lat, head_part(kv_b, H, nope, dv));
      test::expect_reduction_near(out, want.v, want.abs_sum, what);
    }
}

// kv_b_proj whose rows are not heads x (nope + v), or another kv_lora, is an error naming the op.
TEST(OpMla, KvBShapeMismatchThrows) {
  const LinearWeight kv_b = f32_kv_b(3 * 40 + 1, 48, 840);
  Tensor out = Tensor::empty({1, 3, 48}, DType::F32);
  test::expect_error([&] { ops::mla_absorb_q(test::rand_tensor({1, 3, 24}, 841), kv_b, out); },
                     {"mla_absorb_q", "kv_b_proj"});
  const LinearWeight ok = f32_kv_b(3 * 40, 48, 842);
  Tensor v = Tensor::empty({1, 3, 16}, DType::F32);
  test::expect_error([&] { ops::mla_up_v(test::rand_tensor({1, 3, 40}, 843), ok, v); },
                     {"mla_up_v", "kv_b_proj"});
}

struct AttnCase {
  Tensor q, kv;
  std::vector<int32_t> idx;
  int64_t topk;
  double scale;
  int64_t dv;
};

// Runs sparse_mla into out/lse views placed inside guard buffers, checks the guards, and compares
// with the float64 reference.
void check_sparse(const AttnCase& c, const std::string& what) {
  const int64_t rows = c.q.dim(0), H = c.q.dim(1);
  Tensor obuf = test::guard_filled({rows * H * c.dv + 10}, DType::F32);
  Tensor lbuf = test::guard_filled({rows * H + 10}, DType::F32);
  Tensor out = test::contiguous_view_in(obuf, {rows, H, c.dv}, 5);
  Tensor lse = test::contiguous_view_in(lbuf, {rows, H}, 5);
  ops::sparse_mla(c.q, c.kv, Tensor::from_i32(c.idx, {rows, c.topk}), float(c.scale), int(c.dv),
                  out, lse);
  test::expect_guard_intact(obuf, out, what + " out");
  const RefAttn want = ref_sparse_mla(c.q, c.kv, c.idx, c.topk, c.scale, c.dv);
  test::expect_reduction_near(out, want.out.v, want.out.abs_sum, what + " out");
  for (int64_t i = 0; i < rows * H; ++i) {
    const double w = want.lse.v[size_t(i)];
    const float g = lse.f32()[i];
    if (std::isinf(w)) {
      EXPECT_EQ(g, test::kNinfF) << what << " lse " << i;
    } else {
      EXPECT_NEAR(g, w, tol::kDotAbsSumRel * want.lse.abs_sum[size_t(i)]) << what << " lse " << i;
    }
  }
  // Guard of lse: all written, nothing around it (an empty row writes -inf, which is not NaN).
  test::expect_guard_intact(lbuf, lse, what + " lse");
}

// Random rows with -1 slots interleaved and duplicate indices, strided q and kv rows, dv < dk.
TEST(OpMla, SparseMatchesFloat64Softmax) {
  const int64_t rows = 4, H = 3, lora = 32, rope = 8, dk = lora + rope, n = 30, topk = 10;
  const Tensor qw = test::rand_tensor({rows, H, dk + 4}, 840, 2.0f);
  const Tensor cache = test::rand_tensor({n, dk + 8}, 841);
  // clang-format off
  std::vector<int32_t> idx = {0,  -1, 5,  29, -1, 7,  7,  12, -1, 3,    // -1s and a duplicate
                              29, 28, 27, 26, 25, 24, 23, 22, 21, 20,   // full, descending
                              -1, -1, -1, 14, -1, -1, -1, -1, -1, -1,   // one key
                              2,  2,  2,  2,  9,  -1, 9,  -1, 2,  2};   // heavy duplicates
  // clang-format on
  check_sparse(
      {qw.narrow(2, 2, dk), cache.narrow(1, 0, dk), idx, topk, 1.0 / std::sqrt(double(dk)), lora},
      "sparse_mla");
}

// One key: out is exactly that key's value and lse its score. The same key twice: out unchanged,
// lse = score + ln 2 (natural log, duplicates count per slot).
TEST(OpMla, SparseOneKeyAndNaturalLogLse) {
  const int64_t dk = 12, dv = 8;
  const Tensor q = test::rand_tensor({2, 1, dk}, 850);
  const Tensor kv = test::rand_tensor({6, dk}, 851);
  const std::vector<int32_t> idx = {-1, 4, -1, 4, 4, -1};
  Tensor out = Tensor::empty({2, 1, dv}, DType::F32), lse = Tensor::empty({2, 1}, DType::F32);
  ops::sparse_mla(q, kv, Tensor::from_i32(idx, {2, 3}), 0.3f, int(dv), out, lse);
  for (int64_t r = 0; r < 2; ++r) {
    double score = 0;
    for (int64_t c = 0; c < dk; ++c) score += double(q.f32()[r * dk + c]) * kv.f32()[4 * dk + c];
    score *= 0.3;
    for (int64_t c = 0; c < dv; ++c)
      EXPECT_EQ(out.f32()[r * dv + c], kv.f32()[4 * dk + c]) << r << "," << c;
    EXPECT_NEAR(lse.f32()[r], score + (r == 1 ? std::log(2.0) : 0.0), 1e-6) << r;
  }
  check_sparse({q, kv, idx, 3, 0.3, dv}, "sparse_mla one key");
}

// A row with no valid key gets out = 0 and lse = -inf (never NaN); its neighbours are unaffected.
TEST(OpMla, SparseEmptyRowGivesZeroAndNegInf) {
  const int64_t H = 2, dk = 16, dv = 16;
  const Tensor q = test::rand_tensor({3, H, dk}, 860);
  const Tensor kv = test::rand_tensor({5, dk}, 861);
  const std::vector<int32_t> idx = {0, 1, 2, -1, -1, -1, 3, -1, 4};
  Tensor out = Tensor::empty({3, H, dv}, DType::F32), lse = Tensor::empty({3, H}, DType::F32);
  ops::sparse_mla(q, kv, Tensor::from_i32(idx, {3, 3}), 0.25f, int(dv), out, lse);
  for (int64_t h = 0; h < H; ++h) {
    EXPECT_EQ(lse.f32()[1 * H + h], test::kNinfF);
    for (int64_t c = 0; c < dv; ++c) EXPECT_EQ(out.f32()[(1 * H + h) * dv + c], 0.0f);
  }
  for (int64_t i = 0; i < out.numel(); ++i) EXPECT_FALSE(std::isnan(out.f32()[i])) << i;
  check_sparse({q, kv, idx, 3, 0.25, dv}, "sparse_mla empty row");
}

// Scores far beyond exp's range (up to ~800): the softmax subtracts the max and stays finite.
// Small-integer q and kv make every score exact in fp32, so the float64 comparison stays tight.
TEST(OpMla, SparseLargeScoresStayFinite) {
  auto small_ints = [](const Shape& shape, uint64_t seed) {
    std::vector<float> v = test::random_floats(size_t(shape_numel(shape)), seed);
    for (float& x : v) x = std::round(x * 2.0f);  // -2 .. 2
    return Tensor::from_f32(v, shape);
  };
  const Tensor q = small_ints({2, 2, 24}, 870);
  const Tensor kv = small_ints({16, 24}, 871);
  std::vector<int32_t> idx(2 * 16);
  for (int32_t j = 0; j < 32; ++j) idx[size_t(j)] = (j * 5) % 16;
  const RefAttn want = ref_sparse_mla(q, kv, idx, 16, 8.0, 24);
  EXPECT_GT(*std::max_element(want.lse.v.begin(), want.lse.v.end()), 100.0)
      << "scores not large enough";
  check_sparse({q, kv, idx, 16, 8.0, 24}, "sparse_mla large scores");
}

// An index at or past the number of cached keys is an error naming it.
TEST(OpMla, SparseIndexOutOfRangeThrows) {
  const Tensor q = test::rand_tensor({1, 1, 8}, 880), kv = test::rand_tensor({5, 8}, 881);
  Tensor out = Tensor::empty({1, 1, 8}, DType::F32), lse = Tensor::empty({1, 1}, DType::F32);
  test::expect_error(
      [&] {
        ops::sparse_mla(q, kv, Tensor::from_i32({1, 5}, {1, 2}), 1.0f, 8, out, lse);
      },
      {"5"});
}

}  // namespace
}  // namespace dsi
