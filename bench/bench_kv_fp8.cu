// fp8 KV-cache benchmark on one GPU: the indexer decode logits over the paged fp8 key cache
// (32 and 64 heads, d = 128; 8K and 128K keys; 1 row, and 4 sequences x 4 MTP rows; CUDA cores before,
// tensor cores now, the top-2048 select alone and both back to back) and sparse MLA decode
// over the 656-byte cache (top-2048: 64 heads x 1 row, 8 heads x 1 row, 64 heads x 4 requests x 4
// MTP rows, 128 heads x 1 row). Calls the kernel launchers directly (the ops add a synchronising
// error-flag read). Prints the median microseconds and GB/s of the bytes the kernel must move (cache
// entries read + indices + query + output), against the H200's ~4.3 TB/s.
// Sparse MLA is timed HBM-honestly: K launches captured in one CUDA graph, each with its own random
// index set over a 656 MB pool (the sets together exceed the 50 MB L2), median over replays of
// graph time / K. It also prints the tensor-core rate against ~790 TFLOP/s (bf16 dense), the plan
// (heads per CTA, splits, CTAs), and with --sweep every (m_tiles, splits) tiling.
//
// With --torch FILE (written by bench/torch_baseline.py in the same session on the same GPU) each
// case also prints the PyTorch implementation's time and dsinfer's speed-up over it.
//
//   bench_kv_fp8 [--reps N] [--sweep] [--only-mla | --only-indexer [--keys 8192|131072]]
//                [--heads A,B] [--idx-blocks A,B] [--trace] [--torch FILE]
// The indexer runs with 32 heads (GLM-5) and 64 (DeepSeek-V3.2) unless --heads says otherwise;
// --idx-blocks also times the logits kernel with each forced count of blocks per row group
// (set_indexer_logits_blocks).
// Each sparse MLA case runs twice: as a plain call, and "settled" (indices and the first gather
// before the programmatic wait). --trace prints where each CTA's time goes (phase marks).
#include <cuda_runtime.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kv_fp8/kv_fp8.h"
#include "backends/cuda/kv_fp8/sm90_indexer_logits.h"
#include "backends/cuda/kv_fp8/sm90_sparse_mla_decode.h"
#include "backends/cuda/topk/topk.h"
#include "ops/kv_fp8.h"
#include "ops/rope.h"
#include "bench_util.h"

namespace {

constexpr int64_t kPage = dsi::ops::kKvPageTokens;

// PyTorch's times of the same cases (bench/torch_baseline.py), by case name; empty without --torch.
nlohmann::json g_torch;
// --trace: the sparse MLA cases print where each CTA's time goes (SparseMlaDecodeParams::trace).
bool g_trace = false;

// "  PyTorch 120.0 us, 3.1x faster" for a case the baseline file has.
void report_torch(const std::string& name, double us) {
  if (!g_torch.contains(name)) return;
  const double t = g_torch.at(name).get<double>();
  std::printf("%-56s %10.1f us (PyTorch, same GPU): dsinfer %.1fx faster\n", ("  " + name).c_str(), t, t / us);
}

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

// Random indexer-key pages: e4m3 bytes without the NaN codes (bit 3 cleared), scales 2^-6.
__global__ void fill_indexer_pool(uint8_t* pool, int64_t n_pages, int d, uint32_t seed) {
  const int64_t page_bytes = kPage * (d + 4), total = n_pages * page_bytes;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t off = i % page_bytes;
    if (off < kPage * d)
      pool[i] = uint8_t(mix(uint64_t(i), seed) & 0xf7u);
    else if ((off - kPage * d) % 4 == 0)
      *reinterpret_cast<float*>(pool + i) = 0.015625f;
  }
}

