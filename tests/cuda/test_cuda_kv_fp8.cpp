// CUDA tests of the fp8 KV caches (ops/kv_fp8.h) against the CPU reference in one process: the store
// ops write bitwise-identical pools (untouched bytes included), mla_cache_load_fp8 and the CUDA-core
// indexer logits (d < 128) are bitwise equal (same rounding at every step), the tensor-core indexer
// logits (d = 128) stay within a stated bound and give the CPU's top-k where its boundary is
// separated, sparse_mla_fp8 (bf16 tensor cores) agrees
// by normalised MSE with its stated bound; odd key counts (0..2049), several sequences and MTP rows
// per call, heads 1..128, forced logits plans (few blocks: long page walks), every tiling of the
// split-KV decode, NaN guard regions around outputs,
// repeated runs bitwise equal, and the CPU's error messages.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "backends/cuda/kv_fp8/kv_fp8.h"
#include "backends/cuda/kv_fp8/sm90_indexer_logits.h"
#include "backends/cuda/kv_fp8/sm90_sparse_mla_decode.h"
#include "backends/cpu/cpu_kv_fp8.h"
#include "cuda/cuda_test_util.h"
#include "ops/elementwise.h"
#include "ops/kv_fp8.h"
#include "ops/norm.h"
#include "ops/rope.h"
#include "ops/topk.h"

namespace dsi {
namespace {

using test::dev;
using test::host;

class CudaKvFp8 : public test::CudaTest {};

constexpr int64_t kPage = ops::kKvPageTokens;
const std::vector<int64_t> kKeyCounts = {0, 1, 3, 127, 128, 129, 2047, 2048, 2049};

std::string sz(const char* name, int64_t v) { return std::string(" ") + name + "=" + std::to_string(v); }

Tensor filled_u8(const Shape& shape, uint8_t v) {
  Tensor t = Tensor::empty(shape, DType::U8);
  if (t.nbytes() > 0) std::memset(t.raw(), v, t.nbytes());
  return t;
}

Tensor i32(const std::vector<int32_t>& v, const Shape& shape) {
  if (v.empty()) return Tensor::empty(shape, DType::I32);
  return Tensor::from_i32(v, shape);
}

// Bytes of two host U8 tensors; reports the first differing offsets.
void expect_same_bytes(const Tensor& got, const Tensor& want, int64_t row_bytes, const std::string& what) {
  ASSERT_EQ(got.nbytes(), want.nbytes()) << what;
  const auto* g = static_cast<const uint8_t*>(got.raw());
  const auto* w = static_cast<const uint8_t*>(want.raw());
  int bad = 0;
  for (size_t i = 0; i < got.nbytes(); ++i)
    if (g[i] != w[i] && bad++ < 5)
      ADD_FAILURE() << what << ": byte " << i << " (row " << int64_t(i) / row_bytes << ", offset "
                    << int64_t(i) % row_bytes << ") GPU " << int(g[i]) << " CPU " << int(w[i]);
  EXPECT_EQ(bad, 0) << what << ": pools differ";
}

// A paged layout: physical pages shuffled, block tables padded with -1.
struct Paged {
  int64_t n_pages = 0, max_pages = 1;
  std::vector<int32_t> table;
  int32_t slot(int64_t seq, int64_t s) const {
    return table[size_t(seq * max_pages + s / kPage)] * int32_t(kPage) + int32_t(s % kPage);
  }
};

Paged make_paged(const std::vector<int64_t>& lens, uint64_t seed) {
  Paged p;
  int64_t total = 0;
  for (int64_t l : lens) {
    p.max_pages = std::max(p.max_pages, (l + kPage - 1) / kPage);
    total += (l + kPage - 1) / kPage;
  }
  p.n_pages = total + 2;
  std::vector<int32_t> phys(static_cast<size_t>(p.n_pages));
  std::iota(phys.begin(), phys.end(), 0);
  std::mt19937_64 rng(seed);
  std::shuffle(phys.begin(), phys.end(), rng);
  p.table.assign(lens.size() * size_t(p.max_pages), -1);
  size_t next = 0;
  for (size_t q = 0; q < lens.size(); ++q)
    for (int64_t pg = 0; pg * kPage < lens[q]; ++pg) p.table[q * size_t(p.max_pages) + size_t(pg)] = phys[next++];
  return p;
}

// ---------------------------------------------------------------- indexer key store

TEST_F(CudaKvFp8, IndexerStoreBitwiseEqualPools) {
  for (int64_t d : {128, 64, 32, 16}) {
    for (int64_t m : {0, 1, 3, 127, 128, 129, 2049}) {
      const std::string what = "indexer store" + sz("d", d) + sz("m", m);
      const int64_t n_pages = (m + kPage - 1) / kPage + 1;
      Tensor keys = test::rand_tensor({m, d}, uint64_t(m * 7 + d), 3.0f);
      if (m > 2) {
        keys.f32()[d + 1] = 3000.0f;                               // an outlier
        for (int64_t c = 0; c < d; ++c) keys.f32()[2 * d + c] = 0;  // the amax floor
      }
      std::vector<int32_t> sl(static_cast<size_t>(n_pages * kPage));
      std::iota(sl.begin(), sl.end(), 0);
      std::mt19937_64 rng{uint64_t(m)};
      std::shuffle(sl.begin(), sl.end(), rng);
      sl.resize(static_cast<size_t>(m));
      for (size_t i = 5; i < sl.size(); i += 11) sl[i] = -1;
      const Tensor slots = i32(sl, {m});
      Tensor cpu_pool = filled_u8({n_pages, ops::indexer_page_bytes(d)}, 0xa5);
      Tensor gpu_pool = dev(cpu_pool);
      ops::indexer_keys_store_fp8(keys, slots, cpu_pool);
      ops::indexer_keys_store_fp8(test::dev_strided(keys), dev(slots), gpu_pool);
      expect_same_bytes(host(gpu_pool), cpu_pool, ops::indexer_page_bytes(d), what);
    }
  }
}

// ---------------------------------------------------------------- indexer logits

struct LogitsCase {
  int64_t d, heads;
  std::vector<int64_t> lens;
  std::vector<int32_t> row_seq, bounds;
  int plant = 0;  // > 0: this many keys per sequence scaled by 1000 and positive head weights
};

// Tensor-core logits (d = 128) against the CPU. Both sum exact e4m3 products; the CPU adds them in c
// order in fp32 (relative error <= ~200 * 2^-24 of the magnitude below), the tensor core in k32
// steps with a narrower internal accumulator (Hopper's fp8 wgmma aligns the products of a step to
// the largest exponent and keeps about 14 bits), then the heads lane-parallel. Bound per logit:
// kIndexerMmaRelBound times its magnitude M = k_scale * sum_j |w'_j| * sum_c |q8_jc k8_c| (relu is
// 1-Lipschitz); and the normalised MSE over all logits, kIndexerMmaNmse. The tests print what they
// measure.
constexpr double kIndexerMmaRelBound = 1.0 / (1 << 10);
constexpr double kIndexerMmaNmse = 1e-6;

// M[r, s] as above (0 where s >= bound), in double, from the CPU's own quantisation of q.
Tensor logits_magnitude(const Tensor& q, const Tensor& w, const Tensor& pool, const Paged& pg,
                        const LogitsCase& c, float scale, int64_t n_cols) {
  const int64_t rows = q.dim(0), heads = q.dim(1), d = q.dim(2), page_bytes = ops::indexer_page_bytes(d);
  Tensor m = Tensor::zeros({rows, n_cols}, DType::F32);
  std::vector<double> qa(static_cast<size_t>(heads * d)), wa(static_cast<size_t>(heads)), ka(static_cast<size_t>(d));
  std::vector<uint8_t> qb(static_cast<size_t>(d));
  const auto* base = static_cast<const uint8_t*>(pool.raw());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < heads; ++j) {
      const float qs = cpu::rotate_quantize(q.f32() + (r * heads + j) * d, d, qb.data());
      for (int64_t i = 0; i < d; ++i) qa[size_t(j * d + i)] = std::fabs(e4m3_to_f32(qb[size_t(i)]));
      wa[size_t(j)] = std::fabs(double(w.f32()[r * heads + j]) * qs * scale);
    }
    const int64_t seq = c.row_seq[size_t(r)];
    for (int64_t s = 0; s < c.bounds[size_t(r)]; ++s) {
      const uint8_t* page = base + int64_t(pg.table[size_t(seq * pg.max_pages + s / kPage)]) * page_bytes;
      for (int64_t i = 0; i < d; ++i) ka[size_t(i)] = std::fabs(e4m3_to_f32(page[(s % kPage) * d + i]));
      float ks;
      std::memcpy(&ks, page + kPage * d + (s % kPage) * 4, 4);
      double acc = 0;
      for (int64_t j = 0; j < heads; ++j) {
        double dot = 0;
        for (int64_t i = 0; i < d; ++i) dot += qa[size_t(j * d + i)] * ka[size_t(i)];
        acc += wa[size_t(j)] * dot;
      }
      m.f32()[r * n_cols + s] = float(acc * ks);
    }
  }
  return m;
}

