// Exact top-k (k <= 2048) by radix select, one thread-block cluster per row (sm_90 distributed
// shared memory), in dsinfer's total order (score descending, then position ascending). The result
// is the selected set listed by ascending position (ops/topk.h):
//   1. every CTA of the cluster reads its contiguous chunk of the row, caches the scores' bits in
//      shared memory and builds a histogram of the top 12 bits of their order keys (the float's
//      bits made unsigned-monotone, -0 folded onto +0, 0 = not selectable);
//   2. the CTAs add their counts into one cluster-wide histogram cut into slices, each CTA owning
//      one or two of them, and their sums over each slice into every CTA's slice totals (DSMEM);
//      past one all-to-all wait all find the same slice, then the same bin holding the k-th key,
//      and how many keys it holds;
//   3. when CTA 0 has room for them (the usual case), every CTA sends it the keys of that bin (the
//      candidates, tagged with the sender) and its count above the bin; CTA 0 alone runs the two
//      remaining digit passes (12 and 8 bits) over the candidates with block barriers, finds the
//      exact threshold key T and every CTA's share of the winners, and sends each its place. Else
//      the two passes run cluster-wide over the cached keys, and the CTAs exchange their counts of
//      keys > T and == T;
//   4. each CTA writes its winners (every key > T and the lowest positions among the keys == T)
//      straight to the output in position order (an ordered block scan over its chunk). Bitwise
//      the CPU reference's selection.
// One pass over the row, three digits, one gather; no sort; one launch, capturable in a graph.
//
// Rows of at most 12K scores (a decode row up to 12K keys per rank, e.g. 48K at DCP 4) skip the
// cluster: sm90_topk_select_cta.cu runs each on one CTA of 1024 threads (the cluster's exchanges,
// not its reads, set its time at these sizes). DSI_TOPK_CTA=0 keeps every row on the cluster
// kernel, for comparisons. What both kernels share is in select_common.cuh.
#include <cooperative_groups.h>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include <algorithm>
#include <array>
#include <atomic>
#include <climits>
#include <cstdint>

#include "backends/cuda/common.cuh"
#include "backends/cuda/ptx.cuh"
#include "backends/cuda/topk/select_common.cuh"
#include "backends/cuda/topk/topk.h"

namespace dsi::cuda {

namespace {

namespace cg = cooperative_groups;
using namespace topk_select;

constexpr int kSelThreads = 512;
constexpr int kBins = 4096;                       // 12-bit digits (passes 1 and 2), 8 bits last
constexpr int kMaxCluster = 16;                   // non-portable cluster size (Hopper allows 16): any width
                                                  // from 1 to 16 CTAs per row
static_assert(kTopkTraceRanks == kMaxCluster);
constexpr int64_t kCacheMax = 32768;              // scores per CTA kept in shared memory
constexpr int kGatherItems = 8;                   // consecutive keys per thread in the gather pass
constexpr int64_t kCandMax = 16384;               // candidates CTA 0 refines alone (64 KiB)

using Scan = cub::BlockScan<uint32_t, kSelThreads>;
using Reduce = cub::BlockReduce<uint32_t, kSelThreads>;
using ReduceU64 = cub::BlockReduce<unsigned long long, kSelThreads>;

union Temp {
  typename Scan::TempStorage scan;
  typename Reduce::TempStorage reduce;
  typename ReduceU64::TempStorage reduce64;
};

struct Pick {
  uint32_t bin, above, total, count;  // count: the keys in `bin`, cluster-wide
};

// The cluster-wide histograms are cut into `slices_of(C)` slices of equal width (a power of two
// >= C, so a bin's slice and its place in it are a shift and a mask); slice j belongs to CTA j % C,
// the first C at offset 0 of their `merged` arrays and the rest (j >= C: fewer than C of them)
// after it. Rows are cut into chunks of a multiple of 16 scores (16-byte loads stay aligned).
__host__ __device__ constexpr int slices_of(int ctas) {
  int s = 1;
  while (s < ctas) s *= 2;
  return s;
}
__host__ __device__ constexpr int64_t chunk_of(int64_t n, int ctas) { return ((n + ctas - 1) / ctas + 15) / 16 * 16; }
// Dynamic shared memory (words): the local histograms of the three digits (pass 3 reuses the first),
// this CTA's slices of the cluster-wide histograms, then the cached scores.
__host__ __device__ constexpr int64_t merged_words(int ctas) {
  const int ns = slices_of(ctas), owned = (ns + ctas - 1) / ctas;  // slices a CTA owns, at most
  return owned * (2 * (kBins / ns) + 256 / ns);
}
constexpr size_t dynamic_smem(int ctas, int64_t cache_entries) {
  return sizeof(uint32_t) * size_t(2 * kBins + merged_words(ctas) + cache_entries);
}

// TopkSelectParams::trace: thread 0 of this CTA writes %globaltimer as `mark`.
__device__ __forceinline__ void trace_mark(unsigned long long* trace, int mark) {
  trace_at(trace, int64_t(blockIdx.y), int(blockIdx.x), mark);
}

// The split cluster barrier: arrive, then wait before the first access that needs every CTA past
// the arrive (the work in between overlaps the barrier).
__device__ __forceinline__ void cluster_arrive() { asm volatile("barrier.cluster.arrive.release.aligned;\n" ::); }
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::); }

