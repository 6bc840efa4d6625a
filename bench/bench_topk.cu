// Top-k benchmark on one GPU: k = 2048 over 8K, 32K, 128K and 1M scores per row, 1 and 16 rows, random
// scores and relu-like scores (90% exact zeros: the tie-heavy case). The radix select
// (sm90_topk_select.cu; rows up to 12K on one CTA, DSI_TOPK_CTA=0 for the cluster kernel) is timed
// in CUDA graphs over rotating score copies (together more than 2 x L2), median over replays; the previous path (64-bit keys + cub segmented sort + decode, as
// ops::topk ran it) with plain stream launches. GB/s of the scores read + indices written, against
// the H200's ~4.3 TB/s.
//
//   bench_topk [--reps N] [--keys N] [--rows A,B] [--ctas A,B] [--trace]   (--keys: that row length
//   only; --rows: those row counts instead of 1 and 16 (random scores);
//   --ctas: the cluster kernel also at each forced CTA count per row, set_topk_cluster_ctas;
//   --trace: where the select kernel's CTAs spend the last replay, TopkSelectParams::trace)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <string>
#include <vector>

#include "backends/cuda/common.cuh"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/topk/topk.h"
#include "bench_util.h"

namespace {

constexpr int kK = dsi::cuda::kTopkSelectMaxK;

__device__ uint32_t mix(uint64_t i, uint32_t seed) {
  uint64_t z = i * 0x9e3779b97f4a7c15ull + seed;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return uint32_t(z >> 32);
}
// Uniform in [-1, 1); relu: 90% exact zeros, the rest in [0, 1).
__global__ void fill_scores(float* p, int64_t n, uint32_t seed, bool relu) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const uint32_t h = mix(uint64_t(i), seed);
    const float u = float(h >> 8) * 0x1.0p-23f - 1.0f;
    p[i] = relu ? ((h % 10u) != 0u ? 0.0f : fabsf(u)) : u;
  }
}

template <typename T>
T* dalloc(size_t n) {
  void* p = nullptr;
  DSI_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)));
  return static_cast<T*>(p);
}

// The phase marks of the last replay (us after the first CTA's entry: min, median, max over the CTAs
// that wrote each; marks of earlier replays, older than that entry, are left out).
void print_trace(const unsigned long long* dtrace, int64_t rows, int64_t n) {
  constexpr int S = dsi::cuda::kTopkTraceSlots, R = dsi::cuda::kTopkTraceRanks;
  std::vector<unsigned long long> t(size_t(rows * R * S));
  DSI_CUDA_CHECK(cudaMemcpy(t.data(), dtrace, t.size() * sizeof(t[0]), cudaMemcpyDeviceToHost));
  unsigned long long t0 = ~0ull, last = 0;
  for (int64_t b = 0; b < rows * R; ++b) last = std::max(last, t[size_t(b * S)]);
  for (int64_t b = 0; b < rows * R; ++b)  // entries of the last replay: within 1 ms of the latest
    if (t[size_t(b * S)] != 0 && last - t[size_t(b * S)] < 1000000) t0 = std::min(t0, t[size_t(b * S)]);
  std::printf("    trace of the last replay (us after the first CTA's entry: min, median, max over CTAs)\n");
  const bool cta = dsi::cuda::topk_select_one_cta(n);  // that kernel's own marks
  const auto* names = cta ? dsi::cuda::kTopkCtaTraceMarks : dsi::cuda::kTopkTraceMarks;
  const int n_marks = cta ? int(std::size(dsi::cuda::kTopkCtaTraceMarks)) : int(std::size(dsi::cuda::kTopkTraceMarks));
  for (int m = 0; m < n_marks; ++m) {
    const char* what = names[m];
    std::vector<double> v;
    for (int64_t b = 0; b < rows * R; ++b)
      if (const unsigned long long x = t[size_t(b * S + m)]; x >= t0 && x != 0) v.push_back(double(x - t0) * 1e-3);
    if (v.empty()) continue;
    std::sort(v.begin(), v.end());
    std::printf("    %-34s %7.2f %7.2f %7.2f us (%zu CTAs)\n", what, v.front(), v[v.size() / 2], v.back(), v.size());
  }
}

bool g_trace = false;

