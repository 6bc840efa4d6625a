// Dispatch of the linear ops; see linear.h.
#include "ops/linear.h"

#include "backends/cpu/cpu_linear_fp8.h"
#include "backends/cpu/cpu_ops.h"
#include "ops/dispatch.h"
#include "ops/norm.h"
#ifdef DSI_WITH_CUDA
#include "backends/cuda/cuda_linear_fp8.h"
#endif

namespace dsi::ops {

void linear(const Tensor& x, const LinearWeight& w, Tensor& out) {
  DSI_DISPATCH(x.device(), linear, x, w, out);
}

void share_host_cores(int ranks_on_host) { cpu::share_host_cores(ranks_on_host); }

void rms_norm_linear(const Tensor& x, const Tensor& norm_w, float eps, const LinearWeight& w, Tensor& out) {
  DSI_CHECK(x.ndim() == 2 && x.dim(1) == w.in_features() && x.stride(1) == 1,
            "rms_norm_linear: input {} does not match weight {}", x.desc(), w.weight.desc());
  check_dtype(x, DType::F32, "rms_norm_linear input");
  check_shape(norm_w, {x.dim(1)}, "rms_norm_linear norm weight");
  check_dtype(norm_w, DType::F32, "rms_norm_linear norm weight");
  DSI_CHECK(out.ndim() == 2 && out.dim(0) == x.dim(0) && out.dim(1) == w.out_features() && out.stride(1) == 1,
            "rms_norm_linear: output {} for input {} and weight {}", out.desc(), x.desc(), w.weight.desc());
  check_dtype(out, DType::F32, "rms_norm_linear output");
#ifdef DSI_WITH_CUDA
  if (x.device().type == DeviceType::CUDA && norm_w.device() == x.device() && w.weight.device() == x.device() &&
      out.device() == x.device() && cuda::rms_norm_linear_fused(x, norm_w, eps, w, out))
    return;
#endif
  Tensor normed = Tensor::empty(x.shape(), DType::F32, x.device());
  rms_norm(x, norm_w, eps, normed);
  linear(normed, w, out);
}

bool rms_norm_linear_fuses(const Tensor& x, const Tensor& norm_w, const LinearWeight& w) {
#ifdef DSI_WITH_CUDA
  if (x.device().type == DeviceType::CUDA && norm_w.device() == x.device() && w.weight.device() == x.device() &&
      x.ndim() == 2 && x.dim(1) == w.in_features())
    return cuda::rms_norm_linear_fuses(x, norm_w, w);
#endif
  (void)x, (void)norm_w, (void)w;
  return false;
}

void check_linear_weight(const LinearWeight& w) {
  const Tensor& wt = w.weight;
  DSI_CHECK(wt.ndim() == 2 && wt.is_contiguous(), "linear: weight must be a contiguous [out, in], got {}",
            wt.desc());
  if (wt.dtype() != DType::F8_E4M3) return;
  DSI_CHECK(w.scale_inv.defined(), "linear: fp8 weight {} without weight_scale_inv", wt.desc());
  check_dtype(w.scale_inv, DType::F32, "weight_scale_inv");
  DSI_CHECK(w.block_out > 0 && w.block_in > 0, "linear: fp8 block size {}x{}", w.block_out, w.block_in);
  DSI_CHECK(w.row0 >= 0 && w.row0 < w.block_out && w.col0 >= 0 && w.col0 < w.block_in,
            "linear: slice offsets ({}, {}) outside the first {}x{} block", w.row0, w.col0,
            w.block_out, w.block_in);
  check_shape(w.scale_inv,
              {(w.row0 + wt.dim(0) + w.block_out - 1) / w.block_out,
               (w.col0 + wt.dim(1) + w.block_in - 1) / w.block_in},
              "weight_scale_inv");
  DSI_CHECK(w.scale_inv.is_contiguous(), "weight_scale_inv must be contiguous");
}

Tensor dequantize_rows(const LinearWeight& w, int64_t row_begin, int64_t row_end) {
  DSI_DISPATCH(w.weight.device(), dequantize_rows, w, row_begin, row_end);
}

// The fp8-activation ops have their own backend headers (cpu_linear_fp8.h, cuda_linear_fp8.h);
// DSI_DISPATCH finds them by namespace all the same.
namespace {
// The fp8-activation ops' argument checks, the same for every backend.
void check_act(const Tensor& x, const char* op) {
  DSI_CHECK(x.ndim() == 2 && x.stride(1) == 1, "{}: input must be [n, in] with unit column stride, got {}",
            op, x.desc());
  check_dtype(x, DType::F32, "linear_fp8_act input");
}
}  // namespace

void linear_fp8_act(const Tensor& x, const LinearWeight& w, Tensor& out) {
  check_act(x, "linear_fp8_act");
  const Tensor& wt = w.weight;
  DSI_CHECK(wt.defined() && wt.dtype() == DType::F8_E4M3,
            "linear_fp8_act: the weight must be F8_E4M3 with block scales, got {}", wt.desc());
  dequantize_rows(w, 0, 0);  // the weight and scale checks of the linear op, with its messages
  const int64_t out_f = w.out_features(), in_f = w.in_features(), n = x.dim(0);
  DSI_CHECK(x.dim(1) == in_f, "linear_fp8_act: input {} does not match weight {}", x.desc(), wt.desc());
  DSI_CHECK(out.ndim() == 2 && out.dim(0) == n && out.dim(1) == out_f && out.stride(1) == 1,
            "linear_fp8_act: output {} for input {} and weight {}", out.desc(), x.desc(), wt.desc());
  check_dtype(out, DType::F32, "linear_fp8_act output");
  DSI_DISPATCH(x.device(), linear_fp8_act, x, w, out);
}

void quantize_act_fp8(const Tensor& x, int64_t col0, int block, Tensor& q, Tensor& scales) {
  check_act(x, "quantize_act_fp8");
  DSI_CHECK(block > 0 && col0 >= 0 && col0 < block, "quantize_act_fp8: column offset {} in blocks of {}",
            col0, block);
  const int64_t n = x.dim(0), in = x.dim(1), groups = (col0 + in + block - 1) / block;
  check_shape(q, {n, in}, "quantize_act_fp8 q");
  check_dtype(q, DType::F8_E4M3, "quantize_act_fp8 q");
  check_shape(scales, {n, groups}, "quantize_act_fp8 scales");
  check_dtype(scales, DType::F32, "quantize_act_fp8 scales");
  DSI_CHECK(q.is_contiguous() && scales.is_contiguous(), "quantize_act_fp8: outputs must be contiguous");
  DSI_DISPATCH(x.device(), quantize_act_fp8, x, col0, block, q, scales);
}

}  // namespace dsi::ops
