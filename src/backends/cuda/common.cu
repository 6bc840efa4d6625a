// Host side of the CUDA backend's shared pieces; see common.cuh.
#include <atomic>
#include <functional>
#include <cstdlib>
#include <mutex>
#include <string_view>
#include <utility>
#include <vector>

#include "backends/cuda/common.cuh"
#include "backends/cuda/device.h"
#include "backends/cuda/linear/cublas.h"
#include "backends/cuda/linear/fp8_gemm.h"
#include "backends/cuda/memory/memory.h"

namespace dsi::cuda {

namespace {
thread_local int t_logical = -1;  // the innermost DeviceGuard's logical device
thread_local bool t_side = false;    // stream() is the side stream (run_beside)
thread_local bool t_beside = false;  // inside a run_beside
}  // namespace

DeviceGuard::DeviceGuard(Device device) {
  DSI_CHECK(device.type == DeviceType::CUDA, "CUDA backend called for a tensor on {}", device.str());
  const int gpu = physical_device(device.index);
  int cur = -1;
  DSI_CUDA_CHECK(cudaGetDevice(&cur));
  if (cur != gpu) {
    DSI_CUDA_CHECK(cudaSetDevice(gpu));
    prev_gpu_ = cur;
  }
  prev_logical_ = t_logical;
  t_logical = device.index;
}

DeviceGuard::~DeviceGuard() {
  t_logical = prev_logical_;
  if (prev_gpu_ >= 0) cudaSetDevice(prev_gpu_);  // no throw from a destructor; restoring cannot fail here
}

int current_device() {
  int gpu = 0;
  DSI_CUDA_CHECK(cudaGetDevice(&gpu));
  // The guard's device, unless the runtime's device was changed underneath it.
  return t_logical >= 0 && physical_device(t_logical) == gpu ? t_logical : gpu;
}

cudaStream_t stream() {
  constexpr int kMaxDevices = 64;
  static std::atomic<cudaStream_t> streams[kMaxDevices][2];  // [device][main, side]
  static std::mutex mu;
  const int dev = current_device();
  DSI_CHECK(dev >= 0 && dev < kMaxDevices, "cuda:{}: device index beyond {}", dev, kMaxDevices);
  std::atomic<cudaStream_t>& slot = streams[dev][t_side ? 1 : 0];
  cudaStream_t s = slot.load(std::memory_order_acquire);
  if (s != nullptr) return s;
  std::lock_guard<std::mutex> lock(mu);
  s = slot.load();
  if (s == nullptr) {
    // Never destroyed: tensors released during static destruction may still enqueue on it.
    DSI_CUDA_CHECK(cudaStreamCreateWithFlags(&s, gpu_sharing() ? cudaStreamNonBlocking : cudaStreamDefault));
    slot.store(s, std::memory_order_release);
  }
  return s;
}

bool on_side_stream() { return t_side; }

namespace {
// The fork and join events of a device (reused: each record is waited for before the next).
cudaEvent_t beside_event(int dev, int which) {
  constexpr int kMaxDevices = 64;
  static std::atomic<cudaEvent_t> events[kMaxDevices][2];
  static std::mutex mu;
  DSI_CHECK(dev >= 0 && dev < kMaxDevices, "cuda:{}: device index beyond {}", dev, kMaxDevices);
  cudaEvent_t e = events[dev][which].load(std::memory_order_acquire);
  if (e != nullptr) return e;
  std::lock_guard<std::mutex> lock(mu);
  e = events[dev][which].load();
  if (e == nullptr) {
    DSI_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    events[dev][which].store(e, std::memory_order_release);
  }
  return e;
}

// One run_beside: the side stream starts after the work queued so far on the main one, and the main
// one goes on only once the side's work is done (also when an op throws); freed blocks are held
// back in between.
class Beside {
 public:
  explicit Beside(int dev) : dev_(dev), main_(stream()) {
    DSI_CHECK(!t_beside, "run_beside: called inside a run_beside");
    t_side = true;
    side_ = stream();
    t_side = false;
    DSI_CUDA_CHECK(cudaEventRecord(beside_event(dev_, 0), main_));
    DSI_CUDA_CHECK(cudaStreamWaitEvent(side_, beside_event(dev_, 0), 0));
    hold_released_blocks(dev_, true);
    t_beside = true;
  }
  ~Beside() {
    t_side = false;
    t_beside = false;
    // No throw from here: a failing record or wait leaves the error to the next checked call.
    const cudaEvent_t join = beside_event(dev_, 1);
    cudaEventRecord(join, side_);
    cudaStreamWaitEvent(main_, join, 0);
    hold_released_blocks(dev_, false);
  }
  Beside(const Beside&) = delete;
  Beside& operator=(const Beside&) = delete;
  // Runs f with stream() the side stream.
  template <typename F>
  void on_side(F&& f) {
    t_side = true;
    f();
    t_side = false;
  }