// n_seqs sequences of n_keys keys each, rows_per_seq rows per sequence (bounds n_keys - rows + 1 ..
// n_keys, as MTP verification rows). In CUDA graphs over rotating copies of the key pool (together
// more than 2 x L2): the q rotation alone (also with the RoPE and the weights' scale a layer folds
// into it), q rotation + logits on the CUDA cores (the previous kernel), q rotation + logits
// on the tensor cores (sm90_indexer_logits.cu), that kernel alone (launches back to back, as in a
// step: each one's start overlaps the previous one's end), the top-2048 radix select of the logits (L2-resident,
// as right after the logits kernel), and rotation + tensor-core logits + top-2048 back to back.
// Bytes: the keys once per sequence (132 B each: the byte floor), the f32 query, the logits written
// (the top-k reads them; back to back they stay in L2 and only the keys, q and indices count).
void bench_indexer(int64_t n_keys, int n_seqs, int rows_per_seq, int heads, int reps,
                   const std::vector<int>& block_sweep) {
  const int d = 128, k = dsi::cuda::kTopkSelectMaxK;
  const int64_t page_bytes = dsi::ops::indexer_page_bytes(d);
  const int64_t pages_per_seq = (n_keys + kPage - 1) / kPage, pages_per_copy = pages_per_seq * n_seqs;
  const int64_t rows = int64_t(n_seqs) * rows_per_seq;
  const int copies = int(std::clamp<int64_t>((int64_t(120) << 20) / (pages_per_copy * page_bytes) + 1, 2, 64));
  uint8_t* pool = dalloc<uint8_t>(size_t(copies * pages_per_copy * page_bytes));
  fill_indexer_pool<<<1024, 256>>>(pool, copies * pages_per_copy, d, 7);
  DSI_CUDA_CHECK(cudaGetLastError());
  std::vector<int32_t> table(size_t(copies * pages_per_copy));
  for (int64_t i = 0; i < copies * pages_per_copy; ++i) table[size_t(i)] = int32_t(i);  // [copy][seq][page]
  int32_t* dtable = upload(table);
  std::vector<int32_t> row_seq, bounds;
  for (int s = 0; s < n_seqs; ++s)
    for (int j = 0; j < rows_per_seq; ++j) {
      row_seq.push_back(s);
      bounds.push_back(int32_t(n_keys - rows_per_seq + 1 + j));
    }
  float* q = random_f32(rows * heads * d, 2);
  float* w = random_f32(rows * heads, 3);
  float* q8 = dalloc<float>(size_t(rows * heads * d));
  uint8_t* q8b = dalloc<uint8_t>(size_t(rows * heads * d));
  float* wq = dalloc<float>(size_t(rows * heads));
  float* logits = dalloc<float>(size_t(rows * n_keys));
  int32_t* idx = dalloc<int32_t>(size_t(rows * k));
  unsigned long long* bad = dalloc<unsigned long long>(2);
  dsi::cuda::RotateQuantParams rq{};
  rq.x = q;
  rq.x_stride = d;
  rq.n = rows * heads;
  rq.d = d;
  rq.hadamard_scale = float(1.0 / std::sqrt(double(d)));
  rq.weights = w;
  rq.softmax_scale = 1.0f / std::sqrt(float(d));
  rq.q8 = q8;  // both forms: the two logits kernels read one each
  rq.q8_bytes = q8b;
  rq.wq = wq;
  dsi::cuda::IndexerLogitsFp8Params base{};
  base.q8 = q8;
  base.q8_bytes = q8b;
  base.wq = wq;
  base.pool = pool;
  base.row_seq = upload(row_seq);
  base.bounds = upload(bounds);
  base.logits = logits;
  base.rows = rows;
  base.n_cols = n_keys;
  base.n_pages = copies * pages_per_copy;
  base.n_seqs = n_seqs;
  base.max_pages = pages_per_seq;
  base.heads = heads;
  base.d = d;
  base.bad_row = bad;
  base.bad_page = bad + 1;
  auto params = [&](int c) {
    dsi::cuda::IndexerLogitsFp8Params p = base;
    p.block_tables = dtable + int64_t(c) * pages_per_copy;
    return p;
  };
  dsi::cuda::TopkSelectParams tk{};
  tk.scores = logits;
  tk.bounds = base.bounds;
  tk.indices = idx;
  tk.score_stride = n_keys;
  tk.rows = rows;
  tk.n = n_keys;
  tk.k = k;
  const double t_rot = time_graph(1, reps, [&](int, cudaStream_t st) { dsi::cuda::launch_rotate_quant(rq, st); });
  // As a layer calls it (ops::IndexerQueryPrep): RoPE of each head's first 64 dims and the weights'
  // H^-1/2 inside the rotation.
  const dsi::ops::RopeFreqs freqs = dsi::ops::compute_rope_freqs(dsi::RopeConfig{}, 64);
  std::vector<int32_t> positions(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) positions[size_t(r)] = int32_t(n_keys - rows + r);
  dsi::cuda::RotateQuantParams rq_prep = rq;
  rq_prep.positions = upload(positions);
  rq_prep.inv_freq = upload(freqs.inv_freq);
  rq_prep.rope_half = int(freqs.inv_freq.size());
  rq_prep.heads = heads;
  rq_prep.interleaved = true;
  rq_prep.attention_factor = freqs.attention_factor;
  rq_prep.weights_scale = 1.0f / std::sqrt(float(heads));
  const double t_rot_prep =
      time_graph(1, reps, [&](int, cudaStream_t st) { dsi::cuda::launch_rotate_quant(rq_prep, st); });
  const double t_old = time_graph(copies, reps, [&](int c, cudaStream_t st) {
    dsi::cuda::launch_rotate_quant(rq, st);
    dsi::cuda::launch_indexer_logits_fp8(params(c), st);
  });
  const double t_mma = time_graph(copies, reps, [&](int c, cudaStream_t st) {
    dsi::cuda::launch_rotate_quant(rq, st);
    dsi::cuda::launch_indexer_logits_fp8_mma(params(c), st);
  });
  // The logits kernel alone, and the step: rotation, logits, top-2048 (also timed at forced plans below).
  auto logits_alone = [&](int c, cudaStream_t st) { dsi::cuda::launch_indexer_logits_fp8_mma(params(c), st); };
  auto logits_step = [&](int c, cudaStream_t st) {
    dsi::cuda::launch_rotate_quant(rq, st);
    dsi::cuda::launch_indexer_logits_fp8_mma(params(c), st);
    dsi::cuda::launch_topk_select(tk, st);
  };
  const double t_mma_only = time_graph(copies, reps, logits_alone);
  const double t_topk = time_graph(1, reps, [&](int, cudaStream_t st) { dsi::cuda::launch_topk_select(tk, st); });
  const double t_both = time_graph(copies, reps, logits_step);
  const double key_bytes = double(n_seqs) * n_keys * (d + 4), q_bytes = double(rows) * heads * d * 4.0;
  const double logit_bytes = double(rows) * n_keys * 4.0, idx_bytes = double(rows) * k * 4.0;
  const double flops = 2.0 * double(rows) * n_keys * heads * d;
  char tag[96];
  std::snprintf(tag, sizeof(tag), "keys=%lld heads=%d rows=%dx%d", (long long)n_keys, heads, n_seqs, rows_per_seq);
  report(std::string("q rotation + quantisation alone ") + tag, t_rot, q_bytes * 2);
  report(std::string("  with RoPE and the weights' scale inside ") + tag, t_rot_prep, q_bytes * 2);
  report(std::string("indexer logits, CUDA cores (before) ") + tag, t_old, key_bytes + q_bytes + logit_bytes);
  report(std::string("indexer logits, tensor cores ") + tag, t_mma, key_bytes + q_bytes + logit_bytes);
  report(std::string("  the logits kernel alone ") + tag, t_mma_only, key_bytes + q_bytes + logit_bytes);
  std::printf("%-52s %10.1f TFLOP/s (fp8 wgmma), floor %.1f us\n", "", flops / (t_mma_only * 1e-6) / 1e12,
              key_bytes / (kPeakGBs * 1e3));
  report(std::string("top-2048 select of the logits ") + tag, t_topk, logit_bytes + idx_bytes);
  report(std::string("logits + top-2048 back to back ") + tag, t_both, key_bytes + q_bytes + idx_bytes);
  // The logits kernel with each forced count of blocks per row group (--idx-blocks), alone and as
  // a step runs it.
  for (int nb : block_sweep) {
    dsi::cuda::set_indexer_logits_blocks(nb);
    const double alone = time_graph(copies, reps, logits_alone), both = time_graph(copies, reps, logits_step);
    std::printf("  %d blocks per row group: logits kernel alone %.2f us, + rotation, top-2048 %.2f us\n", nb, alone,
                both);
  }
  dsi::cuda::set_indexer_logits_blocks(0);
  char tname[96];
  std::snprintf(tname, sizeof(tname), "indexer keys=%lld rows=%dx%d", (long long)n_keys, n_seqs, rows_per_seq);
  report_torch(tname, t_both);
  for (void* ptr : {(void*)pool, (void*)dtable, (void*)q, (void*)w, (void*)q8, (void*)q8b, (void*)wq, (void*)logits,
                    (void*)idx, (void*)bad, (void*)base.row_seq, (void*)base.bounds, (void*)rq_prep.positions,
                    (void*)rq_prep.inv_freq})
    DSI_CUDA_CHECK(cudaFree(ptr));
}

