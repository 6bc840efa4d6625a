// Device memory of the CUDA backend; see memory.h. CudaStorage owns one block of the caching
// allocator; CudaDeviceBackend is what core/tensor.cpp calls for CUDA tensors.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "backends/cuda/common.cuh"
#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/device.h"
#include "backends/cuda/memory/memory.h"

namespace dsi::cuda {

// One pool of cached blocks on one device. The shared pool of a device lives for the process; a
// private pool lives as long as its graph or any tensor allocated from it.
struct BlockPool {
  int device = 0;
  std::mutex mu;
  std::multimap<size_t, void*> free;         // size class -> free blocks
  std::unordered_map<void*, size_t> blocks;  // every block: its size class
  ~BlockPool();
};

namespace {

constexpr int kMaxDevices = 64;

struct DeviceCounters {
  std::atomic<int64_t> device_allocations{0};
  std::atomic<int64_t> reserved{0};
  std::atomic<int64_t> in_use{0};
};
DeviceCounters& counters(int device) {
  static DeviceCounters c[kMaxDevices];
  return c[device];
}

std::shared_ptr<BlockPool> shared_pool(int device) {
  static std::mutex mu;
  static std::shared_ptr<BlockPool> pools[kMaxDevices];
  std::lock_guard<std::mutex> lock(mu);
  if (!pools[device]) {
    pools[device] = std::make_shared<BlockPool>();
    pools[device]->device = device;
  }
  return pools[device];
}

// Device memory for the caching allocator. With GPU sharing (device.h) stream-ordered, on the
// current logical device's stream: a plain cudaMalloc or cudaFree may wait for the whole GPU, whose
// other ranks' collectives wait for this rank. (A dying pool's destructor frees with cudaFree: at
// exit, or a graph's pool once its rank has no collective in flight.)
cudaError_t device_malloc(void** p, size_t size) {
  return gpu_sharing() ? cudaMallocAsync(p, size, stream()) : cudaMalloc(p, size);
}
cudaError_t device_free(void* p) { return gpu_sharing() ? cudaFreeAsync(p, stream()) : cudaFree(p); }

// Frees every free block of a pool (not while capturing: freeing is not capturable), on the pool's
// device (the caller's DeviceGuard).
void release_free_blocks(BlockPool& pool) {
  std::lock_guard<std::mutex> lock(pool.mu);
  for (const auto& [size, p] : pool.free) {
    device_free(p);
    pool.blocks.erase(p);
    counters(pool.device).reserved -= int64_t(size);
  }
  pool.free.clear();
}

}  // namespace

BlockPool::~BlockPool() {
  int cur = -1, gpu = -1;
  try {
    gpu = physical_device(device);
  } catch (const std::exception&) {
    return;  // no such device: nothing was allocated on it
  }
  const bool switched = cudaGetDevice(&cur) == cudaSuccess && cur != gpu && cudaSetDevice(gpu) == cudaSuccess;
  for (const auto& [p, size] : blocks) {
    cudaFree(p);  // at exit or when a graph's pool dies: no collective is in flight
    counters(device).reserved -= int64_t(size);
  }
  if (switched) cudaSetDevice(cur);
}

size_t block_size_class(size_t bytes) {
  if (bytes <= 4096) return std::max<size_t>(512, (bytes + 511) / 512 * 512);
  constexpr size_t kLarge = size_t(16) << 20, kLargeStep = size_t(2) << 20;
  if (bytes > kLarge) return (bytes + kLargeStep - 1) / kLargeStep * kLargeStep;
  size_t top = 1;
  while (top * 2 <= bytes) top *= 2;
  const size_t step = top / 8;
  return (bytes + step - 1) / step * step;
}

CaptureState*& capture_state() {
  thread_local CaptureState* state = nullptr;
  return state;
}

namespace {

// A free block of class `size` from `pool`, or null.
void* take_free(BlockPool& pool, size_t size) {
  std::lock_guard<std::mutex> lock(pool.mu);
  auto it = pool.free.find(size);
  if (it == pool.free.end()) return nullptr;
  void* p = it->second;
  pool.free.erase(it);
  return p;
}

}  // namespace

void* allocate_block(int device, size_t bytes, std::shared_ptr<BlockPool>& pool) {
  DSI_CHECK(device >= 0 && device < kMaxDevices, "cuda:{}: device index beyond {}", device,
            kMaxDevices);
  const CaptureState* cap = capture_state();
  const bool mine = cap != nullptr && cap->device == device;
  pool = mine ? cap->pool : shared_pool(device);
  const size_t size = block_size_class(bytes);
  if (void* p = take_free(*pool, size)) {
    counters(device).in_use += int64_t(size);
    return p;
  }
  if (mine && cap->checks != nullptr) {
    // Capturing: no cudaMalloc. A free block of the shared pool changes hands instead.
    BlockPool& shared = *shared_pool(device);
    void* p = take_free(shared, size);
    DSI_CHECK(p != nullptr,
              "a captured step asked for a {}-byte block its warm-up did not leave (warm the step "
              "up with the same calls first)",
              bytes);
    {
      std::lock_guard<std::mutex> lock(shared.mu);
      shared.blocks.erase(p);
    }
    std::lock_guard<std::mutex> lock(pool->mu);
    pool->blocks.emplace(p, size);
    counters(device).in_use += int64_t(size);
    return p;
  }
  DeviceGuard guard(Device::cuda(device));
  void* p = nullptr;
  cudaError_t e = device_malloc(&p, size);
  if (e == cudaErrorMemoryAllocation && cap == nullptr) {
    cudaGetLastError();
    release_free_blocks(*shared_pool(device));
    e = device_malloc(&p, size);
  }
  if (e != cudaSuccess) {
    cudaGetLastError();
    fail("out of CUDA memory allocating {} bytes on cuda:{} ({}; {} MiB held by this process)",
         bytes, device, cudaGetErrorString(e), counters(device).reserved.load() >> 20);
  }
  counters(device).device_allocations += 1;
  counters(device).reserved += int64_t(size);
  counters(device).in_use += int64_t(size);
  std::lock_guard<std::mutex> lock(pool->mu);
  pool->blocks.emplace(p, size);
  return p;
}

namespace {
// A device's blocks held back while it runs work on two streams (hold_released_blocks).
struct HeldBlocks {
  std::mutex mu;
  int depth = 0;
  std::vector<std::pair<std::shared_ptr<BlockPool>, void*>> blocks;
};
HeldBlocks& held_blocks(int device) {
  static HeldBlocks h[kMaxDevices];
  return h[device];
}

void free_block(BlockPool& pool, void* ptr) noexcept {
  std::lock_guard<std::mutex> lock(pool.mu);
  auto it = pool.blocks.find(ptr);
  if (it == pool.blocks.end()) return;
  pool.free.emplace(it->second, ptr);
  counters(pool.device).in_use -= int64_t(it->second);
}
}  // namespace

void release_block(const std::shared_ptr<BlockPool>& pool, void* ptr) noexcept {
  if (!pool || ptr == nullptr) return;
  if (pool->device >= 0 && pool->device < kMaxDevices) {
    HeldBlocks& h = held_blocks(pool->device);
    std::lock_guard<std::mutex> lock(h.mu);
    if (h.depth > 0) {
      try {
        h.blocks.emplace_back(pool, ptr);
        return;
      } catch (const std::bad_alloc&) {
        // No room to hold it: a leak of this block is better than handing it out too early.
        return;
      }
    }
  }
  free_block(*pool, ptr);
}

void hold_released_blocks(int device, bool on) {
  DSI_CHECK(device >= 0 && device < kMaxDevices, "cuda:{}: device index beyond {}", device, kMaxDevices);
  HeldBlocks& h = held_blocks(device);
  std::vector<std::pair<std::shared_ptr<BlockPool>, void*>> release;
  {
    std::lock_guard<std::mutex> lock(h.mu);
    h.depth += on ? 1 : -1;
    if (h.depth > 0 || on) return;
    h.depth = 0;
    release.swap(h.blocks);
  }
  for (auto& [pool, ptr] : release) free_block(*pool, ptr);
}

std::shared_ptr<BlockPool> make_private_pool(int device) {
  auto pool = std::make_shared<BlockPool>();
  pool->device = device;
  return pool;
}

MemoryStats memory_stats(int device) {
  DSI_CHECK(device >= 0 && device < kMaxDevices, "cuda:{}: device index beyond {}", device,
            kMaxDevices);
  const DeviceCounters& c = counters(device);
  return {c.device_allocations.load(), c.reserved.load(), c.in_use.load()};
}

void empty_cache(int device) {
  DSI_CHECK(device >= 0 && device < kMaxDevices, "cuda:{}: device index beyond {}", device,
            kMaxDevices);
  DeviceGuard guard(Device::cuda(device));
  DSI_CUDA_CHECK(cudaStreamSynchronize(stream()));
  release_free_blocks(*shared_pool(device));
  // Stream-ordered frees (GPU sharing) go back to the GPU at the stream's next synchronisation.
  if (gpu_sharing()) DSI_CUDA_CHECK(cudaStreamSynchronize(stream()));
}

namespace {

__device__ __forceinline__ void strided_offsets(int64_t flat, int ndim, const int64_t* shape,
                                                const int64_t* sa, const int64_t* sb, int64_t* oa,
                                                int64_t* ob) {
  int64_t a = 0, b = 0;
  for (int d = ndim - 1; d >= 0; --d) {
    const int64_t i = flat % shape[d];
    flat /= shape[d];
    a += i * sa[d];
    b += i * sb[d];
  }
  *oa = a;
  *ob = b;
}

__global__ void strided_copy_kernel(StridedCopyParams p) {
  pdl_enter();
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < p.numel; i += step) {
    int64_t so, dof;
    strided_offsets(i, p.ndim, p.shape, p.src_strides, p.dst_strides, &so, &dof);
    const char* s = p.src + so * p.elem_size;
    char* d = p.dst + dof * p.elem_size;
    if (!p.aligned) {
      for (int b = 0; b < p.elem_size; ++b) d[b] = s[b];
      continue;
    }
    switch (p.elem_size) {
      case 1: *d = *s; break;
      case 2: *reinterpret_cast<uint16_t*>(d) = *reinterpret_cast<const uint16_t*>(s); break;
      case 4: *reinterpret_cast<uint32_t*>(d) = *reinterpret_cast<const uint32_t*>(s); break;
      default:
        *reinterpret_cast<unsigned long long*>(d) = *reinterpret_cast<const unsigned long long*>(s);
    }
  }
}

__global__ void strided_fill_kernel(StridedFillParams p) {
  pdl_enter();
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < p.numel; i += step) {
    int64_t off, unused;
    strided_offsets(i, p.ndim, p.shape, p.strides, p.strides, &off, &unused);
    p.dst[off] = p.value;
  }
}

