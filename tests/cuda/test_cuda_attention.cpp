// CUDA op tests, part 2: the sparse-attention path. Indexer logits, top-k and the DCP top-k merge
// (integer outputs exact, in the total order score desc / position asc, over the odd key counts of
// the engineering guide), the absorbed-MLA GEMMs and sparse MLA (heads 1..128, 0..2049 keys, empty
// rows, holes and duplicates in the index lists), all against the CPU reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cuda/cuda_test_util.h"
#include "ops/indexer.h"
#include "ops/mla.h"
#include "ops/paging.h"
#include "ops/rope.h"
#include "ops/topk.h"

namespace dsi {
namespace {

using test::dev;
using test::dev_strided;
using test::gpu;
using test::host;

class CudaIndexer : public test::CudaTest {};
class CudaTopk : public test::CudaTest {};
class CudaMla : public test::CudaTest {};

const std::vector<int64_t> kKeyCounts = {0, 1, 3, 127, 128, 129, 2047, 2048, 2049};

std::string sz(const char* name, int64_t v) { return std::string(" ") + name + "=" + std::to_string(v); }

// ---------------------------------------------------------------- indexer

TEST_F(CudaIndexer, LogitsOddKeyCounts) {
  const int64_t rows = 3, heads = 4, d = 32;
  for (int64_t n_keys : kKeyCounts) {
    const std::string what = "indexer" + sz("n_keys", n_keys);
    const Tensor q = test::rand_tensor({rows, heads, d}, uint64_t(n_keys) + 1);
    const Tensor w = test::rand_tensor({rows, heads}, uint64_t(n_keys) + 2, 0.5f);
    const Tensor k = test::rand_tensor({n_keys, d}, uint64_t(n_keys) + 3);
    const Tensor b = Tensor::from_i32({int32_t(n_keys), int32_t(n_keys / 2), 0}, {rows});
    const float scale = 1.0f / std::sqrt(float(d));
    Tensor cpu = Tensor::empty({rows, n_keys}, DType::F32);
    ops::indexer_logits(q, w, k, b, scale, cpu);
    test::Guarded g = test::guarded({rows, n_keys}, DType::F32);
    const Tensor dq = dev(q), dw = dev(w), dk = dev_strided(k), db = dev(b);
    ops::indexer_logits(dq, dw, dk, db, scale, g.view);
    const Tensor got = g.check(what);
    test::expect_nmse_close(got, cpu, tol::kCudaReductionNmse, what);
    // Same operation order as the CPU, every product and sum rounded alike: bitwise.
    test::expect_bitwise(got, cpu, what + " (bitwise)");
    ops::indexer_logits(dq, dw, dk, db, scale, g.view);
    test::expect_bitwise(g.check(what), got, what + " repeat");
  }
}

TEST_F(CudaIndexer, BadBoundGivesTheCpuError) {
  const Tensor q = test::rand_tensor({2, 2, 8}, 1), w = test::rand_tensor({2, 2}, 2);
  const Tensor k = test::rand_tensor({3, 8}, 3);
  for (const std::vector<int32_t>& bv : std::vector<std::vector<int32_t>>{{1, 5}, {-1, 2}}) {
    const Tensor b = Tensor::from_i32(bv, {2});
    Tensor co = Tensor::empty({2, 3}, DType::F32), go = Tensor::empty({2, 3}, DType::F32, gpu());
    const std::string cm = test::error_of([&] { ops::indexer_logits(q, w, k, b, 1.0f, co); });
    const std::string gm =
        test::error_of([&] { ops::indexer_logits(dev(q), dev(w), dev(k), dev(b), 1.0f, go); });
    EXPECT_FALSE(cm.empty());
    EXPECT_EQ(gm, cm);
  }
}

// ---------------------------------------------------------------- top-k

// Rows of n scores in several regimes: continuous, three tie levels, -inf and NaN holes, +-0
// ties, +inf entries, all -inf.
Tensor topk_scores(int64_t rows, int64_t n, uint64_t seed) {
  std::vector<float> v = test::random_floats(size_t(rows * n), seed);
  std::mt19937_64 rng(seed);
  for (int64_t r = 0; r < rows; ++r) {
    float* s = v.data() + r * n;
    switch (r % 6) {
      case 0: break;
      case 1:
        for (int64_t i = 0; i < n; ++i) s[i] = float(int64_t(rng() % 3)) * 0.5f;
        break;
      case 2:
        for (int64_t i = 0; i < n; ++i) {
          const uint64_t u = rng() % 5;
          if (u == 0) s[i] = -INFINITY;
          if (u == 1) s[i] = NAN;
        }
        break;
      case 3:
        for (int64_t i = 0; i < n; ++i) s[i] = (rng() % 2) ? -0.0f : 0.0f;
        if (n > 2) s[n / 2] = -1e-30f;
        break;
      case 4:
        for (int64_t i = 0; i < n; i += 7) s[i] = INFINITY;
        break;
      default:
        for (int64_t i = 0; i < n; ++i) s[i] = -INFINITY;
    }
  }
  return Tensor::from_f32(v, {rows, n});
}

void check_topk(const Tensor& scores, const std::vector<int32_t>& bounds, int k,
                const std::string& what) {
  const int64_t rows = scores.dim(0);
  const Tensor hb = Tensor::from_i32(bounds, {rows});
  Tensor ci = Tensor::empty({rows, k}, DType::I32), cv = Tensor::empty({rows, k}, DType::F32);
  ops::topk(scores, hb, k, ci, &cv);
  test::Guarded gi = test::guarded({rows, k}, DType::I32), gv = test::guarded({rows, k}, DType::F32);
  const Tensor ds = dev_strided(scores), db = dev(hb);
  ops::topk(ds, db, k, gi.view, &gv.view);
  const Tensor got_i = gi.check(what + " indices");
  test::expect_same_i32(got_i, ci, what);
  test::expect_bitwise(gv.check(what + " values"), cv, what + " values");
  // Without values (null and undefined), and repeated: the same indices, bitwise.
  Tensor undefined;
  ops::topk(ds, db, k, gi.view, nullptr);
  test::expect_bitwise(gi.check(what + " repeat"), got_i, what + " repeat");
  ops::topk(ds, db, k, gi.view, &undefined);
  test::expect_bitwise(gi.check(what + " repeat"), got_i, what + " repeat");
}

TEST_F(CudaTopk, OddSizesTiesAndSpecialValues) {
  const int64_t rows = 12;
  for (int64_t n : kKeyCounts) {
    const Tensor s = topk_scores(rows, n, uint64_t(n) + 10);
    std::vector<int32_t> bounds(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t choice[] = {n, n - 1, n / 2, 0, 1, n};
      bounds[size_t(r)] = int32_t(std::clamp<int64_t>(choice[(r / 6 + r) % 6], 0, n));
    }
    std::vector<int> ks = {1, 3, 64, 2048, int(n), int(n) + 3};
    std::sort(ks.begin(), ks.end());
    ks.erase(std::unique(ks.begin(), ks.end()), ks.end());
    for (int k : ks)
      if (k > 0) check_topk(s, bounds, k, "topk" + sz("n", n) + sz("k", k));
  }
}

TEST_F(CudaTopk, KZeroAndNoRows) {
  const Tensor s = topk_scores(3, 10, 1);
  test::Guarded gi = test::guarded({3, 0}, DType::I32);
  ops::topk(dev(s), dev(Tensor::from_i32({10, 5, 0}, {3})), 0, gi.view, nullptr);
  gi.check("k = 0");
  test::Guarded g0 = test::guarded({0, 4}, DType::I32);
  ops::topk(Tensor::empty({0, 10}, DType::F32, gpu()), Tensor::empty({0}, DType::I32, gpu()), 4,
            g0.view, nullptr);
  g0.check("no rows");
}

TEST_F(CudaTopk, DecodeAndPrefillScale) {
  // The deployed shapes: 2048 of 2049 keys over 64 rows, and 2048 of 100000 keys.
  check_topk(topk_scores(64, 2049, 3), std::vector<int32_t>(64, 2049), 2048, "topk 64x2049");
  std::vector<int32_t> b = {100000, 77777};
  check_topk(topk_scores(2, 100000, 4), b, 2048, "topk 2x100000");
}

// A bound outside [0, keys] gives the CPU's error, naming the first such row, on every path: the
// one-CTA and cluster select kernels (which check the bounds themselves) and the sort (k past the
// select's); a call with good bounds after it still selects as the CPU.
TEST_F(CudaTopk, BadBoundGivesTheCpuError) {
  struct Case {
    int64_t n;
    int k;
    std::vector<int32_t> bounds;
  };
  for (const Case& c : std::vector<Case>{{5, 2, {3, 6}},
                                         {8192, 2048, {8192, 8193, 5}},
                                         {40000, 2048, {40000, 100, -1, 40001}},
                                         {40000, 2048, {7, 40000, 39999, 2147483647}},
                                         {3000, 2500, {3000, -5}}}) {
    const int64_t rows = int64_t(c.bounds.size());
    const std::string what = "topk" + sz("n", c.n) + sz("k", c.k);
    const Tensor s = topk_scores(rows, c.n, uint64_t(c.n + rows));
    const Tensor b = Tensor::from_i32(c.bounds, {rows});
    Tensor ci = Tensor::empty({rows, c.k}, DType::I32), gi = Tensor::empty({rows, c.k}, DType::I32, gpu());
    const std::string cm = test::error_of([&] { ops::topk(s, b, c.k, ci, nullptr); });
    const std::string gm = test::error_of([&] { ops::topk(dev(s), dev(b), c.k, gi, nullptr); });
    EXPECT_FALSE(cm.empty()) << what;
    EXPECT_EQ(gm, cm) << what;
    std::vector<int32_t> good(c.bounds);
    for (int32_t& v : good) v = std::clamp<int32_t>(v, 0, int32_t(c.n));
    check_topk(s, good, c.k, what + " good bounds after a bad call");
  }
}

TEST_F(CudaTopk, MergeCandidateLists) {
  const int64_t rows = 6;
  for (int64_t m : {0, 1, 3, 129, 2049, 4096}) {
    Tensor s = topk_scores(rows, m, uint64_t(m) + 3);
    std::vector<int32_t> pos(static_cast<size_t>(rows * m));
    std::mt19937_64 rng{uint64_t(m)};
    for (int64_t r = 0; r < rows; ++r) {
      // Distinct positions out of [0, 3m), shuffled, some empty (-1).
      std::vector<int32_t> all(static_cast<size_t>(3 * m));
      std::iota(all.begin(), all.end(), 0);
      std::shuffle(all.begin(), all.end(), rng);
      for (int64_t j = 0; j < m; ++j) pos[size_t(r * m + j)] = rng() % 9 == 0 ? -1 : all[size_t(j)];
    }
    const Tensor p = m ? Tensor::from_i32(pos, {rows, m}) : Tensor::empty({rows, 0}, DType::I32);
    for (int k : {1, 5, 2048, int(m) + 2}) {
      const std::string what = "topk_merge" + sz("m", m) + sz("k", k);
      Tensor cw = Tensor::empty({rows, k}, DType::I32);
      ops::topk_merge(s, p, k, cw);
      test::Guarded g = test::guarded({rows, k}, DType::I32);
      ops::topk_merge(dev(s), dev(p), k, g.view);
      test::expect_same_i32(g.check(what), cw, what);
    }
  }
}

// ---------------------------------------------------------------- MLA

// W_UK^T q and W_UV o read in place from kv_b_proj in each dtype (fp8 also as a tensor-parallel
// slice starting inside a scale block), GLM-5's head geometry and a smaller one, decode row counts
// (the GEMV paths) and more (the dequantise + sgemm path); the absorbed queries with their RoPE
// (one launch at decode row counts, two past them).
TEST_F(CudaMla, AbsorbAndUpProjection) {
  struct Geometry {
    int64_t nope, dv, lora;
  };
  const int64_t rope = 64;
  const Tensor inv_freq = Tensor::from_f32(ops::compute_rope_freqs(RopeConfig{}, int(rope)).inv_freq, {rope / 2});
  const Tensor dinv_freq = dev(inv_freq);
  for (const Geometry& ge : {Geometry{128, 128, 512}, Geometry{192, 256, 512}})
  for (DType dt : {DType::F32, DType::BF16, DType::F8_E4M3})
  for (int64_t row0 : {int64_t(0), int64_t(64)}) {
    if (row0 != 0 && dt != DType::F8_E4M3) continue;
    for (int64_t heads : {1, 3, 8}) {
      const int64_t per = ge.nope + ge.dv;
      const LinearWeight kv_b = test::make_weight(dt, heads * per, ge.lora, uint64_t(heads + per), row0);
      const LinearWeight dkv_b = test::to_gpu(kv_b);
      for (int64_t rows : {0, 1, 3, 5, 8, 17}) {
        const std::string what = std::string("mla ") + std::string(dtype_name(dt)) + sz("row0", row0) +
                                 sz("nope", ge.nope) + sz("heads", heads) + sz("rows", rows);
        // q_nope: the first `nope` dims of [rows, heads, nope + rope] (strided).
        const Tensor qfull =
            test::rand_tensor({rows, heads, ge.nope + rope}, uint64_t(heads * 10 + rows));
        Tensor cpu = Tensor::empty({rows, heads, ge.lora}, DType::F32);
        ops::mla_absorb_q(qfull.narrow(2, 0, ge.nope), kv_b, cpu);
        test::Guarded g = test::guarded_strided({rows, heads, ge.lora}, DType::F32);
        const Tensor dq = dev(qfull).narrow(2, 0, ge.nope);
        ops::mla_absorb_q(dq, dkv_b, g.view);
        const Tensor got = g.check("absorb " + what);
        test::expect_nmse_close(got, cpu, tol::kCudaGemmNmse, "absorb " + what);
        ops::mla_absorb_q(dq, dkv_b, g.view);
        test::expect_bitwise(g.check("absorb " + what), got, "absorb repeat " + what);

        // With the queries' RoPE (one launch at decode sizes): the latent part as above, the rope
        // part as close to the CPU's as the RoPE op is (cos and sin rounded once from double, the
        // CPU's from cosf and sinf) and bitwise the GPU's own RoPE op's.
        std::vector<int32_t> pos;
        for (int64_t r = 0; r < rows; ++r) pos.push_back(int32_t(5 + 977 * r));
        const Tensor positions = Tensor::from_i32(pos, {rows});
        Tensor cpu_q = Tensor::empty({rows, heads, ge.lora + rope}, DType::F32);
        ops::mla_absorbed_queries(qfull, ge.nope, kv_b, positions, inv_freq, 0.9f, RopeStyle::kInterleaved, cpu_q);
        test::Guarded gq = test::guarded_strided({rows, heads, ge.lora + rope}, DType::F32);
        const Tensor dqfull = dev(qfull), dpos = dev(positions);
        ops::mla_absorbed_queries(dqfull, ge.nope, dkv_b, dpos, dinv_freq, 0.9f, RopeStyle::kInterleaved, gq.view);
        const Tensor got_q = gq.check("absorbed queries " + what);
        test::expect_nmse_close(got_q.narrow(2, 0, ge.lora).contiguous(), cpu_q.narrow(2, 0, ge.lora).contiguous(),
                                tol::kCudaGemmNmse, "absorbed queries " + what);
        const Tensor got_pe = got_q.narrow(2, ge.lora, rope).contiguous();
        test::expect_elementwise_close(got_pe, cpu_q.narrow(2, ge.lora, rope).contiguous(),
                                       "absorbed queries' rope part " + what);
        test::Guarded gpe = test::guarded_strided({rows, heads, rope}, DType::F32);
        Tensor dqv = dqfull;
        ops::rope(dqv, dpos, dinv_freq, 0.9f, RopeStyle::kInterleaved, int(ge.nope), &gpe.view);
        test::expect_bitwise(got_pe, gpe.check("rope " + what).contiguous(), "absorbed queries' rope part " + what);
        ops::mla_absorbed_queries(dqfull, ge.nope, dkv_b, dpos, dinv_freq, 0.9f, RopeStyle::kInterleaved, gq.view);
        test::expect_bitwise(gq.check("absorbed queries " + what), got_q, "absorbed queries repeat " + what);

        const Tensor o_lat = test::rand_tensor({rows, heads, ge.lora}, uint64_t(heads * 10 + rows) + 5);
        Tensor cpu_v = Tensor::empty({rows, heads, ge.dv}, DType::F32);
        ops::mla_up_v(o_lat, kv_b, cpu_v);
        test::Guarded gv = test::guarded_strided({rows, heads, ge.dv}, DType::F32);
        ops::mla_up_v(dev_strided(o_lat), dkv_b, gv.view);
        const Tensor got_v = gv.check("up_v " + what);
        test::expect_nmse_close(got_v, cpu_v, tol::kCudaGemmNmse, "up_v " + what);
        ops::mla_up_v(dev_strided(o_lat), dkv_b, gv.view);
        test::expect_bitwise(gv.check("up_v " + what), got_v, "up_v repeat " + what);
      }
    }
  }
}

// Index lists of `topk` slots into n_keys keys: row 0 distinct valid keys, row 1 with holes (-1)
// and duplicates, row 2 empty (all -1).
Tensor mla_indices(int64_t topk, int64_t n_keys, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> idx(static_cast<size_t>(3 * topk), -1);
  std::vector<int32_t> perm(static_cast<size_t>(n_keys));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  for (int64_t j = 0; j < topk; ++j) {
    idx[size_t(j)] = perm[size_t(j % n_keys)];
    const uint64_t u = rng() % 4;
    idx[size_t(topk + j)] = u == 0 ? -1 : int32_t(rng() % uint64_t(n_keys));
  }
  return Tensor::from_i32(idx, {3, topk});
}

void check_sparse_mla(int64_t heads, int64_t topk, int64_t dk, int dv, float q_scale,
                      const std::string& what) {
  const int64_t rows = 3, n_keys = topk + 50;
  const float scale = 1.0f / std::sqrt(192.0f);
  // q: [rows, heads, dk] inside [rows, heads, dk + 8] (strided rows and heads); kv row-strided.
  const Tensor qfull = test::rand_tensor({rows, heads, dk + 8}, uint64_t(heads * 7 + topk), q_scale);
  const Tensor q = qfull.narrow(2, 4, dk);
  const Tensor kv = test::rand_tensor({n_keys, dk}, uint64_t(topk) + 3);
  const Tensor idx = mla_indices(topk, n_keys, uint64_t(topk) + 4);
  Tensor co = Tensor::empty({rows, heads, dv}, DType::F32), cl = Tensor::empty({rows, heads}, DType::F32);
  ops::sparse_mla(q, kv, idx, scale, dv, co, cl);
  test::Guarded go = test::guarded({rows, heads, int64_t(dv)}, DType::F32);
  test::Guarded gl = test::guarded({rows, heads}, DType::F32);
  const Tensor dq = dev(qfull).narrow(2, 4, dk), dkv = dev_strided(kv), di = dev(idx);
  ops::sparse_mla(dq, dkv, di, scale, dv, go.view, gl.view);
  const Tensor out = go.check(what + " out"), lse = gl.check(what + " lse");
  test::expect_nmse_close(out, co, tol::kCudaReductionNmse, what + " out");
  test::expect_nmse_close(lse, cl, tol::kCudaReductionNmse, what + " lse");
  ops::sparse_mla(dq, dkv, di, scale, dv, go.view, gl.view);
  test::expect_bitwise(go.check(what), out, what + " repeat out");
  test::expect_bitwise(gl.check(what), lse, what + " repeat lse");
}

TEST_F(CudaMla, SparseAttentionHeadsAndKeyCounts) {
  for (int64_t heads : {1, 3, 8, 32, 64, 128}) {
    for (int64_t topk : kKeyCounts) {
      // The real latent width (576 / 512) for few heads; a narrow one for many (CPU time).
      const int64_t dk = heads <= 8 ? 576 : 72;
      const int dv = heads <= 8 ? 512 : 64;
      check_sparse_mla(heads, topk, dk, dv, 1.0f, "sparse_mla" + sz("heads", heads) + sz("topk", topk));
    }
  }
}

TEST_F(CudaMla, SparseAttentionDeployedShapeAndPeakySoftmax) {
  check_sparse_mla(128, 2048, 576, 512, 1.0f, "sparse_mla deployed");
  check_sparse_mla(8, 129, 576, 512, 30.0f, "sparse_mla peaky");
}

// A bf16 cache (KvCacheDtype::kBf16): rows stored rounded by scatter_rows, then the indexer logits
// and sparse attention read them, each against the CPU reference on the same bf16 pool.
TEST_F(CudaMla, Bf16CacheStoreIndexerAndAttention) {
  for (int64_t heads : {1, 8, 64}) {
    for (int64_t topk : {1, 129, 2048}) {
      const std::string what = "bf16 cache" + sz("heads", heads) + sz("topk", topk);
      const int64_t rows = 3, n_keys = topk + 50, dk = heads <= 8 ? 576 : 72;
      const int dv = heads <= 8 ? 512 : 64;
      const Tensor rows_f32 = test::rand_tensor({n_keys, dk}, uint64_t(topk) + 7);
      std::vector<int32_t> order(static_cast<size_t>(n_keys));
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), std::mt19937_64(uint64_t(heads)));
      const Tensor where = Tensor::from_i32(order, {n_keys});
      Tensor cpu_pool = Tensor::zeros({n_keys, dk}, DType::BF16);
      ops::scatter_rows(rows_f32, where, cpu_pool);
      Tensor gpu_pool = Tensor::zeros({n_keys, dk}, DType::BF16, gpu());
      ops::scatter_rows(dev(rows_f32), dev(where), gpu_pool);
      const Tensor back = host(gpu_pool);
      ASSERT_EQ(std::memcmp(back.raw(), cpu_pool.raw(), back.nbytes()), 0) << what << " store";

      const Tensor q = test::rand_tensor({rows, heads, dk}, uint64_t(heads) + 9);
      const Tensor idx = mla_indices(topk, n_keys, uint64_t(topk) + 4);
      const float scale = 1.0f / std::sqrt(192.0f);
      Tensor co = Tensor::empty({rows, heads, dv}, DType::F32), cl = Tensor::empty({rows, heads}, DType::F32);
      ops::sparse_mla(q, cpu_pool, idx, scale, dv, co, cl);
      test::Guarded go = test::guarded({rows, heads, int64_t(dv)}, DType::F32);
      test::Guarded gl = test::guarded({rows, heads}, DType::F32);
      ops::sparse_mla(dev(q), gpu_pool, dev(idx), scale, dv, go.view, gl.view);
      test::expect_nmse_close(go.check(what + " out"), co, tol::kCudaReductionNmse, what + " out");
      test::expect_nmse_close(gl.check(what + " lse"), cl, tol::kCudaReductionNmse, what + " lse");

      if (heads != 8) continue;  // the indexer: 64 heads of 128 dims over the first 128 columns
      const Tensor keys_cpu = cpu_pool.narrow(1, 0, 128), keys_gpu = gpu_pool.narrow(1, 0, 128);
      const Tensor iq = test::rand_tensor({rows, 64, 128}, uint64_t(topk) + 10);
      const Tensor iw = test::rand_tensor({rows, 64}, uint64_t(topk) + 11, 0.5f);
      const Tensor b = Tensor::from_i32({int32_t(n_keys), int32_t(n_keys / 2), 0}, {rows});
      Tensor cpu = Tensor::empty({rows, n_keys}, DType::F32);
      ops::indexer_logits(iq, iw, keys_cpu, b, 0.125f, cpu);
      test::Guarded g = test::guarded({rows, n_keys}, DType::F32);
      ops::indexer_logits(dev(iq), dev(iw), keys_gpu, dev(b), 0.125f, g.view);
      test::expect_bitwise(g.check(what + " indexer"), cpu, what + " indexer (bitwise)");
    }
  }
}

TEST_F(CudaMla, SparseAttentionBadIndexGivesTheCpuError) {
  const Tensor q = test::rand_tensor({2, 2, 16}, 1), kv = test::rand_tensor({10, 16}, 2);
  const Tensor idx = Tensor::from_i32({0, 3, -1, 9, 2, 10}, {2, 3});
  Tensor co = Tensor::empty({2, 2, 8}, DType::F32), cl = Tensor::empty({2, 2}, DType::F32);
  Tensor go = Tensor::empty({2, 2, 8}, DType::F32, gpu()), gl = Tensor::empty({2, 2}, DType::F32, gpu());
  const std::string cm = test::error_of([&] { ops::sparse_mla(q, kv, idx, 0.1f, 8, co, cl); });
  const std::string gm =
      test::error_of([&] { ops::sparse_mla(dev(q), dev(kv), dev(idx), 0.1f, 8, go, gl); });
  EXPECT_FALSE(cm.empty());
  EXPECT_EQ(gm, cm);
}

}  // namespace
}  // namespace dsi
