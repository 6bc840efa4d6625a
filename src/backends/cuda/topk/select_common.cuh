// What the two top-k select kernels share (sm90_topk_select.cu: a cluster per row;
// sm90_topk_select_cta.cu: one CTA per row): the order keys, the binning, the crossing bin's
// publication and the ordered gather's writes.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "backends/cuda/topk/topk.h"

namespace dsi::cuda {

namespace topk_select {

// Order key of a score: larger = earlier; 0 for -inf and NaN (never selectable; a selectable score
// never maps to 0).
__device__ __forceinline__ uint32_t order_key(float v) {
  if (!(v > -INFINITY)) return 0u;
  const uint32_t u = __float_as_uint(v == 0.0f ? 0.0f : v);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

constexpr uint32_t kNoKeyBits = 0xff800000u;  // -inf: what a position at or past the bound caches

// hist[bin] += 1 where `take`: one predicated shared reduction. (A guarded atomicAdd costs a
// convergence region and the shared window's address again each time: about ten instructions a
// key in the binning passes.)
__device__ __forceinline__ void count_if(uint32_t* hist, uint32_t bin, bool take) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(hist + bin));
  asm volatile(
      "{\n\t.reg .pred p;\n\tsetp.ne.u32 p, %0, 0;\n\t@p red.shared.add.u32 [%1], 1;\n\t}" ::"r"(uint32_t(take)),
      "r"(addr)
      : "memory");
}

// The op's input check, by one thread of the row: a bound outside [0, n] lowers p.bad to the row.
__device__ __forceinline__ void check_bound(const TopkSelectParams& p, int64_t row, int64_t bound) {
  if (p.bad != nullptr && (bound < 0 || bound > p.n))
    atomicMin(p.bad, static_cast<unsigned long long>(p.first_row + row));
}

// TopkSelectParams::trace: thread 0 of the CTA writes %globaltimer as `mark` of (row, rank).
__device__ __forceinline__ void trace_at(unsigned long long* trace, int64_t row, int rank, int mark) {
  if (trace != nullptr && threadIdx.x == 0) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    trace[(row * kTopkTraceRanks + rank) * kTopkTraceSlots + mark] = t;
  }
}

struct BlockPick {
  uint32_t bin, above, total, count;  // count: the keys in `bin`
};

// The bin at which the count from the top reaches `need`, found by the one (thread, i) that crosses
// it: this thread's counts c[0, per) are of bins nb - 1 - tid * per - i (descending), and `acc` keys
// lie in the bins above them. That thread writes the bin, the count above it and the bin's count.
template <int kMax>
__device__ __forceinline__ void publish_crossing(const uint32_t (&c)[kMax], int per, int nb, uint32_t acc,
                                                 uint32_t need, uint32_t& bin, uint32_t& above, uint32_t& count) {
#pragma unroll
  for (int i = 0; i < kMax; ++i) {
    if (need > 0 && acc < need && acc + c[i] >= need) {  // exactly one (thread, i) crosses
      bin = uint32_t(nb - 1 - int(threadIdx.x) * per - i);
      above = acc;
      count = c[i];
    }
    acc += c[i];
  }
}

// The ordered gather's write for one thread's keys o[] at consecutive positions pos0, pos0 + 1, ...:
// every key > thr, and a key == thr while fewer than take_eq come before it; gt_b / eq_b count the
// keys > thr / == thr before o[0], and `before` the winners ahead of them all. value_of(i) is the
// score written next to position pos0 + i.
template <int ITEMS, typename ValueOf>
__device__ __forceinline__ void write_winners(const uint32_t (&o)[ITEMS], int64_t pos0, uint32_t thr,
                                              uint32_t take_eq, uint32_t before, uint32_t gt_b, uint32_t eq_b,
                                              int32_t* out_idx, float* out_val, ValueOf value_of) {
#pragma unroll
  for (int it = 0; it < ITEMS; ++it) {
    if (o[it] > thr || (o[it] == thr && eq_b < take_eq)) {
      const uint32_t slot = before + gt_b + min(eq_b, take_eq);
      out_idx[slot] = int32_t(pos0 + it);
      if (out_val != nullptr) out_val[slot] = value_of(it);
    }
    gt_b += o[it] > thr ? 1u : 0u;
    eq_b += o[it] == thr ? 1u : 0u;
  }
}

}  // namespace topk_select

// Rows of at most 12K scores on one CTA each (sm90_topk_select_cta.cu), unless DSI_TOPK_CTA=0
// keeps every row on the cluster kernel: false (nothing launched) for the rows it does not take.
bool launch_topk_select_cta(const TopkSelectParams& p, cudaStream_t s);

}  // namespace dsi::cuda
