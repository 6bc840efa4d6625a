// Tensor views, host storage, the device-backend registry and copies across devices; see tensor.h.
#include "core/tensor.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

#ifdef DSI_WITH_CUDA
namespace dsi::cuda {
void init();  // backends/cuda/memory/memory.cu: registers the CUDA device backend (idempotent)
}
#endif

namespace dsi {

namespace {
// One slot per DeviceType; written once by a backend's init, read by every device allocation/copy.
std::atomic<DeviceBackend*> g_device_backends[2] = {nullptr, nullptr};

// The backend that owns `device`'s memory; throws when this build has none for it.
DeviceBackend& backend_of(Device device) {
  DeviceBackend* b = device_backend(device.type);
#ifdef DSI_WITH_CUDA
  if (b == nullptr && device.type == DeviceType::CUDA) {
    cuda::init();
    b = device_backend(device.type);
  }
#endif
  DSI_CHECK(b != nullptr, "tensor on {}: this build has no backend for that device", device.str());
  return *b;
}
}  // namespace

void register_device_backend(DeviceType type, DeviceBackend* backend) {
  g_device_backends[size_t(type)].store(backend, std::memory_order_release);
}

DeviceBackend* device_backend(DeviceType type) {
  return g_device_backends[size_t(type)].load(std::memory_order_acquire);
}

std::string Device::str() const {
  return type == DeviceType::CPU ? std::string("cpu") : fmt::format("cuda:{}", index);
}

HostStorage::HostStorage(size_t bytes) : size_(bytes) {
  const size_t rounded = ((bytes + 63) / 64) * 64;
  ptr_ = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
  DSI_CHECK(ptr_ != nullptr, "out of host memory allocating {} bytes", bytes);
}

HostStorage::~HostStorage() { std::free(ptr_); }

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

namespace {
Shape contiguous_strides(const Shape& shape) {
  Shape st(shape.size());
  int64_t acc = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    st[i] = acc;
    acc *= shape[i];
  }
  return st;
}
}  // namespace

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  for (int64_t d : shape) DSI_CHECK(d >= 0, "negative dimension in shape {}", shape_str(shape));
  const size_t bytes = size_t(shape_numel(shape)) * dtype_size(dtype);
  std::shared_ptr<Storage> st;
  if (device.is_cpu())
    st = std::make_shared<HostStorage>(bytes);
  else
    st = backend_of(device).allocate(bytes, device);
  return wrap(st->data(), shape, dtype, device, st);
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  if (device.is_cpu())
    std::memset(t.raw(), 0, t.nbytes());
  else if (t.nbytes() > 0)
    backend_of(device).fill_zero(t.raw(), t.nbytes(), device);
  return t;
}

Tensor Tensor::wrap(void* data, const Shape& shape, DType dtype, Device device,
                    std::shared_ptr<Storage> keep) {
  Tensor t;
  t.storage_ = std::move(keep);
  t.data_ = data;
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.dtype_ = dtype;
  t.device_ = device;
  return t;
}

Tensor Tensor::from_f32(const std::vector<float>& v, const Shape& shape) {
  DSI_CHECK(int64_t(v.size()) == shape_numel(shape), "from_f32: {} values for shape {}", v.size(),
            shape_str(shape));
  Tensor t = empty(shape, DType::F32);
  if (!v.empty()) std::memcpy(t.raw(), v.data(), v.size() * sizeof(float));
  return t;
}

Tensor Tensor::from_i32(const std::vector<int32_t>& v, const Shape& shape) {
  DSI_CHECK(int64_t(v.size()) == shape_numel(shape), "from_i32: {} values for shape {}", v.size(),
            shape_str(shape));
  Tensor t = empty(shape, DType::I32);
  if (!v.empty()) std::memcpy(t.raw(), v.data(), v.size() * sizeof(int32_t));
  return t;
}

bool Tensor::is_contiguous() const { return strides_ == contiguous_strides(shape_); }

Tensor Tensor::view(const Shape& shape) const {
  DSI_CHECK(is_contiguous(), "view of non-contiguous tensor {}", desc());
  Shape s = shape;
  int infer = -1;
  int64_t known = 1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      DSI_CHECK(infer < 0, "view {}: more than one -1", shape_str(shape));
      infer = int(i);
    } else {
      known *= s[i];
    }
  }
  if (infer >= 0) {
    DSI_CHECK(known > 0 && numel() % known == 0, "view {} of {}", shape_str(shape), desc());
    s[size_t(infer)] = numel() / known;
  }
  DSI_CHECK(shape_numel(s) == numel(), "view {} of {}: element count differs", shape_str(shape),
            desc());
  Tensor t = *this;
  t.shape_ = s;
  t.strides_ = contiguous_strides(s);
  return t;
}

Tensor Tensor::slice(int64_t begin, int64_t end) const { return narrow(0, begin, end - begin); }

