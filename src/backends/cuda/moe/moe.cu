// MoE ops of the CUDA backend; see moe.h and ops/moe.h.
#include <algorithm>
#include <atomic>
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

// Slot q's gate/up group and its down segment (or down group) for expert id e (moe.h: MoePairParams).
__device__ void moe_write_slot(const MoePairParams& p, int64_t q, int32_t e) {
  const bool routed = q < p.pairs;
  const int64_t t = routed ? q / p.k : q - p.pairs;
  bool held = true;
  const MoeExpertPtrs* ex = p.experts + p.n_local;  // the shared expert
  if (routed) {
    if (e < 0 || e >= p.n_experts) atomicMin(p.bad, static_cast<unsigned long long>(q));
    const int64_t local = int64_t(e) - p.first_expert;
    held = e >= 0 && e < p.n_experts && local >= 0 && local < p.n_local;
    ex = held ? p.experts + local : nullptr;
  }
  const GemvGroup(&shape)[3] = p.shape[routed ? 0 : 1];
  float* act = p.act + q * p.inter;
  GemvGroup g = shape[0];
  g.x = p.x + t * p.d;
  g.w = held ? ex->w[0] : nullptr;
  g.scale_inv = held ? ex->scale[0] : nullptr;
  g.w2 = held ? ex->w[1] : nullptr;
  g.scale_inv2 = held ? ex->scale[1] : nullptr;
  g.y = act;
  p.groups[q] = g;
  const GemvGroup& down = shape[2];
  if (p.down_groups != nullptr) {
    GemvGroup dg = down;
    dg.x = act;
    dg.w = held ? ex->w[2] : nullptr;
    dg.scale_inv = held ? ex->scale[2] : nullptr;
    dg.y = p.ys + q * p.d;
    p.down_groups[q] = dg;
    return;
  }
  GemvSegment sg{};
  sg.x = act;
  sg.w = held ? ex->w[2] : nullptr;
  sg.scale_inv = held ? ex->scale[2] : nullptr;
  sg.coef = routed ? p.weights + q : nullptr;
  sg.in = down.in;
  sg.scale_cols = down.scale_cols;
  sg.row0 = down.row0;
  sg.col0 = down.col0;
  p.segs[t * p.n_seg + (routed ? q - t * p.k : p.k)] = sg;
}

// Shared memory: s[E], b[E], gscore[G] (floats), keep[G], sel[k] (ints). With slots.groups set
// (launch_moe_route_slots), each block also writes its token's slots, as moe_pairs_kernel would.
__global__ void __launch_bounds__(kRouteThreads) moe_route_kernel(MoeRouteParams p, MoePairParams slots) {
  pdl_enter();
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
    // Expert i is picked at position rank(i) when that rank is below k. Every thread reads the same
    // b[j] at a time (a broadcast); the loop is unrolled so many loads are in flight (one at a
    // time was most of this kernel's time).
    for (int i = threadIdx.x; i < E; i += blockDim.x) {
      const float bi = b[i];
      int rank = 0;
#pragma unroll 16
      for (int j = 0; j < E; ++j) rank += ranks_before(b[j], j, bi, i) ? 1 : 0;
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
    // The slots point at the weights thread 0 writes; only their addresses are taken here.
    if (slots.groups != nullptr)
      for (int j = threadIdx.x; j < slots.n_seg; j += blockDim.x)
        moe_write_slot(slots, j < p.k ? t * p.k + j : slots.pairs + t, j < p.k ? sel[j] : -1);
    __syncthreads();  // s, b and sel are rewritten for the next token
  }
}

__global__ void moe_gather_kernel(MoeGatherParams p) {
  pdl_enter();
  const int64_t total = p.m * p.d;
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < total; t += step) {
    const int64_t i = t / p.d, c = t % p.d;
    p.xe[t] = p.x[int64_t(p.tokens[i]) * p.d + c];
  }
}

