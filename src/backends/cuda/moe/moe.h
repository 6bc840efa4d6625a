// MoE on the GPU. Routing: one block per token, sigmoid scores and selection in shared memory, the
// picks by rank counting in the total order (score desc, then lower id), so expert ids are exactly
// the CPU's. Experts, two ways:
// - Decode batches (at most kMoeDeviceRoutedPairs (token, expert) pairs) stay on the device, so a
//   step can be captured into a graph: a kernel turns the ids into one slot per pair (expert
//   weights through a per-layer pointer table built once; with ops::moe the routing kernel itself,
//   else the pairs kernel), the shared expert as one more slot per
//   token (up to kMoeFusedSharedTokens tokens; with more its own MLP over all of them, so its
//   weights are read once). Then two GEMV launches: gate, up and SwiGLU of every slot (one grouped
//   GEMV whose warps read a gate row and the up row of the same output, so only the activation
//   reaches memory), and per token the down products of its slots weighted by their routing
//   weights and summed in one pass (a segment-sum GEMV whose reduced dimension runs through the
//   slots in turn), plus the unfused shared expert's output. Batches of more than
//   moe_segment_tokens() tokens (cuda_ops.h), and experts the segment kernel does not take
//   (gemv_seg_ok), run the down products as one grouped GEMV of a product per slot instead, then the weighted sum per token in ascending expert order, as the
//   CPU reference adds (measured faster there: see kMoeSegmentTokens).
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

// The slots of a decode batch: routed pair q = t * k + j (q < pairs) computes its expert (skipped,
// w = null, when another rank holds it); with a shared expert, slot pairs + t computes the shared
// expert of token t. Per slot q: groups[q], the swiglu product of gate and up into act row q
// ([slots, inter], inter the larger of the two experts' widths); and the down product of act row q
// as segment j of token t (segs[t * n_seg + j], j = k for the shared slot) with coefficient
// weights[q] (1 for the shared expert); or, with down_groups, the down product of act row q into
// ys row q (down_groups[q]). Ids outside [0, n_experts) lower *bad to q.
struct MoePairParams {
  const int32_t* ids;             // [n, k]
  const float* weights;           // [n, k] routing weights
  const MoeExpertPtrs* experts;   // [n_local], then the shared expert when shared
  const float* x;                 // [n, d]
  float* act;                     // [slots, inter]
  GemvGroup* groups;              // [slots]: gate and up (swiglu)
  GemvSegment* segs;              // [n, n_seg]: down (segment sums), or null
  GemvGroup* down_groups;         // [slots]: down (grouped), or null
  float* ys;                      // [slots, d]: the grouped down products
  GemvGroup shape[2][3];          // shapes of the routed [0] and shared [1] gate, up and down
  unsigned long long* bad;
  int64_t pairs, slots, k, d, inter;
  int n_seg;                      // k, or k + 1 with the shared slot
  int first_expert, n_local, n_experts;
};
void launch_moe_pairs(const MoePairParams& p, cudaStream_t stream);
// Routing that also writes the slots (slots.groups set: what launch_moe_pairs would write, from the
// ids it picks; slots.ids is not read), so a decode batch's MoE has one kernel fewer.
void launch_moe_route_slots(const MoeRouteParams& p, const MoePairParams& slots, cudaStream_t stream);

// Decode batches of up to this many tokens take the segment-sum down launch; larger ones the
// grouped down products and moe_combine. Measured (bench_moe, one H200, us per MoE layer, segment
// sum against grouped + combine): 1 token GLM-5.2 115.9 / 116.2, DeepSeek-V3.2 128.7 / 133.8;
// 2 tokens 219.4 / 199.9 and 240.5 / 227.6; 4 tokens (GLM-5.2) 375-397 / 358.1.
inline constexpr int kMoeSegmentTokens = 1;

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
