// Tensor helpers of the device communicators; see device_tensors.h.
#include "comm/device_tensors.h"

#include <utility>

namespace dsi {

namespace {

// The byte range [lo, hi) a tensor's elements occupy (any strides >= 0).
std::pair<const char*, const char*> byte_span(const Tensor& t) {
  const char* lo = static_cast<const char*>(t.raw());
  if (t.numel() == 0 || lo == nullptr) return {lo, lo};
  int64_t last = 0;
  for (int d = 0; d < t.ndim(); ++d) last += (t.dim(d) - 1) * t.stride(d);
  return {lo, lo + (last + 1) * int64_t(dtype_size(t.dtype()))};
}

}  // namespace

bool overlaps(const Tensor& a, const Tensor& b) {
  const auto [a0, a1] = byte_span(a);
  const auto [b0, b1] = byte_span(b);
  return a0 < a1 && b0 < b1 && a0 < b1 && b0 < a1;
}

Tensor shape_alias(const Tensor& t) { return Tensor::wrap(t.raw(), t.shape(), t.dtype(), Device::cpu()); }

Tensor device_contiguous(const Tensor& t) {
  if (t.is_contiguous()) return t;
  Tensor c = Tensor::empty(t.shape(), t.dtype(), t.device());
  c.copy_from(t);
  return c;
}

void copy_device(Tensor& dst, const Tensor& src) {
  if (dst.numel() == 0) return;
  if (dst.raw() == src.raw() && dst.strides() == src.strides()) return;
  if (overlaps(dst, src)) {
    Tensor tmp = Tensor::empty(src.shape(), src.dtype(), src.device());
    tmp.copy_from(src);
    dst.copy_from(tmp);
  } else {
    dst.copy_from(src);
  }
}

}  // namespace dsi
