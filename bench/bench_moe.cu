// MoE layer benchmark at a real geometry (configs/glm-5.2.json, configs/deepseek-v3.2.json): one MoE
// layer's decode work as the model runs it (the router product, routing and the experts:
// ops::linear, ops::moe) on synthetic fp8 experts, replayed from a CUDA graph
// as decoding replays it. The graph holds `copies` calls one after the other, each with its own
// input rows (so its own routed experts) and its own router and shared expert, so that no call
// finds its weights in the L2. Prints the time per MoE layer, the bytes the layer must read (the
// router, the distinct routed experts its rows picked, the shared expert, inputs and outputs), the
// rate against the H200's 4.3 TB/s, and the kernels one call launches.
// --seg-plan K,D,R,RING forces the segment-sum down launch's plan (warps per row group, chunks in
// flight, rows per warp, 0 registers or 1 the ring; set_gemv_seg_plan); --segment-tokens N the largest batch that takes it (0: the grouped down products and the
// combine kernel for every batch); --separate-route routes with ops::moe_route, then ops::moe_experts
// (a pairs kernel more). For comparisons.
//   bench_moe --config configs/glm-5.2.json [--rows 1] [--copies 16] [--reps 20] [--seg-plan K,D,R,RING]
//             [--segment-tokens N] [--separate-route]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "dsinfer/error.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/device.h"
#include "backends/cuda/graph/step_graph.h"
#include "bench_fill.cuh"
#include "bench_util.h"
#include "model/config.h"
#include "ops/linear.h"
#include "ops/moe.h"

