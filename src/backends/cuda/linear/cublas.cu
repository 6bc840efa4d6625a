// cuBLAS handles; see cublas.h.
#include <array>

#include "backends/cuda/common.cuh"
#include "backends/cuda/linear/cublas.h"

namespace dsi::cuda {

namespace {
constexpr int kMaxDevices = 64;

// The handles of one host thread (cuBLAS handles must not be shared by threads that change their
// configuration; one per thread keeps that trivially true), per logical device (device.h), each
// with its workspace from the caching allocator: cuBLAS would otherwise cudaMalloc one at its first
// GEMM on a stream, and with GPU sharing a cudaMalloc may wait for other ranks' kernels.
constexpr size_t kWorkspace = size_t(32) << 20;  // what cuBLAS takes by default on Hopper

struct ThreadHandles {
  std::array<cublasHandle_t, kMaxDevices> h{};
  std::array<Scratch, 2 * kMaxDevices> workspace;  // [device][main stream, side stream]
  ~ThreadHandles() {
    for (int d = 0; d < kMaxDevices; ++d) {
      if (h[size_t(d)] == nullptr) continue;
      try {
        DeviceGuard guard(Device::cuda(d));
        cublasDestroy(h[size_t(d)]);  // best effort at exit
      } catch (const std::exception&) {
      }
    }
  }
};
}  // namespace

cublasHandle_t cublas_handle() {
  thread_local ThreadHandles handles;
  const int dev = current_device();
  DSI_CHECK(dev >= 0 && dev < kMaxDevices, "cuBLAS: device {} beyond the {} supported", dev,
            kMaxDevices);
  cublasHandle_t& h = handles.h[size_t(dev)];
  Scratch& ws = handles.workspace[size_t(2 * dev + (on_side_stream() ? 1 : 0))];
  if (h == nullptr) {
    DSI_CUBLAS_CHECK(cublasCreate(&h));
    // Plain fp32 GEMMs (no TF32, whatever NVIDIA_TF32_OVERRIDE says): the CPU reference is fp32.
    DSI_CUBLAS_CHECK(cublasSetMathMode(h, CUBLAS_PEDANTIC_MATH));
    DSI_CUBLAS_CHECK(cublasSetAtomicsMode(h, CUBLAS_ATOMICS_NOT_ALLOWED));
  }
  if (ws.size() == 0) ws = Scratch(kWorkspace);
  // Setting the stream resets the workspace to cuBLAS's own: ours again after it. Each of the
  // device's two streams (run_beside) has its own, so a workspace's uses are ordered by its stream.
  DSI_CUBLAS_CHECK(cublasSetStream(h, stream()));
  DSI_CUBLAS_CHECK(cublasSetWorkspace(h, ws.as<void>(), ws.size()));
  return h;
}

}  // namespace dsi::cuda
