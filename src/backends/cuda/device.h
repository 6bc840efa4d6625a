// CUDA devices visible to this process (the ops themselves are declared in cuda_ops.h).
#pragma once

#include <cstddef>
#include <string>

namespace dsi::cuda {

// Number of visible CUDA devices; 0 when the driver or devices are missing (never throws).
int device_count();
// "NVIDIA H200 (sm_90, 141 GiB)" for device i; throws dsi::Error if i is not visible.
std::string device_description(int i);
// Free bytes on device i now (cudaMemGetInfo); throws dsi::Error if i is not visible.
size_t free_memory(int i);

}  // namespace dsi::cuda
