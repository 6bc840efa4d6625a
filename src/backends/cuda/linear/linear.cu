// Linear ops of the CUDA backend; see linear.h and ops/linear.h.
#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdlib>
#include <optional>

#include "backends/cuda/common.cuh"
#include "backends/cuda/cuda_linear_fp8.h"
#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/linear/cublas.h"
#include "backends/cuda/linear/gemv.h"
#include "backends/cuda/switch_value.h"
#include "backends/cuda/linear/linear.h"
#include "backends/cuda/memory/memory.h"
#include "ops/linear.h"

namespace dsi::cuda {

namespace {

__global__ void dequantize_kernel(DequantParams p) {
  pdl_enter();
  const int64_t total = p.rows * p.in;
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += step) {
    const int64_t r = p.row_begin + i / p.in, c = i % p.in;
    float v = load_float(p.w, p.kind, r * p.in + c);
    if (p.scale_inv != nullptr)
      v = __fmul_rn(v, p.scale_inv[((p.row0 + r) / p.block_out) * p.scale_cols +
                                   (p.col0 + c) / p.block_in]);
    p.out[i] = v;
  }
}

}  // namespace

void validate_weight(const LinearWeight& w, int64_t row_begin, int64_t row_end) {
  const Tensor& wt = w.weight;
  ops::check_linear_weight(w);
  DSI_CHECK(0 <= row_begin && row_begin <= row_end && row_end <= wt.dim(0),
            "dequantize_rows: rows [{}, {}) of {}", row_begin, row_end, wt.desc());
  if (wt.dtype() == DType::F8_E4M3) check_on(w.scale_inv, wt.device(), "linear", "weight_scale_inv");
  float_kind(wt.dtype(), "linear weight");
}

GemvParams gemv_weight_params(const LinearWeight& w) {
  GemvParams p{};
  p.w = w.weight.raw();
  p.kind = float_kind(w.weight.dtype(), "linear weight");
  p.in = w.in_features();
  p.out = w.out_features();
  p.block_out = p.block_in = 1;
  if (p.kind == FloatKind::kE4M3) {
    p.scale_inv = w.scale_inv.f32();
    p.scale_cols = w.scale_inv.dim(1);
    p.row0 = w.row0;
    p.col0 = w.col0;
    p.block_out = w.block_out;
    p.block_in = w.block_in;
  }
  return p;
}

namespace {

// Dequantises rows [row_begin, row_end) of a validated weight into out (device, contiguous).
void dequantize_into(const LinearWeight& w, int64_t row_begin, int64_t row_end, float* out) {
  const GemvParams g = gemv_weight_params(w);  // the weight's fields, shared with the GEMV
  DequantParams p{};
  p.w = g.w;
  p.kind = g.kind;
  p.scale_inv = g.scale_inv;
  p.scale_cols = g.scale_cols;
  p.row0 = g.row0;
  p.col0 = g.col0;
  p.block_out = g.block_out;
  p.block_in = g.block_in;
  p.out = out;
  p.row_begin = row_begin;
  p.rows = row_end - row_begin;
  p.in = g.in;
  launch_dequantize(p, stream());
}

// C[n, m] (row stride ldc) = X[n, k] (row stride ldx) * W[m, k]^T (row stride k), all fp32.
void sgemm_xwt(const float* x, int64_t ldx, const float* w, float* c, int64_t ldc, int64_t n,
               int64_t m, int64_t k) {
  if (n == 1) {  // a single row: its stride is irrelevant, cuBLAS only wants ld >= the row length
    ldx = std::max(ldx, k);
    ldc = std::max(ldc, m);
  }
  DSI_CHECK(ldx >= k && ldc >= m, "linear: row strides {} (input) and {} (output) below {} and {}",
            ldx, ldc, k, m);
  DSI_CHECK(n <= INT_MAX && m <= INT_MAX && k <= INT_MAX && ldx <= INT_MAX && ldc <= INT_MAX,
            "linear: GEMM of {} x {} x {} beyond cuBLAS's 32-bit sizes", n, m, k);
  const float alpha = 1.0f, beta = 0.0f;
  // Column-major view: C^T [m, n] = W [k, m]^T * X^T [k, n].
  DSI_CUBLAS_CHECK(cublasSgemm(cublas_handle(), CUBLAS_OP_T, CUBLAS_OP_N, int(m), int(n), int(k),
                               &alpha, w, int(k), x, int(ldx), &beta, c, int(ldc)));
}

// y = x W^T for 1..kGemvMaxRows rows of x by the weight-streaming GEMV (gemv.h) on a validated
// weight. x rows that are not 16-byte aligned are first packed into an aligned scratch copy (a few
// KB), so the weight is still read with 16-byte loads.
void linear_gemv(const Tensor& x, const LinearWeight& w, Tensor& out) {
  GemvParams p = gemv_weight_params(w);
  p.x = x.f32();
  p.ldx = x.stride(0);
  p.y = out.f32();
  p.ldy = out.stride(0);
  p.n = int(x.dim(0));
  std::optional<Scratch> packed;
  if (!gemv_vector_ok(p)) {
    GemvParams q = p;  // would the weight qualify with an aligned, contiguous x?
    q.x = nullptr;
    q.ldx = p.in;
    if (gemv_vector_ok(q)) {
      packed.emplace(size_t(p.n * p.in) * sizeof(float));
      DSI_CUDA_CHECK(cudaMemcpy2DAsync(packed->as<float>(), size_t(p.in) * sizeof(float), p.x,
                                       size_t(p.ldx) * sizeof(float), size_t(p.in) * sizeof(float),
                                       size_t(p.n), cudaMemcpyDeviceToDevice, stream()));
      p.x = packed->as<float>();
      p.ldx = p.in;
    }
  }
  launch_gemv(p, gemv_plan(p, sm_count()), stream());
}

}  // namespace

