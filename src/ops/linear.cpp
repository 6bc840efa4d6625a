// Dispatch of the linear ops; see linear.h.
#include "ops/linear.h"

#include "ops/dispatch.h"

namespace dsi::ops {

void linear(const Tensor& x, const LinearWeight& w, Tensor& out) {
  DSI_DISPATCH(x.device(), linear, x, w, out);
}

Tensor dequantize_rows(const LinearWeight& w, int64_t row_begin, int64_t row_end) {
  DSI_DISPATCH(w.weight.device(), dequantize_rows, w, row_begin, row_end);
}

}  // namespace dsi::ops