__global__ void moe_scatter_add_kernel(MoeScatterParams p) {
  pdl_enter();
  const int64_t total = p.m * p.d;
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < total; t += step) {
    const int64_t i = t / p.d, c = t % p.d;
    float* o = p.out + int64_t(p.tokens[i]) * p.d + c;
    *o = __fadd_rn(*o, __fmul_rn(p.ye[t], p.w[i]));  // CPU: o[c] += y[c] * wt
  }
}

__global__ void moe_pairs_kernel(MoePairParams p) {
  pdl_enter();
  const int64_t q = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (q >= p.slots) return;
  moe_write_slot(p, q, q < p.pairs ? p.ids[q] : -1);
}

// A block per (token, column range): the token's held slots are ordered once, by rank counting
// in (expert id, slot) order, then each thread sums its columns in that order.
__global__ void moe_combine_kernel(MoeCombineParams p) {
  pdl_enter();
  extern __shared__ int order[];  // [k]
  __shared__ int held;
  const int64_t t = blockIdx.y;
  const int32_t* ids = p.ids + t * p.k;
  if (threadIdx.x == 0) held = 0;
  __syncthreads();
  for (int64_t j = threadIdx.x; j < p.k; j += blockDim.x) {
    const int32_t e = ids[j];
    const int64_t local = int64_t(e) - p.first_expert;
    if (local < 0 || local >= p.n_local) continue;
    int rank = 0;
    for (int64_t i = 0; i < p.k; ++i) {
      const int64_t li = int64_t(ids[i]) - p.first_expert;
      rank += li >= 0 && li < p.n_local && (ids[i] < e || (ids[i] == e && i < j));
    }
    order[rank] = int(j);
    atomicAdd(&held, 1);
  }
  __syncthreads();
  const int count = held;
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= p.d) return;
  float acc = 0.0f;
  for (int r = 0; r < count; ++r) {
    const int64_t q = t * p.k + order[r];
    acc = __fadd_rn(acc, __fmul_rn(p.ys[q * p.d + c], p.w[q]));  // CPU: o[c] += y[c] * wt
  }
  if (p.shared != nullptr) acc = __fadd_rn(acc, p.shared[t * p.d + c]);  // CPU: ffn += shared
  p.out[t * p.d + c] = acc;
}

}  // namespace

void launch_moe_pairs(const MoePairParams& p, cudaStream_t s) {
  if (p.slots == 0) return;
  launch(moe_pairs_kernel, unsigned((p.slots + 127) / 128), 128, 0, s, p);
}

void launch_moe_combine(const MoeCombineParams& p, cudaStream_t s) {
  if (p.n * p.d == 0) return;
  DSI_CHECK(p.n <= 65535, "moe_combine: {} tokens", p.n);
  const dim3 grid(unsigned((p.d + 255) / 256), unsigned(p.n));
  launch(moe_combine_kernel, grid, 256, size_t(std::max<int64_t>(p.k, 1)) * sizeof(int), s, p);
}

size_t moe_route_smem_bytes(const MoeRouteParams& p) {
  return size_t(2 * p.n_experts + p.n_group) * sizeof(float) + size_t(p.n_group + p.k) * sizeof(int);
}

void launch_moe_route_slots(const MoeRouteParams& p, const MoePairParams& slots, cudaStream_t s) {
  if (p.n == 0) return;
  DSI_CHECK(slots.groups == nullptr || (slots.pairs == p.n * p.k && slots.k == p.k && slots.n_seg >= p.k),
            "moe_route: slots of {} pairs for {} tokens x {}", slots.pairs, p.n, p.k);
  const size_t smem = moe_route_smem_bytes(p);
  DSI_CHECK(smem <= 48 * 1024, "moe_route: {} experts need too much shared memory", p.n_experts);
  launch(moe_route_kernel, grid_items(p.n), kRouteThreads, smem, s, p, slots);
}

