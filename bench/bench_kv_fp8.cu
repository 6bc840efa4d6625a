// fp8 KV-cache benchmark on one GPU: the indexer decode logits over the paged fp8 key cache
// (64 heads, d = 128; 8K and 128K keys; 1 row, and 4 sequences x 4 MTP rows) and sparse MLA over the
// 656-byte cache (top-2048, 64 and 8 heads; 1 row and 4 x 4 rows). Calls the kernel launchers
// directly (the ops add a synchronising error-flag read). Prints the median microseconds over the
// timed launches and GB/s of the bytes the kernel must move (cache entries read + query + output),
// against the H200's ~4.3 TB/s.
//
//   bench_kv_fp8 [--reps N]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kv_fp8/kv_fp8.h"
#include "ops/kv_fp8.h"

namespace {

constexpr double kPeakGBs = 4300.0;
constexpr int64_t kPage = dsi::ops::kKvPageTokens;

__device__ uint32_t mix(uint64_t i, uint32_t seed) {
  uint64_t z = i * 0x9e3779b97f4a7c15ull + seed;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return uint32_t(z >> 32);
}
__global__ void fill_f32(float* p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    p[i] = float(mix(uint64_t(i), seed) >> 8) * 0x1.0p-23f - 1.0f;
}

template <typename T>
T* dalloc(size_t n) {
  void* p = nullptr;
  DSI_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)));
  return static_cast<T*>(p);
}
template <typename T>
T* upload(const std::vector<T>& v) {
  T* p = dalloc<T>(v.size());
  DSI_CUDA_CHECK(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return p;
}
float* random_f32(int64_t n, uint32_t seed) {
  float* p = dalloc<float>(size_t(n));
  fill_f32<<<1024, 256>>>(p, n, seed);
  DSI_CUDA_CHECK(cudaGetLastError());
  return p;
}

// Median microseconds of fn() over reps timed launches (after 3 warm-up calls).
template <typename Fn>
double time_us(Fn fn, int reps) {
  for (int i = 0; i < 3; ++i) fn();
  cudaEvent_t a, b;
  DSI_CUDA_CHECK(cudaEventCreate(&a));
  DSI_CUDA_CHECK(cudaEventCreate(&b));
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    DSI_CUDA_CHECK(cudaEventRecord(a));
    fn();
    DSI_CUDA_CHECK(cudaEventRecord(b));
    DSI_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    DSI_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(double(ms) * 1e3);
  }
  DSI_CUDA_CHECK(cudaEventDestroy(a));
  DSI_CUDA_CHECK(cudaEventDestroy(b));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

void report(const std::string& name, double us, double bytes) {
  const double gbs = bytes / (us * 1e-6) / 1e9;
  std::printf("%-52s %10.1f us %9.1f GB/s %6.1f %%\n", name.c_str(), us, gbs, 100.0 * gbs / kPeakGBs);
}

// n_seqs sequences of n_keys keys each, rows_per_seq rows per sequence (bounds n_keys - rows + 1 ..
// n_keys, as MTP verification rows).
void bench_indexer(int64_t n_keys, int n_seqs, int rows_per_seq, int heads, int reps) {
  const int d = 128;
  const int64_t pages_per_seq = (n_keys + kPage - 1) / kPage, n_pages = pages_per_seq * n_seqs;
  const int64_t rows = int64_t(n_seqs) * rows_per_seq, total = n_keys * n_seqs;
  uint8_t* pool = dalloc<uint8_t>(size_t(n_pages * dsi::ops::indexer_page_bytes(d)));
  float* keys = random_f32(total * d, 1);
  std::vector<int32_t> slots(static_cast<size_t>(total)), table(size_t(n_seqs * pages_per_seq), -1);
  for (int64_t i = 0; i < total; ++i) slots[size_t(i)] = int32_t(i % n_keys + (i / n_keys) * pages_per_seq * kPage);
  for (int64_t i = 0; i < n_seqs * pages_per_seq; ++i) table[size_t(i)] = int32_t(i);
  int32_t* dslots = upload(slots);
  unsigned long long* bad = dalloc<unsigned long long>(2);
  dsi::cuda::RotateQuantParams st{};
  st.x = keys;
  st.x_stride = d;
  st.n = total;
  st.d = d;
  st.hadamard_scale = float(1.0 / std::sqrt(double(d)));
  st.slots = dslots;
  st.pool = pool;
  st.n_pages = n_pages;
  st.bad = bad;
  dsi::cuda::launch_rotate_quant(st, nullptr);
  std::vector<int32_t> row_seq, bounds;
  for (int s = 0; s < n_seqs; ++s)
    for (int j = 0; j < rows_per_seq; ++j) {
      row_seq.push_back(s);
      bounds.push_back(int32_t(n_keys - rows_per_seq + 1 + j));
    }
  float* q = random_f32(rows * heads * d, 2);
  float* w = random_f32(rows * heads, 3);
  float* q8 = dalloc<float>(size_t(rows * heads * d));
  float* wq = dalloc<float>(size_t(rows * heads));
  float* logits = dalloc<float>(size_t(rows * n_keys));
  dsi::cuda::RotateQuantParams rq{};
  rq.x = q;
  rq.x_stride = d;
  rq.n = rows * heads;
  rq.d = d;
  rq.hadamard_scale = st.hadamard_scale;
  rq.weights = w;
  rq.softmax_scale = 1.0f / std::sqrt(float(d));
  rq.q8 = q8;
  rq.wq = wq;
  dsi::cuda::IndexerLogitsFp8Params p{};
  p.q8 = q8;
  p.wq = wq;
  p.pool = pool;
  p.block_tables = upload(table);
  p.row_seq = upload(row_seq);
  p.bounds = upload(bounds);
  p.logits = logits;
  p.rows = rows;
  p.n_cols = n_keys;
  p.n_pages = n_pages;
  p.n_seqs = n_seqs;
  p.max_pages = pages_per_seq;
  p.heads = heads;
  p.d = d;
  p.bad_row = bad;
  p.bad_page = bad + 1;
  const double us = time_us([&] {
    dsi::cuda::launch_rotate_quant(rq, nullptr);
    dsi::cuda::launch_indexer_logits_fp8(p, nullptr);
  }, reps);
  // Bytes: every row reads its sequence's keys (d + 4 bytes each), its query and writes its logits.
  const double bytes = double(rows) * (double(n_keys) * (d + 4) + heads * d * 4.0 + n_keys * 4.0);
  const double flops = 2.0 * double(rows) * n_keys * heads * d;
  char name[128];
  std::snprintf(name, sizeof(name), "indexer_logits_fp8 keys=%lld heads=%d rows=%dx%d",
                (long long)n_keys, heads, n_seqs, rows_per_seq);
  report(name, us, bytes);
  std::printf("%-52s %10.1f TFLOP/s (fp32 CUDA cores)\n", "", flops / (us * 1e-6) / 1e12);
  for (void* ptr : {(void*)pool, (void*)keys, (void*)dslots, (void*)bad, (void*)q, (void*)w, (void*)q8,
                    (void*)wq, (void*)logits, (void*)p.block_tables, (void*)p.row_seq, (void*)p.bounds})
    DSI_CUDA_CHECK(cudaFree(ptr));
}

void bench_sparse_mla(int64_t rows, int heads, int64_t topk, int reps) {
  const int64_t n_slots = 1 << 17, dk = 576;
  uint8_t* pool = dalloc<uint8_t>(size_t(n_slots * dsi::ops::kMlaFp8Bytes));
  float* kv = random_f32(n_slots * dk, 4);
  std::vector<int32_t> all(static_cast<size_t>(n_slots));
  for (int64_t i = 0; i < n_slots; ++i) all[size_t(i)] = int32_t(i);
  int32_t* dall = upload(all);
  unsigned long long* bad = dalloc<unsigned long long>(1);
  dsi::cuda::MlaStoreFp8Params st{};
  st.rows = kv;
  st.slots = dall;
  st.pool = pool;
  st.row_stride = dk;
  st.m = n_slots;
  st.n_slots = n_slots;
  st.bad = bad;
  dsi::cuda::launch_mla_store_fp8(st, nullptr);
  std::mt19937_64 rng(5);
  std::vector<int32_t> idx(static_cast<size_t>(rows * topk));
  for (auto& v : idx) v = int32_t(rng() % uint64_t(n_slots));
  dsi::cuda::SparseMlaFp8Params p{};
  p.q = random_f32(rows * heads * dk, 6);
  p.pool = pool;
  p.indices = upload(idx);
  p.out = dalloc<float>(size_t(rows * heads * 512));
  p.lse = dalloc<float>(size_t(rows * heads));
  p.q_s0 = heads * dk;
  p.q_s1 = dk;
  p.rows = rows;
  p.heads = heads;
  p.n_slots = n_slots;
  p.topk = topk;
  p.softmax_scale = 1.0f / std::sqrt(float(dk));
  p.bad = bad;
  const double us = time_us([&] { dsi::cuda::launch_sparse_mla_fp8(p, nullptr); }, reps);
  const double bytes = double(rows) * (double(topk) * (dsi::ops::kMlaFp8Bytes + 4) +
                                       heads * (dk + 512 + 1) * 4.0);
  char name[128];
  std::snprintf(name, sizeof(name), "sparse_mla_fp8 topk=%lld heads=%d rows=%lld", (long long)topk,
                heads, (long long)rows);
  report(name, us, bytes);
  for (void* ptr : {(void*)pool, (void*)kv, (void*)dall, (void*)bad, (void*)p.q, (void*)p.indices,
                    (void*)p.out, (void*)p.lse})
    DSI_CUDA_CHECK(cudaFree(ptr));
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 20;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: bench_kv_fp8 [--reps N]\n");
      return 2;
    }
  }
  try {
    int n = 0;
    DSI_CUDA_CHECK(cudaGetDeviceCount(&n));
    if (n == 0) {
      std::fprintf(stderr, "bench_kv_fp8: no CUDA device\n");
      return 1;
    }
    std::printf("%-52s %13s %14s %7s\n", "case", "time", "bandwidth", "of peak");
    for (int64_t keys : {int64_t(8192), int64_t(131072)}) {
      bench_indexer(keys, 1, 1, 64, reps);
      bench_indexer(keys, 4, 4, 64, reps);
    }
    for (int heads : {64, 8}) {
      bench_sparse_mla(1, heads, 2048, reps);
      bench_sparse_mla(16, heads, 2048, reps);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
