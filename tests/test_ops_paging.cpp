// The paging ops (ops/paging.h) and paged indexer logits: rows land in their pool slots, local
// selections map through block tables, paged logits equal the contiguous ones, and bad slots or
// pages are refused with a message.
#include <gtest/gtest.h>

#include "core/dtype.h"
#include "ops/indexer.h"
#include "ops/mla.h"
#include "ops/paging.h"
#include "test_util.h"

namespace dsi {
namespace {

Tensor randf(const Shape& shape, uint64_t seed) {
  const std::vector<float> v = test::random_floats(size_t(shape_numel(shape)), seed);
  return Tensor::from_f32(v, {int64_t(v.size())}).view(shape);
}

TEST(OpPaging, ScatterRowsAndSlotsFromLocal) {
  const Tensor src = randf({4, 3}, 1);
  Tensor pool = Tensor::zeros({8, 3}, DType::F32);
  ops::scatter_rows(src, Tensor::from_i32({5, -1, 0, 7}, {4}), pool);
  for (int c = 0; c < 3; ++c) {
    EXPECT_EQ(pool.f32()[5 * 3 + c], src.f32()[0 * 3 + c]);
    EXPECT_EQ(pool.f32()[0 * 3 + c], src.f32()[2 * 3 + c]);
    EXPECT_EQ(pool.f32()[7 * 3 + c], src.f32()[3 * 3 + c]);
    EXPECT_EQ(pool.f32()[1 * 3 + c], 0.0f);
  }
  test::expect_error([&] { ops::scatter_rows(src, Tensor::from_i32({8, -1, -1, -1}, {4}), pool); },
                     {"slot 8 outside the 8 rows"});
  test::expect_error([&] { ops::scatter_rows(src, Tensor::from_i32({1, 1, -1, -1}, {4}), pool); },
                     {"slot 1 written twice"});
  // Two sequences with pages of 4 slots: seq 0 owns pages {2, 0}, seq 1 owns page {1}.
  const Tensor tables = Tensor::from_i32({2, 0, 1, -1}, {2, 2});
  const Tensor row_seq = Tensor::from_i32({0, 1}, {2});
  Tensor out = Tensor::empty({2, 3}, DType::I32);
  ops::slots_from_local(Tensor::from_i32({0, 5, -1, 3, 1, -1}, {2, 3}), tables, row_seq, 4, out);
  EXPECT_EQ(std::vector<int32_t>(out.i32(), out.i32() + 6), (std::vector<int32_t>{8, 1, -1, 7, 5, -1}));
  test::expect_error([&] {
    ops::slots_from_local(Tensor::from_i32({0, 4, -1, 0, 0, 0}, {2, 3}), tables, Tensor::from_i32({1, 1}, {2}), 4, out);
  }, {"row 0 selects local token 4 past its pages"});
}

TEST(OpPaging, PagedIndexerLogitsEqualContiguous) {
  const int64_t rows = 3, heads = 2, d = 8, page = 4, keys = 10;
  const Tensor q = randf({rows, heads, d}, 2), w = randf({rows, heads}, 3), k = randf({keys, d}, 4);
  const Tensor bounds = Tensor::from_i32({10, 7, 1}, {rows});
  Tensor ref = Tensor::empty({rows, keys}, DType::F32);
  ops::indexer_logits(q, w, k, bounds, 0.5f, ref);
  // The same keys scattered over pages 3, 0, 2 of a 4-page pool; every row is the one sequence.
  const std::vector<int32_t> pages = {3, 0, 2};
  Tensor pool = Tensor::zeros({4 * page, d}, DType::F32);
  std::vector<int32_t> slots;
  for (int64_t s = 0; s < keys; ++s) slots.push_back(pages[size_t(s / page)] * int32_t(page) + int32_t(s % page));
  ops::scatter_rows(k, Tensor::from_i32(slots, {keys}), pool);
  ops::KeyPages kp{Tensor::from_i32(pages, {1, 3}), Tensor::from_i32({0, 0, 0}, {rows}), int(page)};
  Tensor got = Tensor::empty({rows, keys}, DType::F32);
  ops::indexer_logits(q, w, pool, bounds, 0.5f, got, &kp);
  ASSERT_EQ(std::memcmp(got.raw(), ref.raw(), ref.nbytes()), 0);
  // A bound past the pages the row's sequence holds is an error, not a read of someone else's page.
  kp.block_tables = Tensor::from_i32({3, -1, -1}, {1, 3});
  test::expect_error([&] { ops::indexer_logits(q, w, pool, bounds, 0.5f, got, &kp); },
                     {"indexer_logits", "slot"});
}

// A bf16 cache: scatter_rows rounds each value to nearest even on the way in, and the indexer and
// sparse attention read it back exactly, so they equal the f32 ops on the widened rows bitwise.
TEST(OpPaging, Bf16PoolsRoundOnStoreAndReadExactly) {
  const int64_t n = 6, d = 24, slots = 8, rows = 2, heads = 3;
  const Tensor src = randf({n, d}, 11);
  const Tensor where = Tensor::from_i32({4, 0, -1, 7, 2, 5}, {n});
  Tensor pool16 = Tensor::zeros({slots, d}, DType::BF16);
  ops::scatter_rows(src, where, pool16);
  Tensor widened = Tensor::zeros({slots, d}, DType::F32);
  const uint16_t* bits = static_cast<const uint16_t*>(pool16.raw());
  int64_t inexact = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t s = where.i32()[i];
    for (int64_t c = 0; c < d; ++c) {
      const float v = src.f32()[i * d + c];
      if (s < 0) continue;
      ASSERT_EQ(bits[s * d + c], f32_to_bf16(v)) << "row " << i << " col " << c;
      inexact += bf16_to_f32(f32_to_bf16(v)) != v;
    }
  }
  EXPECT_GT(inexact, 0);  // the values really were rounded
  for (int64_t i = 0; i < slots * d; ++i) widened.f32()[i] = bf16_to_f32(bits[i]);

  const Tensor q = randf({rows, heads, d}, 12), w = randf({rows, heads}, 13);
  const Tensor bounds = Tensor::from_i32({8, 5}, {rows});
  Tensor a = Tensor::empty({rows, slots}, DType::F32), b = Tensor::empty({rows, slots}, DType::F32);
  ops::indexer_logits(q, w, pool16, bounds, 0.25f, a);
  ops::indexer_logits(q, w, widened, bounds, 0.25f, b);
  EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0);

  const Tensor idx = Tensor::from_i32({4, 0, -1, 7, 2, 5, 5, -1}, {rows, 4});
  const int dv = 16;
  Tensor o16 = Tensor::empty({rows, heads, dv}, DType::F32), l16 = Tensor::empty({rows, heads}, DType::F32);
  Tensor o32 = Tensor::empty({rows, heads, dv}, DType::F32), l32 = Tensor::empty({rows, heads}, DType::F32);
  ops::sparse_mla(q, pool16, idx, 0.2f, dv, o16, l16);
  ops::sparse_mla(q, widened, idx, 0.2f, dv, o32, l32);
  EXPECT_EQ(std::memcmp(o16.raw(), o32.raw(), o16.nbytes()), 0);
  EXPECT_EQ(std::memcmp(l16.raw(), l32.raw(), l16.nbytes()), 0);
  Tensor pool_f16 = Tensor::zeros({slots, d}, DType::F16);
  test::expect_error([&] { ops::scatter_rows(src, where, pool_f16); }, {"f32 or bf16"});
}

}  // namespace
}  // namespace dsi