// The kernels are built for Hopper (sm_90a) only: any other GPU fails at its first allocation with
// a one-line message instead of "no kernel image" at the first launch.
void check_supported(int device) {
  static std::mutex mu;
  static std::vector<int> checked;
  std::lock_guard<std::mutex> lock(mu);
  if (std::find(checked.begin(), checked.end(), device) != checked.end()) return;
  cudaDeviceProp p{};
  const cudaError_t e = cudaGetDeviceProperties(&p, physical_device(device));
  if (e != cudaSuccess) {
    cudaGetLastError();
    fail("cuda:{}: not a usable CUDA device ({})", device, cudaGetErrorString(e));
  }
  DSI_CHECK(p.major == 9 && p.minor == 0,
            "cuda:{} is an {} (sm_{}{}); this build's kernels are for Hopper GPUs (sm_90a) only",
            device, p.name, p.major, p.minor);
  checked.push_back(device);
}

// One block of the caching allocator on one device (at least 512 bytes, so data() is never null).
class CudaStorage final : public Storage {
 public:
  CudaStorage(size_t bytes, Device device) : size_(bytes), device_(device) {
    check_supported(device.index);
    ptr_ = allocate_block(device.index, bytes, pool_);
  }
  ~CudaStorage() override { release_block(pool_, ptr_); }
  CudaStorage(const CudaStorage&) = delete;
  CudaStorage& operator=(const CudaStorage&) = delete;
  void* data() override { return ptr_; }
  size_t size() const override { return size_; }
  Device device() const override { return device_; }