// Cross-CTA traffic of the cluster, written by the other CTAs.
struct Mailbox {
  uint32_t totals[3][kMaxCluster];  // per pick level and slice: the sum of that slice of the merged histogram
  uint32_t counts[kMaxCluster][2];  // per CTA: its keys > T and == T (candidates: [0] = above bin 1)
  uint32_t n_cand;                  // CTA 0: candidates pushed so far
  uint32_t place[4];                // from CTA 0 (candidates): T, winners before, keys == T taken, keys > T
};

// Finds the bin of the cluster-wide histogram (this CTA holds `hist`, NB bins of its own keys) at
// which the count from the top reaches `need` (first level: min(k, total)); the cluster-wide count
// above it and the total. Every CTA gets the same answer. The histogram is cut into slices_of(C)
// slices of S bins (slice j at CTA j % C, `merged` + (j / C) * S): every CTA adds its counts into
// the slices' owners, and its sums over each slice j into every CTA's mail.totals[level][j] (both
// zero on entry), then arrives at every CTA's `bar` (a fresh shared-memory barrier expecting C
// arrivals). Past its own, every CTA knows every slice's total, so the slice holding the k-th key,
// and reads that slice from its owner to find the bin (the owner
// leaves it alone, and stays, until every CTA has passed a later wait). Sending the totals after a
// cluster barrier and the bin from the owner after another took 1.2 us more at 128K keys, and a
// cluster barrier instead of the barriers' arrivals about 0.1 us more. Block-synchronising; the
// caller has passed the cluster barrier after which the others may add into this CTA's slices.
template <int NB, bool kPow2>
__device__ Pick cluster_pick(const cg::cluster_group& cluster, const uint32_t* hist, uint32_t* merged,
                             Mailbox& mail, uint64_t* bar, int level, uint32_t need_or_k, bool first,
                             Temp& temp, unsigned long long* trace) {
  __shared__ uint32_t s_need, s_total, s_above, s_fbin, s_fabove, s_fcount;
  __shared__ int s_cross;  // the slice holding the k-th key (-1: none)
  const int tid = threadIdx.x, lane = tid & 31;
  const unsigned n_ctas = cluster.num_blocks(), n_slices = kPow2 ? n_ctas : unsigned(slices_of(int(n_ctas)));
  const int S = NB / int(n_slices);  // a power of two: n_slices is one <= 16 and divides NB
  // A bin's slice and its place in it by shift and mask (a run-time division and remainder cost an
  // integer-division sequence per bin); slice j < 2C: its owner and offset by one comparison.
  const unsigned s_shift = unsigned(__ffs(S) - 1), s_mask = unsigned(S) - 1u;
  auto slice_at = [&](unsigned j) -> uint32_t* {  // slice j at its owner (merged: this CTA's)
    if constexpr (kPow2) {
      return cluster.map_shared_rank(merged, j);  // one slice a CTA
    } else {
      const bool second = j >= n_ctas;
      return cluster.map_shared_rank(merged + (second ? S : 0), second ? j - n_ctas : j);
    }
  };
  __syncthreads();  // this CTA's histogram is complete
  for (int b = tid; b < NB; b += kSelThreads) {
    const uint32_t c = hist[b];
    if (c != 0u) atomicAdd(slice_at(unsigned(b) >> s_shift) + (unsigned(b) & s_mask), c);
  }
  // This CTA's count over each slice: thread t sums bins [8t, 8t + 8) (one slice: S >= 16), the
  // lanes of one slice add theirs, and the slice's first lane (lane j < C of a warp-wide slice)
  // adds the sum into the slice's total at every CTA.
  uint32_t* totals = mail.totals[level];
  constexpr int kSum = 8;
  if (tid * kSum < NB) {  // warp-uniform: NB / 8 is a multiple of 32
    const uint4 x = *reinterpret_cast<const uint4*>(hist + tid * kSum);
    const uint4 y = *reinterpret_cast<const uint4*>(hist + tid * kSum + 4);
    uint32_t part = x.x + x.y + x.z + x.w + y.x + y.y + y.z + y.w;
    const int L = min(32, S / kSum);  // lanes per slice
    for (int o = 1; o < L; o <<= 1) part += __shfl_xor_sync(0xffffffffu, part, o);
    const unsigned slice = unsigned(tid * kSum) >> s_shift;
    if (L == 32) {
      if (unsigned(lane) < n_ctas && part != 0u) atomicAdd(cluster.map_shared_rank(totals + slice, unsigned(lane)), part);
    } else if ((lane & (L - 1)) == 0 && part != 0u) {
      for (unsigned q = 0; q < n_ctas; ++q) atomicAdd(cluster.map_shared_rank(totals + slice, q), part);
    }
  }
  // Every CTA arrives at every CTA's `bar` (n_ctas arrivals, fresh) once its pushes are out.
  __syncthreads();
  if (tid < int(n_ctas)) mbarrier_arrive_remote(bar, unsigned(tid));
  trace_mark(trace, 3);
  mbarrier_wait_cluster(bar, 0u);  // every count is in its slice, every slice total at every CTA
  trace_mark(trace, 4);
  if (tid < 32) {  // lane q: slice q, the bins above it are in the higher slices
    const unsigned q = unsigned(tid);
    const uint32_t t = q < n_slices ? totals[q] : 0u;
    uint32_t total = 0, above = 0;
#pragma unroll
    for (int j = 0; j < kMaxCluster; ++j) {
      const uint32_t tj = __shfl_sync(0xffffffffu, t, j);
      total += tj;
      if (unsigned(j) > q) above += tj;
    }
    const uint32_t need = first ? min(need_or_k, total) : need_or_k;
    if (q == 0) {
      s_cross = -1;
      s_need = need;
      s_total = total;
    }
    __syncwarp();
    if (q < n_slices && need > 0 && above < need && above + t >= need) {  // exactly one lane
      s_cross = int(q);
      s_above = above;
    }
  }
  __syncthreads();
  const int cross = s_cross;
  if (cross >= 0) {  // block-uniform
    const uint32_t* slice = slice_at(unsigned(cross));
    constexpr int kPer = NB >= kSelThreads ? NB / kSelThreads : 1;
    const int per = (S + kSelThreads - 1) / kSelThreads;  // <= kPer
    uint32_t cnt[kPer], sum = 0;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {  // thread t owns slice bins S-1-t*per-i: descending order
      const int j = S - 1 - tid * per - i;
      cnt[i] = i < per && j >= 0 ? slice[j] : 0u;
      sum += cnt[i];
    }
    uint32_t before = 0;
    Scan(temp.scan).ExclusiveSum(sum, before);
    const uint32_t need = s_need - s_above;
    uint32_t acc = before;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      if (acc < need && acc + cnt[i] >= need) {  // exactly one (thread, i) crosses
        s_fbin = uint32_t(cross * S + S - 1 - tid * per - i);
        s_fabove = s_above + acc;
        s_fcount = cnt[i];
      }
      acc += cnt[i];
    }
    __syncthreads();
  }
  Pick r;
  r.total = s_total;
  r.bin = cross < 0 ? 0u : s_fbin;
  r.above = cross < 0 ? 0u : s_fabove;
  r.count = cross < 0 ? 0u : s_fcount;
  return r;
}