void bench(int64_t rows, int64_t n, bool relu, int reps, const std::vector<int>& cta_sweep) {
  const int64_t per_copy = rows * n;
  const int copies = int(std::clamp<int64_t>((int64_t(120) << 20) / (per_copy * 4) + 1, 1, 64));
  float* scores = dalloc<float>(size_t(copies * per_copy));
  fill_scores<<<1024, 256>>>(scores, copies * per_copy, 9, relu);
  DSI_CUDA_CHECK(cudaGetLastError());
  std::vector<int32_t> hb(static_cast<size_t>(rows), int32_t(n));
  int32_t* bounds = dalloc<int32_t>(size_t(rows));
  DSI_CUDA_CHECK(cudaMemcpy(bounds, hb.data(), hb.size() * 4, cudaMemcpyHostToDevice));
  int32_t* idx = dalloc<int32_t>(size_t(rows * kK));
  const double bytes = double(per_copy) * 4.0 + double(rows) * kK * 4.0;
  char tag[96];
  std::snprintf(tag, sizeof(tag), "n=%lld rows=%lld%s", (long long)n, (long long)rows, relu ? " relu" : "");

  dsi::cuda::TopkSelectParams p{};
  p.bounds = bounds;
  p.indices = idx;
  p.score_stride = n;
  p.rows = rows;
  p.n = n;
  p.k = kK;
  auto select = [&](int c, cudaStream_t st) {
    dsi::cuda::TopkSelectParams q = p;
    q.scores = scores + int64_t(c) * per_copy;
    dsi::cuda::launch_topk_select(q, st);
  };
  const double t_sel = time_graph(copies, reps, select);
  report(std::string("top-2048 radix select ") + tag, t_sel, bytes);
  if (g_trace) {
    unsigned long long* tr = dalloc<unsigned long long>(size_t(rows * dsi::cuda::kTopkTraceRanks * dsi::cuda::kTopkTraceSlots));
    DSI_CUDA_CHECK(cudaMemset(tr, 0, size_t(rows * dsi::cuda::kTopkTraceRanks * dsi::cuda::kTopkTraceSlots) * 8));
    p.trace = tr;
    std::printf("  with the marks: %.2f us\n", time_graph(copies, reps, select));
    print_trace(tr, rows, n);
    p.trace = nullptr;
    DSI_CUDA_CHECK(cudaFree(tr));
  }
  for (int c : cta_sweep) {  // --ctas: the cluster kernel at each forced width
    dsi::cuda::set_topk_cluster_ctas(c);
    std::printf("  %2d CTAs per row: %.2f us\n", c, time_graph(copies, reps, select));
  }
  dsi::cuda::set_topk_cluster_ctas(0);

  if (rows * n <= (int64_t(1) << 25)) {
    unsigned long long* keys = dalloc<unsigned long long>(size_t(per_copy));
    unsigned long long* sorted = dalloc<unsigned long long>(size_t(per_copy));
    const double t_sort = time_stream(reps, [&] {
      dsi::cuda::TopkKeysParams kp{};
      kp.scores = scores;
      kp.bounds = bounds;
      kp.keys = keys;
      kp.score_stride = n;
      kp.rows = rows;
      kp.n = n;
      dsi::cuda::launch_topk_keys(kp, nullptr);
      dsi::cuda::sort_rows_descending(keys, sorted, rows, n, nullptr);
      dsi::cuda::TopkDecodeParams dp{};
      dp.sorted = sorted;
      dp.scores = scores;
      dp.indices = idx;
      dp.score_stride = n;
      dp.rows = rows;
      dp.n = n;
      dp.k = kK;
      dsi::cuda::launch_topk_decode(dp, nullptr);
    });
    report(std::string("top-2048 full sort (before) ") + tag, t_sort, bytes);
    DSI_CUDA_CHECK(cudaFree(keys));
    DSI_CUDA_CHECK(cudaFree(sorted));
  }
  for (void* ptr : {(void*)scores, (void*)bounds, (void*)idx}) DSI_CUDA_CHECK(cudaFree(ptr));
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 20;
  int64_t only_keys = 0;
  std::vector<int> cta_sweep, row_counts;
  try {
    parse_options(argc, argv, [&](const std::string& k, auto value) {
      if (k == "--reps") reps = std::max(1, std::stoi(value()));
      else if (k == "--keys") only_keys = std::stoll(value());
      else if (k == "--ctas") cta_sweep = int_list(value());
      else if (k == "--rows") row_counts = int_list(value());
      else if (k == "--trace") g_trace = true;
      else return false;
      return true;
    });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_topk: %s\nusage: bench_topk [--reps N] [--keys N] [--rows A,B] [--ctas A,B] [--trace]\n", e.what());
    return 2;
  }
  try {
    int n = 0;
    DSI_CUDA_CHECK(cudaGetDeviceCount(&n));
    if (n == 0) {
      std::fprintf(stderr, "bench_topk: no CUDA device\n");
      return 1;
    }
    std::printf("%-56s %13s %14s %7s\n", "case", "time", "bandwidth", "of peak");
    auto kept = [&](int64_t len) { return only_keys == 0 || len == only_keys; };
    const int64_t lens[] = {8192, 12288, 16384, 32768, 131072, int64_t(1) << 20};
    if (!row_counts.empty()) {  // --rows: random scores only
      for (int64_t len : lens)
        for (int rows : row_counts)
          if (kept(len) && rows > 0) bench(rows, len, false, reps, cta_sweep);
      return 0;
    }
    for (int64_t len : lens)
      for (int64_t rows : {int64_t(1), int64_t(16)})
        if (kept(len)) bench(rows, len, false, reps, cta_sweep);
    for (int64_t rows : {int64_t(1), int64_t(16)})
      for (int64_t len : {int64_t(8192), int64_t(131072)})
        if (kept(len) && !(rows == 16 && len == 8192)) bench(rows, len, true, reps, cta_sweep);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
