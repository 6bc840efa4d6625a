// CPU reference: noaux_tc routing (sigmoid + correction bias, optional groups) and the expert
// computation, one expert at a time over the tokens routed to it (as HF GlmMoeDsaExperts).
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "backends/cpu/cpu_ops.h"
#include "ops/moe.h"
#include "ops/topk.h"

namespace dsi::cpu {

void moe_route(const Tensor& router_logits, const Tensor& bias, const RouterParams& p,
               Tensor& expert_ids, Tensor& weights) {
  DSI_CHECK(router_logits.ndim() == 2 && router_logits.is_contiguous(),
            "moe_route: logits must be [n, experts], got {}", router_logits.desc());
  const int64_t n = router_logits.dim(0), e = router_logits.dim(1);
  const int k = p.n_experts_active;
  check_shape(bias, {e}, "moe_route bias");
  check_shape(expert_ids, {n, k}, "moe_route expert_ids");
  check_shape(weights, {n, k}, "moe_route weights");
  DSI_CHECK(bias.is_contiguous() && expert_ids.is_contiguous() && weights.is_contiguous(),
            "moe_route: bias, expert_ids and weights must be contiguous");
  DSI_CHECK(p.n_group >= 1 && e % p.n_group == 0 && p.topk_group <= p.n_group,
            "moe_route: {} experts in {} groups, keep {}", e, p.n_group, p.topk_group);
  const int64_t per_group = e / p.n_group;
  const float ninf = -std::numeric_limits<float>::infinity();
  std::vector<float> s(static_cast<size_t>(e)), b(static_cast<size_t>(e));
  std::vector<float> gscore(static_cast<size_t>(p.n_group));
  std::vector<int32_t> order(static_cast<size_t>(e));
  std::vector<int32_t> gorder(static_cast<size_t>(p.n_group));
  for (int64_t t = 0; t < n; ++t) {
    const float* lg = router_logits.f32() + t * e;
    for (int64_t i = 0; i < e; ++i) {
      s[size_t(i)] = 1.0f / (1.0f + std::exp(-lg[i]));
      b[size_t(i)] = s[size_t(i)] + bias.f32()[i];
    }
    if (p.n_group > 1) {
      for (int g = 0; g < p.n_group; ++g) {
        const float* bg = b.data() + g * per_group;
        // Sum of the two largest selection scores of the group.
        float top1 = ninf, top2 = ninf;
        for (int64_t i = 0; i < per_group; ++i) {
          if (bg[i] > top1) {
            top2 = top1;
            top1 = bg[i];
          } else if (bg[i] > top2) {
            top2 = bg[i];
          }
        }
        gscore[size_t(g)] = top1 + top2;
      }
      std::iota(gorder.begin(), gorder.end(), 0);
      std::partial_sort(gorder.begin(), gorder.begin() + p.topk_group, gorder.end(),
                        [&](int32_t x, int32_t y) {
                          return ops::topk_before(gscore[size_t(x)], x, gscore[size_t(y)], y);
                        });
      std::vector<bool> keep(static_cast<size_t>(p.n_group), false);
      for (int g = 0; g < p.topk_group; ++g) keep[size_t(gorder[size_t(g)])] = true;
      for (int64_t i = 0; i < e; ++i)
        if (!keep[size_t(i / per_group)]) b[size_t(i)] = ninf;
    }
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t x, int32_t y) {
      return ops::topk_before(b[size_t(x)], x, b[size_t(y)], y);
    });
    int32_t* ids = expert_ids.i32() + t * k;
    float* w = weights.f32() + t * k;
    float sum = 0.0f;
    for (int j = 0; j < k; ++j) {
      ids[j] = order[size_t(j)];
      w[j] = s[size_t(ids[j])];
      sum += w[j];
    }
    const float denom = p.norm_topk_prob ? sum + 1e-20f : 1.0f;
    for (int j = 0; j < k; ++j) w[j] = w[j] / denom * p.routed_scaling_factor;
  }
}

void mlp(const Tensor& x, const MlpWeights& w, Tensor& out) {
  const int64_t n = x.dim(0), inter = w.gate_proj.out_features();
  Tensor gate = Tensor::empty({n, inter}, DType::F32);
  Tensor up = Tensor::empty({n, inter}, DType::F32);
  linear(x, w.gate_proj, gate);
  linear(x, w.up_proj, up);
  silu_mul(gate, up, gate);
  linear(gate, w.down_proj, out);
}

void moe_experts(const Tensor& x, const Tensor& expert_ids, const Tensor& weights,
                 const std::vector<MlpWeights>& experts, int first_expert, int n_experts,
                 Tensor& out, const MlpWeights* shared) {
  // ops::moe_experts checked the shapes.
  const int64_t n = x.dim(0), d = x.dim(1), k = expert_ids.dim(1);
  std::fill_n(out.f32(), n * d, 0.0f);
  std::vector<std::vector<std::pair<int64_t, float>>> routed(experts.size());
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = expert_ids.i32()[t * k + j];
      DSI_CHECK(e >= 0 && e < n_experts, "moe_experts: expert id {} outside [0, {})", e, n_experts);
      const int64_t local = int64_t(e) - first_expert;
      if (local < 0 || local >= int64_t(experts.size())) continue;  // held by another rank
      routed[size_t(local)].push_back({t, weights.f32()[t * k + j]});
    }
  }
  for (size_t e = 0; e < experts.size(); ++e) {
    const auto& toks = routed[e];
    if (toks.empty()) continue;
    const int64_t m = int64_t(toks.size());
    Tensor xe = Tensor::empty({m, d}, DType::F32);
    for (int64_t i = 0; i < m; ++i)
      std::copy_n(x.f32() + toks[size_t(i)].first * d, d, xe.f32() + i * d);
    Tensor ye = Tensor::empty({m, d}, DType::F32);
    mlp(xe, experts[e], ye);
    for (int64_t i = 0; i < m; ++i) {
      float* o = out.f32() + toks[size_t(i)].first * d;
      const float* y = ye.f32() + i * d;
      const float wt = toks[size_t(i)].second;
      for (int64_t c = 0; c < d; ++c) o[c] += y[c] * wt;
    }
  }
  if (shared != nullptr && n * d > 0) {
    Tensor s = Tensor::empty({n, d}, DType::F32);
    mlp(x, *shared, s);
    for (int64_t i = 0; i < n * d; ++i) out.f32()[i] += s.f32()[i];
  }
}

void moe(const Tensor& x, const Tensor& router_logits, const Tensor& bias, const RouterParams& rp,
         const std::vector<MlpWeights>& experts, int first_expert, int n_experts, Tensor& expert_ids,
         Tensor& weights, Tensor& out, const MlpWeights* shared) {
  moe_route(router_logits, bias, rp, expert_ids, weights);
  moe_experts(x, expert_ids, weights, experts, first_expert, n_experts, out, shared);
}

}  // namespace dsi::cpu