void expect_logits_within(const Tensor& got, const Tensor& cpu, const Tensor& mag, const std::string& what) {
  double worst = 0, num = 0, den = 0;
  int bad = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double gv = got.f32()[i], cv = cpu.f32()[i], mv = mag.f32()[i];
    if (!std::isfinite(cv)) continue;
    const double err = std::fabs(gv - cv);
    num += err * err;
    den += cv * cv;
    if (mv > 0) worst = std::max(worst, err / mv);
    if (!(err <= kIndexerMmaRelBound * mv) && bad++ < 5)
      ADD_FAILURE() << what << ": logit " << i << " GPU " << gv << " CPU " << cv << " magnitude " << mv;
  }
  EXPECT_EQ(bad, 0) << what << ": logits outside the tensor-core bound";
  const double e = den > 0 ? num / den : num;
  EXPECT_LE(e, kIndexerMmaNmse) << what;
  std::printf("[ measured ] %s: max |gpu - cpu| / magnitude %.3g, nmse %.3g\n", what.c_str(), worst, e);
}

// Top-k on the GPU logits (GPU op) against top-k on the CPU logits (CPU op), for each row whose
// boundary is separated by more than the bound: min over the CPU's winners of (cpu - bound) above
// max over the others of (cpu + bound). Such rows must select the same set. Returns rows checked.
int expect_topk_agrees(const Tensor& got, const Tensor& cpu, const Tensor& mag,
                       const std::vector<int32_t>& bounds, const std::string& what) {
  const int64_t rows = cpu.dim(0), n = cpu.dim(1);
  int checked = 0;
  for (int k : {1, 8, 64, 2048}) {
    if (n == 0) break;
    const Tensor hb = i32(bounds, {rows});
    Tensor ci = Tensor::empty({rows, k}, DType::I32);
    ops::topk(cpu, hb, k, ci, nullptr);
    Tensor gi = Tensor::empty({rows, k}, DType::I32, test::gpu());
    ops::topk(dev(got), dev(hb), k, gi, nullptr);
    const Tensor gh = host(gi);
    for (int64_t r = 0; r < rows; ++r) {
      const int32_t* cw = ci.i32() + r * k;
      std::vector<char> in(size_t(n), 0);
      double sel_min = INFINITY, other_max = -INFINITY;
      for (int j = 0; j < k; ++j)
        if (cw[j] >= 0) {
          in[size_t(cw[j])] = 1;
          sel_min = std::min(sel_min, double(cpu.f32()[r * n + cw[j]]) - kIndexerMmaRelBound * mag.f32()[r * n + cw[j]]);
        }
      for (int64_t s = 0; s < bounds[size_t(r)]; ++s)
        if (!in[size_t(s)]) other_max = std::max(other_max, double(cpu.f32()[r * n + s]) + kIndexerMmaRelBound * mag.f32()[r * n + s]);
      if (!(sel_min > other_max)) continue;
      ++checked;
      std::vector<int32_t> a(cw, cw + k), b(gh.i32() + r * k, gh.i32() + (r + 1) * k);
      std::sort(a.begin(), a.end());
      std::sort(b.begin(), b.end());
      EXPECT_EQ(a, b) << what << ": top-" << k << " of row " << r << " differs from the CPU's";
    }
  }
  return checked;
}