// The fp8 MLA pool shared by the sparse MLA cases: 2^20 entries (656 MB) by default, random latents.
// sorted: each row's indices in ascending slot order (the same set: attention does not depend on the
// order), so a split's keys share few pages (measures the cost of address-translation misses).
struct MlaPool {
  int64_t n_slots = int64_t(1) << 20;
  uint8_t* pool = nullptr;
  bool sorted = false;
};

MlaPool make_mla_pool(int64_t n_slots) {
  MlaPool mp;
  mp.n_slots = std::max<int64_t>(n_slots, 65536);
  const int64_t chunk = 65536, dk = 576;
  mp.pool = dalloc<uint8_t>(size_t(mp.n_slots * dsi::ops::kMlaFp8Bytes));
  float* kv = dalloc<float>(size_t(chunk * dk));
  int32_t* slots = dalloc<int32_t>(size_t(chunk));
  unsigned long long* bad = dalloc<unsigned long long>(1);
  std::vector<int32_t> sl(static_cast<size_t>(chunk));
  for (int64_t c0 = 0; c0 < mp.n_slots; c0 += chunk) {
    fill_f32<<<1024, 256>>>(kv, chunk * dk, uint32_t(100 + c0 / chunk));
    DSI_CUDA_CHECK(cudaGetLastError());
    for (int64_t i = 0; i < chunk; ++i) sl[size_t(i)] = int32_t(c0 + i);
    DSI_CUDA_CHECK(cudaMemcpy(slots, sl.data(), sl.size() * 4, cudaMemcpyHostToDevice));
    dsi::cuda::MlaStoreFp8Params st{};
    st.rows = kv;
    st.slots = slots;
    st.pool = mp.pool;
    st.row_stride = dk;
    st.m = chunk;
    st.n_slots = mp.n_slots;
    st.bad = bad;
    dsi::cuda::launch_mla_store_fp8(st, nullptr);
  }
  DSI_CUDA_CHECK(cudaDeviceSynchronize());
  for (void* ptr : {(void*)kv, (void*)slots, (void*)bad}) DSI_CUDA_CHECK(cudaFree(ptr));
  return mp;
}