// hist[digit(key)] += 1 for the selectable keys among the cached scores whose key passes `in_bin`,
// four cached scores per thread per step (one 16-byte shared load).
template <typename InBin, typename Digit>
__device__ __forceinline__ void histogram_pass(const uint32_t* cache, int64_t len, uint32_t* hist, InBin in_bin,
                                               Digit digit) {
  const int64_t n4 = len / 4;
  const uint4* c4 = reinterpret_cast<const uint4*>(cache);
  for (int64_t i = threadIdx.x; i < n4; i += kSelThreads) {
    const uint4 w = c4[i];
    const uint32_t b[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const uint32_t o = order_key(__uint_as_float(b[u]));
      count_if(hist, digit(o), o != 0u && in_bin(o));
    }
  }
  for (int64_t i = 4 * n4 + threadIdx.x; i < len; i += kSelThreads) {
    const uint32_t o = order_key(__uint_as_float(cache[i]));
    count_if(hist, digit(o), o != 0u && in_bin(o));
  }
}

// Where CTA `who`'s winners go in the position-ordered output: the winners of the CTAs before it,
// and how many of its keys == T it takes (the lowest CTAs' first, take_eq in all). Lane q of a full
// warp holds CTA q's keys > T (gt) and == T (eq), 0 past the cluster; every lane gets the answer.
struct Place {
  uint32_t before, take;
};
__device__ __forceinline__ Place place_of(uint32_t gt, uint32_t eq, uint32_t take_eq, unsigned who) {
  Place pl{0u, 0u};
  uint32_t eq_before = 0;
#pragma unroll
  for (int j = 0; j < kMaxCluster; ++j) {  // serial in j, every lane the same: 32 shuffles
    const uint32_t gj = __shfl_sync(0xffffffffu, gt, j), ej = __shfl_sync(0xffffffffu, eq, j);
    const uint32_t t = min(ej, take_eq - min(take_eq, eq_before));
    if (unsigned(j) == who) pl.take = t;
    if (unsigned(j) < who) pl.before += gj + t;
    eq_before += ej;
  }
  return pl;
}

// The bin of hist[0, nb) (larger bins = larger keys) at which the count from the top reaches `need`
// (first pass: min(k, total)), the count above it, and the total, found by one block of kThreads
// (each owns up to kMaxPer bins, descending). The same on every thread; block-synchronising.
template <int kThreads, int kMaxPer>
__device__ BlockPick block_pick(const uint32_t* hist, int nb, uint32_t need_or_k, bool first,
                                typename cub::BlockScan<uint32_t, kThreads>::TempStorage& tmp) {
  __shared__ uint32_t s_bin, s_above, s_count;
  const int tid = threadIdx.x, per = max(1, nb / kThreads);  // per <= kMaxPer
  uint32_t c[kMaxPer], sum = 0, before = 0, total = 0;
#pragma unroll
  for (int i = 0; i < kMaxPer; ++i) {
    const int j = nb - 1 - tid * per - i;
    c[i] = i < per && j >= 0 ? hist[j] : 0u;
    sum += c[i];
  }
  __syncthreads();  // s_bin / s_above of the previous pick are read
  if (tid == 0) s_bin = s_above = s_count = 0;
  cub::BlockScan<uint32_t, kThreads>(tmp).ExclusiveSum(sum, before, total);
  const uint32_t need = first ? min(need_or_k, total) : need_or_k;
  publish_crossing(c, per, nb, before, need, s_bin, s_above, s_count);
  __syncthreads();
  return BlockPick{s_bin, s_above, total, s_count};
}

