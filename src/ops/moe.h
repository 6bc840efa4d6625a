// DeepSeek MoE: noaux_tc routing (sigmoid scores, correction bias for selection only, optional
// groups) and the routed + shared expert computation (dsa-reference.md section 2, FFN).
#pragma once

#include <vector>

#include "core/tensor.h"
#include "ops/linear.h"

namespace dsi {

struct MlpWeights {
  LinearWeight gate_proj;  // [inter, hidden]
  LinearWeight up_proj;    // [inter, hidden]
  LinearWeight down_proj;  // [hidden, inter]
};

struct RouterParams {
  int n_experts_active = 8;  // top-k experts per token
  int n_group = 1;
  int topk_group = 1;
  bool norm_topk_prob = true;
  float routed_scaling_factor = 1.0f;
};

namespace ops {

// Selection uses b = sigmoid(logits) + bias; with n_group > 1 a group scores the sum of its top-2 b
// and only the topk_group best groups stay eligible. Weights are the plain sigmoid scores of the
// picked experts, normalised to sum 1 when norm_topk_prob, times routed_scaling_factor.
// Ties (score, then lower expert id / group id first) follow the total order of ops/topk.h.
// router_logits: [n, E] f32; bias: [E] f32; expert_ids: [n, k] i32; weights: [n, k] f32.
void moe_route(const Tensor& router_logits, const Tensor& bias, const RouterParams& p,
               Tensor& expert_ids, Tensor& weights);

// out = sum_k weights[t, k] * Expert_{ids[t, k]}(x[t]) over the experts this rank holds, in
// ascending (expert id, k), then + Shared(x[t]) when shared is not null: experts[j] is expert
// first_expert + j; routed ids outside that range contribute nothing (another rank adds them:
// expert parallelism). Expert(x) = down(silu(gate x) * up x), the shared expert's likewise (its
// own width; tensor parallelism may split it). The backends may run the shared expert with the
// routed ones (one launch per projection on the GPU).
// x: [n, hidden] f32; expert_ids: [n, k] i32 in [0, n_experts); weights: [n, k] f32;
// out: [n, hidden] f32.
void moe_experts(const Tensor& x, const Tensor& expert_ids, const Tensor& weights,
                 const std::vector<MlpWeights>& experts, int first_expert, int n_experts,
                 Tensor& out, const MlpWeights* shared = nullptr);

// moe_route, then moe_experts with the ids and weights it picks (both written): one op, so that a
// backend can route a decode batch and lay out its experts' work in one pass (one kernel on the GPU).
void moe(const Tensor& x, const Tensor& router_logits, const Tensor& bias, const RouterParams& rp,
         const std::vector<MlpWeights>& experts, int first_expert, int n_experts, Tensor& expert_ids,
         Tensor& weights, Tensor& out, const MlpWeights* shared = nullptr);

// Dense SwiGLU MLP (dense layers and the shared expert). x: [n, hidden]; out: [n, hidden].
void mlp(const Tensor& x, const MlpWeights& w, Tensor& out);

}  // namespace ops
}  // namespace dsi
