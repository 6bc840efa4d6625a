// Checked CUDA runtime calls: a failing call throws dsi::Error naming the call, file and line.
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
