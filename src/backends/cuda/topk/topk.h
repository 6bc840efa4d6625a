// Exact top-k in dsinfer's total order (score descending, then position ascending), as a sort:
// every candidate becomes one 64-bit key (topk_key in common.cuh; 0 = not selectable), each row's
// keys are sorted descending with cub's segmented radix sort, the first k keys are decoded, and the
// winners are sorted by position (the op lists a selection by ascending position). Keys are unique
// within a row, so the result is fully determined: bitwise the CPU's selection.
// The sort stays for k > 2048 and for topk_merge; topk with k <= 2048 runs the radix select below.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dsi::cuda {

// keys[r, s] for the rows [row0, row0 + rows) of a score matrix.
struct TopkKeysParams {
  const float* scores;       // [rows, n], row stride score_stride
  const int32_t* bounds;     // [rows] (topk: positions [0, bound) selectable); null for merge
  const int32_t* positions;  // [rows, n] contiguous (merge: -1 = empty); null for topk
  unsigned long long* keys;  // [rows, n] contiguous, out
  int64_t score_stride;
  int64_t rows, n;
};
void launch_topk_keys(const TopkKeysParams& p, cudaStream_t stream);

// out[r, j] for j < k from the sorted keys: a position (-1 where no key) and, for topk, its score.
struct TopkDecodeParams {
  const unsigned long long* sorted;  // [rows, n] contiguous, each row descending
  const float* scores;               // [rows, n], row stride score_stride (values source)
  int32_t* indices;                  // [rows, k] contiguous, best first, -1 padded
  float* values;                     // [rows, k] contiguous, -inf padded; null when not wanted
  int64_t score_stride;
  int64_t rows, n, k;
};
void launch_topk_decode(const TopkDecodeParams& p, cudaStream_t stream);

// Checks bounds[r] in [0, n]; lowers *bad to the first bad row.
void launch_topk_check_bounds(const int32_t* bounds, int64_t rows, int64_t n,
                              unsigned long long* bad, cudaStream_t stream);

// Exact top-k by radix select (sm90_topk_select.cu): one thread-block cluster per row (one CTA for
// rows of up to 12K scores, sm90_topk_select_cta.cu), the k-th order key found in three digit
// passes over the row's scores (cached in shared memory), the winners written in position order.
// Same selection as the sort, bitwise; k <= 2048.
inline constexpr int kTopkSelectMaxK = 2048;
struct TopkSelectParams {
  const float* scores;    // [rows, n], row stride score_stride
  const int32_t* bounds;  // [rows] positions [0, bound) selectable
  int32_t* indices;       // [rows, k] contiguous, ascending positions, -1 padded
  float* values;          // [rows, k] contiguous, -inf padded; null when not wanted
  int64_t score_stride;
  int64_t rows, n;        // n < 2^31
  int k;                  // 1..kTopkSelectMaxK
  // Lowered (atomicMin) to the first row whose bound is outside [0, n], when not null: the op's
  // input check inside the select (such a row's selection is then meaningless, but reads nothing
  // outside its scores).
  unsigned long long* bad;
  int64_t first_row;  // what bad calls this call's row 0 (the launch's chunks of rows)
  // Benchmarks' phase marks, when not null: thread 0 of each cluster CTA writes %globaltimer at
  // the points kTopkTraceMarks names into trace[(row * kTopkTraceRanks + rank) * kTopkTraceSlots +
  // mark] (a CTA writes only the marks it passes); the one-CTA kernel writes those of
  // kTopkCtaTraceMarks as rank 0.
  unsigned long long* trace;
};
inline constexpr int kTopkTraceRanks = 16;  // the largest cluster
inline constexpr int kTopkTraceSlots = 16;
inline constexpr const char* kTopkTraceMarks[] = {"entry",
                                                   "past the wait",
                                                   "pass 1 (read, histogram)",
                                                   "first pick: counts out",
                                                   "first pick: every CTA's in",
                                                   "first pick: the bin",
                                                   "candidates found",
                                                   "candidates sent",
                                                   "CTA 0: every candidate in",
                                                   "CTA 0: second digit counted",
                                                   "CTA 0: second digit picked",
                                                   "CTA 0: third digit picked",
                                                   "CTA 0: every CTA's share",
                                                   "CTA 0: places sent",
                                                   "place in",
                                                   "done"};
static_assert(sizeof(kTopkTraceMarks) / sizeof(kTopkTraceMarks[0]) == kTopkTraceSlots);
inline constexpr const char* kTopkCtaTraceMarks[] = {"entry",
                                                      "past the wait",
                                                      "keys in registers",
                                                      "pass 1 counted",
                                                      "pass 1 picked",
                                                      "pass 2 counted",
                                                      "pass 2 picked",
                                                      "pass 3 counted",
                                                      "pass 3 picked",
                                                      "gather scanned",
                                                      "done"};
static_assert(sizeof(kTopkCtaTraceMarks) / sizeof(kTopkCtaTraceMarks[0]) <= kTopkTraceSlots);
// True when rows of n scores go to the one-CTA kernel (its trace marks are kTopkCtaTraceMarks).
bool topk_select_one_cta(int64_t n);
// True when the select kernel handles (n, k) on the current device (sm_90+: clusters).
bool topk_select_supported(int64_t n, int k);
void launch_topk_select(const TopkSelectParams& p, cudaStream_t stream);
// CTAs per row forced on the cluster kernel (rows past the one-CTA kernel's), for tests and
// comparisons: 1 to 16 (capped at the largest cluster the GPU places), or 0 (the default) for the
// launch's choice.
void set_topk_cluster_ctas(int ctas);

// Sorts each row of keys_in ([rows, n] contiguous) descending into keys_out (cub segmented radix
// sort; scratch from the stream-ordered pool). rows * n < 2^31.
void sort_rows_descending(const unsigned long long* keys_in, unsigned long long* keys_out,
                          int64_t rows, int64_t n, cudaStream_t stream);

}  // namespace dsi::cuda