int sm_count() {
  int dev = 0, n = 0;
  DSI_CUDA_CHECK(cudaGetDevice(&dev));
  DSI_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
  return n;
}

// The phase marks of the last call (us after the first split CTA's entry): min / median / max over
// the CTAs of each kernel.
void print_trace(const unsigned long long* dtrace, int64_t split_ctas, int64_t combine_ctas) {
  constexpr int S = dsi::cuda::kSparseMlaTraceSlots;
  std::vector<unsigned long long> t(size_t((split_ctas + combine_ctas) * S));
  DSI_CUDA_CHECK(cudaMemcpy(t.data(), dtrace, t.size() * sizeof(t[0]), cudaMemcpyDeviceToHost));
  unsigned long long t0 = ~0ull;
  for (int64_t b = 0; b < split_ctas; ++b) t0 = std::min(t0, t[size_t(b * S)]);
  auto line = [&](const char* what, int64_t first, int64_t n, int mark) {
    std::vector<double> v;
    for (int64_t b = first; b < first + n; ++b)
      if (t[size_t(b * S + mark)] != 0) v.push_back(double(int64_t(t[size_t(b * S + mark)] - t0)) * 1e-3);
    if (v.empty()) return;  // a mark no CTA reached (tile 1 of one-tile splits)
    std::sort(v.begin(), v.end());
    std::printf("    %-34s %7.2f %7.2f %7.2f us\n", what, v.front(), v[v.size() / 2], v.back());
  };
  static const char* split_marks[] = {"entry",           "past the wait",     "indices staged", "tile 0 landed",
                                      "tile 0 unpacked", "tile 0 scores",     "tile 0 softmax", "tile 0 P.V",
                                      "done",            "tile 1 landed",     "tile 1 unpacked", "tile 1 scores",
                                      "tile 1 softmax",  "tile 1 P.V"};
  static const char* combine_marks[] = {"combine: entry", "combine: past the wait", "combine: weights", "combine: done"};
  std::printf("    trace of the last call (us after the first CTA's entry: min, median, max over CTAs)\n");
  for (int m = 0; m < 14; ++m) line(split_marks[m], 0, split_ctas, m);
  for (int m = 0; m < 4 && combine_ctas > 0; ++m) line(combine_marks[m], split_ctas, combine_ctas, m);
}

