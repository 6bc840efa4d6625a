// CUDA device queries and logical devices; see device.h.
#include <atomic>
#include <cstdlib>
#include <string_view>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/device.h"

namespace dsi::cuda {

void prepare_for_spinning_kernels() {
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", /*overwrite=*/0);
  setenv("CUDA_MODULE_LOADING", "EAGER", /*overwrite=*/0);
}

namespace {
std::atomic<bool>& sharing_flag() {
  static std::atomic<bool> on = [] {
    const char* env = std::getenv("DSI_SHARE_GPUS");
    const bool yes = env != nullptr && std::string_view(env) == "1";
    if (yes) prepare_for_spinning_kernels();
    return yes;
  }();
  return on;
}
}  // namespace

void set_gpu_sharing(bool on) {
  if (on) prepare_for_spinning_kernels();
  sharing_flag().store(on, std::memory_order_release);
}

bool gpu_sharing() { return sharing_flag().load(std::memory_order_acquire); }

int physical_device(int i) {
  static const int n = device_count();  // fixed once the runtime has started
  DSI_CHECK(i >= 0 && n > 0 && (i < n || gpu_sharing()),
            "cuda:{} is not visible to this process ({} CUDA devices{})", i, n,
            n > 0 && i >= n ? "; DSI_SHARE_GPUS=1 lets ranks share GPUs" : "");
  return i % n;
}

bool peer_access_among(int n) {
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) {
      const int a = physical_device(i), b = physical_device(j);
      if (a == b) continue;
      int ok = 0;
      DSI_CUDA_CHECK(cudaDeviceCanAccessPeer(&ok, a, b));
      if (!ok) return false;
    }
  return true;
}

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
  DSI_CUDA_CHECK(cudaGetDeviceProperties(&p, physical_device(i)));
  return fmt::format("{} (sm_{}{}, {} GiB)", p.name, p.major, p.minor,
                     p.totalGlobalMem >> 30);
}

size_t free_memory(int i) {
  int prev = 0;
  DSI_CUDA_CHECK(cudaGetDevice(&prev));
  DSI_CUDA_CHECK(cudaSetDevice(physical_device(i)));
  size_t free = 0, total = 0;
  const cudaError_t e = cudaMemGetInfo(&free, &total);
  cudaSetDevice(prev);
  DSI_CUDA_CHECK(e);
  return free;
}

}  // namespace dsi::cuda
