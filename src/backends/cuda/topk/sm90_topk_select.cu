// Exact top-k (k <= 2048) by radix select, one thread-block cluster per row (sm_90 distributed
// shared memory), in dsinfer's total order (score descending, then position ascending):
//   1. every CTA of the cluster maps its contiguous chunk of the row to 32-bit order keys (the
//      float's bits made unsigned-monotone, -0 folded onto +0, 0 = not selectable), caches them in
//      shared memory and builds a histogram of the top 12 bits;
//   2. the CTAs read each other's histograms (DSMEM) and all find the same bin holding the k-th key;
//      two more passes (12 and 8 bits) over the cached keys of that bin give the exact threshold key
//      T and the count above it;
//   3. the winners, every key > T and the lowest positions among the keys == T, are compacted in
//      position order (a prefix over the CTAs, then an ordered block scan) into CTA 0;
//   4. CTA 0 sorts them descending by key with a stable block radix sort: equal keys keep their
//      position order, which is the tie order. Bitwise the CPU reference's selection.
// Four passes over a row instead of a full sort of 64-bit keys; one launch, capturable in a graph.
#include <cooperative_groups.h>
#include <cub/block/block_radix_sort.cuh>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include <algorithm>
#include <cstdint>

#include "backends/cuda/common.cuh"
#include "backends/cuda/topk/topk.h"

