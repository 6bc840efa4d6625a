// Host side of the CUDA backend's shared pieces; see common.cuh.
#include "backends/cuda/common.cuh"
#include "backends/cuda/device.h"

namespace dsi::cuda {

DeviceGuard::DeviceGuard(Device device) {
  DSI_CHECK(device.type == DeviceType::CUDA, "CUDA backend called for a tensor on {}", device.str());
  const int n = device_count();
  DSI_CHECK(device.index >= 0 && device.index < n, "{} is not visible to this process ({} CUDA devices)",
            device.str(), n);
  int cur = -1;
  DSI_CUDA_CHECK(cudaGetDevice(&cur));
  if (cur != device.index) {
    DSI_CUDA_CHECK(cudaSetDevice(device.index));
    prev_ = cur;
  }
}

DeviceGuard::~DeviceGuard() {
  if (prev_ >= 0) cudaSetDevice(prev_);  // no throw from a destructor; restoring cannot fail here
}

Scratch::Scratch(size_t bytes) : size_(bytes) {
  if (bytes > 0) DSI_CUDA_CHECK(cudaMallocAsync(&ptr_, bytes, stream()));
}

Scratch::~Scratch() {
  if (ptr_ != nullptr) cudaFreeAsync(ptr_, stream());
}

ErrorFlag::ErrorFlag() : mem_(sizeof(unsigned long long)) {
  DSI_CUDA_CHECK(cudaMemsetAsync(mem_.as<void>(), 0xff, sizeof(unsigned long long), stream()));
}

unsigned long long ErrorFlag::read() const { return read_device(ptr()); }

void check_on(const Tensor& t, Device device, const char* op, const char* what) {
  DSI_CHECK(t.device() == device, "{}: {} is on {}, the op runs on {}", op, what, t.device().str(),
            device.str());
}

FloatKind float_kind(DType dtype, const char* what) {
  switch (dtype) {
    case DType::F32: return FloatKind::kF32;
    case DType::BF16: return FloatKind::kBF16;
    case DType::F16: return FloatKind::kF16;
    case DType::F8_E4M3: return FloatKind::kE4M3;
    default: fail("{}: {} is not a float dtype", what, dtype_name(dtype));
  }
}

}  // namespace dsi::cuda