// kPow2: the cluster's width is a power of two (one slice a CTA; the code of the one-row launch,
// 16 CTAs, stays that of a kernel without the other widths).
template <bool kCached, bool kPow2>
__global__ void __launch_bounds__(kSelThreads, 1) topk_select_kernel(TopkSelectParams p, int cand_cap) {
  trace_mark(p.trace, 0);
  pdl_enter();
  trace_mark(p.trace, 1);
  extern __shared__ __align__(16) uint32_t dyn[];
  __shared__ Temp temp;
  __shared__ Mailbox mail;
  __shared__ uint32_t s_place[2];  // winners in lower CTAs, keys == T this CTA takes
  // Candidates: [0] (CTA 0) every CTA's candidates and count are in; [1] this CTA's place is in.
  // [2 + l]: every CTA's counts of pick level l are in.
  __shared__ __align__(8) uint64_t s_bars[5];

  const cg::cluster_group cluster = cg::this_cluster();
  const unsigned crank = cluster.block_rank(), n_ctas = cluster.num_blocks();
  uint32_t* hist0 = dyn;                         // [4096] pass 1, then [256] pass 3
  uint32_t* hist1 = dyn + kBins;                 // [4096] pass 2
  // This CTA's slices of the cluster's histograms: passes 1, 2 (4096 / slices_of(C) bins a slice)
  // and 3 (256 / slices_of(C)), one or two slices each.
  const int n_slices = kPow2 ? int(n_ctas) : slices_of(int(n_ctas));
  const int owned = (n_slices + int(n_ctas) - 1) / int(n_ctas);
  uint32_t* merged0 = dyn + 2 * kBins;
  uint32_t* merged1 = merged0 + owned * (kBins / n_slices);
  uint32_t* merged2 = merged1 + owned * (kBins / n_slices);
  uint32_t* cache = dyn + 2 * kBins + merged_words(int(n_ctas));  // [chunk] scores' bits (kCached)
  const int tid = threadIdx.x;
  const int64_t row = blockIdx.y;
  const float* srow = p.scores + row * p.score_stride;
  const int64_t bound = p.bounds[row];
  if (crank == 0 && tid == 0) check_bound(p, row, bound);
  const int64_t chunk = chunk_of(p.n, int(n_ctas));
  const int64_t lo = std::min<int64_t>(p.n, int64_t(crank) * chunk);
  const int64_t len = std::min<int64_t>(p.n, lo + chunk) - lo;
  uint32_t* cand = cache + (kCached ? chunk : 0);  // [cand_cap] CTA 0: the candidates of bin 1
  // The score bits at chunk index i (-inf bits at or past the bound).
  auto bits_at = [&](int64_t i) -> uint32_t {
    if constexpr (kCached) {
      return cache[i];
    } else {
      const int64_t pos = lo + i;
      return pos < bound ? __float_as_uint(srow[pos]) : kNoKeyBits;
    }
  };

  for (int64_t i = tid; i < 2 * kBins + merged_words(int(n_ctas)); i += kSelThreads) dyn[i] = 0;
  if (tid == 0) {
    mail.n_cand = 0;
    mbarrier_init(&s_bars[0], n_ctas);
    mbarrier_init(&s_bars[1], 1);
    for (int l = 2; l < 5; ++l) mbarrier_init(&s_bars[l], n_ctas);
    fence_barrier_init();
  }
  if (tid < 3 * kMaxCluster) mail.totals[tid / kMaxCluster][tid % kMaxCluster] = 0;
  __syncthreads();
  cluster_arrive();  // this CTA's slices are zero: the others may add into them after the wait
  // Pass 1: scores (cached), histogram of bits 31..20 of the selectable keys.
  // Where the chunk is 16-byte aligned: 4 loads of 4 scores per thread in flight (8K scores a round).
  const int64_t n4 = (reinterpret_cast<uintptr_t>(srow + lo) & 15u) == 0 ? len / 4 : 0;  // block-uniform
  for (int64_t base = 0; base < n4; base += int64_t(kSelThreads) * 4) {
    uint4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int64_t i4 = base + int64_t(u) * kSelThreads + tid;
      if (i4 < n4) v[u] = reinterpret_cast<const uint4*>(srow + lo)[i4];
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int64_t i4 = base + int64_t(u) * kSelThreads + tid;
      if (i4 >= n4) continue;
      uint32_t w[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if (lo + 4 * i4 + e >= bound) w[e] = kNoKeyBits;
        const uint32_t o = order_key(__uint_as_float(w[e]));
        count_if(hist0, o >> 20, o != 0u);
      }
      if constexpr (kCached) *reinterpret_cast<uint4*>(cache + 4 * i4) = make_uint4(w[0], w[1], w[2], w[3]);
    }
  }
  // Else, and the tail: 8 loads of one score per thread in flight before their keys are binned.
  constexpr int kLoads = 8;
  for (int64_t base = 4 * n4; base < len; base += int64_t(kSelThreads) * kLoads) {
    uint32_t v[kLoads];
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const int64_t i = base + int64_t(u) * kSelThreads + tid;
      v[u] = i < len && lo + i < bound ? __float_as_uint(srow[lo + i]) : kNoKeyBits;
    }
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const int64_t i = base + int64_t(u) * kSelThreads + tid;
      if (i >= len) continue;
      if constexpr (kCached) cache[i] = v[u];
      const uint32_t o = order_key(__uint_as_float(v[u]));
      count_if(hist0, o >> 20, o != 0u);
    }
  }
  trace_mark(p.trace, 2);
  cluster_wait();
  Pick pick = cluster_pick<kBins, kPow2>(cluster, hist0, merged0, mail, &s_bars[2], 0, uint32_t(p.k), true, temp, p.trace);
  trace_mark(p.trace, 5);
  const uint32_t kk = min(uint32_t(p.k), pick.total);  // winners: min(k, selectable keys)
  int32_t* out_idx = p.indices + row * p.k;
  float* out_val = p.values != nullptr ? p.values + row * p.k : nullptr;
  if (crank == 0)  // the padding after the winners
    for (int j = int(kk) + tid; j < p.k; j += kSelThreads) {
      out_idx[j] = -1;
      if (out_val != nullptr) out_val[j] = -INFINITY;
    }
  if (kk == 0) return;  // no CTA touches another's shared memory any more
  const uint32_t b1 = pick.bin;
  uint32_t thr, win_before, my_take, my_gt;  // the k-th key; this CTA's place in the winner list
  if (pick.count <= uint32_t(cand_cap)) {
    // Candidates: every CTA sends CTA 0 the keys of bin b1 (tagged with its rank) and its count of
    // keys above b1; CTA 0 alone finds the k-th key among the candidates (two digit passes with
    // block barriers), then every CTA's share of the winners, and sends each its place.
    // Each CTA gathers its candidates in its own `cand` (any order), then copies them to the top of
    // CTA 0's, below those already there (one remote atomic per CTA); CTA 0's own stay at the bottom.
    __shared__ uint32_t s_local, s_base;
    if (tid == 0) s_local = 0;
    __syncthreads();
    const int lane = tid & 31;
    uint32_t gt1 = 0;
    for (int64_t base = 0; base < len; base += 4 * kSelThreads) {  // 4 consecutive keys per thread
      const int64_t i0 = base + 4 * int64_t(tid);
      uint32_t o[4];
      if (kCached && i0 + 3 < len) {
        const uint4 w = *reinterpret_cast<const uint4*>(cache + i0);  // i0 % 4 == 0: aligned
        o[0] = w.x, o[1] = w.y, o[2] = w.z, o[3] = w.w;
      } else {
#pragma unroll
        for (int u = 0; u < 4; ++u) o[u] = i0 + u < len ? bits_at(i0 + u) : kNoKeyBits;
      }
      // The warp's candidates of each of the 4 steps by ballot; their slots: the steps before,
      // then the lanes before.
      uint32_t mask[4], warp_total = 0;
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        o[u] = order_key(__uint_as_float(o[u]));
        gt1 += (o[u] >> 20) > b1 ? 1u : 0u;  // > b1 >= 0: selectable
        mask[u] = __ballot_sync(0xffffffffu, o[u] != 0u && (o[u] >> 20) == b1);
        warp_total += __popc(mask[u]);
      }
      if (warp_total == 0u) continue;  // warp-uniform
      uint32_t slot = 0;
      if (lane == 0) slot = atomicAdd(&s_local, warp_total);
      slot = __shfl_sync(0xffffffffu, slot, 0);
      const uint32_t below = (1u << lane) - 1u;
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        if (mask[u] >> lane & 1u) cand[slot + __popc(mask[u] & below)] = (crank << 20) | (o[u] & 0xfffffu);
        slot += __popc(mask[u]);
      }
    }
    __syncthreads();
    trace_mark(p.trace, 6);
    const uint32_t n_local = s_local;
    if (crank != 0) {
      if (tid == 0) s_base = atomicAdd(cluster.map_shared_rank(&mail.n_cand, 0u), n_local);
      __syncthreads();
      uint32_t* dst = cluster.map_shared_rank(cand, 0u) + (cand_cap - s_base - n_local);
      for (uint32_t i = tid; i < n_local; i += kSelThreads) dst[i] = cand[i];
    }
    gt1 = Reduce(temp.reduce).Sum(gt1);
    if (tid == 0) *cluster.map_shared_rank(&mail.counts[crank][0], 0u) = gt1;
    __syncthreads();  // this CTA's candidates and count are sent
    if (tid == 0) mbarrier_arrive_remote(&s_bars[0], 0u);
    trace_mark(p.trace, 7);
    if (crank == 0) {
      mbarrier_wait_cluster(&s_bars[0], 0u);  // CTA 0 has every candidate and count
      trace_mark(p.trace, 8);
      __shared__ uint32_t s_cgt[kMaxCluster], s_ceq[kMaxCluster];
      // The candidates: this CTA's in [0, n_local), the others' in [cand_cap - (n_cand - n_local), cand_cap).
      const uint32_t n_cand = pick.count, need = kk - pick.above;
      const uint32_t shift = uint32_t(cand_cap) - n_cand;
      auto cand_at = [&](uint32_t i) { return cand[i < n_local ? i : shift + i]; };
      if (tid < kMaxCluster) s_cgt[tid] = s_ceq[tid] = 0u;
      for (uint32_t i = tid; i < n_cand; i += kSelThreads) atomicAdd(&hist1[(cand_at(i) >> 8) & 0xfffu], 1u);
      __syncthreads();
      trace_mark(p.trace, 9);
      const BlockPick p2 = block_pick<kSelThreads, kBins / kSelThreads>(hist1, kBins, need, false, temp.scan);
      trace_mark(p.trace, 10);
      // The k-th key T, and how many keys == T to take (lowest positions first). Where the second
      // digit's crossing bin holds just the keys still needed (no tie to break), they all win: T is the
      // key below the bin and no key == T is taken, so the third digit is not counted.
      const uint32_t rest = need - p2.above;  // keys of bin p2.bin still needed (>= 1)
      const uint32_t bin24 = (b1 << 20) | (p2.bin << 8);
      uint32_t t_key = bin24 - 1u, take_eq = 0u;
      if (p2.count != rest || bin24 == 0u) {
        for (int i = tid; i < 256; i += kSelThreads) hist0[i] = 0;
        __syncthreads();
        for (uint32_t i = tid; i < n_cand; i += kSelThreads) {
          const uint32_t w = cand_at(i);
          count_if(hist0, w & 0xffu, ((w >> 8) & 0xfffu) == p2.bin);
        }
        __syncthreads();
        const BlockPick p3 = block_pick<kSelThreads, 1>(hist0, 256, rest, false, temp.scan);
        t_key = bin24 | p3.bin;
        take_eq = rest - p3.above;
      }
      trace_mark(p.trace, 11);
      for (uint32_t i = tid; i < n_cand; i += kSelThreads) {
        const uint32_t w = cand_at(i), key = (b1 << 20) | (w & 0xfffffu);
        if (key > t_key) atomicAdd(&s_cgt[w >> 20], 1u);
        else if (key == t_key) atomicAdd(&s_ceq[w >> 20], 1u);
      }
      __syncthreads();
      trace_mark(p.trace, 12);
      if (tid < 32) {  // lane q: CTA q's place
        const unsigned q = unsigned(tid);
        const uint32_t cgt = q < n_ctas ? mail.counts[q][0] + s_cgt[q] : 0u, ceq = q < n_ctas ? s_ceq[q] : 0u;
        const Place place = place_of(cgt, ceq, take_eq, q);
        if (q < n_ctas) {
          uint32_t* pl = cluster.map_shared_rank(mail.place, q);
          pl[0] = t_key;
          pl[1] = place.before;
          pl[2] = place.take;
          pl[3] = cgt;
          mbarrier_arrive_remote(&s_bars[1], q);
        }
      }
      trace_mark(p.trace, 13);
    }
    // Every CTA has ended its remote accesses (to CTA 0; to the crossing slice of the pick) before
    // its arrival at CTA 0, which sends the places only after them all: past this wait no shared
    // memory is touched remotely.
    mbarrier_wait_cluster(&s_bars[1], 0u);
    trace_mark(p.trace, 14);
    thr = mail.place[0];
    win_before = mail.place[1];
    my_take = mail.place[2];
    my_gt = mail.place[3];
  } else {
    uint32_t above = pick.above;
    // Pass 2: bits 19..8 of the keys in bin b1.
    if constexpr (kCached) {
      histogram_pass(cache, len, hist1, [&](uint32_t o) { return (o >> 20) == b1; },
                     [](uint32_t o) { return (o >> 8) & 0xfffu; });
    } else {
      for (int64_t i = tid; i < len; i += kSelThreads) {
        const uint32_t o = order_key(__uint_as_float(bits_at(i)));
        count_if(hist1, (o >> 8) & 0xfffu, o != 0u && (o >> 20) == b1);
      }
    }
    pick = cluster_pick<kBins, kPow2>(cluster, hist1, merged1, mail, &s_bars[3], 1, kk - above, false, temp, nullptr);
    const uint32_t prefix24 = (b1 << 12) | pick.bin;
    above += pick.above;
    // Pass 3: bits 7..0 of the keys with that 24-bit prefix (hist0 is free again: every CTA's pushes
    // from it ended before the last barrier).
    for (int i = tid; i < 256; i += kSelThreads) hist0[i] = 0;
    __syncthreads();
    if constexpr (kCached) {
      histogram_pass(cache, len, hist0, [&](uint32_t o) { return (o >> 8) == prefix24; },
                     [](uint32_t o) { return o & 0xffu; });
    } else {
      for (int64_t i = tid; i < len; i += kSelThreads) {
        const uint32_t o = order_key(__uint_as_float(bits_at(i)));
        count_if(hist0, o & 0xffu, o != 0u && (o >> 8) == prefix24);
      }
    }
    pick = cluster_pick<256, kPow2>(cluster, hist0, merged2, mail, &s_bars[4], 2, kk - above, false, temp, nullptr);
    thr = (prefix24 << 8) | pick.bin;  // the k-th key (>= 1: selectable)
    above += pick.above;
    const uint32_t take_eq = kk - above;  // keys == thr to take, lowest positions first (>= 1)
    // This CTA's keys > thr and == thr (the histograms only hold the keys of the threshold's bins).
    uint32_t gt = 0, eq = 0;
    if constexpr (kCached) {
      const int64_t n4 = len / 4;
      const uint4* c4 = reinterpret_cast<const uint4*>(cache);
      for (int64_t i = tid; i < n4; i += kSelThreads) {
        const uint4 w = c4[i];
        const uint32_t b[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          const uint32_t o = order_key(__uint_as_float(b[u]));
          gt += o > thr ? 1u : 0u;
          eq += o == thr ? 1u : 0u;
        }
      }
      for (int64_t i = 4 * n4 + tid; i < len; i += kSelThreads) {
        const uint32_t o = order_key(__uint_as_float(cache[i]));
        gt += o > thr ? 1u : 0u;
        eq += o == thr ? 1u : 0u;
      }
    } else {
      for (int64_t i = tid; i < len; i += kSelThreads) {
        const uint32_t o = order_key(__uint_as_float(bits_at(i)));
        gt += o > thr ? 1u : 0u;
        eq += o == thr ? 1u : 0u;
      }
    }
    const unsigned long long both =
        ReduceU64(temp.reduce64).Sum((static_cast<unsigned long long>(eq) << 32) | gt);
    if (tid == 0) {
      s_place[0] = uint32_t(both);
      s_place[1] = uint32_t(both >> 32);
    }
    __syncthreads();
    if (tid < int(n_ctas)) {
      uint32_t* c = cluster.map_shared_rank(mail.counts[crank], unsigned(tid));
      c[0] = s_place[0];
      c[1] = s_place[1];
    }
    cluster.sync();  // every CTA has every CTA's counts; no shared memory is touched remotely after this
    my_gt = mail.counts[crank][0];
    // This CTA's place in the position-ordered winner list: the CTAs before it hold lower positions.
    // Warp 0, lane q: CTA q's counts; the keys == thr go to the lowest CTAs first.
    if (tid < 32) {
      const unsigned q = unsigned(tid);
      const uint32_t cgt = q < n_ctas ? mail.counts[q][0] : 0u, ceq = q < n_ctas ? mail.counts[q][1] : 0u;
      const Place place = place_of(cgt, ceq, take_eq, crank);
      if (q == 0) {
        s_place[0] = place.before;
        s_place[1] = place.take;
      }
    }
    __syncthreads();
    win_before = s_place[0];
    my_take = s_place[1];
  }
  if (my_gt + my_take == 0) return;  // block-uniform
  uint32_t run_gt = 0, run_eq = 0;
  for (int64_t base = 0; base < len; base += int64_t(kSelThreads) * kGatherItems) {
    uint32_t b[kGatherItems], o[kGatherItems];
    const int64_t i0 = base + int64_t(tid) * kGatherItems;
    if (kCached && i0 + kGatherItems <= len) {  // 16-byte loads (i0 % 8 == 0): words were 8-way conflicts
#pragma unroll
      for (int g = 0; g < kGatherItems; g += 4) {
        const uint4 w = *reinterpret_cast<const uint4*>(cache + i0 + g);
        b[g] = w.x, b[g + 1] = w.y, b[g + 2] = w.z, b[g + 3] = w.w;
      }
    } else {
#pragma unroll
      for (int it = 0; it < kGatherItems; ++it) b[it] = i0 + it < len ? bits_at(i0 + it) : kNoKeyBits;
    }
    uint32_t cnt = 0;  // (keys > thr) | (keys == thr) << 16: a tile holds < 2^16 keys
#pragma unroll
    for (int it = 0; it < kGatherItems; ++it) {
      o[it] = order_key(__uint_as_float(b[it]));
      cnt += (o[it] > thr ? 1u : 0u) + (o[it] == thr ? 0x10000u : 0u);
    }
    uint32_t pre = 0, agg = 0;
    Scan(temp.scan).ExclusiveSum(cnt, pre, agg);
    write_winners(o, lo + base + int64_t(tid) * kGatherItems, thr, my_take, win_before, run_gt + (pre & 0xffffu),
                  run_eq + (pre >> 16), out_idx, out_val, [&](int it) { return __uint_as_float(b[it]); });
    run_gt += agg & 0xffffu;
    run_eq += agg >> 16;
    __syncthreads();  // temp.scan is reused by the next tile
  }
  trace_mark(p.trace, 15);
}