 private:
  void* ptr_ = nullptr;
  size_t size_ = 0;
  Device device_;
  std::shared_ptr<BlockPool> pool_;
};

// A host copy of the current logical device through a pinned buffer of its own, waiting for the
// device's stream. With GPU sharing a pageable copy may have to wait for the CUDA driver's staging
// buffers, which all the ranks of the process share; if another rank's copy holds them, queued
// behind a collective that waits for this rank, this rank would never launch its part.
struct PinnedBuffer {
  std::mutex mu;
  void* ptr = nullptr;
};
constexpr size_t kPinnedBytes = size_t(4) << 20;

// The current logical device's pinned buffer, made at its first use and kept for the process.
PinnedBuffer& pinned_buffer() {
  static PinnedBuffer buffers[kMaxDevices];
  const int dev = current_device();
  DSI_CHECK(dev >= 0 && dev < kMaxDevices, "cuda:{}: device index beyond {}", dev, kMaxDevices);
  PinnedBuffer& b = buffers[dev];
  std::lock_guard<std::mutex> lock(b.mu);
  if (b.ptr == nullptr) DSI_CUDA_CHECK(cudaHostAlloc(&b.ptr, kPinnedBytes, cudaHostAllocDefault));
  return b;
}

void pinned_copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  PinnedBuffer& b = pinned_buffer();
  std::lock_guard<std::mutex> lock(b.mu);
  constexpr size_t kBytes = kPinnedBytes;
  for (size_t off = 0; off < bytes; off += kBytes) {
    const size_t len = std::min(kBytes, bytes - off);
    if (kind == cudaMemcpyHostToDevice) {
      std::memcpy(b.ptr, static_cast<const char*>(src) + off, len);
      DSI_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(dst) + off, b.ptr, len, kind, stream()));
      sync_stream();
    } else {
      DSI_CUDA_CHECK(cudaMemcpyAsync(b.ptr, static_cast<const char*>(src) + off, len, kind, stream()));
      sync_stream();
      std::memcpy(static_cast<char*>(dst) + off, b.ptr, len);
    }
  }
}

