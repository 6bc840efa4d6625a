// MoE on the GPU. Routing: one block per token, sigmoid scores and selection in shared memory, the
// picks by rank counting in the total order (score desc, then lower id), so expert ids are exactly
// the CPU's. Experts: tokens are grouped per expert on the host (ids and weights are read back),
// then per expert a gather, the SwiGLU MLP through linear(), and a weighted scatter-add in the CPU
// reference's expert order. Simple and exact; grouped GEMMs come with the performance work.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dsi::cuda {

struct MoeRouteParams {
  const float* logits;  // [n, n_experts] contiguous
  const float* bias;    // [n_experts]
  int32_t* ids;         // [n, k] contiguous, out
  float* weights;       // [n, k] contiguous, out
  int64_t n;
  int n_experts, k, n_group, topk_group;
  bool norm_topk_prob;
  float routed_scaling_factor;
};
size_t moe_route_smem_bytes(const MoeRouteParams& p);
void launch_moe_route(const MoeRouteParams& p, cudaStream_t stream);

// xe[i] = x[tokens[i]] (gather) for i < m.
struct MoeGatherParams {
  const float* x;          // [n, d] contiguous
  const int32_t* tokens;   // [m]
  float* xe;               // [m, d] contiguous
  int64_t m, d;
};
void launch_moe_gather(const MoeGatherParams& p, cudaStream_t stream);

// out[tokens[i]] += ye[i] * w[i] for i < m (tokens distinct within one call: no races).
struct MoeScatterParams {
  const float* ye;         // [m, d] contiguous
  const int32_t* tokens;   // [m]
  const float* w;          // [m]
  float* out;              // [n, d] contiguous
  int64_t m, d;
};
void launch_moe_scatter_add(const MoeScatterParams& p, cudaStream_t stream);

}  // namespace dsi::cuda
