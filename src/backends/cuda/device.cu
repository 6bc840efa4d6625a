// CUDA device queries; see device.h.
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/device.h"

namespace dsi::cuda {

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error from a missing driver
    return 0;
  }
  return n;
}

std::string device_description(int i) {
  cudaDeviceProp p{};
  DSI_CUDA_CHECK(cudaGetDeviceProperties(&p, i));
  return fmt::format("{} (sm_{}{}, {} GiB)", p.name, p.major, p.minor,
                     p.totalGlobalMem >> 30);
}

size_t free_memory(int i) {
  int prev = 0;
  DSI_CUDA_CHECK(cudaGetDevice(&prev));
  DSI_CUDA_CHECK(cudaSetDevice(i));
  size_t free = 0, total = 0;
  const cudaError_t e = cudaMemGetInfo(&free, &total);
  cudaSetDevice(prev);
  DSI_CUDA_CHECK(e);
  return free;
}

}  // namespace dsi::cuda
