// End-to-end decode benchmark at a real geometry with synthetic weights: a few consecutive layers
// of a config (configs/glm-5.2.json, configs/deepseek-v3.2.json) on one GPU, the caches filled to a
// context length, then batch-1 decode steps timed. Prints the time per layer per step, the layer's
// HBM byte floor (this run's dtypes, and the deployment's: fp8 weights, 132-byte indexer keys,
// 656-byte MLA entries) at 4.3 TB/s, and the tokens/s those times imply for the full model.
// With --tp / --dcp the layers run on that many ranks (threads; NCCL or the peer communicator, see
// runtime/ranks.h) and the collectives are counted per layer, and with NCCL's blocking ones timed;
// --rows 4 times MTP-3 verification steps (4 rows per step). --graphs times the step replayed from
// a CUDA graph (backends/cuda/graph/), as decoding runs it (several ranks: with the peer
// communicator, whose collectives are captured too); without it every op is launched from the host.
//   bench_decode --config configs/glm-5.2.json [--layers 4] [--first-layer 6] [--context 131072]
//                [--iters 20] [--weights fp8|bf16] [--kv-cache fp8|bf16|f32] [--tp T] [--dcp W]
//                [--rows R] [--graphs] [--profile-step] [--prefill N]
// --prefill N times a chunk of N prompt tokens after the context instead (eager, as prefill runs;
// DSI_FP8_PREFILL=1 runs fp8 weights' products on the fp8 tensor cores, cuda_ops.h).
// --profile-step runs one more step (or prefill chunk) after the timed ones between cudaProfilerStart and
// cudaProfilerStop, for a kernel profiler started with profiling from the start off (ncu
// --profile-from-start off): its per-kernel table is where a layer's time goes.
#include <cuda_profiler_api.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "backends/cuda/device.h"
#include "backends/cuda/graph/step_graph.h"
#include "model/dsa_model.h"
#include "model/synthetic.h"
#include "runtime/ranks.h"
#include "ops/kv_fp8.h"
#include "ops/paging.h"
#include "bench_util.h"

namespace {

constexpr double kPeakBytesPerSecond = 4.3e12;

struct Args {
  std::string config;
  int layers = 4;
  int first_layer = -1;  // default: the first MoE layer with its own indexer
  int64_t context = 131072;
  int iters = 20;
  std::string weights;  // "" = as the config says
  std::string kv_cache = "fp8";
  int tp = 1, dcp = 1, rows = 1;
  bool graphs = false;
  bool profile_step = false;
  int prefill = 0;  // > 0: time a prefill chunk of this many tokens after the context instead
};

// Forwards every collective to `inner` and adds up the wall time spent in them (the collectives
// block until done, so this is the communication time, waiting for the other ranks included).
class TimedComm final : public dsi::Communicator {
 public:
  explicit TimedComm(dsi::Communicator* inner) : in_(inner) {}
  int rank() const override { return in_->rank(); }
  int world_size() const override { return in_->world_size(); }
  dsi::Communicator& host() const override { return in_->host(); }
  int device() const override { return in_->device(); }
  const dsi::CommOptions& options() const override { return in_->options(); }
  void all_gather(const dsi::Group& g, const dsi::Tensor& i, dsi::Tensor& o) override {
    time([&] { in_->all_gather(g, i, o); });
  }
  void reduce_scatter(const dsi::Group& g, const dsi::Tensor& i, dsi::Tensor& o) override {
    time([&] { in_->reduce_scatter(g, i, o); });
  }
  void all_reduce(const dsi::Group& g, dsi::Tensor& io) override { time([&] { in_->all_reduce(g, io); }); }
  void all_to_all(const dsi::Group& g, const dsi::Tensor& i, dsi::Tensor& o) override {
    time([&] { in_->all_to_all(g, i, o); });
  }
  void broadcast(const dsi::Group& g, dsi::Tensor& io, int root) override {
    time([&] { in_->broadcast(g, io, root); });
  }
  void barrier(const dsi::Group& g) override { in_->barrier(g); }
  void abort(const std::string& why) override { in_->abort(why); }
  void check_async() override { in_->check_async(); }
  bool capturable() const override { return in_->capturable(); }
  double seconds = 0;
  int64_t calls = 0;

