// Exact top-k (k <= 2048) of rows of at most kCtaMaxN scores, one CTA of 1024 threads per row: the
// row's order keys stay in registers, three digit passes (11, 11 and 10 bits) with block barriers,
// and the ordered gather (the cluster kernel's design without its exchanges, which set its time at
// these sizes; sm90_topk_select.cu). Bitwise the CPU reference's selection.
#include <cub/block/block_scan.cuh>

#include <algorithm>
#include <climits>
#include <cstdint>

#include "backends/cuda/common.cuh"
#include "backends/cuda/topk/select_common.cuh"

namespace dsi::cuda {

namespace {

using namespace topk_select;

constexpr int kCtaThreads = 1024;
// On an H200 (bench_topk, one row) the shared-memory version of this kernel took 7.6 us at 8K keys
// and 11.3 us at 16K, the cluster (its candidates refined in one CTA) 9.6 and 9.8 us: past about
// 12K keys the CTA's passes over all its keys, not the cluster's exchanges, set the time.
constexpr int64_t kCtaMaxN = 12288;
constexpr int kCtaBins = 2048;  // 11-bit digits: bits 31..21, 20..10; then 10 bits: 9..0

using CtaScan = cub::BlockScan<uint32_t, kCtaThreads>;

// block_pick for the CTA kernel with two barriers: thread t holds the NB / kCtaThreads bins below
// NB - 1 - t * that (descending); warp scans, the warps' totals through shared memory, then every
// warp scans the totals and the crossing thread publishes the bin.
template <int NB>
__device__ BlockPick cta_pick(const uint32_t* hist, uint32_t need_or_k, bool first) {
  constexpr int kPer = NB / kCtaThreads;
  static_assert(kPer >= 1 && NB % kCtaThreads == 0, "cta_pick: whole bins per thread");
  __shared__ uint32_t s_wtot[32], s_bin, s_above, s_count;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  uint32_t c[kPer], sum = 0;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    c[i] = hist[NB - 1 - tid * kPer - i];
    sum += c[i];
  }
  uint32_t incl = sum;
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    const uint32_t t = __shfl_up_sync(0xffffffffu, incl, d);
    if (lane >= d) incl += t;
  }
  if (lane == 31) s_wtot[warp] = incl;
  __syncthreads();
  const uint32_t wt = s_wtot[lane];
  uint32_t winc = wt;
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    const uint32_t t = __shfl_up_sync(0xffffffffu, winc, d);
    if (lane >= d) winc += t;
  }
  const uint32_t total = __shfl_sync(0xffffffffu, winc, 31);
  const uint32_t need = first ? min(need_or_k, total) : need_or_k;
  if (need == 0) return BlockPick{0u, 0u, total, 0u};  // block-uniform; no bin is read
  publish_crossing(c, kPer, NB, __shfl_sync(0xffffffffu, winc - wt, warp) + incl - sum, need, s_bin, s_above,
                   s_count);
  __syncthreads();
  return BlockPick{s_bin, s_above, total, s_count};
}

