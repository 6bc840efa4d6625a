// Decode context parallelism pieces on thread ranks: the token layout, the exact global top-k
// (against a single rank's top-k over all keys, with exact ties, -inf rows and ranks that own
// nothing), and the LSE-corrected attention combine (ag_rs and a2a against one rank, and each other).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <random>

#include "ops/mla.h"
#include "ops/topk.h"
#include "runtime/dcp.h"
#include "runtime/ranks.h"
#include "test_util.h"
#include "tolerances.h"

namespace dsi {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

TEST(DcpLayout, OwnerLocalGlobalAgree) {
  for (int W : {1, 2, 3, 4}) {
    for (int I : {1, 2, 3}) {
      for (int64_t L = 0; L <= 50; ++L) {
        int64_t total = 0;
        for (int r = 0; r < W; ++r) {
          const DcpLayout d{W, r, I};
          int64_t owned = 0;
          for (int64_t p = 0; p < L; ++p) {
            if (d.owner(p) != r) continue;
            EXPECT_EQ(d.local(p), owned) << "W " << W << " I " << I << " p " << p;
            EXPECT_EQ(d.global(owned), p);
            ++owned;
          }
          EXPECT_EQ(d.local_len(L), owned) << "W " << W << " I " << I << " L " << L << " r " << r;
          total += owned;
        }
        EXPECT_EQ(total, L);
      }
    }
  }
  const DcpLayout d{4, 1, 2};  // positions 2, 3, 10, 11, 18, ... belong to rank 1
  EXPECT_EQ(d.owner(2), 1);
  EXPECT_EQ(d.owner(9), 0);
  EXPECT_EQ(d.global(2), 10);
}

// Scores over `n_keys` global positions for `rows` rows, distributed by the layout of each rank.
struct TopkCase {
  std::vector<float> scores;     // [rows, n_keys] global
  std::vector<int32_t> bounds;   // [rows] global causal bounds
  int64_t rows = 0, n_keys = 0;
  int k = 0;
};

// The single-rank answer: ops::topk over all keys.
std::vector<int32_t> single_rank_topk(const TopkCase& c) {
  Tensor idx = Tensor::empty({c.rows, c.k}, DType::I32);
  ops::topk(Tensor::from_f32(c.scores, {c.rows, c.n_keys}), Tensor::from_i32(c.bounds, {c.rows}),
            c.k, idx, nullptr);
  return std::vector<int32_t>(idx.i32(), idx.i32() + idx.numel());
}

// Runs dcp_topk on W thread ranks (each given only the scores of the keys it owns) and checks the
// merged winners equal the single-rank answer on every rank, and each rank's local slots.
void check_dcp_topk(const TopkCase& c, int W, int I) {
  SCOPED_TRACE("W " + std::to_string(W) + " I " + std::to_string(I));
  const std::vector<int32_t> want = single_rank_topk(c);
  ParallelConfig pc;
  pc.tp = pc.dcp = W;
  pc.dcp_interleave = I;
  std::mutex mu;
  CommOptions opts;
  opts.check_lockstep = true;
  opts.timeout_seconds = 20;
  run_on_thread_ranks(pc, opts, [&](const RankContext& rc) {
    const DcpLayout& d = rc.dcp;
    const int64_t local_n = d.local_len(c.n_keys);
    Tensor local = Tensor::empty({c.rows, local_n}, DType::F32);
    Tensor bounds = Tensor::empty({c.rows}, DType::I32);
    for (int64_t i = 0; i < c.rows; ++i) {
      for (int64_t l = 0; l < local_n; ++l) local.f32()[i * local_n + l] = c.scores[size_t(i * c.n_keys + d.global(l))];
      bounds.i32()[i] = int32_t(d.local_len(c.bounds[size_t(i)]));
    }
    const DcpTopk t = dcp_topk(rc, local, bounds, c.k);
    std::lock_guard<std::mutex> lock(mu);
    const std::vector<int32_t> got(t.global.i32(), t.global.i32() + t.global.numel());
    EXPECT_EQ(got, want) << "rank " << rc.tp_rank;
    for (size_t j = 0; j < want.size(); ++j) {
      const int32_t p = want[j];
      const int32_t expect_local = (p >= 0 && d.owns(p)) ? int32_t(d.local(p)) : -1;
      EXPECT_EQ(t.local.i32()[j], expect_local) << "rank " << rc.tp_rank << " slot " << j;
    }
  });
}

TEST(DcpTopk, ExactTiesEverywhere) {
  // Three score levels over 60 keys: the boundary falls inside a tie group on every row.
  TopkCase c;
  c.rows = 6;
  c.n_keys = 60;
  c.k = 16;
  for (int64_t i = 0; i < c.rows; ++i) {
    for (int64_t p = 0; p < c.n_keys; ++p) c.scores.push_back(float((p * 7 + i) % 3));
    c.bounds.push_back(int32_t(std::vector<int>{60, 59, 17, 16, 3, 1}[size_t(i)]));
  }
  for (int W : {1, 2, 3, 4})
    for (int I : {1, 2}) check_dcp_topk(c, W, I);
}

TEST(DcpTopk, AllNegInfRowsAndEmptyRanks) {
  TopkCase c;
  c.rows = 4;
  c.n_keys = 3;  // fewer keys than ranks: some ranks own nothing
  c.k = 2;
  c.scores = {kNegInf, kNegInf, kNegInf,  // a row with only -inf: selects nothing
              1.0f,    kNegInf, 1.0f,     //
              0.0f,    0.0f,    0.0f,     //
              5.0f,    4.0f,    3.0f};
  c.bounds = {3, 3, 2, 0};  // the last row sees no key at all
  for (int W : {1, 2, 4})
    for (int I : {1, 2}) check_dcp_topk(c, W, I);
}

TEST(DcpTopk, RandomAgainstSingleRank) {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 4; ++trial) {
    TopkCase c;
    c.rows = 9;
    c.n_keys = 40 + int64_t(rng() % 60);
    c.k = int(4 + rng() % 12);
    const std::vector<float> v = test::random_floats(size_t(c.rows * c.n_keys), rng());
    for (float x : v) c.scores.push_back(trial % 2 ? std::round(x * 3.0f) : x);  // odd: ties
    for (int64_t i = 0; i < c.rows; ++i) c.bounds.push_back(int32_t(rng() % uint64_t(c.n_keys + 1)));
    for (int W : {2, 4})
      for (int I : {1, 3}) check_dcp_topk(c, W, I);
  }
}