namespace {

struct Args {
  std::string config;
  int rows = 1, copies = 16, reps = 20;
  int seg_k_split = 0, seg_depth = 0, seg_rows = 0, seg_ring = -1;  // 0 (-1): the plan's
  int segment_tokens = -1;              // -1: the default
  bool separate_route = false;
};

Args parse(int argc, char** argv) {
  Args a;
  parse_options(argc, argv, [&](const std::string& k, auto next) {
    if (k == "--config") a.config = next();
    else if (k == "--rows") a.rows = std::stoi(next());
    else if (k == "--copies") a.copies = std::stoi(next());
    else if (k == "--reps") a.reps = std::stoi(next());
    else if (k == "--segment-tokens") a.segment_tokens = std::stoi(next());
    else if (k == "--separate-route") a.separate_route = true;
    else if (k == "--seg-plan") {
      int* const fields[4] = {&a.seg_k_split, &a.seg_depth, &a.seg_rows, &a.seg_ring};
      std::string v = next() + ",";
      int i = 0;
      for (size_t comma; i < 4 && (comma = v.find(',')) != std::string::npos; ++i, v.erase(0, comma + 1))
        *fields[i] = std::stoi(v.substr(0, comma));
      DSI_CHECK(i == 4 && v.empty(), "--seg-plan takes K,D,R,RING");
    } else {
      return false;
    }
    return true;
  });
  if (a.config.empty()) dsi::fail("--config FILE is required");
  DSI_CHECK(a.rows >= 1 && a.copies >= 1 && a.reps >= 1, "--rows, --copies and --reps must be positive");
  return a;
}

unsigned blocks_for(int64_t n) { return unsigned(std::min<int64_t>(4096, (n + 255) / 256)); }

// fp8 e4m3 weights with 128 x 128 block scales (|w| up to about 0.07), as the released checkpoints.
dsi::LinearWeight fp8_weight(int64_t out, int64_t in, uint32_t seed, dsi::Device d) {
  dsi::LinearWeight w;
  w.weight = dsi::Tensor::empty({out, in}, dsi::DType::F8_E4M3, d);
  w.scale_inv = dsi::Tensor::empty({(out + 127) / 128, (in + 127) / 128}, dsi::DType::F32, d);
  fill_fp8<<<blocks_for(out * in), 256>>>(static_cast<uint8_t*>(w.weight.raw()), out * in, seed);
  fill_f32<<<blocks_for(w.scale_inv.numel()), 256>>>(w.scale_inv.f32(), w.scale_inv.numel(), seed + 1,
                                                      0.5e-4f, 1.5e-4f);
  return w;
}

dsi::MlpWeights fp8_mlp(int64_t hidden, int64_t inter, uint32_t seed, dsi::Device d) {
  return {fp8_weight(inter, hidden, seed, d), fp8_weight(inter, hidden, seed + 2, d),
          fp8_weight(hidden, inter, seed + 4, d)};
}

int64_t weight_bytes(const dsi::LinearWeight& w) {
  return w.weight.nbytes() + (w.scale_inv.defined() ? w.scale_inv.nbytes() : 0);
}
int64_t mlp_bytes(const dsi::MlpWeights& m) {
  return weight_bytes(m.gate_proj) + weight_bytes(m.up_proj) + weight_bytes(m.down_proj);
}

struct Call {  // one MoE layer call of the graph: its weights (experts shared) and buffers
  dsi::LinearWeight router;
  dsi::Tensor bias;
  std::vector<dsi::MlpWeights> experts;  // its own vector (the experts' device table is per vector)
  dsi::MlpWeights shared;
  dsi::Tensor x, logits, ids, weights, out;
};

int run(const Args& a) {
  DSI_CHECK(dsi::cuda::device_count() > 0, "no CUDA device is visible");
  const dsi::ModelConfig cfg = dsi::load_config(a.config);
  dsi::cuda::set_gemv_seg_plan(a.seg_k_split, a.seg_depth, a.seg_rows, a.seg_ring);
  dsi::cuda::set_moe_segment_tokens(a.segment_tokens);
  DSI_CHECK(cfg.n_experts > 0, "{}: no routed experts", a.config);
  const dsi::Device dev = dsi::Device::cuda(0);
  const int64_t hidden = cfg.hidden_size, inter = cfg.moe_intermediate_size, E = cfg.n_experts;
  const int k = cfg.n_experts_active;
  std::printf("device: %s; %s: hidden %lld, %lld routed experts of %lld (%d active), shared %lld; "
              "%d row(s), %d calls per graph\n",
              dsi::cuda::device_description(0).c_str(), a.config.c_str(), static_cast<long long>(hidden),
              static_cast<long long>(E), static_cast<long long>(inter), k,
              static_cast<long long>(cfg.shared_intermediate_size()), a.rows, a.copies);
  std::vector<dsi::MlpWeights> experts;
  for (int64_t e = 0; e < E; ++e) experts.push_back(fp8_mlp(hidden, inter, uint32_t(10 * e + 1), dev));
  std::vector<Call> calls(size_t(a.copies));
  for (int c = 0; c < a.copies; ++c) {
    Call& cl = calls[size_t(c)];
    const uint32_t seed = uint32_t(100000 + 10 * c);
    cl.router.weight = dsi::Tensor::empty({E, hidden}, dsi::DType::BF16, dev);
    fill_bf16<<<blocks_for(E * hidden), 256>>>(static_cast<uint16_t*>(cl.router.weight.raw()), E * hidden, seed,
                                              0.02f);
    cl.bias = dsi::Tensor::empty({E}, dsi::DType::F32, dev);
    fill_f32<<<1, 256>>>(cl.bias.f32(), E, seed + 1, -1e-3f, 1e-3f);
    cl.experts = experts;
    cl.shared = fp8_mlp(hidden, cfg.shared_intermediate_size(), seed + 2, dev);
    cl.x = dsi::Tensor::empty({a.rows, hidden}, dsi::DType::F32, dev);
    fill_f32<<<blocks_for(a.rows * hidden), 256>>>(cl.x.f32(), a.rows * hidden, seed + 8, -1.0f, 1.0f);
    cl.logits = dsi::Tensor::empty({a.rows, E}, dsi::DType::F32, dev);
    cl.ids = dsi::Tensor::empty({a.rows, int64_t(k)}, dsi::DType::I32, dev);
    cl.weights = dsi::Tensor::empty({a.rows, int64_t(k)}, dsi::DType::F32, dev);
    cl.out = dsi::Tensor::empty({a.rows, hidden}, dsi::DType::F32, dev);
  }
  DSI_CUDA_CHECK(cudaDeviceSynchronize());

  dsi::RouterParams rp;
  rp.n_experts_active = k;
  rp.n_group = cfg.n_group;
  rp.topk_group = cfg.topk_group;
  rp.norm_topk_prob = cfg.norm_topk_prob;
  rp.routed_scaling_factor = float(cfg.routed_scaling_factor);
  auto step = [&] {
    for (Call& cl : calls) {
      dsi::ops::linear(cl.x, cl.router, cl.logits);
      if (a.separate_route) {
        dsi::ops::moe_route(cl.logits, cl.bias, rp, cl.ids, cl.weights);
        dsi::ops::moe_experts(cl.x, cl.ids, cl.weights, cl.experts, 0, int(E), cl.out, &cl.shared);
      } else {
        dsi::ops::moe(cl.x, cl.logits, cl.bias, rp, cl.experts, 0, int(E), cl.ids, cl.weights, cl.out, &cl.shared);
      }
    }
  };
  step();  // eagerly first, as a model's first step: one-time state (the experts' device tables)
  DSI_CUDA_CHECK(cudaDeviceSynchronize());
  dsi::cuda::StepGraph graph(dev);
  graph.warm_up(step);
  // Bytes per call: what the layer must read (each distinct routed expert once) and write.
  double bytes = 0;
  double distinct = 0;
  for (const Call& cl : calls) {
    const dsi::Tensor ids = dsi::to_host(cl.ids);
    std::set<int32_t> picked(ids.i32(), ids.i32() + ids.numel());
    distinct += double(picked.size());
    bytes += double(weight_bytes(cl.router) + cl.bias.nbytes() + mlp_bytes(cl.shared)) +
             double(picked.size()) * double(mlp_bytes(experts[0])) + 2.0 * double(cl.x.nbytes());
  }
  bytes /= a.copies;
  distinct /= a.copies;
  graph.capture(step);
  graph.replay();  // warm replay
  std::vector<double> us;
  for (int r = 0; r < a.reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    graph.replay();
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
                 a.copies);
  }
  std::sort(us.begin(), us.end());
  const double med = us[us.size() / 2];
  std::printf("kernels per MoE layer call: %d (graph of %d calls: %d)\n", graph.kernel_nodes() / a.copies,
              a.copies, graph.kernel_nodes());
  std::printf("distinct routed experts per call: %.2f; bytes per call: %.1f MB; floor at %.1f TB/s: %.1f us\n",
              distinct, bytes / 1e6, kPeakGBs / 1e3, bytes / (kPeakGBs * 1e3));
  report("MoE layer (router, routing, experts), median", med, bytes);
  report("MoE layer, fastest replay", us.front(), bytes);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
