// MoE ops of the CUDA backend; see moe.h and ops/moe.h.
#include <algorithm>
#include <map>
#include <mutex>
#include <vector>

#include "backends/cuda/common.cuh"
#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/linear/linear.h"
#include "backends/cuda/memory/memory.h"
#include "backends/cuda/moe/moe.h"
#include "model/weights.h"
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

__global__ void moe_pairs_kernel(MoePairParams p) {
  const int64_t q = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (q >= p.pairs) return;
  const int64_t t = q / p.k;
  const int32_t e = p.ids[q];
  if (e < 0 || e >= p.n_experts) atomicMin(p.bad, static_cast<unsigned long long>(q));
  const int64_t local = int64_t(e) - p.first_expert;
  const bool held = e >= 0 && e < p.n_experts && local >= 0 && local < p.n_local;
  GemvGroup* gate = p.groups;
  GemvGroup* up = p.groups + p.pairs;
  GemvGroup* down = p.groups + 2 * p.pairs;
  const MoeExpertPtrs* ex = held ? p.experts + local : nullptr;
  gate[q] = {p.x + t * p.d, held ? ex->w[0] : nullptr, held ? ex->scale[0] : nullptr,
             p.gate + q * p.inter};
  up[q] = {p.x + t * p.d, held ? ex->w[1] : nullptr, held ? ex->scale[1] : nullptr,
           p.up + q * p.inter};
  down[q] = {p.gate + q * p.inter, held ? ex->w[2] : nullptr, held ? ex->scale[2] : nullptr,
             p.ys + q * p.d};
}

__global__ void moe_combine_kernel(MoeCombineParams p) {
  const int64_t total = p.n * p.d;
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += step) {
    const int64_t t = i / p.d, c = i % p.d;
    const int32_t* ids = p.ids + t * p.k;
    float acc = 0.0f;
    // The held slots in ascending expert id (ids of one token are distinct), as the CPU adds.
    int32_t prev = -1;
    for (int64_t n = 0; n < p.k; ++n) {
      int64_t best = -1;
      for (int64_t j = 0; j < p.k; ++j) {
        const int32_t e = ids[j];
        const int64_t local = int64_t(e) - p.first_expert;
        if (e <= prev || local < 0 || local >= p.n_local) continue;
        if (best < 0 || e < ids[best]) best = j;
      }
      if (best < 0) break;
      prev = ids[best];
      acc = __fadd_rn(acc, __fmul_rn(p.ys[(t * p.k + best) * p.d + c], p.w[t * p.k + best]));
    }
    p.out[i] = acc;
  }
}

}  // namespace

void launch_moe_pairs(const MoePairParams& p, cudaStream_t s) {
  if (p.pairs == 0) return;
  moe_pairs_kernel<<<unsigned((p.pairs + 127) / 128), 128, 0, s>>>(p);
  DSI_CUDA_CHECK_LAUNCH();
}

void launch_moe_combine(const MoeCombineParams& p, cudaStream_t s) {
  if (p.n * p.d == 0) return;
  moe_combine_kernel<<<grid_for(p.n * p.d, 256), 256, 0, s>>>(p);
  DSI_CUDA_CHECK_LAUNCH();
}

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