// The row's order keys stay in registers: thread t holds positions [t * PER, (t + 1) * PER) (blocked,
// so thread order is position order), PER = 4, 8 or 12. Three digit passes each test the PER keys
// against the bin so far and bin the matches into their own zeroed histogram (no barrier to clear
// one), each pick takes two barriers (cta_pick), and the gather is one block scan of each thread's
// keys > T and == T. A pass runs only where the crossing bin's keys are not all winners: a row of
// at most k keys needs one, random scores mostly two (8K keys, one row: 6.2 -> 5.7 us on an H100).
template <int PER>
__global__ void __launch_bounds__(kCtaThreads, 1) topk_select_cta_kernel(TopkSelectParams p) {
  static_assert(PER % 4 == 0, "PER: whole 16-byte loads");
  static_assert(kTopkSelectMaxK <= kCtaBins, "the winners are staged in a histogram's place");
  __shared__ typename CtaScan::TempStorage scan;
  __shared__ uint32_t hist1[kCtaBins], hist2[kCtaBins], hist3[kCtaBins / 2];
  const int tid = threadIdx.x;
  trace_at(p.trace, blockIdx.x, 0, 0);
  // The histograms are zeroed under the previous kernel's tail (shared memory only).
  for (int i = tid; i < kCtaBins; i += kCtaThreads) hist1[i] = hist2[i] = 0;
  for (int i = tid; i < kCtaBins / 2; i += kCtaThreads) hist3[i] = 0;
  pdl_enter();
  trace_at(p.trace, blockIdx.x, 0, 1);
  const int64_t row = blockIdx.x;
  const float* srow = p.scores + row * p.score_stride;
  if (tid == 0) check_bound(p, row, p.bounds[row]);
  const int n = int(p.n), bound = min(int(p.bounds[row]), n);
  int32_t* out_idx = p.indices + row * p.k;
  float* out_val = p.values != nullptr ? p.values + row * p.k : nullptr;
  const int i0 = tid * PER;

  uint32_t key[PER];
  if (i0 + PER <= bound && (reinterpret_cast<uintptr_t>(srow + i0) & 15u) == 0) {
#pragma unroll
    for (int v = 0; v < PER / 4; ++v) {
      const float4 f = *reinterpret_cast<const float4*>(srow + i0 + 4 * v);
      key[4 * v] = order_key(f.x), key[4 * v + 1] = order_key(f.y);
      key[4 * v + 2] = order_key(f.z), key[4 * v + 3] = order_key(f.w);
    }
  } else {
#pragma unroll
    for (int j = 0; j < PER; ++j) key[j] = i0 + j < bound ? order_key(srow[i0 + j]) : 0u;
  }
  __syncthreads();  // the histograms are zero
  trace_at(p.trace, row, 0, 2);
  // Pass 1: bits 31..21 of the selectable keys.
#pragma unroll
  for (int j = 0; j < PER; ++j)
    count_if(hist1, key[j] >> 21, key[j] != 0u);
  __syncthreads();
  trace_at(p.trace, row, 0, 3);
  BlockPick pick = cta_pick<kCtaBins>(hist1, uint32_t(p.k), true);
  trace_at(p.trace, row, 0, 4);
  const uint32_t kk = min(uint32_t(p.k), pick.total);  // winners: min(k, selectable keys)
  if (kk == 0) {
    for (int j = tid; j < p.k; j += kCtaThreads) {
      out_idx[j] = -1;
      if (out_val != nullptr) out_val[j] = -INFINITY;
    }
    return;
  }
  // The threshold so far: the prefix of the k-th key above bit `shift` (pass 1: bits 31..21). Where
  // the crossing bin's keys are all winners (its count is what is still needed: no tie to break),
  // the passes below it are skipped and the gather compares prefixes: every key of the bin is taken.
  uint32_t prefix = pick.bin, shift = 21;  // bin >= 1 when kk >= 1: a bin of selectable keys
  uint32_t above = pick.above;
  if (pick.count != kk - above) {  // block-uniform
    // Pass 2: bits 20..10 of the keys in bin b1.
#pragma unroll
    for (int j = 0; j < PER; ++j)
      count_if(hist2, (key[j] >> 10) & 0x7ffu, (key[j] >> 21) == prefix);
    __syncthreads();
    trace_at(p.trace, row, 0, 5);
    pick = cta_pick<kCtaBins>(hist2, kk - above, false);
    trace_at(p.trace, row, 0, 6);
    prefix = (prefix << 11) | pick.bin;
    shift = 10;
    above += pick.above;
    if (pick.count != kk - above) {
      // Pass 3: bits 9..0 of the keys with that 22-bit prefix.
#pragma unroll
      for (int j = 0; j < PER; ++j)
        count_if(hist3, key[j] & 0x3ffu, (key[j] >> 10) == prefix);
      __syncthreads();
      trace_at(p.trace, row, 0, 7);
      pick = cta_pick<kCtaBins / 2>(hist3, kk - above, false);
      trace_at(p.trace, row, 0, 8);
      prefix = (prefix << 10) | pick.bin;  // the k-th key (>= 1: selectable)
      shift = 0;
      above += pick.above;
    }
  }
  const uint32_t take_eq = kk - above;  // keys with the prefix to take, lowest positions first (>= 1)

  // The ordered gather: (prefixes > prefix) | (prefixes == prefix) << 16 per thread (< 2^16 each),
  // scanned in thread order (= position order).
  uint32_t pre_key[PER];
#pragma unroll
  for (int j = 0; j < PER; ++j) pre_key[j] = key[j] >> shift;
  uint32_t cnt = 0;
#pragma unroll
  for (int j = 0; j < PER; ++j) cnt += (pre_key[j] > prefix ? 1u : 0u) + (pre_key[j] == prefix ? 0x10000u : 0u);
  uint32_t pre = 0;
  CtaScan(scan).ExclusiveSum(cnt, pre);
  trace_at(p.trace, row, 0, 9);
  const uint32_t gt_b = pre & 0xffffu, eq_b = pre >> 16;
  // The winners go to shared memory first (in the histograms' place: every pick is past the scan's
  // barriers), then out with the padding in 16-byte stores where the rows allow: scattered 4-byte
  // stores took about 1.0 us of a one-row 8K select on an H100, this 0.2 us less.
  int32_t* s_idx = reinterpret_cast<int32_t*>(hist1);
  float* s_val = reinterpret_cast<float*>(hist2);
  write_winners(pre_key, i0, prefix, take_eq, 0u, gt_b, eq_b, s_idx, out_val != nullptr ? s_val : nullptr,
                [&](int j) { return srow[i0 + j]; });  // the score itself (-0 stays -0)
  __syncthreads();
  const int k = p.k, n_win = int(kk);
  const auto idx_at = [&](int j) { return j < n_win ? s_idx[j] : -1; };
  const auto val_at = [&](int j) { return j < n_win ? s_val[j] : -INFINITY; };
  const bool vec = (k & 3) == 0 && (reinterpret_cast<uintptr_t>(out_idx) & 15u) == 0 &&
                   (reinterpret_cast<uintptr_t>(out_val) & 15u) == 0;
  if (vec) {
    for (int j = 4 * tid; j < k; j += 4 * kCtaThreads) {
      *reinterpret_cast<int4*>(out_idx + j) = make_int4(idx_at(j), idx_at(j + 1), idx_at(j + 2), idx_at(j + 3));
      if (out_val != nullptr)
        *reinterpret_cast<float4*>(out_val + j) = make_float4(val_at(j), val_at(j + 1), val_at(j + 2), val_at(j + 3));
    }
  } else {
    for (int j = tid; j < k; j += kCtaThreads) {
      out_idx[j] = idx_at(j);
      if (out_val != nullptr) out_val[j] = val_at(j);
    }
  }
  trace_at(p.trace, row, 0, 10);
}