void launch_dequantize(const DequantParams& p, cudaStream_t s) {
  const int64_t total = p.rows * p.in;
  if (total == 0) return;
  launch(dequantize_kernel, grid_for(total, 256), 256, 0, s, p);
}

void dequantize_rows_to(const LinearWeight& w, int64_t row_begin, int64_t row_end, Tensor& out) {
  validate_weight(w, row_begin, row_end);
  check_shape(out, {row_end - row_begin, w.weight.dim(1)}, "dequantize_rows out");
  check_dtype(out, DType::F32, "dequantize_rows out");
  DSI_CHECK(out.is_contiguous(), "dequantize_rows: out must be contiguous");
  check_on(out, w.weight.device(), "dequantize_rows", "out");
  DeviceGuard guard(w.weight.device());
  dequantize_into(w, row_begin, row_end, out.f32());
}

Tensor dequantize_rows(const LinearWeight& w, int64_t row_begin, int64_t row_end) {
  validate_weight(w, row_begin, row_end);
  const int64_t in = w.weight.dim(1);
  Tensor host = Tensor::empty({row_end - row_begin, in}, DType::F32);
  if (host.numel() == 0) return host;
  DeviceGuard guard(w.weight.device());
  Scratch buf(size_t(host.numel()) * sizeof(float));
  dequantize_into(w, row_begin, row_end, buf.as<float>());
  copy_to_host(host.raw(), buf.as<void>(), host.nbytes());
  return host;
}

namespace {
std::atomic<int> g_fp8_prefill{-1};  // -1: DSI_FP8_PREFILL not read yet
}  // namespace

bool fp8_prefill() {
  return switch_value(g_fp8_prefill, [] { return env_switched_on("DSI_FP8_PREFILL") ? 1 : 0; }) == 1;
}

void set_fp8_prefill(bool on) { g_fp8_prefill.store(on ? 1 : 0); }