// The kernel's instantiations: cached / streamed chunks, each at power-of-two widths and others.
constexpr void (*kKernels[])(TopkSelectParams, int) = {topk_select_kernel<true, true>, topk_select_kernel<true, false>,
                                                      topk_select_kernel<false, true>, topk_select_kernel<false, false>};

// CTAs per row forced on the cluster kernel (0: the launch chooses); set_topk_cluster_ctas.
std::atomic<int> g_forced_ctas{0};

}  // namespace

void set_topk_cluster_ctas(int ctas) {
  DSI_CHECK(ctas >= 0 && ctas <= kMaxCluster, "topk: a cluster of 1 to {} CTAs per row (0: the launch's choice), got {}",
            kMaxCluster, ctas);
  g_forced_ctas.store(ctas);
}

bool topk_select_supported(int64_t n, int k) {
  if (k < 1 || k > kTopkSelectMaxK || n >= (int64_t(1) << 31)) return false;
  int dev = 0, major = 0;
  DSI_CUDA_CHECK(cudaGetDevice(&dev));
  DSI_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  return major >= 9;  // thread-block clusters
}

void launch_topk_select(const TopkSelectParams& p, cudaStream_t s) {
  if (p.rows == 0 || p.k == 0) return;
  DSI_CHECK(p.k >= 1 && p.k <= kTopkSelectMaxK, "topk: the select kernel takes k <= {}, got {}",
            kTopkSelectMaxK, p.k);
  if (launch_topk_select_cta(p, s)) return;
  // The dynamic shared memory a CTA may take: the device's opt-in limit less the kernel's static part.
  static const size_t max_smem = [] {
    int dev = 0, optin = 0;
    DSI_CUDA_CHECK(cudaGetDevice(&dev));
    DSI_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    size_t static_smem = 0;
    for (auto kernel : kKernels) {
      cudaFuncAttributes fa{};
      DSI_CUDA_CHECK(cudaFuncGetAttributes(&fa, kernel));
      static_smem = std::max(static_smem, fa.sharedSizeBytes);
    }
    const size_t m = size_t(optin) - static_smem;
    DSI_CHECK(m >= dynamic_smem(1, kCacheMax), "topk: {} bytes of shared memory per block, {} needed", m,
              dynamic_smem(1, kCacheMax));
    for (auto kernel : kKernels) {
      DSI_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(m)));
      DSI_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    }
    return m;
  }();
  // How many clusters of each width this GPU holds at once, one CTA an SM (a cluster of C needs C
  // free SMs of one GPC: an H100 places 30 of 4 CTAs but 15 of 8 and 7 of 16). 0: none.
  static const std::array<int, kMaxCluster + 1> resident = [&] {
    std::array<int, kMaxCluster + 1> r{};
    for (int c = 1; c <= kMaxCluster; ++c) {
      cudaLaunchConfig_t cfg{};
      cfg.gridDim = dim3(unsigned(c), 1, 1);
      cfg.blockDim = dim3(kSelThreads, 1, 1);
      cfg.dynamicSmemBytes = max_smem;
      cudaLaunchAttribute attr[1];
      attr[0].id = cudaLaunchAttributeClusterDimension;
      attr[0].val.clusterDim.x = unsigned(c);
      attr[0].val.clusterDim.y = 1;
      attr[0].val.clusterDim.z = 1;
      cfg.attrs = attr;
      cfg.numAttrs = 1;
      int clusters = 0;
      const cudaError_t e = cudaOccupancyMaxActiveClusters(&clusters, kKernels[(c & (c - 1)) == 0 ? 0 : 1], &cfg);
      if (e != cudaSuccess) cudaGetLastError();
      r[size_t(c)] = e == cudaSuccess ? clusters : 0;
    }
    return r;
  }();
  // The largest cluster this GPU can place (16 needs a GPC with 16 free SMs; 8 is portable).
  static const int largest = [&] {
    int c = kMaxCluster;
    while (c > 8 && resident[size_t(c)] < 1) --c;
    return c;
  }();
  // CTAs per row: one per 2048 scores up to the largest cluster, a power of two; where the rows'
  // clusters of that width would not all be resident at once, narrower (any width down to 2):
  // 16 rows of 128K scores take 6 CTAs each on an H100 (17 such clusters fit), not 8 (15 fit: a
  // second wave) or 4 (a third of the SMs idle).
  int ctas = int(std::clamp<int64_t>((p.n + 2047) / 2048, 1, largest));
  while (ctas & (ctas - 1)) ctas &= ctas - 1;
  while (ctas > 2 && p.rows > resident[size_t(ctas)]) --ctas;
  if (const int forced = g_forced_ctas.load(std::memory_order_relaxed); forced > 0) ctas = std::min(forced, largest);
  const int64_t chunk = chunk_of(p.n, ctas);
  const bool cached = chunk <= kCacheMax;
  const size_t base = dynamic_smem(ctas, cached ? chunk : 0);
  // Room for the candidates (the keys of the threshold's first-digit bin, sent to CTA 0): rows whose
  // bin holds more take the cluster-wide digit passes instead.
  const int cand_cap = int(std::min<int64_t>({kCandMax, p.n, int64_t(max_smem - base) / 4}));
  const size_t smem = base + sizeof(uint32_t) * size_t(cand_cap);
  const bool pow2 = (ctas & (ctas - 1)) == 0;
  auto kernel = kKernels[(cached ? 0 : 2) + (pow2 ? 0 : 1)];
  for (int64_t r0 = 0; r0 < p.rows; r0 += 65535) {
    TopkSelectParams q = p;
    q.rows = std::min<int64_t>(65535, p.rows - r0);
    q.scores = p.scores + r0 * p.score_stride;
    q.bounds = p.bounds + r0;
    q.first_row = p.first_row + r0;
    q.indices = p.indices + r0 * p.k;
    if (q.values != nullptr) q.values = p.values + r0 * p.k;
    if (q.trace != nullptr) q.trace = p.trace + r0 * kTopkTraceRanks * kTopkTraceSlots;
    launch_cluster(kernel, dim3(unsigned(ctas), unsigned(q.rows), 1), dim3(kSelThreads), smem, unsigned(ctas), s, q,
                   cand_cap);
  }
}

}  // namespace dsi::cuda
