// Weights asked of the L2 ahead of the product that reads them (ops::prefetch_linear): queued where
// the kernels in between read little, so the HBM streams them while those kernels wait on latency.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dsi::cuda {

struct GemvParams;  // linear/gemv.h

// L2 bytes one early prefetch asks for at most: DSI_EARLY_PREFETCH_MB from the environment (0 turns
// them off; for comparisons), else kEarlyPrefetchL2Share of the current device's L2.
int64_t early_prefetch_budget();
constexpr double kEarlyPrefetchL2Share = 0.5;

// The stretches are cut into pieces of at most `piece` bytes (a multiple of 16), one per thread:
// thread t asks for [begin, end) of piece t % per of stretch t / per, per =
// prefetch_pieces_per_stretch(len, piece) (empty past the weight), for len <= stride - skip.
// Requests then leave from many SMs at once.
struct PrefetchPiece {
  int64_t begin = 0, end = 0;
};
__host__ __device__ inline int64_t prefetch_pieces_per_stretch(int64_t len, int64_t piece) {
  return (len + piece - 1) / piece;
}
__host__ __device__ inline PrefetchPiece prefetch_piece(int64_t t, int64_t total, int64_t stride, int64_t skip,
                                                        int64_t len, int64_t per, int64_t piece) {
  const int64_t i = t / per, first = i * stride + skip;
  PrefetchPiece p;
  p.begin = first + (t % per) * piece;
  int64_t end = first + len;
  if (end > total) end = total;
  if (end > p.begin + piece) end = p.begin + piece;
  p.end = p.begin < end ? p.begin + (end - p.begin) / 16 * 16 : p.begin;
  return p;
}

// One kernel that asks the L2 for `len` bytes at base + i * stride + skip for each i with
// i * stride < total (cut at stride and at total): the start of each block's stretch of a
// GEMV's rows past what its own prologue asks for. Multiples of 16 bytes, 16-byte aligned base.
// A programmatic dependent launch that waits for the previous kernel before it asks.
void launch_prefetch_stretches(const void* base, int64_t total, int64_t stride, int64_t skip, int64_t len,
                               cudaStream_t s);

// The early prefetch of a GEMV's weight (p's weight fields and n; x may be null): up to `budget`
// bytes, an equal share per block of p's plan, each past what the block's own prologue asks for.
void launch_gemv_prefetch(const GemvParams& p, int64_t budget, cudaStream_t s);

// The prefetches of ops::prefetch_linear and prefetch_shared_expert run on a side stream of the
// device, forked from its stream: join_prefetches() makes the device's stream wait for those queued
// so far (a step graph's capture joins them before it ends); forget_prefetches() drops the record
// of them (a capture that failed).
void join_prefetches();
void forget_prefetches();

}  // namespace dsi::cuda
