// CPU tests of the fp8 KV caches (ops/kv_fp8.h): the quantiser's properties (power-of-two scales,
// the amax floor, values within e4m3 rounding, the Hadamard rotation), the paged layouts, the fp8
// indexer logits against the exact fp32 ops::indexer_logits (loose: only q's quantisation separates
// them) with a top-k sanity check, sparse_mla_fp8 against ops::sparse_mla on the decoded cache
// (tight: bitwise) and on the unquantised rows (loose), and the op-boundary errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "backends/cpu/cpu_kv_fp8.h"
#include "ops/elementwise.h"
#include "ops/indexer.h"
#include "ops/kv_fp8.h"
#include "ops/mla.h"
#include "ops/norm.h"
#include "ops/rope.h"
#include "test_ops_common.h"

namespace dsi {
namespace {

// Tolerances of the fp8 paths against their exact (fp32) references, with their reasons.
// Indexer logits: q is quantised to e4m3 (3 mantissa bits: relative rounding error <= 2^-4, RMS about
// 2^-4/sqrt(3) = 0.036 per element, more for elements far below the group's amax); the dot products
// inherit it, so the logits' normalised MSE is about 1e-3. Bound with margin:
constexpr double kFp8IndexerLogitsNmse = 1e-2;
// Top-k sanity: at least this fraction of the exact top-k keys is also selected by the fp8 logits.
constexpr double kFp8TopkOverlap = 0.8;
// Sparse MLA against unquantised keys and values: e4m3 latent (RMS relative error ~0.036 per
// element), bf16 RoPE; the softmax-weighted average of values shrinks nothing systematically.
constexpr double kFp8SparseMlaNmse = 1e-2;

using test::kNinfF;

constexpr int64_t kPage = ops::kKvPageTokens;

bool is_pow2_float(float s) {
  int e;
  return s > 0 && std::frexp(s, &e) == 0.5f;
}

// Dense Sylvester Hadamard H_d / sqrt(d) applied in float64.
std::vector<double> hadamard_f64(const float* x, int64_t d) {
  std::vector<double> y(size_t(d), 0.0);
  for (int64_t i = 0; i < d; ++i)
    for (int64_t j = 0; j < d; ++j)
      y[size_t(i)] += (__builtin_popcountll(uint64_t(i & j)) % 2 ? -1.0 : 1.0) * x[j];
  for (double& v : y) v /= std::sqrt(double(d));
  return y;
}

// A paged layout of several sequences: physical pages shuffled, block tables padded with -1.
struct Paged {
  std::vector<int64_t> lens;
  int64_t n_pages = 0, max_pages = 1;
  std::vector<int32_t> table;  // [n_seqs, max_pages]
  // Physical slot of local key s of sequence q.
  int32_t slot(int64_t seq, int64_t s) const {
    return table[size_t(seq * max_pages + s / kPage)] * int32_t(kPage) + int32_t(s % kPage);
  }
};

Paged make_paged(const std::vector<int64_t>& lens, uint64_t seed) {
  Paged p;
  p.lens = lens;
  int64_t total = 0;
  for (int64_t l : lens) {
    p.max_pages = std::max(p.max_pages, (l + kPage - 1) / kPage);
    total += (l + kPage - 1) / kPage;
  }
  p.n_pages = total + 2;  // two pages nobody uses
  std::vector<int32_t> phys(size_t(p.n_pages));
  std::iota(phys.begin(), phys.end(), 0);
  std::mt19937_64 rng(seed);
  std::shuffle(phys.begin(), phys.end(), rng);
  p.table.assign(lens.size() * size_t(p.max_pages), -1);
  size_t next = 0;
  for (size_t q = 0; q < lens.size(); ++q)
    for (int64_t pg = 0; pg * kPage < lens[q]; ++pg) p.table[q * size_t(p.max_pages) + size_t(pg)] = phys[next++];
  return p;
}

Tensor filled_u8(const Shape& shape, uint8_t v) {
  Tensor t = Tensor::empty(shape, DType::U8);
  std::memset(t.raw(), v, t.nbytes());
  return t;
}

// ---------------------------------------------------------------- quantiser

TEST(OpKvFp8, Ue8m0ScaleIsTheNextPowerOfTwo) {
  EXPECT_EQ(cpu::ue8m0_scale(448.0f), 1.0f);
  EXPECT_EQ(cpu::ue8m0_scale(448.5f), 2.0f);
  EXPECT_EQ(cpu::ue8m0_scale(224.0f), 0.5f);
  EXPECT_EQ(cpu::ue8m0_scale(300.0f), 1.0f);
  // amax floored at 1e-4: 1e-4 / 448 = 2.23e-7, ceil(log2) = -22.
  EXPECT_EQ(cpu::ue8m0_scale(0.0f), std::ldexp(1.0f, -22));
  EXPECT_EQ(cpu::ue8m0_scale(1e-9f), std::ldexp(1.0f, -22));
  std::mt19937_64 rng(7);
  for (int i = 0; i < 2000; ++i) {
    const float amax = float(std::ldexp(test::uniform01(rng) + 0.01, int(rng() % 60) - 30));
    const float s = cpu::ue8m0_scale(amax);
    ASSERT_TRUE(is_pow2_float(s)) << amax;
    const double ratio = std::max(double(amax), 1e-4) / 448.0;
    EXPECT_GE(double(s), ratio * (1 - 1e-7)) << amax;  // nothing saturates
    EXPECT_LT(double(s), 2 * ratio * (1 + 1e-7)) << amax;  // the smallest such power of two
  }
}

TEST(OpKvFp8, E4m3QuantiserRoundsToNearestAndStoresPositiveZero) {
  EXPECT_EQ(cpu::quantize_e4m3(-0.0f), 0x00);
  EXPECT_EQ(cpu::quantize_e4m3(-1e-6f), 0x00);
  EXPECT_EQ(cpu::quantize_e4m3(448.0f), 0x7e);
  std::mt19937_64 rng(3);
  for (int i = 0; i < 5000; ++i) {
    const float x = float((2 * test::uniform01(rng) - 1) * 448.0);
    const double got = test::ref_e4m3(cpu::quantize_e4m3(x));
    // Nearest: no e4m3 value is closer (checked against all 254 finite codes).
    double best = 1e30;
    for (int b = 0; b < 256; ++b) {
      const double v = test::ref_e4m3(uint8_t(b));
      if (!std::isnan(v)) best = std::min(best, std::fabs(v - x));
    }
    EXPECT_EQ(std::fabs(got - x), best) << x;
  }
}

TEST(OpKvFp8, HadamardRotationIsSylvesterOverSqrtD) {
  for (int64_t d : {16, 32, 64, 128}) {
    const Tensor x = test::rand_tensor({d}, uint64_t(d));
    std::vector<float> y(x.f32(), x.f32() + d);
    cpu::hadamard_rotate(y.data(), d);
    const std::vector<double> want = hadamard_f64(x.f32(), d);
    for (int64_t i = 0; i < d; ++i) EXPECT_NEAR(y[size_t(i)], want[size_t(i)], 1e-5) << d << " " << i;
    cpu::hadamard_rotate(y.data(), d);  // orthogonal and symmetric: its own inverse
    for (int64_t i = 0; i < d; ++i) EXPECT_NEAR(y[size_t(i)], x.f32()[i], 1e-5) << d << " " << i;
  }
}

// Decodes key `slot` of an indexer pool: the e4m3 values times the token's scale.
std::vector<double> decode_indexer_key(const Tensor& pool, int64_t d, int32_t slot, float* scale) {
  const auto* page = static_cast<const uint8_t*>(pool.raw()) + (slot / kPage) * ops::indexer_page_bytes(d);
  std::memcpy(scale, page + kPage * d + (slot % kPage) * 4, 4);
  std::vector<double> v(static_cast<size_t>(d));
  for (int64_t c = 0; c < d; ++c) v[size_t(c)] = test::ref_e4m3(page[(slot % kPage) * d + c]) * *scale;
  return v;
}

TEST(OpKvFp8, IndexerStoreRoundTrip) {
  const int64_t d = 128, m = 70, n_pages = 3;
  Tensor keys = test::rand_tensor({m, d}, 11, 2.0f);
  keys.f32()[5 * d + 3] = 1000.0f;                           // an outlier sets its token's scale
  for (int64_t c = 0; c < d; ++c) keys.f32()[6 * d + c] = 0;  // all zero: the amax floor
  std::vector<int32_t> sl(static_cast<size_t>(m));
  for (int64_t i = 0; i < m; ++i) sl[size_t(i)] = int32_t((i * 37 + 5) % (n_pages * kPage));
  sl[9] = -1;
  Tensor pool = filled_u8({n_pages, ops::indexer_page_bytes(d)}, 0xa5);
  ops::indexer_keys_store_fp8(keys, Tensor::from_i32(sl, {m}), pool);
  std::set<int32_t> written(sl.begin(), sl.end());
  for (int64_t i = 0; i < m; ++i) {
    if (sl[size_t(i)] < 0) continue;
    float scale;
    const std::vector<double> deq = decode_indexer_key(pool, d, sl[size_t(i)], &scale);
    const std::vector<double> rot = hadamard_f64(keys.f32() + i * d, d);
    double amax = 0;
    for (double v : rot) amax = std::max(amax, std::fabs(v));
    ASSERT_TRUE(is_pow2_float(scale)) << i;
    EXPECT_EQ(scale, cpu::ue8m0_scale(float(amax))) << i;
    if (i == 6) {
      EXPECT_EQ(scale, std::ldexp(1.0f, -22));
    }
    for (int64_t c = 0; c < d; ++c) {
      // e4m3 rounding: half an ulp (2^-4 relative) or half the subnormal quantum (2^-10 * scale).
      const double err = std::fabs(deq[size_t(c)] - rot[size_t(c)]);
      EXPECT_LE(err, std::fabs(rot[size_t(c)]) * 0.0625 + std::ldexp(double(scale), -10) + 1e-6 * amax)
          << "key " << i << " dim " << c;
    }
  }
  // Slots nobody wrote keep their bytes.
  const auto* b = static_cast<const uint8_t*>(pool.raw());
  for (int32_t s = 0; s < n_pages * kPage; ++s) {
    if (written.count(s)) continue;
    const uint8_t* page = b + (s / kPage) * ops::indexer_page_bytes(d);
    for (int64_t c = 0; c < d; ++c) ASSERT_EQ(page[(s % kPage) * d + c], 0xa5) << s;
    for (int c = 0; c < 4; ++c) ASSERT_EQ(page[kPage * d + (s % kPage) * 4 + c], 0xa5) << s;
  }
}

// ---------------------------------------------------------------- indexer logits

struct IndexerCase {
  int64_t d, heads;
  std::vector<int64_t> lens;            // keys per sequence
  std::vector<int32_t> row_seq, bounds;  // per query row
};

// The fp8 logits against ops::indexer_logits on the decoded, unrotated keys with the fp32 q.
void check_indexer_vs_fp32(const IndexerCase& c, uint64_t seed) {
  const int64_t rows = int64_t(c.row_seq.size()), d = c.d, heads = c.heads;
  const Paged pg = make_paged(c.lens, seed);
  int64_t total = 0;
  for (int64_t l : c.lens) total += l;
  const Tensor keys = test::rand_tensor({total, d}, seed + 1);
  std::vector<int32_t> sl;
  for (size_t q = 0; q < c.lens.size(); ++q)
    for (int64_t s = 0; s < c.lens[q]; ++s) sl.push_back(pg.slot(int64_t(q), s));
  Tensor pool = filled_u8({pg.n_pages, ops::indexer_page_bytes(d)}, 0);
  ops::indexer_keys_store_fp8(keys, Tensor::from_i32(sl, {total}), pool);
  const Tensor q = test::rand_tensor({rows, heads, d}, seed + 2);
  const Tensor w = test::rand_tensor({rows, heads}, seed + 3, 1.0f / std::sqrt(float(heads)));
  const float scale = 1.0f / std::sqrt(float(d));
  int64_t n_cols = 1;
  for (int64_t l : c.lens) n_cols = std::max(n_cols, l);
  Tensor got = Tensor::empty({rows, n_cols}, DType::F32);
  ops::indexer_logits_fp8(q, w, pool, Tensor::from_i32(pg.table, {int64_t(c.lens.size()), pg.max_pages}),
                          Tensor::from_i32(c.row_seq, {rows}), Tensor::from_i32(c.bounds, {rows}), scale,
                          got);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t seq = c.row_seq[size_t(r)], len = c.lens[size_t(seq)];
    const std::string what = "row " + std::to_string(r) + " d=" + std::to_string(d) +
                             " heads=" + std::to_string(heads) + " len=" + std::to_string(len);
    // The exact reference: decoded keys rotated back (H_d / sqrt(d) is its own inverse).
    Tensor kd = Tensor::zeros({std::max<int64_t>(len, 1), d}, DType::F32);
    for (int64_t s = 0; s < len; ++s) {
      float ks;
      const std::vector<double> deq = decode_indexer_key(pool, d, pg.slot(seq, s), &ks);
      std::vector<float> f(deq.begin(), deq.end());
      const std::vector<double> un = hadamard_f64(f.data(), d);
      for (int64_t i = 0; i < d; ++i) kd.f32()[s * d + i] = float(un[size_t(i)]);
    }
    Tensor want = Tensor::empty({1, len}, DType::F32);
    ops::indexer_logits(q.slice(r, r + 1), w.slice(r, r + 1), kd.slice(0, len),
                        Tensor::from_i32({c.bounds[size_t(r)]}, {1}), scale, want);
    const int64_t bound = c.bounds[size_t(r)];
    double num = 0, den = 0;
    for (int64_t s = 0; s < n_cols; ++s) {
      const float g = got.f32()[r * n_cols + s];
      if (s >= bound) {
        ASSERT_EQ(g, kNinfF) << what << " key " << s;
        continue;
      }
      ASSERT_TRUE(std::isfinite(g)) << what << " key " << s;
      const double e = want.f32()[s];
      num += (g - e) * (g - e);
      den += e * e;
    }
    if (bound > 0) {
      EXPECT_LE(num / std::max(den, 1e-30), kFp8IndexerLogitsNmse) << what;
    }
    // Top-k sanity: the fp8 top-k keeps most of the exact top-k.
    const int64_t k = std::min<int64_t>(bound, 32);
    if (k >= 8) {
      std::vector<int64_t> a(static_cast<size_t>(bound)), b(static_cast<size_t>(bound));
      std::iota(a.begin(), a.end(), 0);
      std::iota(b.begin(), b.end(), 0);
      auto by = [](const float* v) {
        return [v](int64_t x, int64_t y) { return v[x] > v[y] || (v[x] == v[y] && x < y); };
      };
      std::partial_sort(a.begin(), a.begin() + k, a.end(), by(got.f32() + r * n_cols));
      std::partial_sort(b.begin(), b.begin() + k, b.end(), by(want.f32()));
      std::set<int64_t> sa(a.begin(), a.begin() + k);
      int64_t overlap = 0;
      for (int64_t i = 0; i < k; ++i) overlap += sa.count(b[size_t(i)]);
      EXPECT_GE(double(overlap) / double(k), kFp8TopkOverlap) << what;
    }
  }
}

TEST(OpKvFp8, IndexerLogitsAgainstFp32OneSequence) {
  for (int64_t len : {1, 3, 127, 128, 129, 300}) {
    check_indexer_vs_fp32({128, 8, {len}, {0}, {int32_t(len)}}, uint64_t(len));
  }
}

TEST(OpKvFp8, IndexerLogitsAgainstFp32SeveralSequencesAndMtpRows) {
  // Three sequences; sequence 1 has 4 verification rows with consecutive causal bounds, sequence 2
  // is empty (bound 0: all -inf).
  IndexerCase c{64, 16, {200, 130, 0}, {0, 1, 1, 1, 1, 2}, {200, 127, 128, 129, 130, 0}};
  check_indexer_vs_fp32(c, 5);
  check_indexer_vs_fp32({32, 3, {65, 64}, {1, 0, 0}, {64, 65, 1}}, 9);
}

TEST(OpKvFp8, IndexerLogitsAreExactForExactlyRepresentableInputs) {
  // Keys and queries sqrt(d) * e_i rotate to +-1 vectors (a Hadamard column): scale 2^-8, e4m3 values
  // +-256, every product and sum exact, so the fp8 logits equal the fp32 ones exactly.
  const int64_t d = 16, heads = 2;
  const Paged pg = make_paged({5}, 1);
  std::vector<float> kv(size_t(5 * d), 0.0f), qv(size_t(heads * d), 0.0f);
  for (int64_t s = 0; s < 5; ++s) kv[size_t(s * d + s)] = 4.0f;  // sqrt(16) e_s
  qv[0] = 4.0f;
  qv[size_t(d + 2)] = -4.0f;
  std::vector<int32_t> sl;
  for (int64_t s = 0; s < 5; ++s) sl.push_back(pg.slot(0, s));
  Tensor pool = filled_u8({pg.n_pages, ops::indexer_page_bytes(d)}, 0);
  ops::indexer_keys_store_fp8(Tensor::from_f32(kv, {5, d}), Tensor::from_i32(sl, {5}), pool);
  const Tensor q = Tensor::from_f32(qv, {1, heads, d});
  const Tensor w = Tensor::from_f32({0.5f, 0.25f}, {1, heads});
  Tensor got = Tensor::empty({1, 6}, DType::F32), want = Tensor::empty({1, 5}, DType::F32);
  ops::indexer_logits_fp8(q, w, pool, Tensor::from_i32(pg.table, {1, pg.max_pages}),
                          Tensor::from_i32({0}, {1}), Tensor::from_i32({5}, {1}), 0.25f, got);
  ops::indexer_logits(q, w, Tensor::from_f32(kv, {5, d}), Tensor::from_i32({5}, {1}), 0.25f, want);
  for (int64_t s = 0; s < 5; ++s) EXPECT_EQ(got.f32()[s], want.f32()[s]) << s;
  EXPECT_EQ(got.f32()[5], kNinfF);
}

// The store with the key preparation: the bytes of layer_norm + rope + the plain store; keys stay.
TEST(OpKvFp8, IndexerStoreWithKeyPrepIsNormRopeThenStore) {
  const int64_t m = 5, d = 128;
  const Paged pg = make_paged({70}, 4);
  const Tensor keys = test::rand_tensor({m, d}, 51, 2.0f), before = keys.contiguous();
  const Tensor slots = Tensor::from_i32({pg.slot(0, 3), -1, pg.slot(0, 0), pg.slot(0, 69), pg.slot(0, 64)}, {m});
  const ops::RopeFreqs f = ops::compute_rope_freqs(RopeConfig{}, 64);
  for (RopeStyle style : {RopeStyle::kInterleaved, RopeStyle::kHalfSplit}) {
    const ops::IndexerKeyPrep prep{test::rand_tensor({d}, 52, 1.0f), test::rand_tensor({d}, 53, 0.1f), 1e-6f,
                                   Tensor::from_i32({0, 9, 100, 4095, 70000}, {m}), Tensor::from_f32(f.inv_freq, {32}),
                                   0.9f, style};
    Tensor fused = filled_u8({pg.n_pages, ops::indexer_page_bytes(d)}, 0x5a);
    ops::indexer_keys_store_fp8(keys, slots, fused, &prep);
    Tensor prepared = keys.contiguous();
    ops::layer_norm(prepared, prep.norm_weight, prep.norm_bias, prep.eps, prepared);
    Tensor p3 = prepared.view({m, 1, d});
    ops::rope(p3, prep.positions, prep.inv_freq, prep.attention_factor, style, 0);
    Tensor plain = filled_u8({pg.n_pages, ops::indexer_page_bytes(d)}, 0x5a);
    ops::indexer_keys_store_fp8(prepared, slots, plain);
    EXPECT_EQ(std::memcmp(fused.raw(), plain.raw(), size_t(plain.nbytes())), 0) << int(style);
    EXPECT_EQ(std::memcmp(keys.raw(), before.raw(), size_t(keys.nbytes())), 0) << "keys changed";
    ops::indexer_keys_store_fp8(keys, slots, plain);  // the raw keys store other bytes
    EXPECT_NE(std::memcmp(fused.raw(), plain.raw(), size_t(plain.nbytes())), 0);
    ops::IndexerKeyPrep bad = prep;
    bad.norm_bias = Tensor::zeros({d / 2}, DType::F32);
    EXPECT_THROW(ops::indexer_keys_store_fp8(keys, slots, fused, &bad), Error);
  }
}

// The logits with the query preparation: those of rope(q) and weights * weights_scale, bitwise;
// q and the weights stay as they were; a rotation wider than the head is refused.
TEST(OpKvFp8, IndexerLogitsWithQueryPrepAreRopeAndScaleFirst) {
  const int64_t d = 128, heads = 4, rows = 3, len = 150;
  const Paged pg = make_paged({len}, 3);
  std::vector<int32_t> sl;
  for (int64_t s = 0; s < len; ++s) sl.push_back(pg.slot(0, s));
  Tensor pool = filled_u8({pg.n_pages, ops::indexer_page_bytes(d)}, 0);
  ops::indexer_keys_store_fp8(test::rand_tensor({len, d}, 41), Tensor::from_i32(sl, {len}), pool);
  const Tensor q = test::rand_tensor({rows, heads, d}, 42), w = test::rand_tensor({rows, heads}, 43);
  const Tensor q0 = q.contiguous(), w0 = w.contiguous();
  const Tensor table = Tensor::from_i32(pg.table, {1, pg.max_pages});
  const Tensor rs = Tensor::from_i32({0, 0, 0}, {rows}), bd = Tensor::from_i32({150, 149, 100}, {rows});
  const ops::RopeFreqs f = ops::compute_rope_freqs(RopeConfig{}, 64);
  for (RopeStyle style : {RopeStyle::kInterleaved, RopeStyle::kHalfSplit}) {
    const ops::IndexerQueryPrep prep{Tensor::from_i32({7, 4093, 100000}, {rows}), Tensor::from_f32(f.inv_freq, {32}),
                                     0.9f, style, 0.125f};
    Tensor fused = Tensor::empty({rows, len + 2}, DType::F32), plain = Tensor::empty({rows, len + 2}, DType::F32);
    ops::indexer_logits_fp8(q, w, pool, table, rs, bd, 0.0883883f, fused, &prep);
    Tensor qr = q.contiguous(), wr = w.contiguous();
    ops::rope(qr, prep.positions, prep.inv_freq, prep.attention_factor, style, 0);
    ops::scale_inplace(wr, prep.weights_scale);
    ops::indexer_logits_fp8(qr, wr, pool, table, rs, bd, 0.0883883f, plain);
    EXPECT_EQ(std::memcmp(fused.raw(), plain.raw(), size_t(plain.nbytes())), 0) << int(style);
    EXPECT_EQ(std::memcmp(q.raw(), q0.raw(), size_t(q.nbytes())), 0) << "q changed";
    EXPECT_EQ(std::memcmp(w.raw(), w0.raw(), size_t(w.nbytes())), 0) << "weights changed";
    // The rotation matters: without it the logits differ.
    ops::indexer_logits_fp8(q, wr, pool, table, rs, bd, 0.0883883f, plain);
    EXPECT_NE(std::memcmp(fused.raw(), plain.raw(), size_t(plain.nbytes())), 0);
    ops::IndexerQueryPrep bad = prep;
    bad.inv_freq = Tensor::from_f32(std::vector<float>(65, 1.0f), {65});
    EXPECT_THROW(ops::indexer_logits_fp8(q, w, pool, table, rs, bd, 1.0f, fused, &bad), Error);
  }
}

// ---------------------------------------------------------------- MLA cache

// The store with the key preparation: the bytes of rms_norm + rope + the plain store; rows stay.
TEST(OpKvFp8, MlaStoreWithKeyPrepIsNormRopeThenStore) {
  const int64_t m = 5, dk = 576, n_slots = 8;
  const Tensor rows = test::rand_tensor({m, dk}, 31, 3.0f);
  const Tensor before = rows.contiguous();
  const Tensor slots = Tensor::from_i32({3, -1, 0, 7, 5}, {m});
  const ops::RopeFreqs f = ops::compute_rope_freqs(RopeConfig{}, 64);
  for (RopeStyle style : {RopeStyle::kInterleaved, RopeStyle::kHalfSplit}) {
    ops::MlaKeyPrep prep{test::rand_tensor({512}, 32, 1.0f), 1e-6f, Tensor::from_i32({0, 9, 100, 4095, 70000}, {m}),
                         Tensor::from_f32(f.inv_freq, {32}), 1.0f, style};
    Tensor fused = filled_u8({n_slots, ops::kMlaFp8Bytes}, 0x5a);
    ops::mla_cache_store_fp8(rows, slots, fused, &prep);
    Tensor prepared = rows.contiguous();
    Tensor lat = prepared.narrow(1, 0, 512);
    ops::rms_norm(lat, prep.norm_weight, prep.eps, lat);
    Tensor p3 = prepared.view({m, 1, dk});
    ops::rope(p3, prep.positions, prep.inv_freq, 1.0f, style, 512);
    Tensor plain = filled_u8({n_slots, ops::kMlaFp8Bytes}, 0x5a);
    ops::mla_cache_store_fp8(prepared, slots, plain);
    EXPECT_EQ(std::memcmp(fused.raw(), plain.raw(), size_t(plain.nbytes())), 0);
    EXPECT_EQ(std::memcmp(rows.f32(), before.f32(), size_t(rows.nbytes())), 0) << "rows changed";
    ops::MlaKeyPrep bad = prep;
    bad.inv_freq = Tensor::from_f32(std::vector<float>(16, 1.0f), {16});
    EXPECT_THROW(ops::mla_cache_store_fp8(rows, slots, fused, &bad), Error);
  }
}

TEST(OpKvFp8, MlaStoreLoadRoundTrip) {
  const int64_t m = 9, dk = 576, n_slots = 20;
  Tensor rows = test::rand_tensor({m, dk}, 21, 3.0f);
  rows.f32()[2 * dk + 130] = 5000.0f;                          // tile 1 of row 2: a big scale
  for (int64_t c = 256; c < 384; ++c) rows.f32()[3 * dk + c] = 0;  // tile 2 of row 3: the floor
  const std::vector<int32_t> sl = {4, 0, 19, 7, -1, 8, 9, 1, 2};
  Tensor pool = filled_u8({n_slots, ops::kMlaFp8Bytes}, 0x5a);
  ops::mla_cache_store_fp8(rows, Tensor::from_i32(sl, {m}), pool);
  std::vector<int32_t> load_sl = sl;
  load_sl.push_back(-1);
  Tensor back = Tensor::empty({m + 1, dk}, DType::F32);
  ops::mla_cache_load_fp8(pool, Tensor::from_i32(load_sl, {m + 1}), back);
  const auto* b = static_cast<const uint8_t*>(pool.raw());
  for (int64_t i = 0; i < m; ++i) {
    if (sl[size_t(i)] < 0) {
      for (int64_t c = 0; c < dk; ++c) ASSERT_EQ(back.f32()[i * dk + c], 0.0f);
      continue;
    }
    const uint8_t* e = b + sl[size_t(i)] * ops::kMlaFp8Bytes;
    for (int t = 0; t < 4; ++t) {
      float scale;
      std::memcpy(&scale, e + 512 + 4 * t, 4);
      double amax = 0;
      for (int c = 0; c < 128; ++c) amax = std::max(amax, double(std::fabs(rows.f32()[i * dk + t * 128 + c])));
      ASSERT_TRUE(is_pow2_float(scale));
      EXPECT_EQ(scale, cpu::ue8m0_scale(float(amax))) << i << " tile " << t;
      for (int c = 0; c < 128; ++c) {
        const int64_t k = i * dk + t * 128 + c;
        const double deq = test::ref_e4m3(e[t * 128 + c]) * scale;
        EXPECT_EQ(back.f32()[k], float(deq));
        EXPECT_LE(std::fabs(deq - rows.f32()[k]),
                  std::fabs(rows.f32()[k]) * 0.0625 + std::ldexp(double(scale), -10))
            << i << " " << c;
      }
    }
    for (int c = 0; c < 64; ++c) {
      uint16_t h;
      std::memcpy(&h, e + 528 + 2 * c, 2);
      EXPECT_EQ(h, f32_to_bf16(rows.f32()[i * dk + 512 + c]));
      EXPECT_EQ(back.f32()[i * dk + 512 + c], float(test::ref_bf16(h)));
    }
  }
  for (int64_t c = 0; c < dk; ++c) ASSERT_EQ(back.f32()[m * dk + c], 0.0f);
  for (int32_t s : {3, 5, 6, 10, 18})  // untouched slots
    for (int c = 0; c < ops::kMlaFp8Bytes; ++c) ASSERT_EQ(b[s * ops::kMlaFp8Bytes + c], 0x5a);
}

// Random index lists with holes (-1) and duplicates; one all-empty row.
std::vector<int32_t> random_indices(int64_t rows, int64_t topk, int64_t n_slots, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> idx(size_t(rows * topk));
  for (auto& v : idx) v = (rng() % 7 == 0) ? -1 : int32_t(rng() % uint64_t(n_slots));
  if (rows > 1)
    for (int64_t j = 0; j < topk; ++j) idx[size_t(topk + j)] = -1;
  return idx;
}

TEST(OpKvFp8, SparseMlaMatchesTheReferenceOnDecodedAndUnquantisedRows) {
  for (int64_t heads : {1, 3, 16}) {
    for (int64_t topk : {1, 33, 200}) {
      const int64_t rows = 3, n_slots = 150, dk = 576;
      const std::string what = "heads=" + std::to_string(heads) + " topk=" + std::to_string(topk);
      const Tensor kv = test::rand_tensor({n_slots, dk}, uint64_t(heads * 100 + topk));
      std::vector<int32_t> all(static_cast<size_t>(n_slots));
      std::iota(all.begin(), all.end(), 0);
      Tensor pool = filled_u8({n_slots, ops::kMlaFp8Bytes}, 0);
      ops::mla_cache_store_fp8(kv, Tensor::from_i32(all, {n_slots}), pool);
      Tensor dec = Tensor::empty({n_slots, dk}, DType::F32);
      ops::mla_cache_load_fp8(pool, Tensor::from_i32(all, {n_slots}), dec);
      const Tensor q = test::rand_tensor({rows, heads, dk}, uint64_t(topk) + 7);
      const Tensor idx = Tensor::from_i32(random_indices(rows, topk, n_slots, uint64_t(topk)), {rows, topk});
      const float scale = 1.0f / std::sqrt(float(dk));
      Tensor out = Tensor::empty({rows, heads, 512}, DType::F32), lse = Tensor::empty({rows, heads}, DType::F32);
      ops::sparse_mla_fp8(q, pool, idx, scale, 512, out, lse);
      // Tight: the reference on the decoded cache, bitwise (same loops, same order).
      Tensor o2 = Tensor::empty({rows, heads, 512}, DType::F32), l2 = Tensor::empty({rows, heads}, DType::F32);
      ops::sparse_mla(q, dec, idx, scale, 512, o2, l2);
      EXPECT_EQ(std::memcmp(out.raw(), o2.raw(), out.nbytes()), 0) << what;
      EXPECT_EQ(std::memcmp(lse.raw(), l2.raw(), lse.nbytes()), 0) << what;
      // Loose: the unquantised rows.
      Tensor o3 = Tensor::empty({rows, heads, 512}, DType::F32), l3 = Tensor::empty({rows, heads}, DType::F32);
      ops::sparse_mla(q, kv, idx, scale, 512, o3, l3);
      EXPECT_LE(test::nmse(out, o3), kFp8SparseMlaNmse) << what;
      for (int64_t h = 0; h < heads; ++h) {  // the empty row: 0 and -inf
        EXPECT_EQ(lse.f32()[heads + h], kNinfF);
        EXPECT_EQ(out.f32()[(heads + h) * 512 + 7], 0.0f);
        EXPECT_NEAR(lse.f32()[h], l3.f32()[h], 0.05) << what;
      }
    }
  }
}

// ---------------------------------------------------------------- errors

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(OpKvFp8, BoundaryErrorsNameTheBadValue) {
  Tensor pool = filled_u8({2, ops::indexer_page_bytes(128)}, 0);
  EXPECT_NE(error_of([&] {
              ops::indexer_keys_store_fp8(Tensor::zeros({1, 96}, DType::F32),
                                          Tensor::from_i32({0}, {1}), pool);
            }).find("d = 96 is not a power of two"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              ops::indexer_keys_store_fp8(Tensor::zeros({1, 128}, DType::F32),
                                          Tensor::from_i32({128}, {1}), pool);
            }).find("slot 128 of key 0 outside the pool's 128 slots"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              ops::indexer_keys_store_fp8(Tensor::zeros({1, 128}, DType::I32),
                                          Tensor::from_i32({0}, {1}), pool);
            }).find("keys"),
            std::string::npos);
  const Tensor q = Tensor::zeros({1, 2, 128}, DType::F32), w = Tensor::zeros({1, 2}, DType::F32);
  const Tensor table = Tensor::from_i32({0, -1}, {1, 2});
  Tensor logits = Tensor::empty({1, 100}, DType::F32);
  EXPECT_NE(error_of([&] {
              ops::indexer_logits_fp8(q, w, pool, table, Tensor::from_i32({0}, {1}),
                                      Tensor::from_i32({70}, {1}), 1.0f, logits);
            }).find("sequence 0 page 1 is physical page -1"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              ops::indexer_logits_fp8(q, w, pool, table, Tensor::from_i32({0}, {1}),
                                      Tensor::from_i32({101}, {1}), 1.0f, logits);
            }).find("row 0 bound 101 outside [0, 100]"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              ops::indexer_logits_fp8(q, w, pool, table, Tensor::from_i32({1}, {1}),
                                      Tensor::from_i32({1}, {1}), 1.0f, logits);
            }).find("row 0 has sequence 1 outside [0, 1)"),
            std::string::npos);
  Tensor mpool = filled_u8({4, ops::kMlaFp8Bytes}, 0);
  EXPECT_NE(error_of([&] {
              ops::mla_cache_store_fp8(Tensor::zeros({1, 576}, DType::F32), Tensor::from_i32({4}, {1}),
                                       mpool);
            }).find("slot 4 of row 0 outside the pool's 4 slots"),
            std::string::npos);
  Tensor out = Tensor::empty({1, 1, 512}, DType::F32), lse = Tensor::empty({1, 1}, DType::F32);
  EXPECT_NE(error_of([&] {
              ops::sparse_mla_fp8(Tensor::zeros({1, 1, 576}, DType::F32), mpool,
                                  Tensor::from_i32({1, 4}, {1, 2}), 1.0f, 512, out, lse);
            }).find("index 4 outside the 4 cache slots"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              ops::sparse_mla_fp8(Tensor::zeros({1, 1, 576}, DType::F32), mpool,
                                  Tensor::from_i32({1}, {1, 1}), 1.0f, 256, out, lse);
            }).find("dv = 256"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              Tensor small = filled_u8({4, 600}, 0);
              ops::mla_cache_store_fp8(Tensor::zeros({1, 576}, DType::F32), Tensor::from_i32({0}, {1}),
                                       small);
            }).find("pool"),
            std::string::npos);
}

}  // namespace
}  // namespace dsi
