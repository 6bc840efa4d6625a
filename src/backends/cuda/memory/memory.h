// Device memory of the CUDA backend: the caching allocator behind every CUDA tensor and op scratch,
// host/device copies, and the strided copy and fill kernels behind Tensor::copy_from and ops::copy.
//
// The caching allocator: a freed block goes back to its pool's free list and the next request of the
// same size class takes it, so once a step has run, running it again calls cudaMalloc no more (the
// workspace of a step is what its first run reserved; it stays counted as used memory, so KV sizing
// after a warm-up sees it). Size classes: multiples of 512 B up to 4 KiB, then 8 classes per power
// of two (at most 12.5% rounding) up to 16 MiB, then multiples of 2 MiB (weights and KV pools lose
// little to rounding). A step graph (graph/step_graph.h) captures with a private pool: its
// blocks keep their addresses for every replay and are never handed to other work.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace dsi::cuda {

struct BlockPool;

// The size class of a request of `bytes`.
size_t block_size_class(size_t bytes);
// A block of at least `bytes` from the pool this thread allocates from on `device` (the capturing
// step graph's, else the device's shared pool); `pool` receives the owner. Out of memory: the shared
// pool's free blocks are released and the request retried, then a dsi::Error.
void* allocate_block(int device, size_t bytes, std::shared_ptr<BlockPool>& pool);
// Gives a block back to its pool (never throws).
void release_block(const std::shared_ptr<BlockPool>& pool, void* ptr) noexcept;
// While work runs on two streams of `device` (run_beside), a block freed on either may still be in
// use by the other's kernels: from hold_released_blocks(device, true) to the matching false, blocks
// released go back to their pools only then (nesting counts).
void hold_released_blocks(int device, bool on);
// A new pool private to one step graph (its blocks are freed with the last reference).
std::shared_ptr<BlockPool> make_private_pool(int device);

// Input checks of the ops captured into one step graph: one device word per check (ErrorFlag), all
// in one array so a replay reads them back at once.
struct DeferredChecks {
  unsigned long long* flags = nullptr;  // [capacity] device words
  int capacity = 0;
  std::vector<std::string> what;        // claimed slots: what each check reports
};

// While a thread warms up or captures a step graph: the device and the graph's pool; while it
// captures, also the graph's checks. Capture cannot cudaMalloc, so a block the pool lacks then is
// taken from the shared pool's free blocks, or the capture fails: the warm-up, running the same
// calls eagerly into the same pool, leaves every block the capture will ask for.
struct CaptureState {
  int device = -1;
  std::shared_ptr<BlockPool> pool;
  DeferredChecks* checks = nullptr;  // null while warming up
};
// This thread's warm-up or capture (null when neither).
CaptureState*& capture_state();

inline constexpr int kMaxCopyDims = 8;

// dst[idx] = src[idx] for every index of `shape` (row-major walk), elements of elem_size bytes.
struct StridedCopyParams {
  const char* src;                      // [shape] with src_strides, elem_size-byte elements
  char* dst;                            // [shape] with dst_strides (must not overlap src)
  int64_t shape[kMaxCopyDims];          // ndim sizes
  int64_t src_strides[kMaxCopyDims];    // in elements
  int64_t dst_strides[kMaxCopyDims];    // in elements
  int ndim;                             // 0 (a scalar) .. kMaxCopyDims
  int elem_size;                        // bytes per element: 1, 2, 4 or 8
  bool aligned;                         // both pointers aligned to elem_size (else byte copies)
  int64_t numel;                        // product of shape
};
void launch_strided_copy(const StridedCopyParams& p, cudaStream_t stream);

// dst[idx] = value for every index of `shape`, 4-byte elements.
struct StridedFillParams {
  uint32_t* dst;                    // [shape] with strides, 4-byte elements
  int64_t shape[kMaxCopyDims];      // ndim sizes
  int64_t strides[kMaxCopyDims];    // in elements
  int ndim;
  uint32_t value;                   // the element's bits
  int64_t numel;
};
void launch_strided_fill(const StridedFillParams& p, cudaStream_t stream);

// Host wrappers (current device = the tensors' device; checks shapes and dims).
void copy_strided_tensor(const Tensor& src, const Tensor& dst);
// Fills a 4-byte-element CUDA tensor (any strides) with the bits of `value`.
void fill_f32(const Tensor& t, float value);

}  // namespace dsi::cuda