bool cta_path_enabled() {
  static const bool on = !env_switched_off("DSI_TOPK_CTA");
  return on;
}

}  // namespace

bool topk_select_one_cta(int64_t n) { return n <= kCtaMaxN && cta_path_enabled(); }

bool launch_topk_select_cta(const TopkSelectParams& p, cudaStream_t s) {
  if (!topk_select_one_cta(p.n)) return false;
  const auto kernel = p.n <= 4 * kCtaThreads   ? topk_select_cta_kernel<4>
                      : p.n <= 8 * kCtaThreads ? topk_select_cta_kernel<8>
                                               : topk_select_cta_kernel<12>;
  for (int64_t r0 = 0; r0 < p.rows; r0 += INT32_MAX) {
    TopkSelectParams q = p;
    q.rows = std::min<int64_t>(INT32_MAX, p.rows - r0);
    q.scores = p.scores + r0 * p.score_stride;
    q.bounds = p.bounds + r0;
    q.first_row = p.first_row + r0;
    q.indices = p.indices + r0 * p.k;
    if (q.values != nullptr) q.values = p.values + r0 * p.k;
    if (q.trace != nullptr) q.trace = p.trace + r0 * kTopkTraceRanks * kTopkTraceSlots;
    launch(kernel, dim3(unsigned(q.rows)), dim3(kCtaThreads), 0, s, q);
  }
  return true;
}

}  // namespace dsi::cuda