// Returns the number of (row, k) top-k checks whose boundary was separated (d = 128); the GPU's
// logits (host) in *got_out when given.
int run_logits_case(const LogitsCase& c, uint64_t seed, const std::string& what, Tensor* got_out = nullptr) {
  const int64_t rows = int64_t(c.row_seq.size()), d = c.d, heads = c.heads;
  const Paged pg = make_paged(c.lens, seed);
  int64_t total = 0, n_cols = 0;
  for (int64_t l : c.lens) {
    total += l;
    n_cols = std::max(n_cols, l);
  }
  n_cols += 3;  // columns past every bound: -inf
  Tensor keys = test::rand_tensor({total, d}, seed + 1);
  int64_t first = 0;
  for (int64_t l : c.lens) {  // planted keys: positions 61 i + 7 mod len (lengths not multiples of 61)
    for (int64_t i = 0; i < std::min<int64_t>(c.plant, l); ++i)
      for (int64_t e = 0; e < d; ++e) keys.f32()[(first + (61 * i + 7) % l) * d + e] *= 1000.0f;
    first += l;
  }
  std::vector<int32_t> sl;
  for (size_t q = 0; q < c.lens.size(); ++q)
    for (int64_t s = 0; s < c.lens[q]; ++s) sl.push_back(pg.slot(int64_t(q), s));
  Tensor pool = filled_u8({pg.n_pages, ops::indexer_page_bytes(d)}, 0);
  ops::indexer_keys_store_fp8(keys, i32(sl, {total}), pool);
  const Tensor q = test::rand_tensor({rows, heads, d}, seed + 2);
  Tensor w = test::rand_tensor({rows, heads}, seed + 3, 1.0f / std::sqrt(float(heads)));
  if (c.plant > 0)
    for (int64_t i = 0; i < w.numel(); ++i) w.f32()[i] = std::fabs(w.f32()[i]);
  const Tensor table = i32(pg.table, {int64_t(c.lens.size()), pg.max_pages});
  const Tensor rs = i32(c.row_seq, {rows}), bd = i32(c.bounds, {rows});
  const float scale = 1.0f / std::sqrt(float(d));
  Tensor cpu = Tensor::empty({rows, n_cols}, DType::F32);
  ops::indexer_logits_fp8(q, w, pool, table, rs, bd, scale, cpu);
  test::Guarded g = test::guarded({rows, n_cols}, DType::F32);
  const Tensor dq = dev(q), dw = dev(w), dp = dev(pool), dt = dev(table), drs = dev(rs), dbd = dev(bd);
  ops::indexer_logits_fp8(dq, dw, dp, dt, drs, dbd, scale, g.view);
  const Tensor got = g.check(what);
  test::expect_same_specials(got, cpu, what);
  int checked = 0;
  if (d == 128) {
    // The tensor-core kernel (sm90_indexer_logits.cu): exact e4m3 products, other summation order
    // and width; bounded by the magnitude of the terms, and the top-k must agree where separated.
    const Tensor bnd = logits_magnitude(q, w, pool, pg, c, scale, n_cols);
    expect_logits_within(got, cpu, bnd, what);
    checked = expect_topk_agrees(got, cpu, bnd, c.bounds, what);
  } else {
    // The CUDA-core kernel: same rounding at every step (the heads summed in order): bitwise.
    test::expect_nmse_close(got, cpu, tol::kCudaReductionNmse, what);
    test::expect_bitwise(got, cpu, what + " (bitwise)");
  }
  ops::indexer_logits_fp8(dq, dw, dp, dt, drs, dbd, scale, g.view);
  test::expect_bitwise(g.check(what), got, what + " repeat");
  if (got_out != nullptr) *got_out = got;
  return checked;
}

TEST_F(CudaKvFp8, IndexerLogitsOddKeyCounts) {
  for (int64_t n : kKeyCounts) {
    // One sequence, three rows: the full bound, half of it and an MTP-like bound one short.
    const int32_t b = int32_t(n);
    run_logits_case({128, 8, {n}, {0, 0, 0}, {b, b / 2, std::max(b - 1, 0)}}, uint64_t(n) + 1,
                    "indexer logits" + sz("n_keys", n));
  }
}

TEST_F(CudaKvFp8, IndexerLogitsSeveralSequencesMtpRowsAndHeads) {
  // Sequences of different lengths in one call; sequence 1 has 4 verification rows with consecutive
  // causal bounds; sequence 3 is empty.
  for (int64_t heads : {1, 32, 64, 96, 128}) {
    run_logits_case({128, heads, {2049, 129, 1, 0}, {0, 1, 1, 1, 1, 2, 3}, {2049, 126, 127, 128, 129, 1, 0}},
                    uint64_t(heads), "indexer logits batch" + sz("heads", heads));
  }
  for (int64_t d : {16, 32, 64}) {
    run_logits_case({d, 5, {300, 64}, {1, 0, 0}, {64, 300, 65}}, uint64_t(d), "indexer logits" + sz("d", d));
  }
}

TEST_F(CudaKvFp8, IndexerLogitsDecodeShapesAndSeparatedTopk) {
  // GLM-5 decode geometry (64 heads): 1 row, and 2 sequences x 4 MTP rows, 5000 and 3001 keys.
  run_logits_case({128, 64, {5000}, {0}, {5000}}, 201, "indexer logits decode rows=1");
  run_logits_case({128, 64, {5000, 3001}, {0, 0, 0, 0, 1, 1, 1, 1}, {4997, 4998, 4999, 5000, 2998, 2999, 3000, 3001}},
                  202, "indexer logits decode rows=2x4");
  // Calls of 2 and 3 rows (the kernel sizes its accumulators by the call): GLM-5's 32 heads and 64.
  for (int64_t heads : {32, 64}) {
    run_logits_case({128, heads, {3000}, {0, 0}, {2999, 3000}}, 204 + uint64_t(heads),
                    "indexer logits rows=2" + sz("heads", heads));
    run_logits_case({128, heads, {3001}, {0, 0, 0}, {2999, 3000, 3001}}, 205 + uint64_t(heads),
                    "indexer logits rows=3" + sz("heads", heads));
  }
  // 64 planted keys per sequence (x1000, positive weights): the top-64 boundary is far apart, so the
  // GPU top-64 of the GPU logits must be the CPU's on every row.
  const int checked = run_logits_case(
      {128, 64, {4099, 2051}, {0, 0, 0, 1}, {4099, 4000, 4098, 2051}, 64}, 203, "indexer logits planted");
  EXPECT_GE(checked, 4) << "every row's top-64 boundary is separated";
}