namespace {

// The device-routed path's view of one layer's local experts: their pointers on the device and the
// shape of each projection. Built on first use (a host-to-device copy, so before any capture) and
// kept per experts vector; rebuilt if that vector's weights changed.
struct ExpertTable {
  std::vector<MoeExpertPtrs> host;
  Tensor device;      // [n_local * sizeof(MoeExpertPtrs)] u8
  GemvParams proj[3]; // the shared shape, dtype and blocks of gate, up, down
  bool uniform = false;
};

bool same_shape(const GemvParams& a, const GemvParams& b) {
  return a.kind == b.kind && a.in == b.in && a.out == b.out && a.scale_cols == b.scale_cols &&
         a.row0 == b.row0 && a.col0 == b.col0 && a.block_out == b.block_out &&
         a.block_in == b.block_in;
}

const LinearWeight& projection(const MlpWeights& m, int i) {
  return i == 0 ? m.gate_proj : i == 1 ? m.up_proj : m.down_proj;
}

const ExpertTable& expert_table(const std::vector<MlpWeights>& experts, Device dev) {
  static std::mutex mu;
  static std::map<const void*, ExpertTable> tables;
  std::lock_guard<std::mutex> lock(mu);
  std::vector<MoeExpertPtrs> host(experts.size());
  for (size_t e = 0; e < experts.size(); ++e)
    for (int i = 0; i < 3; ++i) {
      const LinearWeight& w = projection(experts[e], i);
      host[e].w[i] = w.weight.raw();
      host[e].scale[i] = w.weight.dtype() == DType::F8_E4M3 ? w.scale_inv.f32() : nullptr;
    }
  ExpertTable& t = tables[&experts];
  const auto same = [](const MoeExpertPtrs& a, const MoeExpertPtrs& b) {
    return std::equal(a.w, a.w + 3, b.w) && std::equal(a.scale, a.scale + 3, b.scale);
  };
  if (t.device.defined() && t.host.size() == host.size() &&
      std::equal(host.begin(), host.end(), t.host.begin(), same))
    return t;
  DSI_CHECK(capture_state() == nullptr,
            "moe_experts: the experts' table is built by an eager run before a step is captured");
  t = ExpertTable{};
  t.host = host;
  t.uniform = !experts.empty();
  for (int i = 0; i < 3 && t.uniform; ++i) {
    t.proj[i] = gemv_weight_params(projection(experts[0], i));
    for (const MlpWeights& m : experts) {
      const LinearWeight& w = projection(m, i);
      validate_weight(w, 0, w.out_features());
      GemvParams q = gemv_weight_params(w);
      q.x = nullptr;  // the pair buffers are 16-byte aligned rows
      q.ldx = q.in;
      q.n = 1;
      t.uniform = t.uniform && same_shape(q, t.proj[i]) && w.weight.device() == dev &&
                  gemv_vector_ok(q);
    }
  }
  t.uniform = t.uniform && t.proj[0].out == t.proj[1].out && t.proj[2].in == t.proj[0].out;
  const size_t bytes = host.size() * sizeof(MoeExpertPtrs);
  t.device = Tensor::empty({int64_t(std::max<size_t>(bytes, 1))}, DType::U8, dev);
  if (bytes > 0) t.device.copy_from(Tensor::wrap(host.data(), {int64_t(bytes)}, DType::U8));
  return t;
}

// The experts of a decode batch, routed on the device (moe.h).
void moe_experts_on_device(const Tensor& x, const Tensor& expert_ids, const Tensor& weights,
                           const ExpertTable& table, int first_expert, int n_experts, Tensor& out) {
  const int64_t n = x.dim(0), d = x.dim(1), k = expert_ids.dim(1), pairs = n * k;
  const int64_t inter = table.proj[0].out;
  Scratch buf(size_t(pairs * (2 * inter + d)) * sizeof(float));
  Scratch groups(size_t(3 * pairs) * sizeof(GemvGroup));
  ErrorFlag bad("moe_experts: an expert id outside [0, experts)");
  MoePairParams pp{};
  pp.ids = expert_ids.i32();
  pp.experts = static_cast<const MoeExpertPtrs*>(table.device.raw());
  pp.x = x.f32();
  pp.gate = buf.as<float>();
  pp.up = pp.gate + pairs * inter;
  pp.ys = pp.up + pairs * inter;
  pp.groups = groups.as<GemvGroup>();
  pp.bad = bad.ptr();
  pp.pairs = pairs;
  pp.k = k;
  pp.d = d;
  pp.inter = inter;
  pp.first_expert = first_expert;
  pp.n_local = int(table.host.size());
  pp.n_experts = n_experts;
  launch_moe_pairs(pp, stream());
  const int sms = sm_count();
  for (int i = 0; i < 3; ++i) {
    GemvParams g = table.proj[i];
    g.x = i == 2 ? pp.gate : pp.x;  // representative operands for the alignment checks
    g.y = i == 0 ? pp.gate : i == 1 ? pp.up : pp.ys;
    g.ldx = g.in;
    g.ldy = g.out;
    g.n = 1;
    g.groups = pp.groups + i * pairs;
    g.n_groups = int(pairs);
    launch_gemv(g, gemv_plan(g, sms), stream());
    if (i == 1) {
      Tensor gate = Tensor::wrap(pp.gate, {pairs, inter}, DType::F32, x.device());
      Tensor up = Tensor::wrap(pp.up, {pairs, inter}, DType::F32, x.device());
      silu_mul(gate, up, gate);
    }
  }
  launch_moe_combine({expert_ids.i32(), weights.f32(), pp.ys, out.f32(), n, k, d, first_expert,
                      pp.n_local},
                     stream());
  const unsigned long long first = bad.read();
  if (first != ErrorFlag::kNone)
    fail("moe_experts: expert id {} outside [0, {})", read_device(expert_ids.i32() + first),
         n_experts);
}

}  // namespace

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
  if (n * k > 0 && n * k <= kMoeDeviceRoutedPairs && d > 0) {
    const ExpertTable& table = expert_table(experts, x.device());
    // Every pair's rows (x rows, gate rows) must keep the GEMV's 16-byte alignment.
    const bool aligned = d % 4 == 0 && table.proj[0].out % 4 == 0 &&
                         reinterpret_cast<uintptr_t>(x.raw()) % 16 == 0;
    if (table.uniform && aligned) {
      moe_experts_on_device(x, expert_ids, weights, table, first_expert, n_experts, out);
      return;
    }
  }
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
  DSI_CUDA_CHECK(cudaMemcpyAsync(tok_d.as<void>(), tokens.data(), tokens.size() * sizeof(int32_t),
                                 cudaMemcpyHostToDevice, stream()));
  DSI_CUDA_CHECK(cudaMemcpyAsync(tw_d.as<void>(), tw.data(), tw.size() * sizeof(float),
                                 cudaMemcpyHostToDevice, stream()));
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