class CudaDeviceBackend final : public DeviceBackend {
 public:
  std::shared_ptr<Storage> allocate(size_t bytes, Device device) override {
    DSI_CHECK(device_count() > 0, "tensor on {}: no CUDA device is visible to this process",
              device.str());
    return std::make_shared<CudaStorage>(bytes, device);
  }

  void fill_zero(void* data, size_t bytes, Device device) override {
    DeviceGuard guard(device);
    DSI_CUDA_CHECK(cudaMemsetAsync(data, 0, bytes, stream()));
  }

  // On the device's stream: host-to-device and device-to-device copies are asynchronous (a pageable
  // source is staged before the call returns), device-to-host ones wait for the data. With GPU
  // sharing, host copies go through pinned_copy instead.
  void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device,
                  size_t bytes) override {
    if (bytes == 0) return;
    if (dst_device.is_cpu() && src_device.is_cpu()) {
      std::memcpy(dst, src, bytes);
    } else if (src_device.is_cpu()) {
      DeviceGuard guard(dst_device);
      copy_from_host(dst, src, bytes);
    } else if (dst_device.is_cpu()) {
      DeviceGuard guard(src_device);
      copy_to_host(dst, src, bytes);
    } else if (src_device == dst_device) {
      DeviceGuard guard(dst_device);
      DSI_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream()));
    } else {
      // Between devices: both streams' queued work first (each device runs its own stream).
      {
        DeviceGuard guard(src_device);
        sync_stream();
      }
      DeviceGuard guard(dst_device);
      sync_stream();
      const int src_gpu = physical_device(src_device.index), dst_gpu = physical_device(dst_device.index);
      if (src_gpu == dst_gpu) {  // two logical devices of one GPU (device.h): a copy on its stream
        DSI_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream()));
        sync_stream();
      } else {
        DSI_CUDA_CHECK(cudaMemcpyPeer(dst, dst_gpu, src, src_gpu, bytes));
      }
    }
  }

  void copy_strided(const Tensor& src, const Tensor& dst) override {
    DSI_CHECK(src.device() == dst.device() && !dst.device().is_cpu(),
              "copy_strided: {} on {} into {} on {}", src.desc(), src.device().str(), dst.desc(),
              dst.device().str());
    DeviceGuard guard(dst.device());
    copy_strided_tensor(src, dst);
  }
};

}  // namespace

