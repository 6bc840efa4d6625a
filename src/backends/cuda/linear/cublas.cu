// cuBLAS handles; see cublas.h.
#include <array>

#include "backends/cuda/common.cuh"
#include "backends/cuda/linear/cublas.h"

namespace dsi::cuda {

namespace {
constexpr int kMaxDevices = 64;

// The handles of one host thread (cuBLAS handles must not be shared by threads that change their
// configuration; one per thread keeps that trivially true).
struct ThreadHandles {
  std::array<cublasHandle_t, kMaxDevices> h{};
  ~ThreadHandles() {
    for (int d = 0; d < kMaxDevices; ++d) {
      if (h[size_t(d)] == nullptr) continue;
      if (cudaSetDevice(d) == cudaSuccess) cublasDestroy(h[size_t(d)]);  // best effort at exit
    }
  }
};
}  // namespace

cublasHandle_t cublas_handle() {
  thread_local ThreadHandles handles;
  int dev = 0;
  DSI_CUDA_CHECK(cudaGetDevice(&dev));
  DSI_CHECK(dev >= 0 && dev < kMaxDevices, "cuBLAS: device {} beyond the {} supported", dev,
            kMaxDevices);
  cublasHandle_t& h = handles.h[size_t(dev)];
  if (h == nullptr) {
    DSI_CUBLAS_CHECK(cublasCreate(&h));
    // Plain fp32 GEMMs (no TF32, whatever NVIDIA_TF32_OVERRIDE says): the CPU reference is fp32.
    DSI_CUBLAS_CHECK(cublasSetMathMode(h, CUBLAS_PEDANTIC_MATH));
    DSI_CUBLAS_CHECK(cublasSetAtomicsMode(h, CUBLAS_ATOMICS_NOT_ALLOWED));
  }
  DSI_CUBLAS_CHECK(cublasSetStream(h, stream()));
  return h;
}

}  // namespace dsi::cuda
