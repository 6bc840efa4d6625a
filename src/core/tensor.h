// Tensor: a typed, shaped, strided view of memory on one device, optionally keeping its storage alive.
// Storage is anything that owns bytes: host allocations, memory-mapped checkpoint files, and device
// allocations (made by the device's backend through DeviceBackend, so core/ has no CUDA headers).
// Views (view/slice/narrow) share the storage; nothing here copies implicitly.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "dsinfer/error.h"

namespace dsi {

enum class DeviceType : uint8_t { CPU, CUDA };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;
  static Device cpu() { return {}; }
  static Device cuda(int i) { return {DeviceType::CUDA, i}; }
  bool is_cpu() const { return type == DeviceType::CPU; }
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  std::string str() const;
};

// Owner of bytes. Subclasses: HostStorage (aligned heap memory), MappedFile (safetensors), device buffers.
class Storage {
 public:
  virtual ~Storage() = default;
  virtual void* data() = 0;
  virtual size_t size() const = 0;
  virtual Device device() const = 0;
};

class HostStorage final : public Storage {
 public:
  explicit HostStorage(size_t bytes);
  ~HostStorage() override;
  HostStorage(const HostStorage&) = delete;
  HostStorage& operator=(const HostStorage&) = delete;
  void* data() override { return ptr_; }
  size_t size() const override { return size_; }
  Device device() const override { return Device::cpu(); }

 private:
  void* ptr_ = nullptr;
  size_t size_ = 0;
};

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);  // "[2, 3, 4]"
int64_t shape_numel(const Shape& s);

class Tensor {
 public:
  Tensor() = default;

  // Uninitialised / zero-filled tensors: host memory 64-byte aligned; device memory from the device's
  // backend (throws when this build or machine has none).
  static Tensor empty(const Shape& shape, DType dtype, Device device = Device::cpu());
  static Tensor zeros(const Shape& shape, DType dtype, Device device = Device::cpu());
  // A contiguous view of memory someone else owns; `keep` (optional) is kept alive by the view.
  static Tensor wrap(void* data, const Shape& shape, DType dtype, Device device = Device::cpu(),
                     std::shared_ptr<Storage> keep = nullptr);
  // Host fp32/int32 tensors from values (tests, small tables).
  static Tensor from_f32(const std::vector<float>& v, const Shape& shape);
  static Tensor from_i32(const std::vector<int32_t>& v, const Shape& shape);

  bool defined() const { return data_ != nullptr; }
  void* raw() const { return data_; }
  template <typename T>
  T* data() const {
    return static_cast<T*>(data_);
  }
  // Typed accessors that check the dtype (use at op boundaries).
  float* f32() const { return checked<float>(DType::F32); }
  int32_t* i32() const { return checked<int32_t>(DType::I32); }

  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }  // in elements
  int ndim() const { return int(shape_.size()); }
  int64_t dim(int i) const { return shape_.at(size_t(i < 0 ? i + ndim() : i)); }
  int64_t stride(int i) const { return strides_.at(size_t(i < 0 ? i + ndim() : i)); }
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype_); }
  bool is_contiguous() const;
  const std::shared_ptr<Storage>& storage() const { return storage_; }

  // Reshape a contiguous tensor; one dimension may be -1.
  Tensor view(const Shape& shape) const;
  // Rows [begin, end) along dimension 0 (stays contiguous when the tensor is).
  Tensor slice(int64_t begin, int64_t end) const;
  // [start, start+len) along dimension `d` (strided view).
  Tensor narrow(int d, int64_t start, int64_t len) const;
  // A dimension of size 1 inserted before dimension `d` (0 <= d <= ndim; any layout).
  Tensor unsqueeze(int d) const;
  // A contiguous copy on the host (any layout and device in, same dtype out).
  Tensor contiguous() const;
  // Copies the contents of `src` (same shape and dtype, any layout, any device) into this tensor.
  void copy_from(const Tensor& src);

  std::string desc() const;  // "F32[2, 3]" for error messages

 private:
  template <typename T>
  T* checked(DType want) const {
    DSI_CHECK(dtype_ == want, "tensor {} accessed as {}", desc(), dtype_name(want));
    return static_cast<T*>(data_);
  }

  std::shared_ptr<Storage> storage_;
  void* data_ = nullptr;
  Shape shape_;
  Shape strides_;
  DType dtype_ = DType::F32;
  Device device_;
};

// Memory of a device type other than the host, provided by that device's backend. The CUDA backend
// registers one (backends/cuda/memory); core/ only sees this interface.
class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;
  // A new allocation of `bytes` (may be 0; data() is never null) on `device`, contents undefined.
  virtual std::shared_ptr<Storage> allocate(size_t bytes, Device device) = 0;
  virtual void fill_zero(void* data, size_t bytes, Device device) = 0;
  // Copies `bytes` contiguous bytes; each side is the host or one of this backend's devices.
  virtual void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device,
                          size_t bytes) = 0;
  // dst = src for two tensors of the same shape and dtype on one of this backend's devices, any
  // strides (dst must not overlap src).
  virtual void copy_strided(const Tensor& src, const Tensor& dst) = 0;
};

// Installs the backend of a device type (idempotent). The CUDA backend installs itself the first time
// a CUDA tensor is made (dsi::cuda::init()).
void register_device_backend(DeviceType type, DeviceBackend* backend);
// The backend of `type`, or null when none is registered (the host has none: it is core's own).
DeviceBackend* device_backend(DeviceType type);

// A contiguous copy of `t` (any layout, any device) on `device`.
Tensor to_device(const Tensor& t, Device device);
// A contiguous copy of `t` on the host (same as t.contiguous()).
Tensor to_host(const Tensor& t);
// The parts ([m_i, ...], same dtype, device and row shape; undefined ones skipped) stacked along
// dimension 0 into a new contiguous tensor on their device. At least one part must be defined.
Tensor cat_rows(const std::vector<Tensor>& parts);
inline Tensor cat_rows(const Tensor& top, const Tensor& rows) { return cat_rows({top, rows}); }

// Checks used at op boundaries: "what" names the argument in the message.
void check_shape(const Tensor& t, const Shape& want, const char* what);
void check_dtype(const Tensor& t, DType want, const char* what);

}  // namespace dsi
