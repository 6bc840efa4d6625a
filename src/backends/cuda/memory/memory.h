// Device memory of the CUDA backend: storage (cudaMalloc), host/device copies, and the strided copy
// and fill kernels behind Tensor::copy_from and ops::copy on CUDA tensors.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/tensor.h"

namespace dsi::cuda {

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