// The tensor-core kernel with few blocks per row group, so that each block walks many pages (its
// double buffer wraps around many times and the barriers' phases flip): 1 row of 32 heads; 2
// sequences x 4 MTP rows of 64 heads with bounds inside the last pages; a group of 3 rows and one
// of 2 (32 heads); 2 rows of 128 heads (two chunks a row). The same bound and top-k checks as the
// launch's own plan, and the same bits (a logit's sums do not depend on which block reads its page).
TEST_F(CudaKvFp8, IndexerLogitsLongPageWalks) {
  struct Restore {
    ~Restore() { cuda::set_indexer_logits_blocks(0); }
  } restore;
  const std::vector<LogitsCase> cases = {
      {128, 32, {3001}, {0}, {3001}},
      {128, 64, {2999, 1500}, {0, 0, 0, 0, 1, 1, 1, 1}, {2996, 2997, 2998, 2999, 1497, 1498, 1499, 1500}},
      {128, 32, {700, 300}, {0, 0, 0, 1, 1}, {698, 699, 700, 299, 300}},
      {128, 128, {1000}, {0, 0}, {999, 1000}}};
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    Tensor first;
    for (int blocks : {0, 1, 3}) {
      cuda::set_indexer_logits_blocks(blocks);
      const std::string what = "indexer logits" + sz("case", int64_t(ci)) + sz("blocks", blocks);
      Tensor got;
      run_logits_case(cases[ci], 300 + ci, what, &got);
      if (blocks == 0) first = got;
      else test::expect_bitwise(got, first, what + " against the launch's plan");
    }
  }
}

// The key store with the key preparation (LayerNorm and RoPE inside the rotation): the bytes of the
// GPU's own layer_norm + rope + store, for contiguous keys (the norm's float4 path) and strided ones
// (its scalar path), d = 128 and 64, both RoPE layouts; the keys stay as they were.
TEST_F(CudaKvFp8, IndexerStoreKeyPrepIsNormRopeThenStore) {
  for (int64_t d : {128, 64}) {
    const int64_t m = 37;
    const Paged pg = make_paged({m + 20}, uint64_t(d) + 7);
    std::vector<int32_t> sl;
    for (int64_t s = 0; s < m; ++s) sl.push_back(s % 11 == 5 ? -1 : pg.slot(0, (s * 7) % (m + 20)));
    const Tensor slots = dev(i32(sl, {m}));
    const Tensor keys = test::rand_tensor({m, d}, uint64_t(d) + 8, 3.0f);
    const ops::RopeFreqs f = ops::compute_rope_freqs(RopeConfig{}, int(d / 2));
    const int64_t half = int64_t(f.inv_freq.size());
    std::vector<int32_t> pos(static_cast<size_t>(m));
    for (int64_t i = 0; i < m; ++i) pos[size_t(i)] = int32_t((i * 7919 + 3) % 163840);
    for (RopeStyle style : {RopeStyle::kInterleaved, RopeStyle::kHalfSplit}) {
      const ops::IndexerKeyPrep dprep{dev(test::rand_tensor({d}, uint64_t(d) + 9, 1.0f)),
                                      dev(test::rand_tensor({d}, uint64_t(d) + 10, 0.1f)), 1e-6f, dev(i32(pos, {m})),
                                      dev(Tensor::from_f32(f.inv_freq, {half})), 0.9f, style};
      for (bool strided : {false, true}) {
        const std::string what = "indexer store prep" + sz("d", d) + " style " + std::to_string(int(style)) +
                                 (strided ? " strided" : " contiguous");
        const Tensor dk = strided ? test::dev_strided(keys) : dev(keys);
        Tensor fused = dev(filled_u8({pg.n_pages, ops::indexer_page_bytes(d)}, 0x5a));
        ops::indexer_keys_store_fp8(dk, slots, fused, &dprep);
        test::expect_bitwise(host(dk).contiguous(), keys, what + " keys untouched");
        Tensor prepared = strided ? test::dev_strided(keys) : dev(keys);  // the ops one after another
        ops::layer_norm(prepared, dprep.norm_weight, dprep.norm_bias, dprep.eps, prepared);
        Tensor p3 = prepared.unsqueeze(1);
        ops::rope(p3, dprep.positions, dprep.inv_freq, dprep.attention_factor, style, 0);
        Tensor separate = dev(filled_u8({pg.n_pages, ops::indexer_page_bytes(d)}, 0x5a));
        ops::indexer_keys_store_fp8(prepared, slots, separate);
        const Tensor fused_h = host(fused);
        expect_same_bytes(fused_h, host(separate), ops::indexer_page_bytes(d), what);
        Tensor raw = dev(filled_u8({pg.n_pages, ops::indexer_page_bytes(d)}, 0x5a));
        ops::indexer_keys_store_fp8(dk, slots, raw);
        EXPECT_NE(std::memcmp(fused_h.raw(), host(raw).raw(), size_t(fused_h.nbytes())), 0) << what;
      }
    }
  }
}

// The logits with the query preparation (RoPE of q and the weights' scale inside the rotation):
// bitwise the GPU's own rope + scale_inplace + logits, on both kernels (d = 128 tensor cores, d = 64
// CUDA cores, where it is also bitwise the CPU's fused op), both RoPE layouts; q and the weights
// stay as they were.
TEST_F(CudaKvFp8, IndexerLogitsQueryPrepIsRopeAndScaleFirst) {
  for (int64_t d : {128, 64}) {
    const int64_t heads = 64, rows = 4, len = 1000, n_cols = len + 3;
    const Paged pg = make_paged({len}, uint64_t(d));
    std::vector<int32_t> sl;
    for (int64_t s = 0; s < len; ++s) sl.push_back(pg.slot(0, s));
    Tensor pool = filled_u8({pg.n_pages, ops::indexer_page_bytes(d)}, 0);
    ops::indexer_keys_store_fp8(test::rand_tensor({len, d}, uint64_t(d) + 1), i32(sl, {len}), pool);
    const Tensor q = test::rand_tensor({rows, heads, d}, uint64_t(d) + 2);
    const Tensor w = test::rand_tensor({rows, heads}, uint64_t(d) + 3);
    const Tensor dp = dev(pool), dt = dev(i32(pg.table, {1, pg.max_pages}));
    const Tensor rs = i32({0, 0, 0, 0}, {rows}), bd = i32({1000, 999, 998, 997}, {rows});
    const Tensor drs = dev(rs), dbd = dev(bd);
    const float scale = 1.0f / std::sqrt(float(d));
    const ops::RopeFreqs f = ops::compute_rope_freqs(RopeConfig{}, int(d / 2));
    const int64_t half = int64_t(f.inv_freq.size());
    for (RopeStyle style : {RopeStyle::kInterleaved, RopeStyle::kHalfSplit}) {
      const std::string what = "indexer logits prep" + sz("d", d) + " style " + std::to_string(int(style));
      const ops::IndexerQueryPrep prep{i32({5, 4095, 70000, 131071}, {rows}), Tensor::from_f32(f.inv_freq, {half}),
                                       0.9f, style, 1.0f / std::sqrt(float(heads))};
      const ops::IndexerQueryPrep dprep{dev(prep.positions), dev(prep.inv_freq), prep.attention_factor, style,
                                        prep.weights_scale};
      const Tensor dq = dev(q), dw = dev(w);
      test::Guarded fused = test::guarded({rows, n_cols}, DType::F32);
      ops::indexer_logits_fp8(dq, dw, dp, dt, drs, dbd, scale, fused.view, &dprep);
      const Tensor got = fused.check(what);
      test::expect_bitwise(host(dq), q, what + " q untouched");
      test::expect_bitwise(host(dw), w, what + " weights untouched");
      Tensor qr = dev(q), wr = dev(w);  // the ops one after another, on the GPU
      ops::rope(qr, dprep.positions, dprep.inv_freq, dprep.attention_factor, style, 0);
      ops::scale_inplace(wr, dprep.weights_scale);
      test::Guarded plain = test::guarded({rows, n_cols}, DType::F32);
      ops::indexer_logits_fp8(qr, wr, dp, dt, drs, dbd, scale, plain.view);
      test::expect_bitwise(got, plain.check(what + " separate"), what);
      Tensor cpu = Tensor::empty({rows, n_cols}, DType::F32);
      ops::indexer_logits_fp8(q, w, pool, i32(pg.table, {1, pg.max_pages}), rs, bd, scale, cpu, &prep);
      if (d < 128) test::expect_bitwise(got, cpu, what + " vs CPU");
      test::expect_same_specials(got, cpu, what + " vs CPU");
    }
  }
}

