// Normalisation ops of the CUDA backend; see norm.h and ops/norm.h (HF GlmMoeDsaRMSNorm, nn.LayerNorm).
#include "backends/cuda/common.cuh"
#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/norm/norm.h"

namespace dsi::cuda {

namespace {

constexpr int kNormThreads = 256;

__global__ void __launch_bounds__(kNormThreads) rms_norm_kernel(NormParams p) {
  __shared__ float red[33];
  for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
    const float* x = p.x + r * p.x_stride;
    float* o = p.out + r * p.out_stride;
    float ss = 0.0f;
    for (int64_t j = threadIdx.x; j < p.d; j += blockDim.x) ss = __fadd_rn(ss, __fmul_rn(x[j], x[j]));
    ss = block_sum(ss, red);
    // CPU: 1 / sqrt(ss / d + eps), then w * (x * inv)
    const float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, float(p.d)), p.eps)));
    for (int64_t j = threadIdx.x; j < p.d; j += blockDim.x)
      o[j] = __fmul_rn(p.weight[j], __fmul_rn(x[j], inv));
  }
}

__global__ void __launch_bounds__(kNormThreads) layer_norm_kernel(NormParams p) {
  __shared__ float red[33];
  for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
    const float* x = p.x + r * p.x_stride;
    float* o = p.out + r * p.out_stride;
    float s = 0.0f;
    for (int64_t j = threadIdx.x; j < p.d; j += blockDim.x) s = __fadd_rn(s, x[j]);
    const float mean = __fdiv_rn(block_sum(s, red), float(p.d));
    float v = 0.0f;
    for (int64_t j = threadIdx.x; j < p.d; j += blockDim.x) {
      const float c = __fsub_rn(x[j], mean);
      v = __fadd_rn(v, __fmul_rn(c, c));
    }
    const float var = __fdiv_rn(block_sum(v, red), float(p.d));
    const float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(var, p.eps)));
    // CPU: (x - mean) * inv * w + b
    for (int64_t j = threadIdx.x; j < p.d; j += blockDim.x)
      o[j] = __fadd_rn(__fmul_rn(__fmul_rn(__fsub_rn(x[j], mean), inv), p.weight[j]), p.bias[j]);
  }
}

void check_rows(const Tensor& x, const Tensor& weight, const Tensor& out, const char* op) {
  DSI_CHECK(x.ndim() == 2 && x.stride(1) == 1, "{}: x must be [n, d] with contiguous rows, got {}",
            op, x.desc());
  check_dtype(x, DType::F32, op);
  check_shape(weight, {x.dim(1)}, op);
  check_dtype(weight, DType::F32, op);
  DSI_CHECK(out.shape() == x.shape() && out.stride(1) == 1, "{}: out {} for x {}", op, out.desc(),
            x.desc());
  check_dtype(out, DType::F32, op);
  check_on(weight, x.device(), op, "weight");
  check_on(out, x.device(), op, "out");
}

NormParams params(const Tensor& x, const Tensor& weight, const Tensor& out, float eps) {
  NormParams p{};
  p.x = x.f32();
  p.weight = weight.f32();
  p.out = out.f32();
  p.x_stride = x.stride(0);
  p.out_stride = out.stride(0);
  p.rows = x.dim(0);
  p.d = x.dim(1);
  p.eps = eps;
  return p;
}

}  // namespace

void launch_rms_norm(const NormParams& p, cudaStream_t s) {
  if (p.rows == 0) return;
  rms_norm_kernel<<<grid_items(p.rows), kNormThreads, 0, s>>>(p);
  DSI_CUDA_CHECK_LAUNCH();
}

void launch_layer_norm(const NormParams& p, cudaStream_t s) {
  if (p.rows == 0) return;
  layer_norm_kernel<<<grid_items(p.rows), kNormThreads, 0, s>>>(p);
  DSI_CUDA_CHECK_LAUNCH();
}

void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) {
  check_rows(x, weight, out, "rms_norm");
  DeviceGuard guard(x.device());
  launch_rms_norm(params(x, weight, out, eps), stream());
}

void layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps, Tensor& out) {
  check_rows(x, weight, out, "layer_norm");
  check_shape(bias, {x.dim(1)}, "layer_norm bias");
  check_dtype(bias, DType::F32, "layer_norm bias");
  check_on(bias, x.device(), "layer_norm", "bias");
  DeviceGuard guard(x.device());
  NormParams p = params(x, weight, out, eps);
  p.bias = bias.f32();
  launch_layer_norm(p, stream());
}

}  // namespace dsi::cuda
