// MoE ops of the CUDA backend; see moe.h and ops/moe.h.
#include <algorithm>
#include <vector>

#include "backends/cuda/common.cuh"
#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/moe/moe.h"
#include "ops/moe.h"

namespace dsi::cuda {

namespace {

constexpr int kRouteThreads = 256;

__device__ __forceinline__ bool ranks_before(float a, int pa, float b, int pb) {
  return a > b || (a == b && pa < pb);  // ops::topk_before
}

// Shared memory: s[E], b[E], gscore[G] (floats), keep[G], sel[k] (ints).
__global__ void __launch_bounds__(kRouteThreads) moe_route_kernel(MoeRouteParams p) {
  extern __shared__ float smem[];
  const int E = p.n_experts, G = p.n_group, per_group = E / G;
  float* s = smem;
  float* b = s + E;
  float* gscore = b + E;
  int* keep = reinterpret_cast<int*>(gscore + G);
  int* sel = keep + G;
  for (int64_t t = blockIdx.x; t < p.n; t += gridDim.x) {
    const float* lg = p.logits + t * E;
    for (int i = threadIdx.x; i < E; i += blockDim.x) {
      const float si = __fdiv_rn(1.0f, __fadd_rn(1.0f, exp_f(-lg[i])));
      s[i] = si;
      b[i] = __fadd_rn(si, p.bias[i]);
    }
    for (int j = threadIdx.x; j < p.k; j += blockDim.x) sel[j] = 0;  // defined even for NaN scores
    __syncthreads();
    if (G > 1) {
      for (int g = threadIdx.x; g < G; g += blockDim.x) {
        // Sum of the two largest selection scores of the group (the CPU's loop).
        float top1 = -INFINITY, top2 = -INFINITY;
        for (int i = 0; i < per_group; ++i) {
          const float v = b[g * per_group + i];
          if (v > top1) {
            top2 = top1;
            top1 = v;
          } else if (v > top2) {
            top2 = v;
          }
        }
        gscore[g] = __fadd_rn(top1, top2);
      }
      __syncthreads();
      for (int g = threadIdx.x; g < G; g += blockDim.x) {
        int rank = 0;
        for (int g2 = 0; g2 < G; ++g2) rank += ranks_before(gscore[g2], g2, gscore[g], g) ? 1 : 0;
        keep[g] = rank < p.topk_group;
      }
      __syncthreads();
      for (int i = threadIdx.x; i < E; i += blockDim.x)
        if (!keep[i / per_group]) b[i] = -INFINITY;
      __syncthreads();
    }
    // Expert i is picked at position rank(i) when that rank is below k.
    for (int i = threadIdx.x; i < E; i += blockDim.x) {
      int rank = 0;
      for (int j = 0; j < E; ++j) rank += ranks_before(b[j], j, b[i], i) ? 1 : 0;
      if (rank < p.k) sel[rank] = i;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int32_t* ids = p.ids + t * p.k;
      float* w = p.weights + t * p.k;
      float sum = 0.0f;
      for (int j = 0; j < p.k; ++j) {
        ids[j] = sel[j];
        w[j] = s[sel[j]];
        sum = __fadd_rn(sum, w[j]);
      }
      const float denom = p.norm_topk_prob ? __fadd_rn(sum, 1e-20f) : 1.0f;
      for (int j = 0; j < p.k; ++j) w[j] = __fmul_rn(__fdiv_rn(w[j], denom), p.routed_scaling_factor);
    }
    __syncthreads();  // s, b and sel are rewritten for the next token
  }
}

__global__ void moe_gather_kernel(MoeGatherParams p) {
  const int64_t total = p.m * p.d;
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < total; t += step) {
    const int64_t i = t / p.d, c = t % p.d;
    p.xe[t] = p.x[int64_t(p.tokens[i]) * p.d + c];
  }
}

__global__ void moe_scatter_add_kernel(MoeScatterParams p) {
  const int64_t total = p.m * p.d;
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < total; t += step) {
    const int64_t i = t / p.d, c = t % p.d;
    float* o = p.out + int64_t(p.tokens[i]) * p.d + c;
    *o = __fadd_rn(*o, __fmul_rn(p.ye[t], p.w[i]));  // CPU: o[c] += y[c] * wt
  }
}

}  // namespace

