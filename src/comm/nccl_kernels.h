// Device helpers of the NCCL communicator (nccl_kernels.cu, compiled by nvcc into the CUDA backend
// library): the member-order sum that keeps GPU reductions bitwise equal to the CPU communicators.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dsi::nccl_detail {

// out[e] = ((parts[0 * n + e] + parts[1 * n + e]) + parts[2 * n + e]) + ... for e < n:
// parts: [n_parts, n] F32 contiguous (row i from member i); out: [n] F32 (may alias row 0 only
// when out == parts). The same order and rounding as sum_in_member_order (lockstep.h).
// Returns the launch error (cudaSuccess when n == 0).
cudaError_t launch_member_order_sum(float* out, const float* parts, int n_parts, int64_t n,
                                    cudaStream_t stream);

}  // namespace dsi::nccl_detail
