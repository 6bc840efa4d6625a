// CUDA tests of the radix-select top-k (backends/cuda/topk/sm90_topk_select.cu) against the CPU
// reference at the deployed sizes: k = 2048 over 8K..1M scores (cached and streamed chunks, 1..16
// CTAs per cluster, forced widths included), many rows, exact ties straddling the CTA chunks and the threshold (relu zeros, a
// few distinct levels), -inf/NaN holes, bounds inside the row, strided rows; indices exact and values
// bitwise, repeated runs identical; rows of up to 12K scores on the one-CTA kernel. The odd sizes
// are in test_cuda_attention.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "backends/cuda/topk/topk.h"
#include "cuda/cuda_test_util.h"
#include "ops/topk.h"

namespace dsi {
namespace {

using test::dev;
using test::host;

class CudaTopkSelect : public test::CudaTest {};

enum class Fill { kRandom, kReluZeros, kFewLevels, kHoles, kAllTied };

Tensor scores(int64_t rows, int64_t n, Fill fill, uint64_t seed) {
  std::vector<float> v = test::random_floats(size_t(rows * n), seed);
  std::mt19937_64 rng(seed);
  for (auto& x : v) {
    switch (fill) {
      case Fill::kRandom: break;
      case Fill::kReluZeros: x = (rng() % 10 < 9) ? ((rng() & 1) ? 0.0f : -0.0f) : std::fabs(x); break;
      case Fill::kFewLevels: x = float(int(rng() % 4)) * 0.25f; break;
      case Fill::kHoles: {
        const uint64_t u = rng() % 7;
        if (u == 0) x = -INFINITY;
        if (u == 1) x = NAN;
        break;
      }
      case Fill::kAllTied: x = 1.5f; break;
    }
  }
  return Tensor::from_f32(v, {rows, n});
}

void check(const Tensor& s, const std::vector<int32_t>& bounds, int k, const std::string& what,
           bool strided = false) {
  const int64_t rows = s.dim(0);
  const Tensor hb = Tensor::from_i32(bounds, {rows});
  Tensor ci = Tensor::empty({rows, k}, DType::I32), cv = Tensor::empty({rows, k}, DType::F32);
  ops::topk(s, hb, k, ci, &cv);
  test::Guarded gi = test::guarded({rows, k}, DType::I32), gv = test::guarded({rows, k}, DType::F32);
  const Tensor ds = strided ? test::dev_strided(s) : dev(s), db = dev(hb);
  ops::topk(ds, db, k, gi.view, &gv.view);
  const Tensor got = gi.check(what + " indices");
  test::expect_same_i32(got, ci, what);
  test::expect_bitwise(gv.check(what + " values"), cv, what + " values");
  ops::topk(ds, db, k, gi.view, nullptr);
  test::expect_bitwise(gi.check(what + " repeat"), got, what + " repeat");
}

std::string name(const char* fill, int64_t rows, int64_t n, int k) {
  return std::string("topk select ") + fill + " rows=" + std::to_string(rows) + " n=" + std::to_string(n) +
         " k=" + std::to_string(k);
}

TEST_F(CudaTopkSelect, DecodeSizes) {
  for (int64_t n : {8192, 131072}) {
    check(scores(1, n, Fill::kRandom, uint64_t(n)), {int32_t(n)}, 2048, name("random", 1, n, 2048));
    std::vector<int32_t> b(16);
    for (int r = 0; r < 16; ++r) b[size_t(r)] = int32_t(n - 3 + r % 4 - (r / 4) * 1000);
    check(scores(16, n, Fill::kRandom, uint64_t(n) + 1), b, 2048, name("random", 16, n, 2048));
  }
}

// The threshold's first-digit bin decides the route: up to 16K keys go to one CTA as candidates
// (random, relu zeros, holes; few levels at 32K: 8K keys per level, tied across every chunk), more
// take the cluster-wide passes (few levels and all tied at 128K).
TEST_F(CudaTopkSelect, TiesAtTheThresholdAndAcrossChunks) {
  for (int64_t n : {32768, 131072})
    for (Fill f : {Fill::kReluZeros, Fill::kFewLevels, Fill::kHoles, Fill::kAllTied}) {
      const char* fn[] = {"random", "relu zeros", "few levels", "holes", "all tied"};
      const std::string label = fn[int(f)];
      for (int k : {1, 100, 2047, 2048}) {
        check(scores(3, n, f, uint64_t(k) + 7), {int32_t(n), int32_t(n / 2 + 1), 5000}, k,
              name(label.c_str(), 3, n, k));
      }
    }
}

TEST_F(CudaTopkSelect, StreamedLongRowsAndStrides) {
  // 1M scores: chunks too large for shared memory (re-read from L2 every pass).
  const int64_t n = 1 << 20;
  check(scores(2, n, Fill::kRandom, 11), {int32_t(n), int32_t(n - 12345)}, 2048, name("random", 2, n, 2048));
  check(scores(2, n, Fill::kReluZeros, 12), {int32_t(n), 777777}, 2048, name("relu zeros", 2, n, 2048));
  // Strided rows, fewer selectable keys than k, one CTA per row.
  check(scores(4, 3000, Fill::kHoles, 13), {3000, 1500, 1, 0}, 2048, name("holes strided", 4, 3000, 2048), true);
  check(scores(64, 2049, Fill::kFewLevels, 14), std::vector<int32_t>(64, 2049), 2048,
        name("few levels", 64, 2049, 2048));
}

// Rows of at most 12K scores run one CTA each (the row's keys in registers, 4, 8 or 12 a thread):
// every fill, ties at the threshold, k from 1 to 2048 over rows shorter and longer than k, bounds
// inside the row, a row just past a keys-per-thread step (4097), rows whose starts are not 16-byte
// aligned (2049, 4097), the largest such row and the first larger one (the cluster kernel's).
TEST_F(CudaTopkSelect, OneCtaRows) {
  const char* fn[] = {"random", "relu zeros", "few levels", "holes", "all tied"};
  for (int64_t n : {1, 100, 2049, 4097, 8192, 12288, 12289})
    for (Fill f : {Fill::kRandom, Fill::kReluZeros, Fill::kFewLevels, Fill::kHoles, Fill::kAllTied})
      for (int k : {1, 77, 2048}) {
        const int32_t full = int32_t(n);
        check(scores(3, n, f, uint64_t(n * 10 + k)), {full, std::max<int32_t>(0, full / 2 - 1), std::min<int32_t>(full, 3)},
              k, name(fn[int(f)], 3, n, k));
      }
}

// Every cluster width the launch may take or be forced to, on one row length: 1 CTA (a chunk past
// the shared-memory cache: streamed), 2 to 7 (cached; 3, 5, 6 and 7 own two slices of the merged
// histograms, some of them), 8, 12 and 16 (the largest, capped where the GPU places no cluster of
// 16); random scores, relu zeros (ties at the threshold across chunks), all tied (more candidates
// than CTA 0 takes: the cluster-wide passes), and bounds inside the row.
TEST_F(CudaTopkSelect, ForcedClusterWidths) {
  struct Restore {
    ~Restore() { cuda::set_topk_cluster_ctas(0); }
  } restore;
  const int64_t n = 40000;
  for (int ctas : {1, 2, 3, 4, 5, 6, 7, 8, 12, 16}) {
    cuda::set_topk_cluster_ctas(ctas);
    const std::string w = " ctas=" + std::to_string(ctas);
    check(scores(2, n, Fill::kRandom, 21), {int32_t(n), 33333}, 2048, name("random", 2, n, 2048) + w);
    check(scores(2, n, Fill::kReluZeros, 22), {int32_t(n), 9000}, 100, name("relu zeros", 2, n, 100) + w);
    check(scores(2, n, Fill::kAllTied, 23), {int32_t(n), 20001}, 2048, name("all tied", 2, n, 2048) + w);
  }
}

}  // namespace
}  // namespace dsi
