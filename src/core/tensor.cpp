// Tensor views and host storage; see tensor.h.
#include "core/tensor.h"

#include <cstdlib>
#include <cstring>

namespace dsi {

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
  DSI_CHECK(device.is_cpu(), "Tensor::empty on {}: device tensors are allocated by their backend",
            device.str());
  for (int64_t d : shape) DSI_CHECK(d >= 0, "negative dimension in shape {}", shape_str(shape));
  auto st = std::make_shared<HostStorage>(size_t(shape_numel(shape)) * dtype_size(dtype));
  return wrap(st->data(), shape, dtype, device, st);
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  std::memset(t.raw(), 0, t.nbytes());
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

Tensor Tensor::contiguous() const {
  Tensor out = empty(shape_, dtype_);
  out.copy_from(*this);
  return out;
}

void Tensor::copy_from(const Tensor& src) {
  DSI_CHECK(device_.is_cpu() && src.device_.is_cpu(), "copy_from: host tensors only");
  DSI_CHECK(src.shape_ == shape_ && src.dtype_ == dtype_, "copy_from: {} into {}", src.desc(),
            desc());
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