void copy_to_host(void* dst, const void* src, size_t bytes) {
  if (gpu_sharing()) return pinned_copy(dst, src, bytes, cudaMemcpyDeviceToHost);
  DSI_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream()));
  sync_stream();
}

void copy_from_host(void* dst, const void* src, size_t bytes) {
  if (gpu_sharing()) return pinned_copy(dst, src, bytes, cudaMemcpyHostToDevice);
  DSI_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream()));
}

void prepare_host_copies() {
  if (gpu_sharing()) (void)pinned_buffer();
}

void launch_strided_copy(const StridedCopyParams& p, cudaStream_t s) {
  if (p.numel == 0) return;
  launch(strided_copy_kernel, grid_for(p.numel, 256), 256, 0, s, p);
}

void launch_strided_fill(const StridedFillParams& p, cudaStream_t s) {
  if (p.numel == 0) return;
  launch(strided_fill_kernel, grid_for(p.numel, 256), 256, 0, s, p);
}

void copy_strided_tensor(const Tensor& src, const Tensor& dst) {
  DSI_CHECK(src.shape() == dst.shape() && src.dtype() == dst.dtype(), "copy: {} into {}",
            src.desc(), dst.desc());
  DSI_CHECK(dst.ndim() <= kMaxCopyDims, "copy: {} has more than {} dimensions", dst.desc(),
            kMaxCopyDims);
  StridedCopyParams p{};
  p.src = static_cast<const char*>(src.raw());
  p.dst = static_cast<char*>(dst.raw());
  p.ndim = dst.ndim();
  for (int d = 0; d < p.ndim; ++d) {
    p.shape[d] = dst.dim(d);
    p.src_strides[d] = src.stride(d);
    p.dst_strides[d] = dst.stride(d);
  }
  p.elem_size = int(dtype_size(dst.dtype()));
  p.aligned = (reinterpret_cast<uintptr_t>(p.src) | reinterpret_cast<uintptr_t>(p.dst)) %
                  uintptr_t(p.elem_size) == 0;
  p.numel = dst.numel();
  launch_strided_copy(p, stream());
}

void fill_f32(const Tensor& t, float value) {
  DSI_CHECK(dtype_size(t.dtype()) == 4 && t.ndim() <= kMaxCopyDims, "fill: {}", t.desc());
  StridedFillParams p{};
  p.dst = static_cast<uint32_t*>(t.raw());
  p.ndim = t.ndim();
  for (int d = 0; d < p.ndim; ++d) {
    p.shape[d] = t.dim(d);
    p.strides[d] = t.stride(d);
  }
  std::memcpy(&p.value, &value, 4);
  p.numel = t.numel();
  launch_strided_fill(p, stream());
}

void init() {
  // Stateless; never destroyed, so tensors released during static destruction still find it.
  static CudaDeviceBackend* const backend = new CudaDeviceBackend();
  register_device_backend(DeviceType::CUDA, backend);
}

}  // namespace dsi::cuda