Tensor Tensor::narrow(int d, int64_t start, int64_t len) const {
  if (d < 0) d += ndim();
  DSI_CHECK(d >= 0 && d < ndim(), "narrow: dimension {} of {}", d, desc());
  DSI_CHECK(start >= 0 && len >= 0 && start + len <= shape_[size_t(d)],
            "narrow [{}, {}) out of range for dimension {} of {}", start, start + len, d, desc());
  Tensor t = *this;
  t.shape_[size_t(d)] = len;
  t.data_ = static_cast<char*>(data_) + start * strides_[size_t(d)] * int64_t(dtype_size(dtype_));
  return t;
}

Tensor Tensor::unsqueeze(int d) const {
  DSI_CHECK(d >= 0 && d <= ndim(), "unsqueeze: dimension {} of {}", d, desc());
  Tensor t = *this;
  const int64_t stride = d < ndim() ? shape_[size_t(d)] * strides_[size_t(d)] : 1;
  t.shape_.insert(t.shape_.begin() + d, 1);
  t.strides_.insert(t.strides_.begin() + d, stride);
  return t;
}

Tensor Tensor::contiguous() const {
  Tensor out = empty(shape_, dtype_);
  out.copy_from(*this);
  return out;
}

void Tensor::copy_from(const Tensor& src) {
  DSI_CHECK(src.shape_ == shape_ && src.dtype_ == dtype_, "copy_from: {} into {}", src.desc(),
            desc());
  if (!device_.is_cpu() || !src.device_.is_cpu()) {
    if (numel() == 0) return;
    if (is_contiguous() && src.is_contiguous()) {
      backend_of(device_.is_cpu() ? src.device_ : device_)
          .copy_bytes(data_, device_, src.data_, src.device_, nbytes());
    } else if (device_ == src.device_) {
      backend_of(device_).copy_strided(src, *this);
    } else if (!src.is_contiguous()) {
      // Gather on src's side first, then move contiguous bytes (and scatter below if needed).
      Tensor packed = empty(shape_, dtype_, src.device_);
      packed.copy_from(src);
      copy_from(packed);
    } else {
      // src is contiguous, this is strided and on another device: move the bytes, then scatter.
      Tensor staged = empty(shape_, dtype_, device_);
      staged.copy_from(src);
      copy_from(staged);
    }
    return;
  }
  const size_t es = dtype_size(dtype_);
  if (is_contiguous() && src.is_contiguous()) {
    std::memcpy(data_, src.data_, nbytes());
    return;
  }
  // Generic strided copy: iterate over all indices of the shape.
  const int n = ndim();
  std::vector<int64_t> idx(static_cast<size_t>(n), 0);
  const int64_t total = numel();
  for (int64_t k = 0; k < total; ++k) {
    int64_t so = 0, doff = 0;
    for (int i = 0; i < n; ++i) {
      so += idx[size_t(i)] * src.strides_[size_t(i)];
      doff += idx[size_t(i)] * strides_[size_t(i)];
    }
    std::memcpy(static_cast<char*>(data_) + doff * int64_t(es),
                static_cast<const char*>(src.data_) + so * int64_t(es), es);
    for (int i = n - 1; i >= 0; --i) {
      if (++idx[size_t(i)] < shape_[size_t(i)]) break;
      idx[size_t(i)] = 0;
    }
  }
}

Tensor to_device(const Tensor& t, Device device) {
  Tensor out = Tensor::empty(t.shape(), t.dtype(), device);
  out.copy_from(t);
  return out;
}

Tensor to_host(const Tensor& t) { return t.contiguous(); }

Tensor cat_rows(const std::vector<Tensor>& parts) {
  const Tensor* first = nullptr;
  int64_t rows = 0;
  for (const Tensor& t : parts) {
    if (!t.defined()) continue;
    if (!first) first = &t;
    DSI_CHECK(t.dtype() == first->dtype() && t.device() == first->device() && t.ndim() == first->ndim() &&
                  Shape(t.shape().begin() + 1, t.shape().end()) ==
                      Shape(first->shape().begin() + 1, first->shape().end()),
              "cat_rows: {} and {} do not stack", first->desc(), t.desc());
    rows += t.dim(0);
  }
  DSI_CHECK(first != nullptr, "cat_rows: nothing to stack");
  Shape shape = first->shape();
  shape[0] = rows;
  Tensor out = Tensor::empty(shape, first->dtype(), first->device());
  int64_t at = 0;
  for (const Tensor& t : parts) {
    if (!t.defined() || t.dim(0) == 0) continue;
    Tensor dst = out.slice(at, at + t.dim(0));
    dst.copy_from(t);
    at += t.dim(0);
  }
  return out;
}

std::string Tensor::desc() const { return std::string(dtype_name(dtype_)) + shape_str(shape_); }

void check_shape(const Tensor& t, const Shape& want, const char* what) {
  DSI_CHECK(t.shape() == want, "{}: expected shape {}, got {}", what, shape_str(want),
            shape_str(t.shape()));
}

void check_dtype(const Tensor& t, DType want, const char* what) {
  DSI_CHECK(t.dtype() == want, "{}: expected dtype {}, got {}", what, dtype_name(want),
            dtype_name(t.dtype()));
}

}  // namespace dsi