void linear(const Tensor& x, const LinearWeight& w, Tensor& out) {
  const int64_t out_f = w.out_features(), in_f = w.in_features();
  DSI_CHECK(x.ndim() == 2 && x.dim(1) == in_f && x.stride(1) == 1,
            "linear: input {} does not match weight {}", x.desc(), w.weight.desc());
  check_dtype(x, DType::F32, "linear input");
  DSI_CHECK(out.ndim() == 2 && out.dim(0) == x.dim(0) && out.dim(1) == out_f && out.stride(1) == 1,
            "linear: output {} for input {} and weight {}", out.desc(), x.desc(), w.weight.desc());
  check_dtype(out, DType::F32, "linear output");
  check_on(w.weight, x.device(), "linear", "weight");
  check_on(out, x.device(), "linear", "output");
  const int64_t n = x.dim(0);
  if (n == 0 || out_f == 0) return;
  DeviceGuard guard(x.device());
  if (in_f == 0) {
    fill_f32(out, 0.0f);
    return;
  }
  if (n <= kGemvMaxRows) {  // decode: stream the weight once at memory bandwidth
    validate_weight(w, 0, out_f);
    linear_gemv(x, w, out);
    return;
  }
  if (w.weight.dtype() == DType::F8_E4M3 && fp8_prefill()) {  // prefill: fp8 tensor cores
    validate_weight(w, 0, out_f);
    linear_fp8_act(x, w, out);
    return;
  }
  if (w.weight.dtype() == DType::F32 && w.weight.is_contiguous()) {
    sgemm_xwt(x.f32(), x.stride(0), w.weight.f32(), out.f32(), out.stride(0), n, out_f, in_f);
    return;
  }
  validate_weight(w, 0, out_f);
  // Dequantise up to 64 MiB of fp32 weight rows at a time into one reused scratch buffer.
  const int64_t chunk = std::min(out_f, std::max<int64_t>(1, (int64_t(1) << 24) / in_f));
  Scratch wf(size_t(chunk * in_f) * sizeof(float));
  for (int64_t r0 = 0; r0 < out_f; r0 += chunk) {
    const int64_t r1 = std::min(out_f, r0 + chunk);
    dequantize_into(w, r0, r1, wf.as<float>());
    sgemm_xwt(x.f32(), x.stride(0), wf.as<float>(), out.f32() + r0, out.stride(0), n, r1 - r0, in_f);
  }
}

namespace {
std::atomic<int> g_norm_in_gemv{-1};  // -1: DSI_GEMV_NORM not read yet
}  // namespace

bool norm_in_gemv() {
  return switch_value(g_norm_in_gemv, [] { return env_switched_off("DSI_GEMV_NORM") ? 0 : 1; }) == 1;
}

void set_norm_in_gemv(bool on) { g_norm_in_gemv.store(on ? 1 : 0); }

namespace {
// The one-row tensor-map GEMV's parameters and plan with the norm in its prologue; false where that
// kernel does not take the product (the caller runs the norm and the linear).
bool fused_norm_plan(const Tensor& x, const Tensor& norm_w, float eps, const LinearWeight& w, float* y,
                     int64_t ldy, GemvParams& p, GemvPlan& plan) {
  if (x.dim(0) != 1 || w.weight.dtype() != DType::F8_E4M3 || !gemv_tma() || !norm_in_gemv()) return false;
  validate_weight(w, 0, w.out_features());
  p = gemv_weight_params(w);
  p.x = x.f32();
  p.ldx = x.stride(0);
  p.y = y;
  p.ldy = ldy;
  p.n = 1;
  p.norm_w = norm_w.f32();
  p.norm_eps = eps;
  if (!gemv_tma_ok(p) || reinterpret_cast<uintptr_t>(p.norm_w) % 16 != 0) return false;
  plan = gemv_plan(p, sm_count());
  return plan.tma.warp_tiles > 0;
}
}  // namespace

bool rms_norm_linear_fuses(const Tensor& x, const Tensor& norm_w, const LinearWeight& w) {
  DeviceGuard guard(x.device());
  GemvParams p;
  GemvPlan plan;
  return fused_norm_plan(x, norm_w, 0.0f, w, nullptr, w.out_features(), p, plan);
}

bool rms_norm_linear_fused(const Tensor& x, const Tensor& norm_w, float eps, const LinearWeight& w, Tensor& out) {
  DeviceGuard guard(x.device());
  GemvParams p;
  GemvPlan plan;
  if (!fused_norm_plan(x, norm_w, eps, w, out.f32(), out.stride(0), p, plan)) return false;
  launch_gemv(p, plan, stream());
  return true;
}

}  // namespace dsi::cuda
