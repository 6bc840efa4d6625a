// CUDA devices visible to this process (the ops themselves are declared in cuda_ops.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace dsi::cuda {

// Number of visible CUDA devices; 0 when the driver or devices are missing (never throws).
int device_count();
// "NVIDIA H200 (sm_90, 141 GiB)" for device i; throws dsi::Error if i is not visible.
std::string device_description(int i);
// Free bytes on device i now (cudaMemGetInfo); throws dsi::Error if i is not visible.
size_t free_memory(int i);

// The caching allocator of device i (memory/memory.h): cudaMalloc calls so far, bytes it holds from
// the device, bytes of those in live tensors and scratch.
struct MemoryStats {
  int64_t device_allocations = 0;
  int64_t reserved_bytes = 0;
  int64_t in_use_bytes = 0;
};
MemoryStats memory_stats(int i);
// Returns the cached free blocks of device i to the device (after its stream's work).
void empty_cache(int i);

}  // namespace dsi::cuda