 private:
  template <typename F>
  void time(F&& f) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++calls;
  }
  dsi::Communicator* in_;
};

Args parse(int argc, char** argv) {
  Args a;
  parse_options(argc, argv, [&](const std::string& k, auto next) {
    if (k == "--config") a.config = next();
    else if (k == "--layers") a.layers = std::stoi(next());
    else if (k == "--first-layer") a.first_layer = std::stoi(next());
    else if (k == "--context") a.context = std::stoll(next());
    else if (k == "--iters") a.iters = std::stoi(next());
    else if (k == "--weights") a.weights = next();
    else if (k == "--kv-cache") a.kv_cache = next();
    else if (k == "--tp") a.tp = std::stoi(next());
    else if (k == "--dcp") a.dcp = std::stoi(next());
    else if (k == "--rows") a.rows = std::stoi(next());
    else if (k == "--graphs") a.graphs = true;
    else if (k == "--profile-step") a.profile_step = true;
    else if (k == "--prefill") a.prefill = std::stoi(next());
    else return false;
    return true;
  });
  if (a.config.empty()) dsi::fail("--config FILE is required");
  return a;
}

// The config of layers [first, first + n) of `full`, without the MTP layer.
dsi::ModelConfig slice(const dsi::ModelConfig& full, int first, int n) {
  DSI_CHECK(first >= 0 && n >= 1 && first + n <= full.n_layers, "layers [{}, {}) outside the {} layers",
            first, first + n, full.n_layers);
  DSI_CHECK(full.indexer_full[size_t(first)], "layer {} has no indexer of its own: start elsewhere", first);
  dsi::ModelConfig c = full;
  c.n_layers = n;
  c.indexer_full.assign(full.indexer_full.begin() + first, full.indexer_full.begin() + first + n);
  c.layer_is_moe.assign(full.layer_is_moe.begin() + first, full.layer_is_moe.begin() + first + n);
  c.n_mtp_layers = 0;
  return c;
}

// Small pseudo-random values, [rows, cols] f32 on `device`.
dsi::Tensor random_rows(int64_t rows, int64_t cols, uint32_t seed, dsi::Device device) {
  dsi::Tensor h = dsi::Tensor::empty({rows, cols}, dsi::DType::F32);
  uint32_t x = seed * 2654435761u + 1;
  for (int64_t i = 0; i < h.numel(); ++i) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    h.f32()[i] = float(int32_t(x & 0xffff) - 32768) / 32768.0f;
  }
  return dsi::to_device(h, device);
}

// Puts `context` tokens of random keys into every layer's caches, through the ops that store them
// (so fp8 pools hold properly quantised entries), a chunk of rows at a time.
void fill_cache(const dsi::DsaModel& m, dsi::SequenceKvCache& cache, int64_t context) {
  const dsi::ModelConfig& c = m.config();
  const int64_t chunk = 8192;
  for (int64_t b = 0; b < context; b += chunk) {
    std::vector<int32_t> slots;  // this rank's tokens of [b, b + chunk)
    for (int64_t p = b; p < std::min(b + chunk, context); ++p)
      if (cache.dcp().owns(p)) slots.push_back(int32_t(cache.slot_of(p)));
    const int64_t n = int64_t(slots.size());
    if (n == 0) continue;
    const dsi::Tensor s = dsi::to_device(dsi::Tensor::from_i32(slots, {n}), m.device());
    for (int l = 0; l < c.n_layers; ++l) {
      dsi::LayerKvCache& kv = cache.layer(l);
      const dsi::Tensor lat = random_rows(n, c.kv_lora_rank + c.head_dim_rope, uint32_t(2 * l + 1 + b), m.device());
      if (kv.latent.dtype() == dsi::DType::U8) dsi::ops::mla_cache_store_fp8(lat, s, kv.latent);
      else dsi::ops::scatter_rows(lat, s, kv.latent);
      if (!kv.index_keys.defined()) continue;
      const dsi::Tensor keys = random_rows(n, c.index_head_dim, uint32_t(2 * l + 2 + b), m.device());
      if (kv.index_keys.dtype() == dsi::DType::U8) dsi::ops::indexer_keys_store_fp8(keys, s, kv.index_keys);
      else dsi::ops::scatter_rows(keys, s, kv.index_keys);
    }
  }
}