void launch_moe_route(const MoeRouteParams& p, cudaStream_t s) { launch_moe_route_slots(p, MoePairParams{}, s); }

void launch_moe_gather(const MoeGatherParams& p, cudaStream_t s) {
  if (p.m * p.d == 0) return;
  launch(moe_gather_kernel, grid_for(p.m * p.d, 256), 256, 0, s, p);
}

void launch_moe_scatter_add(const MoeScatterParams& p, cudaStream_t s) {
  if (p.m * p.d == 0) return;
  launch(moe_scatter_add_kernel, grid_for(p.m * p.d, 256), 256, 0, s, p);
}

namespace {

// The routing launch of ops::moe_route's operands (checked); n = 0 when there is nothing to route.
MoeRouteParams route_params(const Tensor& router_logits, const Tensor& bias, const RouterParams& rp,
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
  MoeRouteParams p{};
  if (n == 0 || k == 0) return p;
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
  return p;
}

}  // namespace

void moe_route(const Tensor& router_logits, const Tensor& bias, const RouterParams& rp,
               Tensor& expert_ids, Tensor& weights) {
  const MoeRouteParams p = route_params(router_logits, bias, rp, expert_ids, weights);
  if (p.n == 0) return;
  DeviceGuard guard(router_logits.device());
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

// The device-routed path's view of one layer's local experts (and its shared expert): their
// pointers on the device and the shape of each projection. Built on first use (a host-to-device
// copy, so before any capture) and kept per experts vector; rebuilt if the weights changed.
struct ExpertTable {
  std::vector<MoeExpertPtrs> key;   // what it was built for: the experts, then the shared one
  std::vector<MoeExpertPtrs> host;  // the local experts, then the shared expert when fused
  Tensor device;                    // host's bytes on the device
  GemvParams proj[3];               // the routed experts' shape, dtype and blocks of gate, up, down
  GemvParams shared_proj[3];        // the shared expert's, when fused
  bool uniform = false;             // the routed experts can take the device path
  bool shared = false;              // the shared expert is fused into it
};

bool same_shape(const GemvParams& a, const GemvParams& b) {
  return a.kind == b.kind && a.in == b.in && a.out == b.out && a.scale_cols == b.scale_cols &&
         a.row0 == b.row0 && a.col0 == b.col0 && a.block_out == b.block_out &&
         a.block_in == b.block_in;
}

const LinearWeight& projection(const MlpWeights& m, int i) {
  return i == 0 ? m.gate_proj : i == 1 ? m.up_proj : m.down_proj;
}

MoeExpertPtrs expert_ptrs(const MlpWeights& m) {
  MoeExpertPtrs e{};
  for (int i = 0; i < 3; ++i) {
    const LinearWeight& w = projection(m, i);
    e.w[i] = w.weight.raw();
    e.scale[i] = w.weight.dtype() == DType::F8_E4M3 ? w.scale_inv.f32() : nullptr;
  }
  return e;
}

// The three projections of m as one-row GEMVs over the pair buffers (16-byte aligned rows), or
// false when one of them cannot take the vector kernel on `dev`.
bool expert_shape(const MlpWeights& m, Device dev, GemvParams (&proj)[3]) {
  for (int i = 0; i < 3; ++i) {
    const LinearWeight& w = projection(m, i);
    validate_weight(w, 0, w.out_features());
    GemvParams q = gemv_weight_params(w);
    q.x = nullptr;
    q.ldx = q.in;
    q.n = 1;
    if (!(w.weight.device() == dev) || !gemv_vector_ok(q)) return false;
    proj[i] = q;
  }
  return proj[0].out == proj[1].out && proj[2].in == proj[0].out;
}

const ExpertTable& expert_table(const std::vector<MlpWeights>& experts, const MlpWeights* shared,
                                Device dev) {
  static std::mutex mu;
  static std::map<const void*, ExpertTable> tables;
  std::lock_guard<std::mutex> lock(mu);
  std::vector<MoeExpertPtrs> host;
  for (const MlpWeights& m : experts) host.push_back(expert_ptrs(m));
  if (shared != nullptr) host.push_back(expert_ptrs(*shared));
  ExpertTable& t = tables[&experts];
  const auto same = [](const MoeExpertPtrs& a, const MoeExpertPtrs& b) {
    return std::equal(a.w, a.w + 3, b.w) && std::equal(a.scale, a.scale + 3, b.scale);
  };
  if (t.device.defined() && t.key.size() == host.size() &&
      std::equal(host.begin(), host.end(), t.key.begin(), same))
    return t;
  DSI_CHECK(capture_state() == nullptr,
            "moe_experts: the experts' table is built by an eager run before a step is captured");
  t = ExpertTable{};
  t.uniform = !experts.empty() && expert_shape(experts[0], dev, t.proj);
  for (size_t e = 1; e < experts.size() && t.uniform; ++e) {
    GemvParams q[3];
    t.uniform = expert_shape(experts[e], dev, q);
    for (int i = 0; i < 3 && t.uniform; ++i) t.uniform = same_shape(q[i], t.proj[i]);
  }
  // The shared expert joins the routed experts' launches when it has their dtype and scale blocks
  // and is no larger (tensor parallelism narrows it; the launches are sized by the routed shape).
  if (t.uniform && shared != nullptr && expert_shape(*shared, dev, t.shared_proj)) {
    t.shared = true;
    for (int i = 0; i < 3; ++i) {
      const GemvParams &a = t.proj[i], &b = t.shared_proj[i];
      t.shared = t.shared && a.kind == b.kind && a.block_out == b.block_out &&
                 a.block_in == b.block_in && b.out <= a.out && b.in <= a.in;
    }
  }
  t.key = host;
  t.host = host;
  if (!t.shared && shared != nullptr) t.host.pop_back();
  const size_t bytes = t.host.size() * sizeof(MoeExpertPtrs);
  t.device = Tensor::empty({int64_t(std::max<size_t>(bytes, 1))}, DType::U8, dev);
  if (bytes > 0) t.device.copy_from(Tensor::wrap(t.host.data(), {int64_t(bytes)}, DType::U8));
  return t;
}

GemvGroup group_shape(const GemvParams& p) {
  GemvGroup g{};
  g.out = p.out;
  g.in = p.in;
  g.scale_cols = p.scale_cols;
  g.row0 = p.row0;
  g.col0 = p.col0;
  return g;
}

// A grouped one-row GEMV of `groups` with the shape of proj; x and y are representative operands
// (the first group's) for the alignment checks.
GemvParams grouped_launch(const GemvParams& proj, const float* x, float* y, const GemvGroup* groups,
                          int64_t n_groups) {
  GemvParams g = proj;
  g.x = x;
  g.y = y;
  g.ldx = g.in;
  g.ldy = g.out;
  g.n = 1;
  g.groups = groups;
  g.n_groups = int(n_groups);
  return g;
}

// The down launch of n tokens with n_seg slots each (segments and operands set by the caller).
GemvSegParams seg_params(const ExpertTable& table, int64_t n, int n_seg) {
  const GemvParams& down = table.proj[2];
  GemvSegParams sp{};
  sp.ldy = down.out;
  sp.out = down.out;
  sp.max_in = int64_t(n_seg) * down.in;
  sp.n = int(n);
  sp.n_seg = n_seg;
  sp.kind = down.kind;
  sp.block_out = down.block_out;
  sp.block_in = down.block_in;
  return sp;
}

// out += SharedExpert(x) (ops::moe_experts' last step) when shared is not null.
void add_shared(const Tensor& x, const MlpWeights* shared, Tensor& out) {
  if (shared == nullptr || x.numel() == 0) return;
  Tensor s = Tensor::empty(out.shape(), DType::F32, x.device());
  mlp(x, *shared, s);
  add_inplace(out, s);
}

// The experts of a decode batch, routed on the device (moe.h), and the shared expert's output: with
// table.shared for one or two tokens as slots of the two launches (one x row per slot, so its
// weights are read once per token), for more as its own MLP over all the tokens (`shared`: its
// weights read once, 3..8 rows on the GEMV's tensor cores), added by the combine (or by the
// segment-sum launch, when tests force it on such batches); without, added after (add_shared).
// With `route`, that launch routes the batch and writes the slots (no pairs kernel).
void moe_experts_on_device(const Tensor& x, const Tensor& expert_ids, const Tensor& weights,
                           const ExpertTable& table, const MlpWeights* shared, int first_expert,
                           int n_experts, Tensor& out, const MoeRouteParams* route = nullptr) {
  const int64_t n = x.dim(0), d = x.dim(1), k = expert_ids.dim(1), pairs = n * k;
  const bool fused = table.shared && n <= kMoeFusedSharedTokens;
  Tensor shared_out;
  if (table.shared && !fused) {
    shared_out = Tensor::empty({n, d}, DType::F32, x.device());
    mlp(x, *shared, shared_out);
  }
  const int64_t slots = pairs + (fused ? n : 0);
  const int n_seg = int(k) + (fused ? 1 : 0);
  // The segment sum for small batches when its kernel takes these experts (power-of-two fp8 blocks,
  // at most kGemvMaxSegments slots a token); else the grouped down products and the combine.
  const bool segment_sum = n <= moe_segment_tokens() && gemv_seg_ok(seg_params(table, n, n_seg));
  const int64_t inter = table.proj[0].out;  // the shared expert's is no larger
  Scratch act(size_t(slots * inter) * sizeof(float));
  Scratch groups(size_t(slots) * sizeof(GemvGroup));
  Scratch segs(segment_sum ? size_t(n * n_seg) * sizeof(GemvSegment) : 0);
  Scratch down_groups(segment_sum ? 0 : size_t(slots) * sizeof(GemvGroup));
  Scratch ys(segment_sum ? 0 : size_t(slots * d) * sizeof(float));
  ErrorFlag bad("moe_experts: an expert id outside [0, experts)");
  MoePairParams pp{};
  pp.ids = expert_ids.i32();
  pp.weights = weights.f32();
  pp.experts = static_cast<const MoeExpertPtrs*>(table.device.raw());
  pp.x = x.f32();
  pp.act = act.as<float>();
  pp.groups = groups.as<GemvGroup>();
  pp.segs = segment_sum ? segs.as<GemvSegment>() : nullptr;
  pp.down_groups = segment_sum ? nullptr : down_groups.as<GemvGroup>();
  pp.ys = segment_sum ? nullptr : ys.as<float>();
  for (int i = 0; i < 3; ++i) {
    pp.shape[0][i] = group_shape(table.proj[i]);
    pp.shape[1][i] = group_shape(table.shared ? table.shared_proj[i] : table.proj[i]);
  }
  pp.bad = bad.ptr();
  pp.pairs = pairs;
  pp.slots = slots;
  pp.k = k;
  pp.d = d;
  pp.inter = inter;
  pp.n_seg = n_seg;
  pp.first_expert = first_expert;
  pp.n_local = int(table.host.size()) - (table.shared ? 1 : 0);
  pp.n_experts = n_experts;
  if (route != nullptr)
    launch_moe_route_slots(*route, pp, stream());
  else
    launch_moe_pairs(pp, stream());
  const int sms = sm_count();
  // Gate, up and SwiGLU of every slot: one grouped launch.
  GemvParams g = grouped_launch(table.proj[0], pp.x, pp.act, pp.groups, slots);
  g.swiglu = true;
  launch_gemv(g, gemv_plan(g, sms), stream());
  if (segment_sum) {
    // Down of every slot, weighted and summed per token (right after the launch above, which writes
    // none of the segments: launch_gemv_seg's contract).
    GemvSegParams sp = seg_params(table, n, n_seg);
    sp.segs = pp.segs;
    sp.add = fused || !table.shared ? nullptr : shared_out.f32();
    sp.y = out.f32();
    launch_gemv_seg(sp, gemv_seg_plan(sp, sms), stream());
  } else {
    // Down of every slot (a product each), then the weighted sum per token.
    const GemvParams dn = grouped_launch(table.proj[2], pp.act, pp.ys, pp.down_groups, slots);
    launch_gemv(dn, gemv_plan(dn, sms), stream());
    const float* shared_rows = fused ? pp.ys + pairs * d : table.shared ? shared_out.f32() : nullptr;
    launch_moe_combine({expert_ids.i32(), weights.f32(), pp.ys, shared_rows, out.f32(), n, k, d, first_expert,
                        pp.n_local},
                       stream());
  }
  const unsigned long long first = bad.read();
  if (first != ErrorFlag::kNone)
    fail("moe_experts: expert id {} outside [0, {})", read_device(expert_ids.i32() + first),
         n_experts);
  if (!table.shared) add_shared(x, shared, out);
}

// Larger batches: the routing table on the host (a synchronising read), tokens grouped per expert.
void moe_experts_on_host(const Tensor& x, const Tensor& expert_ids, const Tensor& weights,
                         const std::vector<MlpWeights>& experts, int first_expert, int n_experts,
                         Tensor& out) {
  const int64_t n = x.dim(0), d = x.dim(1), k = expert_ids.dim(1);
  if (n * d > 0) DSI_CUDA_CHECK(cudaMemsetAsync(out.raw(), 0, out.nbytes(), stream()));
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
  // One upload of every expert's token lists and weights. A token that lists an expert twice
  // appears in two lists of it (rounds), so no list repeats a token (the scatter-add does not
  // race) and each token still adds its slots in the CPU's order.
  struct Batch {
    size_t expert;
    int64_t begin, end;
  };
  std::vector<Batch> batches;
  std::vector<int32_t> tokens;
  std::vector<float> tw;
  int64_t max_m = 0;
  for (size_t e = 0; e < experts.size(); ++e) {
    std::vector<std::vector<std::pair<int32_t, float>>> rounds;
    size_t round = 0;
    for (size_t i = 0; i < routed[e].size(); ++i) {
      round = i > 0 && routed[e][i - 1].first == routed[e][i].first ? round + 1 : 0;
      if (round == rounds.size()) rounds.emplace_back();
      rounds[round].push_back(routed[e][i]);
    }
    for (const auto& r : rounds) {
      const int64_t b = int64_t(tokens.size());
      for (const auto& [t, wt] : r) {
        tokens.push_back(t);
        tw.push_back(wt);
      }
      batches.push_back({e, b, int64_t(tokens.size())});
      max_m = std::max<int64_t>(max_m, int64_t(r.size()));
    }
  }
  if (tokens.empty() || d == 0) return;
  Scratch tok_d(tokens.size() * sizeof(int32_t)), tw_d(tw.size() * sizeof(float));
  copy_from_host(tok_d.as<void>(), tokens.data(), tokens.size() * sizeof(int32_t));
  copy_from_host(tw_d.as<void>(), tw.data(), tw.size() * sizeof(float));
  Scratch xy(size_t(2 * max_m * d) * sizeof(float));
  for (const Batch& bt : batches) {
    const int64_t m = bt.end - bt.begin;
    const int32_t* tok = tok_d.as<int32_t>() + bt.begin;
    Tensor xe = Tensor::wrap(xy.as<float>(), {m, d}, DType::F32, x.device());
    Tensor ye = Tensor::wrap(xy.as<float>() + max_m * d, {m, d}, DType::F32, x.device());
    launch_moe_gather({x.f32(), tok, xe.f32(), m, d}, stream());
    mlp(xe, experts[bt.expert], ye);
    launch_moe_scatter_add({ye.f32(), tok, tw_d.as<float>() + bt.begin, out.f32(), m, d}, stream());
  }
}

// The device-routed path's table when a batch of x's rows with k experts each takes it (at most
// kMoeDeviceRoutedPairs pairs, experts of one shape, rows that keep the GEMV's 16-byte alignment),
// else null.
const ExpertTable* device_routed_table(const Tensor& x, int64_t k, const std::vector<MlpWeights>& experts,
                                       const MlpWeights* shared) {
  const int64_t n = x.dim(0), d = x.dim(1);
  if (n * k <= 0 || n * k > kMoeDeviceRoutedPairs || d <= 0) return nullptr;
  const ExpertTable& table = expert_table(experts, shared, x.device());
  const bool aligned =
      d % 4 == 0 && table.proj[0].out % 4 == 0 && reinterpret_cast<uintptr_t>(x.raw()) % 16 == 0;
  return table.uniform && aligned ? &table : nullptr;
}

}  // namespace

