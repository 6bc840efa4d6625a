// The NCCL communicator's member-order sum kernel; see nccl_kernels.h.
#include "comm/nccl_kernels.h"

namespace dsi::nccl_detail {

namespace {

// One element per thread per step (grid-stride); the parts are read in member order and added with
// explicit round-to-nearest adds (__fadd_rn is never contracted into anything else).
__global__ void member_order_sum_kernel(float* out, const float* parts, int n_parts, int64_t n) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += step) {
    float acc = parts[e];
    for (int p = 1; p < n_parts; ++p) acc = __fadd_rn(acc, parts[int64_t(p) * n + e]);
    out[e] = acc;
  }
}

}  // namespace

cudaError_t launch_member_order_sum(float* out, const float* parts, int n_parts, int64_t n,
                                    cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  constexpr int kThreads = 256;
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  const unsigned grid = unsigned(blocks < 65536 * 8 ? blocks : 65536 * 8);
  member_order_sum_kernel<<<grid, kThreads, 0, stream>>>(out, parts, n_parts, n);
  return cudaGetLastError();
}

}  // namespace dsi::nccl_detail