namespace dsi::cuda {

namespace {

namespace cg = cooperative_groups;

constexpr int kSelThreads = 512;
constexpr int kBins = 4096;                       // 12-bit digits (passes 1 and 2), 8 bits last
constexpr int kMaxK = kTopkSelectMaxK;            // 2048
constexpr int kSortItems = kMaxK / kSelThreads;   // 4
constexpr int kMaxCluster = 16;                   // non-portable cluster size (Hopper allows 16)
constexpr int64_t kCacheMax = 32768;              // order keys per CTA kept in shared memory
constexpr int kGatherItems = 8;                   // consecutive keys per thread in the gather pass

using Scan = cub::BlockScan<uint32_t, kSelThreads>;
using Reduce = cub::BlockReduce<uint32_t, kSelThreads>;
using Sort = cub::BlockRadixSort<uint32_t, kSelThreads, kSortItems, int32_t>;

union Temp {
  typename Scan::TempStorage scan;
  typename Reduce::TempStorage reduce;
  typename Sort::TempStorage sort;
};

struct Pick {
  uint32_t bin, above, local_above, total;
};

// Order key of a score: larger = earlier; 0 for -inf and NaN (never selectable; a selectable score
// never maps to 0).
__device__ __forceinline__ uint32_t order_key(float v) {
  if (!(v > -INFINITY)) return 0u;
  const uint32_t u = __float_as_uint(v == 0.0f ? 0.0f : v);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

constexpr size_t dynamic_smem(int64_t cache_entries) {
  return sizeof(uint32_t) * (2 * size_t(kBins) + 2 * size_t(kMaxK) + size_t(cache_entries));
}

// Sums histogram `hist` (NB bins, in every CTA of the cluster) and finds the bin where the count
// from the top reaches `need` (first pass: need = min(k, total)). Every CTA gets the same bin; also
// the cluster-wide count above it and this CTA's own count above it. Block-synchronising.
// The merge is split: CTA q sums only its slice of NB / C bins over the C histograms (C remote
// reads per bin instead of every CTA reading every histogram), the slice totals locate the slice
// holding the k-th key, and that slice's CTA finds the bin and hands it to the others.
template <int NB>
__device__ void pick_bin(const cg::cluster_group& cluster, uint32_t* hist, uint32_t need_or_k, bool first,
                         Temp& temp, Pick& pick) {
  __shared__ uint32_t merged[NB];      // this CTA's slice of the summed histogram
  __shared__ uint32_t slice_total;     // read by every CTA of the cluster
  __shared__ Pick found;               // the crossing CTA's answer, read by every CTA
  __shared__ int cross;                // the CTA whose slice holds the k-th key (-1: none)
  __shared__ uint32_t above_slices, need_s;
  const int tid = threadIdx.x;
  const unsigned n_ctas = cluster.num_blocks(), me = cluster.block_rank();
  const int S = NB / int(n_ctas);  // n_ctas is a power of two <= 16 and divides NB
  const int lo = int(me) * S;
  uint32_t tot = 0;
  for (int j = tid; j < S; j += kSelThreads) {
    uint32_t c = 0;
#pragma unroll
    for (unsigned q = 0; q < kMaxCluster; ++q)  // the remote loads are in flight together
      if (q < n_ctas) c += cluster.map_shared_rank(hist, q)[lo + j];
    merged[j] = c;
    tot += c;
  }
  tot = Reduce(temp.reduce).Sum(tot);
  if (tid == 0) slice_total = tot;
  cluster.sync();
  if (tid == 0) {
    uint32_t t[kMaxCluster], total = 0;
    for (unsigned q = 0; q < n_ctas; ++q) {
      t[q] = *cluster.map_shared_rank(&slice_total, q);
      total += t[q];
    }
    const uint32_t need = first ? min(need_or_k, total) : need_or_k;
    cross = -1;
    above_slices = 0;
    uint32_t acc = 0;
    for (int q = int(n_ctas) - 1; q >= 0; --q) {  // high bins first
      if (need > 0 && acc < need && acc + t[q] >= need) {
        cross = q;
        above_slices = acc;
      }
      acc += t[q];
    }
    need_s = need;
    pick.total = total;
  }
  __syncthreads();
  if (cross == int(me)) {  // block-uniform
    constexpr int kPer = NB >= kSelThreads ? NB / kSelThreads : 1;
    const int per = (S + kSelThreads - 1) / kSelThreads;  // <= kPer
    uint32_t cnt[kPer], sum = 0;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {  // thread t owns slice bins S-1-t*per-i: descending order
      const int j = S - 1 - tid * per - i;
      cnt[i] = i < per && j >= 0 ? merged[j] : 0u;
      sum += cnt[i];
    }
    uint32_t before = 0;
    Scan(temp.scan).ExclusiveSum(sum, before);
    const uint32_t need = need_s - above_slices;
    uint32_t acc = before;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      if (acc < need && acc + cnt[i] >= need) {  // exactly one (thread, i) crosses
        found.bin = uint32_t(lo + S - 1 - tid * per - i);
        found.above = above_slices + acc;
      }
      acc += cnt[i];
    }
  }
  cluster.sync();
  if (tid == 0) {
    if (cross >= 0) {
      const Pick f = *cluster.map_shared_rank(&found, unsigned(cross));
      pick.bin = f.bin;
      pick.above = f.above;
    } else {
      pick.bin = 0;
      pick.above = 0;
    }
  }
  __syncthreads();
  const uint32_t bin = pick.bin;
  uint32_t la = 0;
  for (int b = tid; b < NB; b += kSelThreads)
    if (uint32_t(b) > bin) la += hist[b];
  la = Reduce(temp.reduce).Sum(la);
  if (tid == 0) pick.local_above = la;
  __syncthreads();
}

template <bool kCached>
__global__ void __launch_bounds__(kSelThreads, 1) topk_select_kernel(TopkSelectParams p) {
  extern __shared__ __align__(16) uint32_t dyn[];
  uint32_t* hist0 = dyn;                 // [4096] pass 1, then [256] pass 3
  uint32_t* hist1 = dyn + kBins;         // [4096] pass 2
  uint32_t* win_ord = dyn + 2 * kBins;   // [kMaxK] CTA 0: winners' keys, position order
  int32_t* win_pos = reinterpret_cast<int32_t*>(win_ord + kMaxK);  // [kMaxK] their positions
  uint32_t* cache = reinterpret_cast<uint32_t*>(win_pos + kMaxK);  // [chunk] kCached only
  __shared__ Temp temp;
  __shared__ Pick pick;
  __shared__ uint32_t s_counts[2];  // this CTA's keys > T and == T

  const cg::cluster_group cluster = cg::this_cluster();
  const unsigned crank = cluster.block_rank(), n_ctas = cluster.num_blocks();
  const int tid = threadIdx.x;
  const int64_t row = blockIdx.y;
  const float* srow = p.scores + row * p.score_stride;
  const int64_t bound = p.bounds[row];
  const int64_t chunk = (p.n + n_ctas - 1) / n_ctas;
  const int64_t lo = std::min<int64_t>(p.n, int64_t(crank) * chunk);
  const int64_t len = std::min<int64_t>(p.n, lo + chunk) - lo;
  auto key_at = [&](int64_t i) -> uint32_t {
    if constexpr (kCached) {
      return cache[i];
    } else {
      const int64_t pos = lo + i;
      return pos < bound ? order_key(srow[pos]) : 0u;
    }
  };

  for (int i = tid; i < 2 * kBins; i += kSelThreads) dyn[i] = 0;
  __syncthreads();
  // Pass 1: keys (cached), histogram of bits 31..20 of the selectable ones.
  // 8 loads per thread in flight before their keys are binned (one at a time is latency-bound).
  constexpr int kLoads = 8;
  for (int64_t base = 0; base < len; base += int64_t(kSelThreads) * kLoads) {
    float v[kLoads];
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const int64_t i = base + int64_t(u) * kSelThreads + tid;
      v[u] = i < len && lo + i < bound ? srow[lo + i] : -INFINITY;  // -inf: key 0
    }
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const int64_t i = base + int64_t(u) * kSelThreads + tid;
      if (i >= len) continue;
      const uint32_t o = order_key(v[u]);
      if constexpr (kCached) cache[i] = o;
      if (o != 0u) atomicAdd(&hist0[o >> 20], 1u);
    }
  }
  cluster.sync();
  pick_bin<kBins>(cluster, hist0, uint32_t(p.k), true, temp, pick);
  const uint32_t kk = min(uint32_t(p.k), pick.total);  // winners: min(k, selectable keys)
  int32_t* out_idx = p.indices + row * p.k;
  float* out_val = p.values != nullptr ? p.values + row * p.k : nullptr;
  if (kk == 0) {
    cluster.sync();  // no CTA reads another's histogram any more
    if (crank == 0)
      for (int j = tid; j < p.k; j += kSelThreads) {
        out_idx[j] = -1;
        if (out_val != nullptr) out_val[j] = -INFINITY;
      }
    return;
  }
  const uint32_t b1 = pick.bin;
  uint32_t above = pick.above, local_above = pick.local_above;
  // Pass 2: bits 19..8 of the keys in bin b1.
  for (int64_t i = tid; i < len; i += kSelThreads) {
    const uint32_t o = key_at(i);
    if ((o >> 20) == b1) atomicAdd(&hist1[(o >> 8) & 0xfffu], 1u);
  }
  cluster.sync();  // also: every CTA has finished reading the pass-1 histograms
  pick_bin<kBins>(cluster, hist1, kk - above, false, temp, pick);
  const uint32_t prefix24 = (b1 << 12) | pick.bin;
  above += pick.above;
  local_above += pick.local_above;
  // Pass 3: bits 7..0 of the keys with that 24-bit prefix (hist0 is free again).
  for (int i = tid; i < 256; i += kSelThreads) hist0[i] = 0;
  __syncthreads();
  for (int64_t i = tid; i < len; i += kSelThreads) {
    const uint32_t o = key_at(i);
    if ((o >> 8) == prefix24) atomicAdd(&hist0[o & 0xffu], 1u);
  }
  cluster.sync();
  pick_bin<256>(cluster, hist0, kk - above, false, temp, pick);
  const uint32_t thr = (prefix24 << 8) | pick.bin;  // the k-th key (>= 1: selectable)
  above += pick.above;
  local_above += pick.local_above;
  const uint32_t take_eq = kk - above;  // keys == thr to take, lowest positions first (>= 1)
  if (tid == 0) {
    s_counts[0] = local_above;
    s_counts[1] = hist0[pick.bin];
  }
  cluster.sync();
  // This CTA's place in the position-ordered winner list: the CTAs before it hold lower positions.
  uint32_t eq_before = 0, win_before = 0;
  for (unsigned q = 0; q < crank; ++q) {
    const uint32_t* c = cluster.map_shared_rank(s_counts, q);
    const uint32_t gt = c[0], eq = c[1];
    const uint32_t t = min(eq, take_eq - min(take_eq, eq_before));
    win_before += gt + t;
    eq_before += eq;
  }
  const uint32_t my_take = min(s_counts[1], take_eq - min(take_eq, eq_before));
  uint32_t* dst_ord = cluster.map_shared_rank(win_ord, 0);
  int32_t* dst_pos = cluster.map_shared_rank(win_pos, 0);
  if (s_counts[0] + my_take > 0) {  // block-uniform
    uint32_t run_gt = 0, run_eq = 0;
    for (int64_t base = 0; base < len; base += int64_t(kSelThreads) * kGatherItems) {
      uint32_t o[kGatherItems];
      uint32_t cnt = 0;  // (keys > thr) | (keys == thr) << 16: a tile holds < 2^16 keys
#pragma unroll
      for (int it = 0; it < kGatherItems; ++it) {
        const int64_t i = base + int64_t(tid) * kGatherItems + it;
        o[it] = i < len ? key_at(i) : 0u;
        cnt += (o[it] > thr ? 1u : 0u) + (o[it] == thr ? 0x10000u : 0u);
      }
      uint32_t pre = 0, agg = 0;
      Scan(temp.scan).ExclusiveSum(cnt, pre, agg);
      uint32_t gt_b = run_gt + (pre & 0xffffu), eq_b = run_eq + (pre >> 16);
#pragma unroll
      for (int it = 0; it < kGatherItems; ++it) {
        const int64_t pos = lo + base + int64_t(tid) * kGatherItems + it;
        if (o[it] > thr) {
          const uint32_t slot = win_before + gt_b + min(eq_b, my_take);
          dst_ord[slot] = o[it];
          dst_pos[slot] = int32_t(pos);
          ++gt_b;
        } else if (o[it] == thr) {
          if (eq_b < my_take) {
            const uint32_t slot = win_before + gt_b + eq_b;
            dst_ord[slot] = o[it];
            dst_pos[slot] = int32_t(pos);
          }
          ++eq_b;
        }
      }
      run_gt += agg & 0xffffu;
      run_eq += agg >> 16;
      __syncthreads();  // temp.scan is reused by the next tile
    }
  }
  cluster.sync();  // every winner is in CTA 0
  if (crank != 0) return;
  uint32_t keys[kSortItems];
  int32_t vals[kSortItems];
#pragma unroll
  for (int i = 0; i < kSortItems; ++i) {  // blocked arrangement = position order
    const uint32_t j = uint32_t(tid * kSortItems + i);
    keys[i] = j < kk ? win_ord[j] : 0u;
    vals[i] = j < kk ? win_pos[j] : -1;
  }
  // Stable: equal keys stay in position order, the tie order of the total order.
  Sort(temp.sort).SortDescending(keys, vals);
#pragma unroll
  for (int i = 0; i < kSortItems; ++i) {
    const int j = tid * kSortItems + i;
    if (j >= p.k) continue;
    const int32_t pos = uint32_t(j) < kk ? vals[i] : -1;
    out_idx[j] = pos;
    if (out_val != nullptr) out_val[j] = pos >= 0 ? srow[pos] : -INFINITY;
  }
}

}  // namespace

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
  const size_t max_smem = dynamic_smem(kCacheMax);
  for (auto kernel : {topk_select_kernel<true>, topk_select_kernel<false>}) {
    DSI_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        int(max_smem)));
    DSI_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  }
  // The largest cluster this GPU can place (16 needs a GPC with 16 free SMs; else 8, portable).
  static const int largest = [&] {
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(16, 1, 1);
    cfg.blockDim = dim3(kSelThreads, 1, 1);
    cfg.dynamicSmemBytes = max_smem;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = 16;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    int clusters = 0;
    const cudaError_t e = cudaOccupancyMaxActiveClusters(&clusters, topk_select_kernel<true>, &cfg);
    if (e != cudaSuccess) cudaGetLastError();
    return e == cudaSuccess && clusters > 0 ? 16 : 8;
  }();
  // CTAs per row: one per 2048 scores up to the largest cluster; fewer when many rows already
  // fill the device.
  int ctas = int(std::clamp<int64_t>((p.n + 2047) / 2048, 1, largest));
  while (ctas & (ctas - 1)) ctas &= ctas - 1;  // a power of two: it divides the histograms' bins
  const int64_t sms = sm_count();
  while (ctas > 2 && p.rows * ctas > sms / 2) ctas /= 2;
  const int64_t chunk = (p.n + ctas - 1) / ctas;
  const bool cached = chunk <= kCacheMax;
  const size_t smem = dynamic_smem(cached ? chunk : 0);
  auto kernel = cached ? topk_select_kernel<true> : topk_select_kernel<false>;
  for (int64_t r0 = 0; r0 < p.rows; r0 += 65535) {
    TopkSelectParams q = p;
    q.rows = std::min<int64_t>(65535, p.rows - r0);
    q.scores = p.scores + r0 * p.score_stride;
    q.bounds = p.bounds + r0;
    q.indices = p.indices + r0 * p.k;
    if (q.values != nullptr) q.values = p.values + r0 * p.k;
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(unsigned(ctas), unsigned(q.rows), 1);
    cfg.blockDim = dim3(kSelThreads, 1, 1);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = unsigned(ctas);
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    DSI_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, q));
    DSI_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace dsi::cuda