namespace {
std::atomic<int> g_segment_tokens{kMoeSegmentTokens};
}  // namespace

int moe_segment_tokens() { return g_segment_tokens.load(std::memory_order_relaxed); }
void set_moe_segment_tokens(int n) { g_segment_tokens.store(n < 0 ? kMoeSegmentTokens : n); }

void moe_experts(const Tensor& x, const Tensor& expert_ids, const Tensor& weights,
                 const std::vector<MlpWeights>& experts, int first_expert, int n_experts,
                 Tensor& out, const MlpWeights* shared) {
  // ops::moe_experts checked the shapes.
  const int64_t k = expert_ids.dim(1);
  check_dtype(x, DType::F32, "moe_experts x");
  check_dtype(out, DType::F32, "moe_experts out");
  check_on(expert_ids, x.device(), "moe_experts", "expert_ids");
  check_on(weights, x.device(), "moe_experts", "weights");
  check_on(out, x.device(), "moe_experts", "out");
  DeviceGuard guard(x.device());
  if (experts.empty()) {  // a rank that holds no routed expert (more ranks than experts): the shared one
    if (out.numel() > 0) DSI_CUDA_CHECK(cudaMemsetAsync(out.raw(), 0, out.nbytes(), stream()));
    add_shared(x, shared, out);
    return;
  }
  if (const ExpertTable* table = device_routed_table(x, k, experts, shared)) {
    moe_experts_on_device(x, expert_ids, weights, *table, shared, first_expert, n_experts, out);
    return;
  }
  moe_experts_on_host(x, expert_ids, weights, experts, first_expert, n_experts, out);
  add_shared(x, shared, out);
}

void moe(const Tensor& x, const Tensor& router_logits, const Tensor& bias, const RouterParams& rp,
         const std::vector<MlpWeights>& experts, int first_expert, int n_experts, Tensor& expert_ids,
         Tensor& weights, Tensor& out, const MlpWeights* shared) {
  const MoeRouteParams route = route_params(router_logits, bias, rp, expert_ids, weights);
  check_dtype(x, DType::F32, "moe x");
  check_dtype(out, DType::F32, "moe out");
  check_on(router_logits, x.device(), "moe", "router_logits");
  check_on(out, x.device(), "moe", "out");
  DeviceGuard guard(x.device());
  if (const ExpertTable* table = device_routed_table(x, route.k, experts, shared)) {  // route.k 0: nothing to route
    moe_experts_on_device(x, expert_ids, weights, *table, shared, first_expert, n_experts, out, &route);
    return;
  }
  launch_moe_route(route, stream());
  moe_experts(x, expert_ids, weights, experts, first_expert, n_experts, out, shared);
}

}  // namespace dsi::cuda