int run(const Args& a) {
  DSI_CHECK(dsi::cuda::device_count() > 0, "no CUDA device is visible");
  dsi::ModelConfig full = dsi::load_config(a.config);
  if (a.weights == "bf16") full.quant.fp8 = false;
  else if (a.weights == "fp8") full.quant.fp8 = true;
  else if (!a.weights.empty()) dsi::fail("--weights {}: expected fp8 or bf16", a.weights);
  int first = a.first_layer;
  for (int i = 0; first < 0 && i < full.n_layers; ++i)
    if (full.layer_is_moe[size_t(i)] && full.indexer_full[size_t(i)]) first = i;
  const dsi::ModelConfig cfg = slice(full, first, a.layers);
  const int64_t C = std::min<int64_t>(a.context, full.max_position_embeddings - 2);

  fmt::print("device: {} ({} visible)\n", dsi::cuda::device_description(0), dsi::cuda::device_count());
  fmt::print("{}: layers [{}, {}) of {} ({} weights, {} KV cache), context {} tokens, batch 1, {} "
             "row(s) per step, tp {}, dcp {}, {} steps{}\n", a.config, first, first + a.layers,
             full.n_layers, cfg.quant.fp8 ? "fp8" : "bf16", a.kv_cache, C, a.rows, a.tp, a.dcp,
             a.iters, a.graphs ? ", CUDA graph replay" : ", eager launches");
  dsi::ParallelConfig pc;
  pc.tp = a.tp;
  pc.dcp = a.dcp;
  pc.validate(cfg);
  auto t0 = std::chrono::steady_clock::now();
  const dsi::Checkpoint ck = dsi::synthetic_checkpoint(cfg);
  const dsi::KvCacheDtype kv = dsi::resolve_kv_cache_dtype(a.kv_cache, cfg, dsi::Device::cuda(0));
  std::vector<double> times;
  double comm_seconds = 0;
  int64_t comm_calls = 0;
  bool comm_blocking = true;  // NCCL's collectives return when done; the peer ones once enqueued
  dsi::run_on_thread_ranks(
      pc, dsi::CommOptions{},
      [&](const dsi::RankContext& given) {
        TimedComm timed(given.comm);
        const dsi::RankContext rank =
            dsi::RankContext::make(pc, given.tp_rank, given.comm ? &timed : nullptr);
        if (a.graphs && given.comm != nullptr && given.comm->world_size() > 1 && !given.comm->capturable())
          dsi::fail("--graphs with {} ranks needs collectives that can be captured: the peer communicator "
                    "(DSI_DEVICE_COMM=peer), not NCCL", pc.tp);
        auto model = dsi::DsaModel::load(ck, cfg, rank, dsi::rank_cuda_device(given.tp_rank));
        if (rank.is_root())
          fmt::print("synthetic weights made and loaded in {:.1f} s\n",
                     std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        dsi::SequenceKvCache cache = model->make_cache(C + std::max(a.rows, a.prefill), /*with_mtp=*/false, kv);
        fill_cache(*model, cache, C);
        if (a.prefill > 0) {  // a chunk of prompt tokens after the context, eager, as prefill runs
          std::vector<int32_t> ids(size_t(a.prefill));
          for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t((i * 7919) % size_t(cfg.vocab_size));
          const dsi::Tensor chunk = dsi::Tensor::from_i32(ids, {a.prefill});
          for (int it = 0; it < a.iters + 1; ++it) {
            cache.set_length(C);
            const auto s = std::chrono::steady_clock::now();
            dsi::to_host(model->forward(chunk, cache));  // waits for the chunk
            const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - s).count();
            if (it >= 1 && rank.is_root()) times.push_back(dt);
          }
          if (a.profile_step) {
            cache.set_length(C);
            cudaProfilerStart();
            dsi::to_host(model->forward(chunk, cache));
            cudaProfilerStop();
          }
          return;
        }
        const dsi::Tensor tokens = dsi::Tensor::from_i32(std::vector<int32_t>(size_t(a.rows), 42), {a.rows});
        // The graph's inputs: the same step (positions C ..) every iteration.
        cache.set_length(C);
        const dsi::LayerContext ctx =
            model->upload_context(model->plan_context({dsi::BatchSeq{&cache, a.rows}}, false));
        const dsi::Tensor tokens_d = dsi::to_device(tokens, model->device());
        std::unique_ptr<dsi::cuda::StepGraph> graph;
        dsi::Tensor out;
        int64_t calls_per_step = 0;  // counted on the second eager warm-up step
        for (int it = 0; it < a.iters + 2; ++it) {
          cache.set_length(C);
          if (it == 1) timed.calls = 0;
          if (it == 2) calls_per_step = timed.calls, timed.seconds = 0;  // two warm-up steps
          if (a.graphs && it == 2) {
            graph = std::make_unique<dsi::cuda::StepGraph>(model->device());
            graph->warm_up([&] { model->forward_planned(tokens_d, ctx, cache); });
            graph->capture([&] { out = model->forward_planned(tokens_d, ctx, cache); });
            if (rank.is_root())
              fmt::print("graph: {} kernels per step (embedding and final norm included; {:.1f} per layer)\n",
                         graph->kernel_nodes(), double(graph->kernel_nodes()) / cfg.n_layers);
          }
          const auto s = std::chrono::steady_clock::now();
          if (graph) graph->replay();  // waits for the step
          else dsi::to_host(model->forward(tokens, cache));  // waits for the step
          const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - s).count();
          if (it >= 2 && rank.is_root()) times.push_back(dt);
        }
        if (a.profile_step) {
          cache.set_length(C);
          cudaProfilerStart();
          if (graph) graph->replay();
          else dsi::to_host(model->forward(tokens, cache));
          cudaProfilerStop();
        }
        if (rank.is_root()) {
          comm_seconds = timed.seconds;
          comm_calls = calls_per_step;
          comm_blocking = given.comm != nullptr && !given.comm->capturable();
        }
      },
      /*cuda=*/true);
  std::sort(times.begin(), times.end());
  const double step = times[times.size() / 2];
  if (a.prefill > 0) {
    fmt::print("\nprefill chunk of {} tokens after {}: {:.2f} ms median over {} ({:.3f} ms per layer; "
               "min {:.2f}, max {:.2f} ms); {:.0f} prompt tok/s implied for all {} layers\n",
               a.prefill, C, step * 1e3, times.size(), step / cfg.n_layers * 1e3, times.front() * 1e3,
               times.back() * 1e3, a.prefill / (step / cfg.n_layers * full.n_layers), full.n_layers);
    return 0;
  }

  fmt::print("\n{:>6} {:>8} {:>6} {:>12} {:>16} {:>16}\n", "layer", "indexer", "mlp", "weights MB",
             "floor us (run)", "floor us (fp8)");
  double floor_run = 0, floor_fp8 = 0;
  const int64_t latent = cfg.kv_lora_rank + cfg.head_dim_rope;
  for (int l = 0; l < cfg.n_layers; ++l) {
    const bool idx = cfg.indexer_full[size_t(l)];
    const int64_t w = dsi::decode_weight_bytes(cfg, l);
    dsi::ModelConfig fp8cfg = cfg;
    fp8cfg.quant.fp8 = true;
    const int64_t w8 = dsi::decode_weight_bytes(fp8cfg, l);
    const int64_t k = std::min<int64_t>(cfg.index_topk, C + 1);
    const bool kv8 = kv == dsi::KvCacheDtype::kFp8;
    const int64_t eb = kv == dsi::KvCacheDtype::kBf16 ? 2 : 4;  // bytes per cached value (f32 / bf16)
    const double run_b = double(w) + (idx ? double(C) * (kv8 ? cfg.index_head_dim + 4 : cfg.index_head_dim * eb) : 0) +
                         double(k) * (kv8 ? 656 : latent * eb);
    const double fp8_b = double(w8) + (idx ? double(C) * (cfg.index_head_dim + 4) : 0) + double(k) * 656;
    floor_run += run_b / kPeakBytesPerSecond;
    floor_fp8 += fp8_b / kPeakBytesPerSecond;
    fmt::print("{:>6} {:>8} {:>6} {:>12.1f} {:>16.1f} {:>16.1f}\n", first + l, idx ? "full" : "shared",
               cfg.layer_is_moe[size_t(l)] ? "moe" : "dense", double(w) / 1e6,
               run_b / kPeakBytesPerSecond * 1e6, fp8_b / kPeakBytesPerSecond * 1e6);
  }
  const double per_layer = step / cfg.n_layers;
  fmt::print("\ndecode step: {:.1f} us median over {} steps ({:.1f} us per layer; min {:.1f}, max {:.1f} "
             "us per step)\n",
             step * 1e6, times.size(), per_layer * 1e6, times.front() * 1e6, times.back() * 1e6);
  fmt::print("byte floor per layer: {:.1f} us with this run's dtypes, {:.1f} us deployed "
             "(fp8); measured / floor = {:.1f}x (run), {:.1f}x (fp8)\n",
             floor_run / cfg.n_layers * 1e6, floor_fp8 / cfg.n_layers * 1e6, step / floor_run,
             step / floor_fp8);
  if (a.rows > 1 && cfg.n_experts > 0) {
    // Rows route independently: with random routing (the synthetic weights') a step reads about
    // E (1 - (1 - k / E)^rows) distinct routed experts per MoE layer, not k.
    const double E = cfg.n_experts, k = cfg.n_experts_active;
    const double distinct = E * (1.0 - std::pow(1.0 - k / E, double(a.rows)));
    const double expert_b = 3.0 * double(cfg.moe_intermediate_size) * double(cfg.hidden_size);  // fp8
    int moe_layers = 0;
    for (int l = 0; l < cfg.n_layers; ++l) moe_layers += cfg.layer_is_moe[size_t(l)] ? 1 : 0;
    const double extra = (distinct - k) * expert_b * moe_layers / kPeakBytesPerSecond;
    fmt::print("with {} rows routed at random: about {:.1f} distinct routed experts per MoE layer "
               "(not {:.0f}); fp8 byte floor {:.1f} us per layer, measured / floor = {:.1f}x\n",
               a.rows, distinct, k, (floor_fp8 + extra) / cfg.n_layers * 1e6, step / (floor_fp8 + extra));
  }
  if (pc.tp > 1 && !a.graphs && comm_blocking)
    fmt::print("collectives: {:.1f} per layer per step, {:.1f} us per layer per step (rank 0, "
               "waiting included)\n", double(comm_calls) / cfg.n_layers,
               comm_seconds / a.iters / cfg.n_layers * 1e6);
  else if (pc.tp > 1)  // the calls only enqueue (or replay inside the graph): no host-side time
    fmt::print("collectives: {:.1f} per layer per step (their time is inside the step: compare with tp 1)\n",
               double(comm_calls) / cfg.n_layers);
  fmt::print("implied for all {} layers: {:.2f} tok/s now; {:.1f} tok/s at the fp8 byte floor\n",
             full.n_layers, 1.0 / (per_layer * full.n_layers),
             1.0 / (floor_fp8 / cfg.n_layers * full.n_layers));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  dsi::cuda::prepare_for_spinning_kernels();  // before CUDA starts: the peer collectives wait on each other
  try {
    return run(parse(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