// The query rotation of d = 128 (rotate_quant's query mode), on one warp per vector (the default)
// and on one block per vector, against the CPU reference: RoPE of either style or none, then the
// rotation and quantisation; the e4m3 bytes, their f32 values and the folded weights bitwise. An
// outlier, an all-zero vector (the amax floor) and a count of vectors that leaves a block part-full.
TEST_F(CudaKvFp8, QueryRotationOnWarpsAndBlocksIsTheCpus) {
  const int64_t rows = 3, heads = 13, d = 128, n = rows * heads;
  Tensor q = test::rand_tensor({rows, heads, d}, 91, 3.0f);
  q.f32()[d + 9] = 3000.0f;
  for (int64_t c = 0; c < d; ++c) q.f32()[2 * d + c] = 0.0f;
  const Tensor w = test::rand_tensor({rows, heads}, 92);
  const ops::RopeFreqs f = ops::compute_rope_freqs(RopeConfig{}, 64);
  const int64_t half = int64_t(f.inv_freq.size());
  const Tensor pos = i32({7, 4095, 131071}, {rows}), inv = Tensor::from_f32(f.inv_freq, {half});
  const float softmax_scale = 1.0f / std::sqrt(float(d)), wscale = 1.0f / std::sqrt(float(heads));
  const Tensor dq = dev(q), dw = dev(w), dpos = dev(pos), dinv = dev(inv);
  for (int style = -1; style <= 1; ++style) {
    // The CPU: RoPE on a copy, then each vector's rotation and quantisation.
    Tensor qr = Tensor::empty({rows, heads, d}, DType::F32);
    ops::copy(q, qr);
    if (style >= 0) ops::rope(qr, pos, inv, 0.9f, RopeStyle(style), 0);
    std::vector<uint8_t> want(static_cast<size_t>(n * d));
    std::vector<float> want_w(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      const float qs = cpu::rotate_quantize(qr.f32() + i * d, d, want.data() + i * d);
      want_w[size_t(i)] = ((w.f32()[i] * wscale) * qs) * softmax_scale;
    }
    for (bool warp : {true, false}) {
      const std::string what = "query rotation style " + std::to_string(style) + (warp ? " warp" : " block");
      Tensor q8 = dev(Tensor::zeros({n, d}, DType::F32)), q8b = dev(filled_u8({n, d}, 0xa5));
      Tensor wq = dev(Tensor::zeros({n}, DType::F32));
      cuda::RotateQuantParams p{};
      p.x = dq.f32();
      p.x_stride = d;
      p.n = n;
      p.d = int(d);
      p.hadamard_scale = float(1.0 / std::sqrt(double(d)));
      p.weights = dw.f32();
      p.softmax_scale = softmax_scale;
      p.weights_scale = wscale;
      p.q8 = q8.f32();
      p.q8_bytes = static_cast<uint8_t*>(q8b.raw());
      p.wq = wq.f32();
      if (style >= 0) {
        p.positions = dpos.i32();
        p.inv_freq = dinv.f32();
        p.rope_half = int(half);
        p.heads = int(heads);
        p.interleaved = RopeStyle(style) == RopeStyle::kInterleaved;
        p.attention_factor = 0.9f;
      }
      cuda::set_rotate_quant_warp(warp);
      cuda::launch_rotate_quant(p, nullptr);
      cuda::set_rotate_quant_warp(true);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
      const Tensor gb = host(q8b), gf = host(q8), gw = host(wq);
      const auto* b = static_cast<const uint8_t*>(gb.raw());
      int bad = 0;
      for (int64_t i = 0; i < n * d; ++i)
        if ((b[i] != want[size_t(i)] || gf.f32()[i] != e4m3_to_f32(want[size_t(i)])) && bad++ < 5)
          ADD_FAILURE() << what << ": value " << i << " GPU byte " << int(b[i]) << " CPU " << int(want[size_t(i)]);
      EXPECT_EQ(bad, 0) << what;
      for (int64_t i = 0; i < n; ++i)
        EXPECT_EQ(gw.f32()[i], want_w[size_t(i)]) << what << ": folded weight " << i;
    }
  }
}

