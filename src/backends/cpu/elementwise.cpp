// CPU reference: residual adds, SiLU-and-multiply, embedding gather.
#include <cmath>

#include "backends/cpu/cpu_ops.h"

namespace dsi::cpu {

namespace {
void check_same_2d(const Tensor& a, const Tensor& b, const char* op) {
  DSI_CHECK(a.shape() == b.shape() && a.ndim() == 2, "{}: shapes {} and {}", op, a.desc(), b.desc());
  check_dtype(a, DType::F32, op);
  check_dtype(b, DType::F32, op);
  DSI_CHECK(a.stride(1) == 1 && b.stride(1) == 1, "{}: rows must be contiguous", op);
}
}  // namespace

void copy(const Tensor& src, Tensor& dst) { dst.copy_from(src); }

void scale_inplace(Tensor& a, float scale) {
  DSI_CHECK(a.ndim() == 2 && a.stride(1) == 1, "scale_inplace: {}", a.desc());
  check_dtype(a, DType::F32, "scale_inplace");
  for (int64_t i = 0; i < a.dim(0); ++i) {
    float* ai = a.f32() + i * a.stride(0);
    for (int64_t j = 0; j < a.dim(1); ++j) ai[j] *= scale;
  }
}

void add_inplace(Tensor& a, const Tensor& b) {
  check_same_2d(a, b, "add_inplace");
  for (int64_t i = 0; i < a.dim(0); ++i) {
    float* ai = a.f32() + i * a.stride(0);
    const float* bi = b.f32() + i * b.stride(0);
    for (int64_t j = 0; j < a.dim(1); ++j) ai[j] += bi[j];
  }
}

void axpy_inplace(Tensor& a, const Tensor& b, float scale) {
  check_same_2d(a, b, "axpy_inplace");
  for (int64_t i = 0; i < a.dim(0); ++i) {
    float* ai = a.f32() + i * a.stride(0);
    const float* bi = b.f32() + i * b.stride(0);
    for (int64_t j = 0; j < a.dim(1); ++j) ai[j] += bi[j] * scale;
  }
}

void silu_mul(const Tensor& gate, const Tensor& up, Tensor& out) {
  check_same_2d(gate, up, "silu_mul");
  check_same_2d(gate, out, "silu_mul out");
  for (int64_t i = 0; i < gate.dim(0); ++i) {
    const float* g = gate.f32() + i * gate.stride(0);
    const float* u = up.f32() + i * up.stride(0);
    float* o = out.f32() + i * out.stride(0);
    for (int64_t j = 0; j < gate.dim(1); ++j) o[j] = g[j] / (1.0f + std::exp(-g[j])) * u[j];
  }
}

void embedding(const Tensor& table, const Tensor& ids, Tensor& out) {
  DSI_CHECK(table.ndim() == 2 && table.is_contiguous(), "embedding: table must be [vocab, d], got {}",
            table.desc());
  DSI_CHECK(ids.ndim() == 1, "embedding: ids must be [n], got {}", ids.desc());
  check_shape(out, {ids.dim(0), table.dim(1)}, "embedding out");
  check_dtype(out, DType::F32, "embedding out");
  const int64_t vocab = table.dim(0), d = table.dim(1);
  for (int64_t i = 0; i < ids.dim(0); ++i) {
    const int64_t id = ids.i32()[i];
    DSI_CHECK(id >= 0 && id < vocab, "token id {} is outside the vocabulary [0, {})", id, vocab);
    float* o = out.f32() + i * out.stride(0);
    load_span_as_f32(table.raw(), table.dtype(), id * d, d, o);
  }
}

void run_beside(Device, const std::function<void()>& side, const std::function<void()>& main) {
  side();
  main();
}

}  // namespace dsi::cpu