// Sparse MLA decode, `rows` rows of `heads` heads over top-`topk` keys. The figure of merit is the
// byte floor (entries + indices + q + out + lse at 4.3 TB/s); the FLOPs are the scores (576 dims)
// and the output (512) per head and key, at ~790 TFLOP/s bf16 dense.
void bench_sparse_mla(const MlaPool& mp, int64_t rows, int heads, int64_t topk, int reps, bool sweep,
                      bool baseline) {
  const int64_t dk = 576;
  // Enough index sets that the entries they touch (rows * topk * 656 B each) exceed 2 x L2.
  const int copies = int(std::clamp<int64_t>(
      (int64_t(120) << 20) / (rows * topk * dsi::ops::kMlaFp8Bytes) + 1, 2, 128));
  // (A pool smaller than the L2 keeps the entries L2-resident whatever the copies: a latency figure.)
  std::mt19937_64 rng(5);
  std::vector<int32_t> idx(static_cast<size_t>(copies * rows * topk));
  for (auto& v : idx) v = int32_t(rng() % uint64_t(mp.n_slots));
  if (mp.sorted)
    for (size_t r = 0; r + size_t(topk) <= idx.size(); r += size_t(topk))
      std::sort(idx.begin() + std::ptrdiff_t(r), idx.begin() + std::ptrdiff_t(r + size_t(topk)));
  int32_t* didx = upload(idx);
  unsigned long long* bad = dalloc<unsigned long long>(1);
  DSI_CUDA_CHECK(cudaMemset(bad, 0xff, sizeof(unsigned long long)));
  dsi::cuda::SparseMlaDecodeParams p{};
  p.q = random_f32(rows * heads * dk, 6);
  p.pool = mp.pool;
  p.out = dalloc<float>(size_t(rows * heads * 512));
  p.lse = dalloc<float>(size_t(rows * heads));
  p.q_s0 = heads * dk;
  p.q_s1 = dk;
  p.rows = rows;
  p.heads = heads;
  p.n_slots = mp.n_slots;
  p.topk = topk;
  p.softmax_scale = 1.0f / std::sqrt(float(dk));
  p.bad = bad;
  const double bytes = double(rows) * (double(topk) * (dsi::ops::kMlaFp8Bytes + 4) +
                                       heads * (dk + 512 + 1) * 4.0);
  const double flops = 2.0 * double(rows) * heads * topk * (dk + 512);
  const int sms = sm_count();
  // settled: the launches read the indices and start the gather before their programmatic wait
  // (valid here: the kernel before each call is the previous call's combine, which writes neither).
  auto run_plan = [&](const dsi::cuda::SparseMlaDecodePlan& plan, const char* tag, bool settled = false,
                      bool trace = false) {
    void* ws = nullptr;
    if (plan.workspace_bytes > 0) DSI_CUDA_CHECK(cudaMalloc(&ws, plan.workspace_bytes));
    const int64_t split_ctas = rows * plan.head_groups * plan.n_splits;
    const int64_t trace_ctas = split_ctas + (plan.n_splits > 1 ? rows * heads : 0);
    const size_t trace_n = size_t(trace_ctas * dsi::cuda::kSparseMlaTraceSlots);
    unsigned long long* tr = trace ? dalloc<unsigned long long>(trace_n) : nullptr;
    if (tr != nullptr) DSI_CUDA_CHECK(cudaMemset(tr, 0, trace_n * sizeof(unsigned long long)));
    const double us = time_graph(copies, reps, [&](int c, cudaStream_t st) {
      dsi::cuda::SparseMlaDecodeParams pc = p;
      pc.indices = didx + int64_t(c) * rows * topk;
      pc.workspace = ws;
      pc.settled = settled;
      pc.trace = tr;
      dsi::cuda::launch_sparse_mla_decode(pc, plan, st);
    });
    if (ws != nullptr) DSI_CUDA_CHECK(cudaFree(ws));
    if (tr != nullptr) {
      print_trace(tr, split_ctas, trace_ctas - split_ctas);
      DSI_CUDA_CHECK(cudaFree(tr));
    }
    char name[160];
    std::snprintf(name, sizeof(name), "%ssparse_mla_fp8 topk=%lld heads=%d rows=%lld", tag, (long long)topk,
                  heads, (long long)rows);
    report(name, us, bytes);
    if (tag[0] == '\0') {
      char tname[96];
      std::snprintf(tname, sizeof(tname), "sparse_mla heads=%d rows=%lld", heads, (long long)rows);
      report_torch(tname, us);
    }
    std::printf("%-52s %10.1f TFLOP/s (%.1f %% of 790), %d heads/CTA x %d splits x %d tiles = %lld CTAs\n",
                "", flops / (us * 1e-6) / 1e12, 100.0 * flops / (us * 1e-6) / 790e12, 16 * plan.m_tiles,
                plan.n_splits, plan.tiles_per_split,
                (long long)(rows * plan.head_groups * plan.n_splits));
  };
  run_plan(dsi::cuda::plan_sparse_mla_decode(rows, heads, topk, sms), "", false, g_trace);
  run_plan(dsi::cuda::plan_sparse_mla_decode(rows, heads, topk, sms), "  settled ", true, g_trace);
  if (sweep) {
    for (int mt : {1, 2, 4})
      for (int splits : {1, 2, 4, 8, 16, 32}) {
        const auto plan = dsi::cuda::plan_sparse_mla_decode(rows, heads, topk, sms, mt, splits);
        if (plan.n_splits != splits) continue;  // rounded to another tiling: already listed
        run_plan(plan, "  sweep ", false, g_trace);
        run_plan(plan, "  sweep settled ", true, g_trace);
      }
  }
  if (baseline) {  // the previous kernel (one block per row and 16 heads, no split), for reference
    const dsi::cuda::SparseMlaFp8Params o = p;  // the same operands, without the workspace
    const double us = time_graph(copies, 3, [&](int c, cudaStream_t st) {
      dsi::cuda::SparseMlaFp8Params oc = o;
      oc.indices = didx + int64_t(c) * rows * topk;
      dsi::cuda::launch_sparse_mla_fp8(oc, st);
    });
    char name[160];
    std::snprintf(name, sizeof(name), "  previous kernel topk=%lld heads=%d rows=%lld", (long long)topk,
                  heads, (long long)rows);
    report(name, us, bytes);
  }
  unsigned long long b = 0;
  DSI_CUDA_CHECK(cudaMemcpy(&b, bad, sizeof(b), cudaMemcpyDeviceToHost));
  if (b != ~0ull) std::printf("  (error flag set: %llu)\n", b);
  for (void* ptr : {(void*)bad, (void*)p.q, (void*)didx, (void*)p.out, (void*)p.lse}) DSI_CUDA_CHECK(cudaFree(ptr));
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 20;
  bool sweep = false, only_mla = false, only_indexer = false, sorted = false;
  int64_t pool_slots = int64_t(1) << 20, only_keys = 0;
  std::vector<int> head_counts = {32, 64}, block_sweep;  // heads: GLM-5's, then DeepSeek-V3.2's
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else if (std::strcmp(argv[i], "--sweep") == 0) {
      sweep = true;
    } else if (std::strcmp(argv[i], "--only-mla") == 0) {
      only_mla = true;
    } else if (std::strcmp(argv[i], "--only-indexer") == 0) {
      only_indexer = true;
    } else if (std::strcmp(argv[i], "--keys") == 0 && i + 1 < argc) {
      only_keys = std::atoll(argv[++i]);
    } else if (std::strcmp(argv[i], "--heads") == 0 && i + 1 < argc) {
      head_counts = int_list(argv[++i]);
    } else if (std::strcmp(argv[i], "--idx-blocks") == 0 && i + 1 < argc) {
      block_sweep = int_list(argv[++i]);
    } else if (std::strcmp(argv[i], "--torch") == 0 && i + 1 < argc) {
      std::ifstream f(argv[++i]);
      if (!f) {
        std::fprintf(stderr, "bench_kv_fp8: cannot open %s\n", argv[i]);
        return 2;
      }
      g_torch = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
      if (g_torch.is_discarded() || !g_torch.is_object()) {
        std::fprintf(stderr, "bench_kv_fp8: %s is not a JSON object of case timings\n", argv[i]);
        return 2;
      }
    } else if (std::strcmp(argv[i], "--trace") == 0) {
      g_trace = true;
    } else if (std::strcmp(argv[i], "--sorted") == 0) {
      sorted = true;
    } else if (std::strcmp(argv[i], "--pool-slots") == 0 && i + 1 < argc) {
      pool_slots = std::atoll(argv[++i]);
    } else {
      std::fprintf(stderr,
                   "usage: bench_kv_fp8 [--reps N] [--sweep] [--only-mla] [--only-indexer] [--keys N] [--heads A,B] "
                   "[--idx-blocks A,B] [--sorted] [--pool-slots N] [--trace] [--torch FILE]\n");
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
      if (only_mla) break;
      if (only_keys > 0 && keys != only_keys) continue;
      for (int heads : head_counts) {
        bench_indexer(keys, 1, 1, heads, reps, block_sweep);
        bench_indexer(keys, 4, 4, heads, reps, block_sweep);
      }
    }
    if (only_indexer) return 0;
    MlaPool mp = make_mla_pool(pool_slots);
    mp.sorted = sorted;
    std::printf("sparse MLA: pool of %lld entries (%.0f MB), %s indices\n", (long long)mp.n_slots,
                mp.n_slots * 656.0 / 1e6, sorted ? "per-row sorted" : "random");
    bench_sparse_mla(mp, 1, 64, 2048, reps, sweep, !only_mla);
    bench_sparse_mla(mp, 1, 8, 2048, reps, sweep, false);
    bench_sparse_mla(mp, 4, 64, 2048, reps, sweep, false);  // one request's MTP-3 verification rows
    bench_sparse_mla(mp, 16, 64, 2048, reps, sweep, false);
    bench_sparse_mla(mp, 1, 128, 2048, reps, sweep, false);
    DSI_CUDA_CHECK(cudaFree(mp.pool));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
