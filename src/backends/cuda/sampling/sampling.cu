// Sampling ops of the CUDA backend; see sampling.h and ops/sampling.h.
#include "backends/cpu/cpu_ops.h"
#include "backends/cuda/common.cuh"
#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/sampling/sampling.h"

namespace dsi::cuda {

namespace {

constexpr int kArgmaxThreads = 256;

// (v, i) beats (bv, bi): bi < 0 means "none yet"; NaN never wins; ties go to the lower id.
__device__ __forceinline__ bool argmax_better(float v, int64_t i, float bv, int64_t bi) {
  if (i < 0) return false;
  if (bi < 0) return true;
  return v > bv || (v == bv && i < bi);
}

// The CPU scans best = 0; best = i when l[i] > l[best]. With l[0] not NaN that is the lowest id of
// the maximum over the non-NaN entries; with l[0] NaN nothing ever compares greater: the answer is 0.
__global__ void __launch_bounds__(kArgmaxThreads) argmax_kernel(ArgmaxParams p) {
  pdl_enter();
  __shared__ float sv[kArgmaxThreads];
  __shared__ int64_t si[kArgmaxThreads];
  for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
    const float* l = p.logits + r * p.logit_stride;
    float bv = 0.0f;
    int64_t bi = -1;
    for (int64_t i = threadIdx.x; i < p.vocab; i += blockDim.x) {
      const float v = l[i];
      if (v == v && argmax_better(v, i, bv, bi)) {
        bv = v;
        bi = i;
      }
    }
    sv[threadIdx.x] = bv;
    si[threadIdx.x] = bi;
    __syncthreads();
    for (int half = blockDim.x / 2; half > 0; half >>= 1) {
      if (int(threadIdx.x) < half) {
        const float ov = sv[threadIdx.x + half];
        const int64_t oi = si[threadIdx.x + half];
        if (argmax_better(ov, oi, sv[threadIdx.x], si[threadIdx.x])) {
          sv[threadIdx.x] = ov;
          si[threadIdx.x] = oi;
        }
      }
      __syncthreads();
    }
    if (threadIdx.x == 0) {
      const bool first_nan = p.vocab > 0 && l[0] != l[0];
      p.out[r * p.out_stride] = int32_t(first_nan || si[0] < 0 ? 0 : si[0]);
    }
    __syncthreads();  // sv/si are rewritten for the next row
  }
}

}  // namespace

void launch_argmax(const ArgmaxParams& p, cudaStream_t s) {
  if (p.rows == 0) return;
  launch(argmax_kernel, grid_items(p.rows), kArgmaxThreads, 0, s, p);
}

void argmax(const Tensor& logits, Tensor& out) {
  DSI_CHECK(logits.ndim() == 2 && logits.stride(1) == 1, "argmax: logits {}", logits.desc());
  check_shape(out, {logits.dim(0)}, "argmax out");
  check_on(out, logits.device(), "argmax", "out");
  ArgmaxParams p{};
  p.logits = logits.f32();
  p.out = out.i32();
  p.logit_stride = logits.stride(0);
  p.out_stride = out.stride(0);
  p.rows = logits.dim(0);
  p.vocab = logits.dim(1);
  DeviceGuard guard(logits.device());
  launch_argmax(p, stream());
}

std::vector<double> token_distribution(const Tensor& logits, const SamplingParams& sp) {
  return cpu::token_distribution(to_host(logits), sp);
}

}  // namespace dsi::cuda