 private:
  int dev_;
  cudaStream_t main_, side_ = nullptr;
};
}  // namespace

void run_beside(Device device, const std::function<void()>& side, const std::function<void()>& main) {
  // DSI_BESIDE=0 runs both on the one stream, side first (for comparisons).
  static const bool on = !env_switched_off("DSI_BESIDE");
  if (!on) {
    side();
    main();
    return;
  }
  DeviceGuard guard(device);
  Beside beside(current_device());
  beside.on_side(side);
  main();
}

int sm_count() {
  int dev = 0, sms = 0;
  DSI_CUDA_CHECK(cudaGetDevice(&dev));
  DSI_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  return sms;
}

bool env_switched_off(const char* name) {
  const char* env = std::getenv(name);
  return env != nullptr && std::string_view(env) == "0";
}

bool env_switched_on(const char* name) {
  const char* env = std::getenv(name);
  return env != nullptr && std::atoi(env) > 0;
}

bool pdl_enabled() {
  static const bool on = [] {
    if (env_switched_off("DSI_PDL")) return false;
    int dev = 0, major = 0;
    DSI_CUDA_CHECK(cudaGetDevice(&dev));
    DSI_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    return major >= 9;
  }();
  // Not with GPU sharing: a kernel launched early sits resident on the GPU waiting for the one
  // before it, and the GPU's other ranks need room for the peer collectives that one waits for.
  return on && !gpu_sharing();
}

void sync_stream() { DSI_CUDA_CHECK(cudaStreamSynchronize(stream())); }

void prepare_thread(int i) {
  thread_local std::vector<bool> done;
  DSI_CHECK(i >= 0, "cuda:{}: no such device", i);
  if (size_t(i) < done.size() && done[size_t(i)]) return;
  DeviceGuard guard(Device::cuda(i));
  (void)stream();
  prepare_host_copies();
  (void)cublas_handle();
  t_side = true;  // the side stream and its cuBLAS workspace too, before any capture
  try {
    (void)stream();
    (void)cublas_handle();
  } catch (...) {
    t_side = false;
    throw;
  }
  t_side = false;
  prepare_fp8_gemm_lt();
  if (done.size() <= size_t(i)) done.resize(size_t(i) + 1, false);
  done[size_t(i)] = true;
}

Scratch::Scratch(size_t bytes) : size_(bytes) {
  if (bytes == 0) return;
  ptr_ = allocate_block(current_device(), bytes, pool_);
}

Scratch::~Scratch() { release_block(pool_, ptr_); }

Scratch::Scratch(Scratch&& o) noexcept : ptr_(o.ptr_), size_(o.size_), pool_(std::move(o.pool_)) {
  o.ptr_ = nullptr;
  o.size_ = 0;
}

Scratch& Scratch::operator=(Scratch&& o) noexcept {
  if (this != &o) {
    release_block(pool_, ptr_);
    ptr_ = std::exchange(o.ptr_, nullptr);
    size_ = std::exchange(o.size_, 0);
    pool_ = std::move(o.pool_);
  }
  return *this;
}

ErrorFlag::ErrorFlag(const char* what) {
  const int dev = current_device();
  CaptureState* cap = capture_state();
  if (cap != nullptr && cap->device == dev && cap->checks != nullptr) {
    DeferredChecks& c = *cap->checks;
    DSI_CHECK(int(c.what.size()) < c.capacity,
              "a captured step holds more than {} input checks", c.capacity);
    ptr_ = c.flags + c.what.size();  // reset to kNone at the start of every replay
    c.what.emplace_back(what);
    deferred_ = true;
    return;
  }
  mem_ = Scratch(sizeof(unsigned long long));
  ptr_ = mem_.as<unsigned long long>();
  DSI_CUDA_CHECK(cudaMemsetAsync(ptr_, 0xff, sizeof(unsigned long long), stream()));
}

unsigned long long ErrorFlag::read() const { return deferred_ ? kNone : read_device(ptr_); }

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
