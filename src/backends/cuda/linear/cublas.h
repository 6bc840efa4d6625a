// cuBLAS handles of the CUDA backend: one per (host thread, device), created on first use with the
// stream ops run on and full fp32 math (no TF32), destroyed when the thread exits.
#pragma once

#include <cublas_v2.h>

#include "dsinfer/error.h"

#define DSI_CUBLAS_CHECK(call)                                                                \
  do {                                                                                        \
    const cublasStatus_t dsi_st_ = (call);                                                    \
    if (dsi_st_ != CUBLAS_STATUS_SUCCESS)                                                     \
      ::dsi::fail("cuBLAS error {} ({}) in {} at {}:{}", int(dsi_st_),                        \
                  cublasGetStatusString(dsi_st_), #call, __FILE__, __LINE__);                 \
  } while (0)

namespace dsi::cuda {

// The calling thread's handle for the current device (set by a DeviceGuard), bound to stream().
cublasHandle_t cublas_handle();

}  // namespace dsi::cuda
