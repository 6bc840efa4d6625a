// Dispatch of the element-wise ops; see elementwise.h.
#include "ops/elementwise.h"

#include "ops/dispatch.h"

namespace dsi::ops {

void copy(const Tensor& src, Tensor& dst) { DSI_DISPATCH(dst.device(), copy, src, dst); }
void scale_inplace(Tensor& a, float scale) { DSI_DISPATCH(a.device(), scale_inplace, a, scale); }
void add_inplace(Tensor& a, const Tensor& b) { DSI_DISPATCH(a.device(), add_inplace, a, b); }
void axpy_inplace(Tensor& a, const Tensor& b, float scale) {
  DSI_DISPATCH(a.device(), axpy_inplace, a, b, scale);
}
void silu_mul(const Tensor& gate, const Tensor& up, Tensor& out) {
  DSI_DISPATCH(gate.device(), silu_mul, gate, up, out);
}
void embedding(const Tensor& table, const Tensor& ids, Tensor& out) {
  DSI_DISPATCH(out.device(), embedding, table, ids, out);
}

}  // namespace dsi::ops
