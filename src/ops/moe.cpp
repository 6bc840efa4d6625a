// Dispatch of the MoE ops; see moe.h.
#include "ops/moe.h"

#include "ops/dispatch.h"

namespace dsi::ops {

void moe_route(const Tensor& router_logits, const Tensor& bias, const RouterParams& p,
               Tensor& expert_ids, Tensor& weights) {
  DSI_DISPATCH(router_logits.device(), moe_route, router_logits, bias, p, expert_ids, weights);
}
namespace {
// moe_experts' operand checks (its backends rely on them).
void check_experts(const Tensor& x, const Tensor& expert_ids, const Tensor& weights,
                   const std::vector<MlpWeights>& experts, int first_expert, int n_experts, const Tensor& out) {
  DSI_CHECK(x.ndim() == 2 && x.is_contiguous(), "moe_experts: x {}", x.desc());
  DSI_CHECK(expert_ids.ndim() == 2 && expert_ids.dim(0) == x.dim(0), "moe_experts: expert ids {} for {} tokens",
            expert_ids.desc(), x.dim(0));
  const int64_t n = x.dim(0), d = x.dim(1), k = expert_ids.dim(1);
  check_shape(weights, {n, k}, "moe_experts weights");
  check_shape(out, {n, d}, "moe_experts out");
  DSI_CHECK(first_expert >= 0 && first_expert + int64_t(experts.size()) <= n_experts,
            "moe_experts: experts [{}, {}) outside [0, {})", first_expert,
            first_expert + int64_t(experts.size()), n_experts);
  DSI_CHECK(out.is_contiguous() && expert_ids.is_contiguous() && weights.is_contiguous(),
            "moe_experts: out, expert_ids and weights must be contiguous");
}
}  // namespace

void moe_experts(const Tensor& x, const Tensor& expert_ids, const Tensor& weights,
                 const std::vector<MlpWeights>& experts, int first_expert, int n_experts,
                 Tensor& out, const MlpWeights* shared) {
  check_experts(x, expert_ids, weights, experts, first_expert, n_experts, out);
  DSI_DISPATCH(x.device(), moe_experts, x, expert_ids, weights, experts, first_expert, n_experts,
               out, shared);
}
void moe(const Tensor& x, const Tensor& router_logits, const Tensor& bias, const RouterParams& rp,
         const std::vector<MlpWeights>& experts, int first_expert, int n_experts, Tensor& expert_ids,
         Tensor& weights, Tensor& out, const MlpWeights* shared) {
  check_experts(x, expert_ids, weights, experts, first_expert, n_experts, out);
  DSI_CHECK(router_logits.ndim() == 2 && router_logits.dim(0) == x.dim(0),
            "moe: router logits {} for {} tokens", router_logits.desc(), x.dim(0));
  DSI_DISPATCH(x.device(), moe, x, router_logits, bias, rp, experts, first_expert, n_experts, expert_ids,
               weights, out, shared);
}
void mlp(const Tensor& x, const MlpWeights& w, Tensor& out) { DSI_DISPATCH(x.device(), mlp, x, w, out); }

}  // namespace dsi::ops
