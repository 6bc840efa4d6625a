// The DCP exchange ops (ops/dcp_exchange.h) on CUDA against the CPU reference: the candidate
// exchange exactly, the LSE combines by normalised MSE, both combines agreeing.
#include <gtest/gtest.h>

#include <cmath>

#include "cuda/cuda_test_util.h"
#include "ops/dcp_exchange.h"
#include "test_util.h"

namespace dsi {
namespace {

class CudaDcpOps : public test::CudaTest {};

Tensor randf(const Shape& shape, uint64_t seed, float scale = 1.0f) {
  const std::vector<float> v = test::random_floats(size_t(shape_numel(shape)), seed);
  Tensor t = Tensor::from_f32(v, {int64_t(v.size())}).view(shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] *= scale;
  return t;
}

void expect_same_i32(const Tensor& gpu, const Tensor& cpu) {
  const Tensor g = to_host(gpu);
  ASSERT_EQ(g.numel(), cpu.numel());
  for (int64_t i = 0; i < g.numel(); ++i) ASSERT_EQ(g.i32()[i], cpu.i32()[i]) << "element " << i;
}

TEST_F(CudaDcpOps, CandidateExchangeIsExact) {
  for (const ops::DcpPlace place : {ops::DcpPlace{2, 1, 1}, ops::DcpPlace{4, 3, 2}}) {
    const int64_t n = 5, k = 7, W = place.size;
    std::vector<int32_t> ids;
    for (int64_t i = 0; i < n * k; ++i) ids.push_back(i % 5 == 4 ? -1 : int32_t((i * 13) % 97));
    const Tensor idx = Tensor::from_i32(ids, {n, k}), val = randf({n, k}, 3);
    Tensor packed = Tensor::empty({n, k, 2}, DType::I32), gpacked = Tensor::empty({n, k, 2}, DType::I32, test::gpu());
    ops::dcp_pack_candidates(idx, val, place, packed);
    ops::dcp_pack_candidates(test::dev(idx), test::dev(val), place, gpacked);
    expect_same_i32(gpacked, packed);
    // Unpack a gathered block of W members (the same packed rows W times, shifted).
    std::vector<int32_t> g;
    for (int64_t m = 0; m < W; ++m)
      for (int64_t i = 0; i < n * k * 2; ++i) g.push_back(packed.i32()[i] + (i % 2 ? int32_t(m) : 0));
    const Tensor gathered = Tensor::from_i32(g, {W * n, k, 2});
    Tensor sc = Tensor::empty({n, W * k}, DType::F32), pos = Tensor::empty({n, W * k}, DType::I32);
    Tensor gsc = Tensor::empty({n, W * k}, DType::F32, test::gpu());
    Tensor gpos = Tensor::empty({n, W * k}, DType::I32, test::gpu());
    ops::dcp_unpack_candidates(gathered, int(W), sc, pos);
    ops::dcp_unpack_candidates(test::dev(gathered), int(W), gsc, gpos);
    expect_same_i32(gpos, pos);
    const Tensor hs = to_host(gsc);
    ASSERT_EQ(std::memcmp(hs.raw(), sc.raw(), sc.nbytes()), 0);
    Tensor loc = Tensor::empty({n, W * k}, DType::I32), gloc = Tensor::empty({n, W * k}, DType::I32, test::gpu());
    ops::dcp_localize(pos, place, loc);
    ops::dcp_localize(gpos, place, gloc);
    expect_same_i32(gloc, loc);
  }
}

TEST_F(CudaDcpOps, CombinesMatchTheCpu) {
  for (int W : {2, 4}) {
    const int64_t n = 3, hl = 5, dv = 33, H = W * hl;
    const Tensor part = randf({n, H, dv}, 7), lse_all = randf({W * n, H}, 8, 4.0f);
    Tensor lse = Tensor::empty({n, H}, DType::F32);
    for (int64_t i = 0; i < n * H; ++i) lse.f32()[i] = lse_all.f32()[i + n * H];  // this member = 1
    lse.f32()[0] = -INFINITY;  // a head that saw no key
    // ag_rs scaling
    Tensor chunks = Tensor::empty({W * n, hl, dv}, DType::F32);
    Tensor gchunks = Tensor::empty({W * n, hl, dv}, DType::F32, test::gpu());
    ops::dcp_scale_partials(part, lse, lse_all, W, chunks);
    ops::dcp_scale_partials(test::dev(part), test::dev(lse), test::dev(lse_all), W, gchunks);
    EXPECT_LT(test::nmse(to_host(gchunks), chunks), 1e-12);
    // a2a pack (exact) and combine
    Tensor send = Tensor::empty({W * n, hl, dv + 1}, DType::F32);
    Tensor gsend = Tensor::empty({W * n, hl, dv + 1}, DType::F32, test::gpu());
    ops::dcp_a2a_pack(part, lse, W, send);
    ops::dcp_a2a_pack(test::dev(part), test::dev(lse), W, gsend);
    const Tensor hsend = to_host(gsend);
    ASSERT_EQ(std::memcmp(hsend.raw(), send.raw(), send.nbytes()), 0);
    Tensor out = Tensor::empty({n, hl, dv}, DType::F32), gout = Tensor::empty({n, hl, dv}, DType::F32, test::gpu());
    ops::dcp_a2a_combine(send, W, out);
    ops::dcp_a2a_combine(gsend, W, gout);
    EXPECT_LT(test::nmse(to_host(gout), out), 1e-12);
    // member heads (exact)
    const Tensor in = randf({W * n, hl, 9}, 9);
    Tensor mh = Tensor::empty({n, H, 9}, DType::F32), gmh = Tensor::empty({n, H, 9}, DType::F32, test::gpu());
    ops::dcp_member_heads(in, W, mh);
    ops::dcp_member_heads(test::dev(in), W, gmh);
    const Tensor hmh = to_host(gmh);
    ASSERT_EQ(std::memcmp(hmh.raw(), mh.raw(), mh.nbytes()), 0);
  }
}

}  // namespace
}  // namespace dsi