TEST_F(CudaKvFp8, IndexerLogitsBadInputsGiveTheCpuErrors) {
  const int64_t d = 128;
  const Tensor q = Tensor::zeros({1, 2, d}, DType::F32), w = Tensor::zeros({1, 2}, DType::F32);
  const Tensor pool = filled_u8({2, ops::indexer_page_bytes(d)}, 0);
  const Tensor table = Tensor::from_i32({0, -1}, {1, 2});
  auto both = [&](const Tensor& rs, const Tensor& bd) {
    Tensor c = Tensor::empty({1, 100}, DType::F32);
    const std::string ce = test::error_of([&] { ops::indexer_logits_fp8(q, w, pool, table, rs, bd, 1.0f, c); });
    Tensor g = Tensor::empty({1, 100}, DType::F32, test::gpu());
    const std::string ge = test::error_of(
        [&] { ops::indexer_logits_fp8(dev(q), dev(w), dev(pool), dev(table), dev(rs), dev(bd), 1.0f, g); });
    EXPECT_FALSE(ce.empty());
    EXPECT_EQ(ge, ce);
  };
  both(Tensor::from_i32({0}, {1}), Tensor::from_i32({70}, {1}));   // page 1 is -1
  both(Tensor::from_i32({0}, {1}), Tensor::from_i32({101}, {1}));  // past the logits
  both(Tensor::from_i32({3}, {1}), Tensor::from_i32({1}, {1}));    // no such sequence
  Tensor gp = dev(pool);
  const std::string ge = test::error_of([&] {
    ops::indexer_keys_store_fp8(dev(Tensor::zeros({2, d}, DType::F32)), dev(Tensor::from_i32({0, 128}, {2})), gp);
  });
  EXPECT_NE(ge.find("slot 128 of key 1 outside the pool's 128 slots"), std::string::npos) << ge;
}

// ---------------------------------------------------------------- MLA cache

TEST_F(CudaKvFp8, MlaStoreAndLoadBitwise) {
  for (int64_t m : {0, 1, 3, 127, 128, 129, 2049}) {
    const std::string what = "mla store/load" + sz("m", m);
    const int64_t n_slots = m + 5, dk = 576;
    Tensor rows = test::rand_tensor({m, dk}, uint64_t(m) + 3, 4.0f);
    if (m > 3) {
      rows.f32()[dk + 200] = 7000.0f;
      for (int64_t c = 384; c < 512; ++c) rows.f32()[2 * dk + c] = 0;
      rows.f32()[3 * dk + 530] = 1.00390625f;  // a bf16 tie: rounds to even (1.0)
    }
    std::vector<int32_t> sl(static_cast<size_t>(n_slots));
    std::iota(sl.begin(), sl.end(), 0);
    std::mt19937_64 rng(uint64_t(m) + 9);
    std::shuffle(sl.begin(), sl.end(), rng);
    sl.resize(static_cast<size_t>(m));
    for (size_t i = 2; i < sl.size(); i += 13) sl[i] = -1;
    const Tensor slots = i32(sl, {m});
    Tensor cpu_pool = filled_u8({n_slots, ops::kMlaFp8Bytes}, 0x5a);
    Tensor gpu_pool = dev(cpu_pool);
    ops::mla_cache_store_fp8(rows, slots, cpu_pool);
    ops::mla_cache_store_fp8(test::dev_strided(rows), dev(slots), gpu_pool);
    expect_same_bytes(host(gpu_pool), cpu_pool, ops::kMlaFp8Bytes, what);
    // With the key preparation fused in (RMSNorm of the latent, RoPE of k_pe): the bytes of the
    // GPU's own rms_norm + rope + store (the GPU's norm sums in its own order, so the CPU's bytes
    // may differ by an e4m3 step); decoded, within the quantisation of the CPU's prepared rows.
    // Both RoPE layouts; the GPU's rows stay as they were.
    for (RopeStyle style : {RopeStyle::kInterleaved, RopeStyle::kHalfSplit}) {
      const ops::RopeFreqs f = ops::compute_rope_freqs(RopeConfig{}, 64);
      std::vector<int32_t> pos(static_cast<size_t>(m));
      for (int64_t i = 0; i < m; ++i) pos[size_t(i)] = int32_t((i * 7919 + 5) % 163840);
      ops::MlaKeyPrep prep{test::rand_tensor({512}, uint64_t(m) + 17, 1.0f), 1e-6f, i32(pos, {m}),
                           Tensor::from_f32(f.inv_freq, {32}), 0.8f, style};
      ops::MlaKeyPrep dprep{dev(prep.norm_weight), prep.eps, dev(prep.positions), dev(prep.inv_freq),
                            prep.attention_factor, style};
      const std::string pw = what + " prepared, style " + std::to_string(int(style));
      Tensor fused = dev(filled_u8({n_slots, ops::kMlaFp8Bytes}, 0x5a));
      const Tensor drows = test::dev_strided(rows);
      ops::mla_cache_store_fp8(drows, dev(slots), fused, &dprep);
      test::expect_bitwise(host(drows).contiguous(), rows, pw + " rows untouched");
      Tensor prepared = dev(rows);  // the three ops, one after another, on the GPU
      Tensor lat = prepared.narrow(1, 0, 512);
      ops::rms_norm(lat, dprep.norm_weight, dprep.eps, lat);
      Tensor p3 = prepared.view({m, 1, dk});
      ops::rope(p3, dprep.positions, dprep.inv_freq, dprep.attention_factor, style, 512);
      Tensor separate = dev(filled_u8({n_slots, ops::kMlaFp8Bytes}, 0x5a));
      ops::mla_cache_store_fp8(prepared, dev(slots), separate);
      const Tensor fused_h = host(fused);
      expect_same_bytes(fused_h, host(separate), ops::kMlaFp8Bytes, pw);
      if (m == 0) continue;
      Tensor cpu_prep = filled_u8({n_slots, ops::kMlaFp8Bytes}, 0x5a);
      ops::mla_cache_store_fp8(rows, slots, cpu_prep, &prep);
      Tensor a = Tensor::empty({m, dk}, DType::F32), b = Tensor::empty({m, dk}, DType::F32);
      ops::mla_cache_load_fp8(fused_h, slots, a);
      ops::mla_cache_load_fp8(cpu_prep, slots, b);
      test::expect_nmse_close(a, b, 1e-4, pw + " against the CPU");
      EXPECT_NE(std::memcmp(cpu_prep.raw(), cpu_pool.raw(), size_t(cpu_pool.nbytes())), 0) << pw;
    }
    // Load every slot (the -1 entries give zero rows), from the GPU's own pool.
    std::vector<int32_t> all(static_cast<size_t>(n_slots));
    std::iota(all.begin(), all.end(), 0);
    all.push_back(-1);
    const Tensor all_t = i32(all, {n_slots + 1});
    Tensor cpu_rows = Tensor::empty({n_slots + 1, dk}, DType::F32);
    Tensor filled = filled_u8({n_slots, ops::kMlaFp8Bytes}, 0);  // deterministic bytes everywhere
    ops::mla_cache_store_fp8(rows, slots, filled);
    ops::mla_cache_load_fp8(filled, all_t, cpu_rows);
    test::Guarded g = test::guarded({n_slots + 1, dk}, DType::F32);
    ops::mla_cache_load_fp8(dev(filled), dev(all_t), g.view);
    test::expect_bitwise(g.check(what), cpu_rows, what + " load");
  }
}