// The attention combine: W ranks, each owning its keys, attend for their heads; the result must
// equal one rank attending over all selected keys (tolerance: the LSE rescaling rounds), and ag_rs
// must equal a2a bit for bit (same products, same member order).
TEST(DcpAttention, CombineMatchesSingleRankAndModesAgree) {
  const int64_t n = 5, n_keys = 23, dk = 12, dv = 8, hl = 2, k = 7;
  const int W = 4, I = 2;
  const std::vector<float> kv_all = test::random_floats(size_t(n_keys * dk), 21);
  const std::vector<float> q_all = test::random_floats(size_t(n * W * hl * dk), 22);
  // Global selection per row; row 3 selects nothing, row 4 only keys of one rank.
  std::vector<int32_t> sel = {0, 5, 9, 22, 13, -1, 7,   //
                              1, 2, 3, 4, -1, -1, -1,   //
                              22, 21, 20, 19, 18, 17, 16,
                              -1, -1, -1, -1, -1, -1, -1,  //
                              2, 3, 10, 11, -1, -1, -1};  // rank 1 owns 2, 3, 10, 11
  // Reference: one rank, all W * hl heads, all keys.
  Tensor ref_out = Tensor::empty({n, W * hl, dv}, DType::F32), ref_lse = Tensor::empty({n, W * hl}, DType::F32);
  ops::sparse_mla(Tensor::from_f32(q_all, {n, W * hl, dk}), Tensor::from_f32(kv_all, {n_keys, dk}),
                  Tensor::from_i32(sel, {n, k}), 0.3f, int(dv), ref_out, ref_lse);

  std::vector<Tensor> by_mode[2];
  for (int mode = 0; mode < 2; ++mode) {
    ParallelConfig pc;
    pc.tp = pc.dcp = W;
    pc.dcp_interleave = I;
    pc.combine = mode == 0 ? DcpCombine::kAgRs : DcpCombine::kA2a;
    std::mutex mu;
    by_mode[mode].resize(W);
    run_on_thread_ranks(pc, CommOptions{true, 20}, [&](const RankContext& rc) {
      const DcpLayout& d = rc.dcp;
      const int64_t local_n = d.local_len(n_keys);
      Tensor kv = Tensor::empty({local_n, dk}, DType::F32);
      for (int64_t l = 0; l < local_n; ++l)
        std::memcpy(kv.f32() + l * dk, kv_all.data() + d.global(l) * dk, sizeof(float) * dk);
      Tensor local_sel = Tensor::empty({n, k}, DType::I32);
      for (int64_t j = 0; j < n * k; ++j)
        local_sel.i32()[j] = (sel[size_t(j)] >= 0 && d.owns(sel[size_t(j)])) ? int32_t(d.local(sel[size_t(j)])) : -1;
      Tensor q = Tensor::empty({n, hl, dk}, DType::F32);  // this rank's heads
      for (int64_t i = 0; i < n; ++i)
        std::memcpy(q.f32() + i * hl * dk, q_all.data() + (i * W * hl + rc.tp_rank * hl) * dk,
                    sizeof(float) * hl * dk);
      Tensor o = dcp_sparse_attention(rc, q, kv, local_sel, 0.3f, int(dv));
      std::lock_guard<std::mutex> lock(mu);
      by_mode[mode][size_t(rc.tp_rank)] = o;
    });
  }
  for (int r = 0; r < W; ++r) {
    const Tensor& a = by_mode[0][size_t(r)];
    const Tensor& b = by_mode[1][size_t(r)];
    EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0) << "ag_rs and a2a differ on rank " << r;
    const Tensor want = ref_out.narrow(1, r * hl, hl).contiguous();
    EXPECT_LE(test::nmse(a, want), tol::kSelfConsistencyNmse) << "rank " << r;
    for (int64_t h = 0; h < hl; ++h)
      for (int64_t c = 0; c < dv; ++c) EXPECT_EQ(a.f32()[(3 * hl + h) * dv + c], 0.0f);  // empty row
  }
}

}  // namespace
}  // namespace dsi
