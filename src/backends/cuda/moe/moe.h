// MoE on the GPU. Routing: one block per token, sigmoid scores and selection in shared memory, the
// picks by rank counting in the total order (score desc, then lower id), so expert ids are exactly
// the CPU's. Experts, two ways:
// - Decode batches (at most kMoeDeviceRoutedPairs (token, expert) pairs) stay on the device, so a
//   step can be captured into a graph: a kernel turns the ids into one grouped-GEMV product per pair
//   and projection (expert weights through a per-layer pointer table built once), the shared
//   expert as one more product per token (up to kMoeFusedSharedTokens tokens; with more its own
//   product over all of them, so its weights are read once); gate and up of all of them are one
//   launch, down another; then the weighted sum per token in ascending expert order, as the CPU
//   reference adds, and the shared expert's output.
// - Larger batches group tokens per expert on the host (ids and weights are read back), then per
//   expert a gather, the SwiGLU MLP through linear(), and a weighted scatter-add in expert order.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/linear/gemv.h"

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

inline constexpr int64_t kMoeDeviceRoutedPairs = 256;
inline constexpr int64_t kMoeFusedSharedTokens = 2;

// One local expert's weights for the device-routed path: data and (fp8) scale_inv of each projection.
struct MoeExpertPtrs {
  const void* w[3];         // gate_proj, up_proj, down_proj
  const float* scale[3];    // null unless fp8
};

// The products of a decode batch, one slot each: routed pair q = t * k + j (q < pairs) computes
// its expert (skipped, w = null, when another rank holds it); with a shared expert, slot
// pairs + t computes the shared expert of token t. Per slot: gate and up rows [slots, inter] (inter
// the larger of the two experts' widths), ys [slots, d]. Groups: gate of every slot, then up of
// every slot (one launch), then down of every slot. Ids outside [0, n_experts) lower *bad to q.
struct MoePairParams {
  const int32_t* ids;             // [n, k]
  const MoeExpertPtrs* experts;   // [n_local], then the shared expert when shared
  const float* x;                 // [n, d]
  float* gate;                    // [slots, inter]
  float* up;                      // [slots, inter]
  float* ys;                      // [slots, d]
  GemvGroup* groups;              // [3, slots]: gate, up, down
  GemvGroup shape[2][3];          // shapes of the routed [0] and shared [1] projections
  unsigned long long* bad;
  int64_t pairs, slots, k, d, inter;
  int first_expert, n_local, n_experts;
};
void launch_moe_pairs(const MoePairParams& p, cudaStream_t stream);

// out[t] = sum over its slots of held experts in ascending (expert id, slot), as the CPU adds:
// w[t, j] * ys[t * k + j]; then + shared[t] when shared is not null.
struct MoeCombineParams {
  const int32_t* ids;   // [n, k]
  const float* w;       // [n, k]
  const float* ys;      // [n * k, d]
  const float* shared;  // [n, d] or null
  float* out;           // [n, d]
  int64_t n, k, d;
  int first_expert, n_local;
};
void launch_moe_combine(const MoeCombineParams& p, cudaStream_t stream);

}  // namespace dsi::cuda