std::vector<int32_t> random_indices(int64_t rows, int64_t topk, int64_t n_slots, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> idx(static_cast<size_t>(rows * topk));
  for (auto& v : idx) v = (rng() % 9 == 0) ? -1 : int32_t(rng() % uint64_t(n_slots));  // duplicates too
  if (rows > 1)
    for (int64_t j = 0; j < topk; ++j) idx[size_t(topk + j)] = -1;  // row 1: no key at all
  return idx;
}

// Sparse MLA on the GPU runs bf16 tensor cores (sm90_sparse_mla_decode.cu): q is rounded to bf16 in
// the kernel, so the cases feed bf16-representable q (the CPU reference then sees the same q and the
// rounding is exact); K/V decode exactly (power-of-two scales). What remains is the softmax weights P
// rounded to bf16 for the P.V product: 2^-9 relative at most, rms ~2^-9 / sqrt(3), which gives an
// output normalised MSE of ~1.3e-6 whatever the key count (the error and the output are weighted
// sums of the same values); bound 1e-5. The LSE sums the unrounded weights: fp32 reduction bound.
constexpr double kSparseMlaBf16OutNmse = 1e-5;

Tensor bf16_rounded(Tensor t) {
  for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = bf16_to_f32(f32_to_bf16(t.f32()[i]));
  return t;
}

struct SparseInputs {
  Tensor pool, q, idx;
};

// subnormal: small latents with one outlier per 128-value tile, so most e4m3 codes are subnormal.
SparseInputs sparse_inputs(int64_t rows, int64_t heads, int64_t topk, uint64_t seed, bool subnormal = false) {
  const int64_t n_slots = std::max<int64_t>(topk + 7, 40), dk = 576;
  Tensor kv = test::rand_tensor({n_slots, dk}, seed, subnormal ? 0.02f : 2.0f);
  if (subnormal)
    for (int64_t r = 0; r < n_slots; ++r)
      for (int64_t t = 0; t < 4; ++t) kv.f32()[r * dk + t * 128 + (r * 7 + t) % 128] = (r + t) % 2 ? 300.0f : -300.0f;
  std::vector<int32_t> all(static_cast<size_t>(n_slots));
  std::iota(all.begin(), all.end(), 0);
  SparseInputs in;
  in.pool = filled_u8({n_slots, ops::kMlaFp8Bytes}, 0);
  ops::mla_cache_store_fp8(kv, i32(all, {n_slots}), in.pool);
  in.q = bf16_rounded(test::rand_tensor({rows, heads, dk}, seed + 1, 0.5f));
  in.idx = i32(random_indices(rows, topk, n_slots, seed + 2), {rows, topk});
  return in;
}

void run_sparse_case(int64_t rows, int64_t heads, int64_t topk, uint64_t seed, const std::string& what,
                     bool subnormal = false) {
  const int64_t dk = 576;
  const SparseInputs in = sparse_inputs(rows, heads, topk, seed, subnormal);
  const Tensor &pool = in.pool, &q = in.q, &idx = in.idx;
  const float scale = 1.0f / std::sqrt(float(dk));
  Tensor co = Tensor::empty({rows, heads, 512}, DType::F32), cl = Tensor::empty({rows, heads}, DType::F32);
  ops::sparse_mla_fp8(q, pool, idx, scale, 512, co, cl);
  test::Guarded go = test::guarded({rows, heads, 512}, DType::F32);
  test::Guarded gl = test::guarded({rows, heads}, DType::F32);
  const Tensor dq = test::dev_strided(q), dp = dev(pool), di = dev(idx);
  ops::sparse_mla_fp8(dq, dp, di, scale, 512, go.view, gl.view);
  const Tensor out = go.check(what + " out"), lse = gl.check(what + " lse");
  test::expect_nmse_close(out, co, kSparseMlaBf16OutNmse, what + " out");
  test::expect_nmse_close(lse, cl, tol::kCudaReductionNmse, what + " lse");
  if (rows * heads * topk >= 64 * 2048) {  // the decode shapes: report the measured errors
    auto finite_nmse = [](const Tensor& g, const Tensor& w) {  // rows without keys (-inf) left out
      double num = 0, den = 0;
      for (int64_t i = 0; i < w.numel(); ++i)
        if (std::isfinite(w.f32()[i])) {
          num += (double(g.f32()[i]) - w.f32()[i]) * (double(g.f32()[i]) - w.f32()[i]);
          den += double(w.f32()[i]) * w.f32()[i];
        }
      return den > 0 ? num / den : num;
    };
    std::printf("[ measured ] %s: out nmse %.3g, lse nmse %.3g\n", what.c_str(), finite_nmse(out, co),
                finite_nmse(lse, cl));
  }
  ops::sparse_mla_fp8(dq, dp, di, scale, 512, go.view, gl.view);
  test::expect_bitwise(go.check(what + " out"), out, what + " out repeat");
  test::expect_bitwise(gl.check(what + " lse"), lse, what + " lse repeat");
}

TEST_F(CudaKvFp8, SparseMlaOddTopk) {
  for (int64_t topk : kKeyCounts)
    run_sparse_case(3, 16, topk, uint64_t(topk) + 1, "sparse mla fp8" + sz("topk", topk));
}

TEST_F(CudaKvFp8, SparseMlaHeads) {
  for (int64_t heads : {1, 2, 3, 8, 9, 17, 64, 72, 128})
    run_sparse_case(3, heads, 129, uint64_t(heads) + 50, "sparse mla fp8" + sz("heads", heads));
  run_sparse_case(2, 128, 2049, 77, "sparse mla fp8 heads=128 topk=2049");
  run_sparse_case(2, 64, 4100, 78, "sparse mla fp8 heads=64 topk=4100");
}

TEST_F(CudaKvFp8, SparseMlaDecodeShapes) {
  // GLM-5 (64 heads) and DeepSeek-V3.2 (128 heads) decode: 1 row, 4 requests x 4 MTP rows, few heads.
  run_sparse_case(1, 64, 2048, 91, "sparse mla fp8 decode heads=64 rows=1");
  run_sparse_case(16, 64, 2048, 92, "sparse mla fp8 decode heads=64 rows=16");
  run_sparse_case(1, 128, 2048, 93, "sparse mla fp8 decode heads=128 rows=1");
  run_sparse_case(1, 8, 2048, 94, "sparse mla fp8 decode heads=8 rows=1");
}

