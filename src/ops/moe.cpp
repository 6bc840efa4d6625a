// Dispatch of the MoE ops; see moe.h.
#include "ops/moe.h"

#include "ops/dispatch.h"

namespace dsi::ops {

void moe_route(const Tensor& router_logits, const Tensor& bias, const RouterParams& p,
               Tensor& expert_ids, Tensor& weights) {
  DSI_DISPATCH(router_logits.device(), moe_route, router_logits, bias, p, expert_ids, weights);
}
void moe_experts(const Tensor& x, const Tensor& expert_ids, const Tensor& weights,
                 const std::vector<MlpWeights>& experts, int first_expert, int n_experts,
                 Tensor& out, const MlpWeights* shared) {
  DSI_DISPATCH(x.device(), moe_experts, x, expert_ids, weights, experts, first_expert, n_experts,
               out, shared);
}
void mlp(const Tensor& x, const MlpWeights& w, Tensor& out) { DSI_DISPATCH(x.device(), mlp, x, w, out); }

}  // namespace dsi::ops
