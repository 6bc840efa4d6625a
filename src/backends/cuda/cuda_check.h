// Checked CUDA runtime / cuBLAS calls: a failing call throws dsi::Error naming the call, file and line.
#pragma once

#include <cuda_runtime.h>

#include "dsinfer/error.h"

#define DSI_CUDA_CHECK(call)                                                                  \
  do {                                                                                        \
    const cudaError_t dsi_err_ = (call);                                                      \
    if (dsi_err_ != cudaSuccess)                                                              \
      ::dsi::fail("CUDA error {} ({}) in {} at {}:{}", int(dsi_err_),                         \
                  cudaGetErrorString(dsi_err_), #call, __FILE__, __LINE__);                   \
  } while (0)

namespace dsi::cuda {
cudaStream_t stream();  // common.cuh
}  // namespace dsi::cuda

// After a kernel launch: launch-configuration errors always; in debug builds also the kernel's own
// faults (synchronising, unless the stream is being captured into a graph), so they are reported at
// the launch that caused them.
#ifdef NDEBUG
#define DSI_CUDA_CHECK_LAUNCH() DSI_CUDA_CHECK(cudaGetLastError())
#else
#define DSI_CUDA_CHECK_LAUNCH()                                                              \
  do {                                                                                       \
    DSI_CUDA_CHECK(cudaGetLastError());                                                      \
    cudaStreamCaptureStatus dsi_cap_ = cudaStreamCaptureStatusNone;                          \
    DSI_CUDA_CHECK(cudaStreamIsCapturing(::dsi::cuda::stream(), &dsi_cap_));                  \
    if (dsi_cap_ == cudaStreamCaptureStatusNone)                                             \
      DSI_CUDA_CHECK(cudaStreamSynchronize(::dsi::cuda::stream()));                          \
  } while (0)
#endif
