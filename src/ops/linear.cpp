// Dispatch of the linear ops; see linear.h.
#include "ops/linear.h"

#include "backends/cpu/cpu_linear_fp8.h"
#include "ops/dispatch.h"
#ifdef DSI_WITH_CUDA
#include "backends/cuda/cuda_linear_fp8.h"
#endif

namespace dsi::ops {

void linear(const Tensor& x, const LinearWeight& w, Tensor& out) {
  DSI_DISPATCH(x.device(), linear, x, w, out);
}

Tensor dequantize_rows(const LinearWeight& w, int64_t row_begin, int64_t row_end) {
  DSI_DISPATCH(w.weight.device(), dequantize_rows, w, row_begin, row_end);
}

// The fp8-activation ops have their own backend headers (cpu_linear_fp8.h, cuda_linear_fp8.h);
// DSI_DISPATCH finds them by namespace all the same.
void linear_fp8_act(const Tensor& x, const LinearWeight& w, Tensor& out) {
  DSI_DISPATCH(x.device(), linear_fp8_act, x, w, out);
}

void quantize_act_fp8(const Tensor& x, int64_t col0, int block, Tensor& q, Tensor& scales) {
  DSI_DISPATCH(x.device(), quantize_act_fp8, x, col0, block, q, scales);
}

}  // namespace dsi::ops