TEST_F(CudaKvFp8, SparseMlaSubnormalLatents) {
  // The kernel unpacks e4m3 codes to bf16 with integer ops: subnormal codes must decode exactly too.
  run_sparse_case(3, 16, 300, 95, "sparse mla fp8 subnormal latents", true);
  run_sparse_case(2, 64, 2048, 96, "sparse mla fp8 subnormal latents heads=64", true);
}

// Every tiling of the split-KV kernels (mma.sync with 16 or 32 heads per CTA, wgmma with 64; no split
// .. one tile per split), called through the launcher with a caller-provided workspace, against the CPU;
// each also "settled" (indices and the first gather before the programmatic wait), which must give
// the same bits. One index outside the pool in the second row: the flag names it, either way.
TEST_F(CudaKvFp8, SparseMlaDecodeEveryTiling) {
  const int64_t rows = 3, heads = 40, topk = 2049;  // 40 heads: padded head groups either way
  SparseInputs in = sparse_inputs(rows, heads, topk, 123);
  const float scale = 1.0f / std::sqrt(576.0f);
  Tensor co = Tensor::empty({rows, heads, 512}, DType::F32), cl = Tensor::empty({rows, heads}, DType::F32);
  ops::sparse_mla_fp8(in.q, in.pool, in.idx, scale, 512, co, cl);
  const Tensor dq = test::dev_strided(in.q), dp = dev(in.pool), di = dev(in.idx);
  Tensor bad_idx = Tensor::empty(in.idx.shape(), DType::I32);
  bad_idx.copy_from(in.idx);
  const int64_t bad_at = topk + 1500;  // row 1, key 1500 (split 0 only without splitting)
  bad_idx.i32()[bad_at] = int32_t(in.pool.dim(0));
  const Tensor dbi = dev(bad_idx);
  for (int mt : {1, 2, 4}) {
    for (int splits : {1, 2, 5, 33, 200}) {
      const cuda::SparseMlaDecodePlan plan = cuda::plan_sparse_mla_decode(rows, heads, topk, 132, mt, splits);
      const std::string what0 = "sparse mla decode" + sz("m_tiles", mt) + sz("splits", plan.n_splits) +
                                sz("tiles_per_split", plan.tiles_per_split);
      EXPECT_EQ(plan.m_tiles, mt) << what0;
      EXPECT_LE(plan.tiles_per_split, cuda::kSparseMlaMaxSplitTiles) << what0;
      EXPECT_GE(int64_t(plan.n_splits) * plan.tiles_per_split * cuda::kSparseMlaKeyTile, topk) << what0;
      Tensor first_out, first_lse;
      for (bool settled : {false, true}) {
        const std::string what = what0 + (settled ? " settled" : "");
        test::Guarded go = test::guarded({rows, heads, 512}, DType::F32);
        test::Guarded gl = test::guarded({rows, heads}, DType::F32);
        Tensor ws = Tensor::empty({std::max<int64_t>(1, int64_t(plan.workspace_bytes))}, DType::U8, test::gpu());
        cuda::SparseMlaDecodeParams p{};
        p.q = dq.f32();
        p.pool = static_cast<const uint8_t*>(dp.raw());
        p.out = go.view.f32();
        p.lse = gl.view.f32();
        p.q_s0 = dq.stride(0);
        p.q_s1 = dq.stride(1);
        p.rows = rows;
        p.heads = heads;
        p.n_slots = dp.dim(0);
        p.topk = topk;
        p.softmax_scale = scale;
        p.workspace = ws.raw();
        p.settled = settled;
        for (bool with_bad : {true, false}) {  // the good call last: its outputs are checked
          Tensor bad = dev(filled_u8({8}, 0xff));
          p.indices = with_bad ? dbi.i32() : di.i32();
          p.bad = static_cast<unsigned long long*>(bad.raw());
          cuda::launch_sparse_mla_decode(p, plan, nullptr);
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
          const Tensor hb = host(bad);
          ASSERT_EQ(hb.nbytes(), 8u);
          const uint64_t flag = *static_cast<const uint64_t*>(hb.raw());
          EXPECT_EQ(flag, with_bad ? uint64_t(bad_at) : ~uint64_t(0)) << what;
        }
        const Tensor out = go.check(what + " out"), lse = gl.check(what + " lse");
        test::expect_nmse_close(out, co, kSparseMlaBf16OutNmse, what + " out");
        test::expect_nmse_close(lse, cl, tol::kCudaReductionNmse, what + " lse");
        if (!settled) {
          first_out = out;  // check() returns a fresh host copy
          first_lse = lse;
        } else {
          test::expect_bitwise(out, first_out, what + " out, against the plain call");
          test::expect_bitwise(lse, first_lse, what + " lse, against the plain call");
        }
      }
    }
  }
}

TEST_F(CudaKvFp8, SparseMlaBadIndexGivesTheCpuError) {
  const Tensor q = Tensor::zeros({1, 2, 576}, DType::F32);
  const Tensor pool = filled_u8({4, ops::kMlaFp8Bytes}, 0);
  const Tensor idx = Tensor::from_i32({1, 9, -1}, {1, 3});
  Tensor co = Tensor::empty({1, 2, 512}, DType::F32), cl = Tensor::empty({1, 2}, DType::F32);
  const std::string ce = test::error_of([&] { ops::sparse_mla_fp8(q, pool, idx, 1.0f, 512, co, cl); });
  Tensor go = Tensor::empty({1, 2, 512}, DType::F32, test::gpu()), gl = Tensor::empty({1, 2}, DType::F32, test::gpu());
  const std::string ge =
      test::error_of([&] { ops::sparse_mla_fp8(dev(q), dev(pool), dev(idx), 1.0f, 512, go, gl); });
  EXPECT_FALSE(ce.empty());
  EXPECT_EQ(ge, ce);
  Tensor gp = dev(pool);
  const std::string se = test::error_of([&] {
    ops::mla_cache_store_fp8(dev(Tensor::zeros({1, 576}, DType::F32)), dev(Tensor::from_i32({4}, {1})), gp);
  });
  EXPECT_NE(se.find("slot 4 of row 0 outside the pool's 4 slots"), std::string::npos) << se;
}

}  // namespace
}  // namespace dsi
