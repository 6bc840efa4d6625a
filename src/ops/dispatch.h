// Routes an op to the backend that owns its tensors' device. The CPU backend is the reference
// implementation of every op; the CUDA backend (built with DSI_CUDA) mirrors the same signatures.
#pragma once

#include "backends/cpu/cpu_ops.h"
#include "core/tensor.h"

#ifdef DSI_WITH_CUDA
#include "backends/cuda/cuda_ops.h"
#define DSI_DISPATCH_CUDA_(dev, op, ...) \
  if ((dev).type == ::dsi::DeviceType::CUDA) return ::dsi::cuda::op(__VA_ARGS__);
#else
#define DSI_DISPATCH_CUDA_(dev, op, ...)
#endif

#define DSI_DISPATCH(device, op, ...)                                                     \
  do {                                                                                    \
    const ::dsi::Device dsi_dev_ = (device);                                              \
    if (dsi_dev_.is_cpu()) return ::dsi::cpu::op(__VA_ARGS__);                            \
    DSI_DISPATCH_CUDA_(dsi_dev_, op, __VA_ARGS__)                                         \
    ::dsi::fail("op " #op ": no backend for device {} in this build", dsi_dev_.str());    \
  } while (0)