size_t moe_route_smem_bytes(const MoeRouteParams& p) {
  return size_t(2 * p.n_experts + p.n_group) * sizeof(float) + size_t(p.n_group + p.k) * sizeof(int);
}

void launch_moe_route(const MoeRouteParams& p, cudaStream_t s) {
  if (p.n == 0) return;
  const size_t smem = moe_route_smem_bytes(p);
  DSI_CHECK(smem <= 48 * 1024, "moe_route: {} experts need too much shared memory", p.n_experts);
  moe_route_kernel<<<grid_items(p.n), kRouteThreads, smem, s>>>(p);
  DSI_CUDA_CHECK_LAUNCH();
}

void launch_moe_gather(const MoeGatherParams& p, cudaStream_t s) {
  if (p.m * p.d == 0) return;
  moe_gather_kernel<<<grid_for(p.m * p.d, 256), 256, 0, s>>>(p);
  DSI_CUDA_CHECK_LAUNCH();
}

void launch_moe_scatter_add(const MoeScatterParams& p, cudaStream_t s) {
  if (p.m * p.d == 0) return;
  moe_scatter_add_kernel<<<grid_for(p.m * p.d, 256), 256, 0, s>>>(p);
  DSI_CUDA_CHECK_LAUNCH();
}

void moe_route(const Tensor& router_logits, const Tensor& bias, const RouterParams& rp,
               Tensor& expert_ids, Tensor& weights) {
  DSI_CHECK(router_logits.ndim() == 2 && router_logits.is_contiguous(),
            "moe_route: logits must be [n, experts], got {}", router_logits.desc());
  const int64_t n = router_logits.dim(0), e = router_logits.dim(1);
  const int k = rp.n_experts_active;
  check_shape(bias, {e}, "moe_route bias");
  check_shape(expert_ids, {n, k}, "moe_route expert_ids");
  check_shape(weights, {n, k}, "moe_route weights");
  DSI_CHECK(bias.is_contiguous() && expert_ids.is_contiguous() && weights.is_contiguous(),
            "moe_route: bias, expert_ids and weights must be contiguous");
  DSI_CHECK(rp.n_group >= 1 && e % rp.n_group == 0 && rp.topk_group <= rp.n_group,
            "moe_route: {} experts in {} groups, keep {}", e, rp.n_group, rp.topk_group);
  DSI_CHECK(k >= 0 && k <= e, "moe_route: {} active experts of {}", k, e);
  check_dtype(router_logits, DType::F32, "moe_route logits");
  check_dtype(bias, DType::F32, "moe_route bias");
  check_on(bias, router_logits.device(), "moe_route", "bias");
  check_on(expert_ids, router_logits.device(), "moe_route", "expert_ids");
  check_on(weights, router_logits.device(), "moe_route", "weights");
  if (n == 0 || k == 0) return;
  DeviceGuard guard(router_logits.device());
  MoeRouteParams p{};
  p.logits = router_logits.f32();
  p.bias = bias.f32();
  p.ids = expert_ids.i32();
  p.weights = weights.f32();
  p.n = n;
  p.n_experts = int(e);
  p.k = k;
  p.n_group = rp.n_group;
  p.topk_group = rp.topk_group;
  p.norm_topk_prob = rp.norm_topk_prob;
  p.routed_scaling_factor = rp.routed_scaling_factor;
  launch_moe_route(p, stream());
}

void mlp(const Tensor& x, const MlpWeights& w, Tensor& out) {
  const int64_t n = x.dim(0), inter = w.gate_proj.out_features();
  DeviceGuard guard(x.device());
  Scratch buf(size_t(2 * n * inter) * sizeof(float));
  Tensor gate = Tensor::wrap(buf.as<float>(), {n, inter}, DType::F32, x.device());
  Tensor up = Tensor::wrap(buf.as<float>() + n * inter, {n, inter}, DType::F32, x.device());
  linear(x, w.gate_proj, gate);
  linear(x, w.up_proj, up);
  silu_mul(gate, up, gate);
  linear(gate, w.down_proj, out);
}

void moe_experts(const Tensor& x, const Tensor& expert_ids, const Tensor& weights,
                 const std::vector<MlpWeights>& experts, int first_expert, int n_experts,
                 Tensor& out) {
  DSI_CHECK(x.ndim() == 2 && x.is_contiguous(), "moe_experts: x {}", x.desc());
  const int64_t n = x.dim(0), d = x.dim(1), k = expert_ids.dim(1);
  check_shape(weights, {n, k}, "moe_experts weights");
  check_shape(out, {n, d}, "moe_experts out");
  DSI_CHECK(first_expert >= 0 && first_expert + int64_t(experts.size()) <= n_experts,
            "moe_experts: experts [{}, {}) outside [0, {})", first_expert,
            first_expert + int64_t(experts.size()), n_experts);
  DSI_CHECK(out.is_contiguous() && expert_ids.is_contiguous() && weights.is_contiguous(),
            "moe_experts: out, expert_ids and weights must be contiguous");
  check_dtype(x, DType::F32, "moe_experts x");
  check_dtype(out, DType::F32, "moe_experts out");
  check_on(expert_ids, x.device(), "moe_experts", "expert_ids");
  check_on(weights, x.device(), "moe_experts", "weights");
  check_on(out, x.device(), "moe_experts", "out");
  DeviceGuard guard(x.device());
  if (n * d > 0) DSI_CUDA_CHECK(cudaMemsetAsync(out.raw(), 0, out.nbytes(), stream()));
  // Routing table on the host (a synchronising read; the performance work keeps it on the device).
  const Tensor ids_h = to_host(expert_ids), w_h = to_host(weights);
  std::vector<std::vector<std::pair<int32_t, float>>> routed(experts.size());
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = ids_h.i32()[t * k + j];
      DSI_CHECK(e >= 0 && e < n_experts, "moe_experts: expert id {} outside [0, {})", e, n_experts);
      const int64_t local = int64_t(e) - first_expert;
      if (local < 0 || local >= int64_t(experts.size())) continue;  // held by another rank
      routed[size_t(local)].push_back({int32_t(t), w_h.f32()[t * k + j]});
    }
  }
  // One upload of every expert's token list and weights, laid out expert after expert.
  std::vector<int32_t> tokens;
  std::vector<float> tw;
  std::vector<int64_t> begin(experts.size() + 1, 0);
  int64_t max_m = 0;
  for (size_t e = 0; e < experts.size(); ++e) {
    for (const auto& [t, wt] : routed[e]) {
      tokens.push_back(t);
      tw.push_back(wt);
    }
    begin[e + 1] = int64_t(tokens.size());
    max_m = std::max<int64_t>(max_m, int64_t(routed[e].size()));
  }
  if (tokens.empty() || d == 0) return;
  Scratch tok_d(tokens.size() * sizeof(int32_t)), tw_d(tw.size() * sizeof(float));
  DSI_CUDA_CHECK(cudaMemcpy(tok_d.as<void>(), tokens.data(), tokens.size() * sizeof(int32_t),
                            cudaMemcpyHostToDevice));
  DSI_CUDA_CHECK(cudaMemcpy(tw_d.as<void>(), tw.data(), tw.size() * sizeof(float),
                            cudaMemcpyHostToDevice));
  Scratch xy(size_t(2 * max_m * d) * sizeof(float));
  for (size_t e = 0; e < experts.size(); ++e) {
    const int64_t m = begin[e + 1] - begin[e];
    if (m == 0) continue;
    Tensor xe = Tensor::wrap(xy.as<float>(), {m, d}, DType::F32, x.device());
    Tensor ye = Tensor::wrap(xy.as<float>() + max_m * d, {m, d}, DType::F32, x.device());
    launch_moe_gather({x.f32(), tok_d.as<int32_t>() + begin[e], xe.f32(), m, d}, stream());
    mlp(xe, experts[e], ye);
    launch_moe_scatter_add(
        {ye.f32(), tok_d.as<int32_t>() + begin[e], tw_d.as<float>() + begin[e], out.f32(), m, d},
        stream());
  }
}

}  // namespace dsi::cuda
