// Linear-layer benchmark on one GPU: the weight-streaming GEMV (ops::linear for 1..8 rows) and the
// fp8-activation GEMM (ops::linear_fp8_act) on GLM-5 and DeepSeek-V3.2 shapes, fp8 (128x128 block
// scales) and bf16 weights. Kernels are timed HBM-honest: each timed launch reads a weight copy not
// touched in the last (copies - 1) launches, the copies together at least 3x the L2; K launches are
// captured in one CUDA graph (no host launch gaps), and the figure is the median over replays of
// (graph time / K). Prints microseconds, GB/s (weight + scale + x + y bytes), % of 4.3 TB/s and
// TFLOP/s. --sweep also times every GEMV plan and prints the best, to tune gemv_plan(). Rows of
// fp8 weights also time the tensor-core kernel (plan "mma") next to the FMA ones; one row of fp8
// takes the tensor-map kernel (plan "tma") where gemv_plan chooses it (DSI_GEMV_TMA=0: never).
//
// The MoE rows time the grouped GEMVs of one token's experts as the MoE layer launches them; the
// MLA rows the per-head products of kv_b_proj (absorbed query, value up-projection).
// --only NAME keeps the shapes whose layer name contains NAME (and skips the MoE rows).
// --rows N times the GEMV rows of N rows of x only (1, 2, 4 or 8; default all four).
//   bench_linear [--sweep] [--reps N] [--only NAME] [--rows N] [--gemm-only | --gemv-only | --moe-only]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "backends/cuda/common.cuh"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/device.h"
#include "backends/cuda/linear/fp8_gemm.h"
#include "backends/cuda/linear/gemv.h"
#include "bench_fill.cuh"
#include "bench_util.h"

namespace {

using dsi::cuda::FloatKind;


struct Shape {
  const char* model;
  const char* name;
  int64_t out, in;
};

struct Weights {  // `copies` device copies of one weight (and its scales), rotated through
  std::vector<void*> w;
  std::vector<float*> s;
  int64_t bytes = 0, scale_bytes = 0;
};

Weights make_weights(const Shape& sh, bool fp8, int64_t l2_bytes) {
  Weights ws;
  const int64_t numel = sh.out * sh.in;
  ws.bytes = numel * (fp8 ? 1 : 2);
  const int64_t so = (sh.out + 127) / 128, si = (sh.in + 127) / 128;
  ws.scale_bytes = fp8 ? so * si * 4 : 0;
  const int64_t copies = std::max<int64_t>(3, (3 * l2_bytes + ws.bytes - 1) / ws.bytes);
  for (int64_t c = 0; c < copies; ++c) {
    void* w = nullptr;
    DSI_CUDA_CHECK(cudaMalloc(&w, size_t(ws.bytes)));
    if (fp8)
      fill_fp8<<<1024, 256>>>(static_cast<uint8_t*>(w), numel, uint32_t(c + 1));
    else
      fill_bf16<<<1024, 256>>>(static_cast<uint16_t*>(w), numel, uint32_t(c + 1), 1.0f);
    ws.w.push_back(w);
    if (fp8) {
      float* s = nullptr;
      DSI_CUDA_CHECK(cudaMalloc(&s, size_t(ws.scale_bytes)));
      fill_f32<<<64, 256>>>(s, so * si, uint32_t(c + 100), 0.5f / 448, 2.0f / 448);
      ws.s.push_back(s);
    }
  }
  DSI_CUDA_CHECK(cudaDeviceSynchronize());
  return ws;
}

void free_weights(Weights& ws) {
  for (void* p : ws.w) cudaFree(p);
  for (float* p : ws.s) cudaFree(p);
  ws = Weights{};
}

dsi::cuda::GemvParams gemv_params(const Shape& sh, bool fp8, int n, const float* x, float* y) {
  dsi::cuda::GemvParams p{};
  p.x = x;
  p.ldx = sh.in;
  p.y = y;
  p.ldy = sh.out;
  p.in = sh.in;
  p.out = sh.out;
  p.n = n;
  p.kind = fp8 ? FloatKind::kE4M3 : FloatKind::kBF16;
  p.block_out = p.block_in = fp8 ? 128 : 1;
  p.scale_cols = (sh.in + 127) / 128;
  return p;
}

std::string plan_name(const dsi::cuda::GemvPlan& plan) {
  if (plan.tma.warp_tiles > 0)
    return "tma " + std::to_string(plan.tma.warp_tiles) + "x" + std::to_string(plan.tma.k_split) + " tiles/warp " +
           std::to_string(plan.tma.tiles_per_warp) + " piece " + std::to_string(plan.tma.piece);
  if (plan.mma) return "mma ks" + std::to_string(plan.k_split);
  return "R" + std::to_string(plan.rows_per_warp) + " ks" + std::to_string(plan.k_split) +
         (plan.pipelined ? " pipe" : " regs") +
         (plan.row_groups_per_warp > 1 ? " rg" + std::to_string(plan.row_groups_per_warp) : "");
}

// Times every FMA plan and names the three fastest: "; best R4 ks2 regs 30.1 us (77.0%); R4 ks4
// pipe 30.4 us (76.2%); ...". The heuristic's own time counts as "heuristic" where it beats them.
template <typename Run>
std::string sweep_plans(const dsi::cuda::GemvPlan& plan, double us, double bytes, Run&& run_plan) {
  std::vector<std::pair<double, std::string>> times = {{us, "heuristic"}};
  for (bool pipe : {false, true})
  for (int r : {1, 2, 4})
    for (int ks : {1, 2, 4, 8}) {
      dsi::cuda::GemvPlan alt = plan;
      alt.rows_per_warp = r;
      alt.k_split = ks;
      alt.pipelined = pipe;
      alt.row_groups_per_warp = 1;
      alt.mma = false;
      alt.tma = {};
      times.emplace_back(run_plan(alt), plan_name(alt));
    }
  std::sort(times.begin(), times.end());
  std::string out;
  for (size_t i = 0; i < times.size() && i < 3; ++i) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "; %s%s %.2f us (%.1f%%)", i == 0 ? "best " : "", times[i].second.c_str(),
                  times[i].first, 100.0 * bytes / (times[i].first * 1e-6) / 1e9 / kPeakGBs);
    out += buf;
  }
  return out;
}

// One fp8 row: times every tensor-map plan launch_gemv_tma takes (one or more blocks per SM; the
// plan of gemv_tma_plan is one block per SM, all in one wave): the fastest time, and the five
// fastest plans.
template <typename Run>
std::pair<double, std::string> sweep_tma_plans(const dsi::cuda::GemvParams& p, double bytes, Run&& run_plan) {
  std::vector<std::pair<double, std::string>> times;
  const int64_t tiles = (p.out + 15) / 16, kb = p.in / 128;
  for (int ks = 1; ks <= 8; ks *= 2)
    for (int wt = 1; wt * ks <= 12; ++wt)
      for (int tpw = 1; tpw <= (ks == 1 ? 4 : 1); ++tpw)
        for (int piece : {256, 512}) {
          if ((p.in / ks) % piece != 0 || p.in % ks != 0 || int64_t(wt) * tpw * kb > 1024) continue;
          dsi::cuda::GemvPlan alt;
          alt.tma = dsi::cuda::GemvTmaPlan{wt, ks, tpw, piece};
          if (dsi::cuda::gemv_tma_smem(p, alt.tma) == 0) continue;
          const int64_t blocks = (tiles + int64_t(wt) * tpw - 1) / (int64_t(wt) * tpw);
          times.emplace_back(run_plan(alt), plan_name(alt) + " (" + std::to_string(blocks) + " blocks)");
        }
  std::sort(times.begin(), times.end());
  std::string out;
  for (size_t i = 0; i < times.size() && i < 5; ++i) {
    char buf[128];
    std::snprintf(buf, sizeof buf, "; %s %.2f us (%.1f%%)", times[i].second.c_str(), times[i].first,
                  100.0 * bytes / (times[i].first * 1e-6) / 1e9 / kPeakGBs);
    out += buf;
  }
  return {times.empty() ? 0.0 : times[0].first, out};
}

void print_row(const Shape& sh, const char* dt, int n, const char* kernel, double us, double bytes,
               const std::string& extra) {
  const double gbs = bytes / (us * 1e-6) / 1e9;
  const double tflops = 2.0 * n * double(sh.out) * double(sh.in) / (us * 1e-6) / 1e12;
  std::printf("%-8s %-14s %5lld %6lld %-5s %4d %-10s %9.2f %8.0f %6.1f%% %8.2f  %s\n", sh.model,
              sh.name, static_cast<long long>(sh.out), static_cast<long long>(sh.in), dt, n, kernel,
              us, gbs, 100.0 * gbs / kPeakGBs, tflops, extra.c_str());
}

// The MoE decode launches of one token, fp8, as moe_experts makes them: gate, up and SwiGLU of 8
// routed and 1 shared expert as one grouped GEMV (9 groups, each reading a [inter, hidden] gate and
// up weight), then the down products and their sum as one segment-sum GEMV (9 segments of
// [hidden, inter]). `copies` sets of weights rotate through the graph. --sweep also times every
// plan of the down launch.
void bench_grouped(const char* model, int64_t hidden, int64_t inter, int sms, int64_t l2, int reps,
                   bool sweep, const float* x, float* y) {
  constexpr int kSlots = 9;
  const int64_t per_w = inter * hidden, per_s = ((inter + 127) / 128) * ((hidden + 127) / 128);
  for (int proj = 0; proj < 2; ++proj) {
    const Shape sh = proj == 0 ? Shape{model, "moe_gate_up", inter, hidden}
                               : Shape{model, "moe_down", hidden, inter};
    const int n_weights = proj == 0 ? 2 * kSlots : kSlots;
    Weights ws = make_weights(Shape{model, "", sh.out * n_weights, sh.in}, true, l2);
    const int copies = int(ws.w.size());
    const double bytes = double(ws.bytes + ws.scale_bytes) + 4.0 * kSlots * (sh.in + sh.out);
    std::vector<void*> tables(static_cast<size_t>(copies));
    for (int c = 0; c < copies; ++c) {
      const uint8_t* w = static_cast<const uint8_t*>(ws.w[size_t(c)]);
      const float* s = ws.s[size_t(c)];
      std::vector<dsi::cuda::GemvGroup> g(kSlots);
      std::vector<dsi::cuda::GemvSegment> seg(kSlots);
      for (int i = 0; i < kSlots; ++i) {
        g[size_t(i)] = {x, w + i * per_w, s + i * per_s, y + i * inter, inter, hidden, (hidden + 127) / 128, 0, 0,
                        w + (kSlots + i) * per_w, s + (kSlots + i) * per_s};
        seg[size_t(i)] = {x + i * inter, w + i * per_w, s + i * per_s, nullptr, inter, (inter + 127) / 128, 0, 0};
      }
      const size_t n = proj == 0 ? g.size() * sizeof(g[0]) : seg.size() * sizeof(seg[0]);
      DSI_CUDA_CHECK(cudaMalloc(&tables[size_t(c)], n));
      DSI_CUDA_CHECK(cudaMemcpy(tables[size_t(c)], proj == 0 ? static_cast<const void*>(g.data()) : seg.data(), n,
                                cudaMemcpyHostToDevice));
    }
    std::string extra;
    double us = 0;
    if (proj == 0) {
      dsi::cuda::GemvParams p = gemv_params(sh, true, 1, x, y);
      p.w = ws.w[0];
      p.scale_inv = ws.s[0];
      p.n_groups = kSlots;
      p.swiglu = true;
      const dsi::cuda::GemvPlan plan = dsi::cuda::gemv_plan(p, sms);
      us = time_graph(copies, reps, [&](int c, cudaStream_t st) {
        dsi::cuda::GemvParams q = p;
        q.groups = static_cast<const dsi::cuda::GemvGroup*>(tables[size_t(c)]);
        dsi::cuda::launch_gemv(q, plan, st);
      });
      extra = plan_name(plan) + " swiglu";
    } else {
      dsi::cuda::GemvSegParams p;
      p.y = y;
      p.ldy = hidden;
      p.out = hidden;
      p.max_in = kSlots * inter;
      p.n = 1;
      p.n_seg = kSlots;
      p.kind = FloatKind::kE4M3;
      auto run_plan = [&](const dsi::cuda::GemvSegPlan& plan) {
        return time_graph(copies, reps, [&](int c, cudaStream_t st) {
          dsi::cuda::GemvSegParams q = p;
          q.segs = static_cast<const dsi::cuda::GemvSegment*>(tables[size_t(c)]);
          dsi::cuda::launch_gemv_seg(q, plan, st);
        });
      };
      const dsi::cuda::GemvSegPlan plan = dsi::cuda::gemv_seg_plan(p, sms);
      us = run_plan(plan);
      auto name = [](const dsi::cuda::GemvSegPlan& pl) {
        return "ks" + std::to_string(pl.k_split) + " r" + std::to_string(pl.rows) + (pl.ring ? " ring" : " regs") +
               " d" + std::to_string(pl.depth);
      };
      extra = "segment sum " + name(plan);
      if (sweep)
        for (int rows : {4, 2})
          for (bool ring : {false, true})
            for (int depth : ring ? std::vector<int>{2, 3} : std::vector<int>{2, 4})
              for (int ks : {1, 2, 4, 8}) {
                char buf[64];
                std::snprintf(buf, sizeof buf, " %.2f", run_plan({ks, rows, ring, depth}));
                extra += "; " + name({ks, rows, ring, depth}) + buf;
              }
    }
    Shape all = sh;
    all.out = sh.out * (proj == 0 ? 2 * kSlots : kSlots);
    print_row(all, "fp8", 1, "grouped", us, bytes, extra + " (" + std::to_string(kSlots) + " slots)");
    for (void* t : tables) cudaFree(t);
    free_weights(ws);
  }
}

// MLA's per-head products at decode, fp8 kv_b_proj ([heads * (nope + dv), lora], 128 x 128 block
// scales) read in place as the layer runs them: the absorbed query W_UK[h]^T q_nope[h] (the
// transposed kernel, mla_absorb_q) and the value up-projection W_UV[h] o_lat[h] (a head-batched
// GEMV, mla_up_v), for 1 and 4 rows; x and y strided per head as in the layer.
void bench_mla_heads(const char* model, int64_t heads, int64_t nope, int64_t dv, int64_t lora, int sms,
                     int64_t l2, int reps, const std::string& only, const float* x, float* y) {
  const char* names[2] = {"mla_absorb_q", "mla_up_v"};
  const bool want[2] = {std::string(names[0]).find(only) != std::string::npos,
                        std::string(names[1]).find(only) != std::string::npos};
  if (!want[0] && !want[1]) return;
  const int64_t per = nope + dv;
  Weights ws = make_weights(Shape{model, "", heads * per, lora}, true, l2);
  const int copies = int(ws.w.size());
  for (int uv = 0; uv < 2; ++uv)
    for (int n : {1, 4}) {
      if (!want[uv]) continue;
      dsi::cuda::GemvParams p{};
      p.kind = FloatKind::kE4M3;
      p.block_out = p.block_in = 128;
      p.scale_cols = (lora + 127) / 128;
      p.n_groups = int(heads);
      p.batch_rows = per;
      p.n = n;
      p.x = x;
      p.y = y;
      p.row0 = uv ? nope : 0;  // W_UV: the last dv rows of each head
      const int64_t w_off = uv ? nope * lora : 0;
      const int64_t in = uv ? lora : nope, out = uv ? dv : lora;
      p.in = in;
      p.out = out;
      p.batch_x = uv ? lora : nope + 64;  // o_lat [n, H, lora]; q [n, H, nope + rope]
      p.batch_y = uv ? dv : lora + 64;    // out [n, H, dv]; q_abs [n, H, lora + rope]
      p.ldx = heads * p.batch_x;
      p.ldy = heads * p.batch_y;
      const Shape sh{model, names[uv], heads * out, in};
      const double bytes = double(heads * in * out) + double(ws.scale_bytes) * double(in) / double(per) +
                           4.0 * n * heads * double(in + out);
      p.w = static_cast<const uint8_t*>(ws.w[0]) + w_off;
      p.scale_inv = ws.s[0];
      const bool transposed = !uv;
      const dsi::cuda::GemvPlan plan = transposed ? dsi::cuda::GemvPlan{} : dsi::cuda::gemv_plan(p, sms);
      const double us = time_graph(copies, reps, [&](int c, cudaStream_t st) {
        dsi::cuda::GemvParams q = p;
        q.w = static_cast<const uint8_t*>(ws.w[size_t(c)]) + w_off;
        q.scale_inv = ws.s[size_t(c)];
        if (transposed)
          dsi::cuda::launch_gemv_t(q, st);
        else
          dsi::cuda::launch_gemv(q, plan, st);
      });
      print_row(sh, "fp8", n, transposed ? "gemv_t" : "gemv", us, bytes,
                (transposed ? std::string("transposed") : plan_name(plan)) + " (" + std::to_string(heads) +
                    " heads)");
    }
  free_weights(ws);
}

}  // namespace

int main(int argc, char** argv) {
  bool sweep = false, gemv = true, gemm = true, moe_only = false;
  int reps = 30, only_rows = 0;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--sweep")) sweep = true;
    else if (!std::strcmp(argv[i], "--gemm-only")) gemv = false;
    else if (!std::strcmp(argv[i], "--gemv-only")) gemm = false;
    else if (!std::strcmp(argv[i], "--moe-only")) gemm = false, moe_only = true;
    else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) reps = std::max(3, std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
    else if (!std::strcmp(argv[i], "--rows") && i + 1 < argc) only_rows = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr,
                   "usage: %s [--sweep] [--reps N] [--only NAME] [--rows N] [--gemm-only | --gemv-only | --moe-only]\n",
                   argv[0]);
      return 2;
    }
  }
  try {
    if (dsi::cuda::device_count() == 0) {
      std::fprintf(stderr, "error: no CUDA device visible\n");
      return 1;
    }
    DSI_CUDA_CHECK(cudaSetDevice(0));
    int sms = 0, l2 = 0;
    DSI_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    DSI_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
    std::printf("device: %s, %d SMs, L2 %d MiB; peak taken as %.0f GB/s\n",
                dsi::cuda::device_description(0).c_str(), sms, l2 >> 20, kPeakGBs);
    // in_proj: the stacked q_a, kv_a (576 rows padded to 640, whole scale blocks) and indexer wk
    // (AttentionWeights::in_proj; GLM-5.2's shared-indexer layers have no wk: 2688 rows).
    std::vector<Shape> shapes = {
        {"GLM-5", "in_proj", 2816, 6144},     {"GLM-5", "in_proj_shared", 2688, 6144},
        {"DSV3.2", "in_proj", 2304, 7168},
        {"GLM-5", "o_proj", 6144, 16384},     {"GLM-5", "q_b_proj", 16384, 2048},
        {"GLM-5", "expert_gate", 2048, 6144}, {"GLM-5", "expert_down", 6144, 2048},
        {"DSV3.2", "o_proj", 7168, 16384},    {"DSV3.2", "expert_gate", 2048, 7168},
        {"DSV3.2", "expert_down", 7168, 2048}, {"GLM-5", "router", 256, 6144},
        {"DSV3.2", "router", 256, 7168},      {"GLM-5", "idx_wproj", 32, 6144}};
    if (!only.empty())
      shapes.erase(std::remove_if(shapes.begin(), shapes.end(),
                                  [&](const Shape& sh) { return std::string(sh.name).find(only) == std::string::npos; }),
                   shapes.end());
    // (Shared experts have the routed experts' shapes; q_b_proj of DSV3.2 is GLM-5's [16384, 1536].)
    std::printf("%-8s %-14s %5s %6s %-5s %4s %-10s %9s %8s %7s %8s  %s\n", "model", "layer", "out", "in",
                "dtype", "n", "kernel", "us", "GB/s", "%peak", "TFLOP/s", "plan");
    float *x = nullptr, *y = nullptr;
    uint8_t* xq = nullptr;
    float* sx = nullptr;
    const int64_t max_n = 4096, max_in = 16384, max_out = 16384;
    void* lt_ws = nullptr;
    DSI_CUDA_CHECK(cudaMalloc(&lt_ws, dsi::cuda::kFp8GemmLtWorkspace));
    DSI_CUDA_CHECK(cudaMalloc(&x, size_t(max_n * max_in) * 4));
    DSI_CUDA_CHECK(cudaMalloc(&y, size_t(max_n * max_out) * 4));
    DSI_CUDA_CHECK(cudaMalloc(&xq, size_t(max_n * max_in)));
    DSI_CUDA_CHECK(cudaMalloc(&sx, size_t(max_n * (max_in / 128 + 1)) * 4));
    fill_f32<<<1024, 256>>>(x, max_n * max_in, 7, -1.0f, 1.0f);
    DSI_CUDA_CHECK(cudaDeviceSynchronize());

    if (gemv && only.empty()) {
      bench_grouped("GLM-5", 6144, 2048, sms, l2, reps, sweep, x, y);
      bench_grouped("DSV3.2", 7168, 2048, sms, l2, reps, sweep, x, y);
    }
    if (gemv && !moe_only) {  // --only filters these rows by name, as the shapes below
      bench_mla_heads("GLM-5", 64, 192, 256, 512, sms, l2, reps, only, x, y);
      bench_mla_heads("DSV3.2", 128, 128, 128, 512, sms, l2, reps, only, x, y);
    }
    for (const Shape& sh : moe_only ? std::vector<Shape>{} : shapes)
      for (bool fp8 : {true, false}) {
        Weights ws = make_weights(sh, fp8, l2);
        const int copies = int(ws.w.size());
        const char* dt = fp8 ? "fp8" : "bf16";
        if (gemv)
          for (int n : {1, 2, 4, 8}) {
            if (only_rows != 0 && n != only_rows) continue;
            dsi::cuda::GemvParams p = gemv_params(sh, fp8, n, x, y);
            const double bytes = double(ws.bytes + ws.scale_bytes) + 4.0 * n * (sh.in + sh.out);
            auto run_plan = [&](const dsi::cuda::GemvPlan& plan) {
              return time_graph(copies, reps, [&](int c, cudaStream_t st) {
                dsi::cuda::GemvParams q = p;
                q.w = ws.w[size_t(c)];
                q.scale_inv = fp8 ? ws.s[size_t(c)] : nullptr;
                dsi::cuda::launch_gemv(q, plan, st);
              });
            };
            p.w = ws.w[0];
            p.scale_inv = fp8 ? ws.s[0] : nullptr;
            const dsi::cuda::GemvPlan plan = dsi::cuda::gemv_plan(p, sms);
            // The plan gemv_plan makes with the tensor-map kernel off (the FMA kernels').
            const bool tma = dsi::cuda::gemv_tma();
            dsi::cuda::set_gemv_tma(false);
            const dsi::cuda::GemvPlan fma = dsi::cuda::gemv_plan(p, sms);
            dsi::cuda::set_gemv_tma(tma);
            const double us = run_plan(plan);
            std::string extra = plan_name(plan);
            if (sweep) extra += sweep_plans(fma, us, bytes, run_plan);  // the FMA plans around it
            print_row(sh, dt, n, "gemv", us, bytes, extra);
            if (sweep && dsi::cuda::gemv_tma_ok(p)) {
              const auto [best, plans] = sweep_tma_plans(p, bytes, run_plan);
              if (best > 0) print_row(sh, dt, n, "gemv_tma", best, bytes, "tensor-map plans" + plans);
            }
            if (plan.tma.warp_tiles > 0)  // the tensor-map kernel and the FMA plan side by side
              print_row(sh, dt, n, "gemv", run_plan(fma), bytes, plan_name(fma));
            if (dsi::cuda::gemv_mma_ok(p)) {  // the FMA and tensor-core kernels side by side
              dsi::cuda::GemvPlan other = dsi::cuda::gemv_mma_plan(p, sms);
              if (plan.mma) {
                dsi::cuda::set_gemv_tensor_cores(false);
                other = dsi::cuda::gemv_plan(p, sms);
                dsi::cuda::set_gemv_tensor_cores(true);
              }
              print_row(sh, dt, n, "gemv", run_plan(other), bytes, plan_name(other));
            }
          }
        if (gemm && fp8)
          for (int n : {1, 8, 64, 512, 4096}) {
            const int64_t groups = (sh.in + 127) / 128;
            const double bytes = double(ws.bytes + ws.scale_bytes) + 4.0 * n * (sh.in + sh.out);
            const double flops = 2.0 * n * double(sh.in) * double(sh.out);
            for (bool lt : {false, true}) {
              dsi::cuda::Fp8GemmParams gp{};
              gp.xq = xq;
              gp.sx = sx;
              const int n_lt = (n + 7) / 8 * 8;  // cuBLASLt's rows: x padded to 8 as the op does
              gp.sx_row = lt ? 1 : groups;
              gp.sx_group = lt ? n_lt : 1;
              gp.w = static_cast<const uint8_t*>(ws.w[0]);
              gp.scale_inv = ws.s[0];
              gp.y = y;
              gp.ldy = sh.out;
              gp.n = lt ? n_lt : n;
              gp.in = sh.in;
              gp.out = sh.out;
              gp.groups = groups;
              gp.block_out = gp.block_in = 128;
              if (lt && !(dsi::cuda::fp8_gemm_lt_supported(gp) && dsi::cuda::fp8_gemm_lt_available(gp))) {
                print_row(sh, dt, n, "fp8_act", 0.0, bytes, "cuBLASLt: no algorithm");
                continue;
              }
              if (!lt && n > 512) continue;  // the tiled kernel takes seconds there
              const double us = time_graph(copies, std::max(3, reps / 3), [&](int c, cudaStream_t st) {
                dsi::cuda::ActQuantParams qp{};
                qp.x = x;
                qp.q = xq;
                qp.scales = sx;
                qp.scale_row = gp.sx_row;
                qp.scale_group = gp.sx_group;
                qp.ldx = sh.in;
                qp.n = n;
                qp.in = sh.in;
                qp.groups = groups;
                qp.block = 128;
                dsi::cuda::launch_act_quant_fp8(qp, st);
                dsi::cuda::Fp8GemmParams g = gp;
                g.w = static_cast<const uint8_t*>(ws.w[size_t(c)]);
                g.scale_inv = ws.s[size_t(c)];
                if (lt)
                  dsi::cuda::launch_fp8_gemm_lt(g, lt_ws, st);
                else
                  dsi::cuda::launch_fp8_gemm(g, st);
              });
              char buf[96];
              std::snprintf(buf, sizeof buf, "quantise + %s GEMM, %.0f TFLOP/s", lt ? "cuBLASLt" : "tiled",
                            flops / (us * 1e-6) / 1e12);
              print_row(sh, dt, n, "fp8_act", us, bytes, buf);
            }
          }
        free_weights(ws);
      }
    cudaFree(x);
    cudaFree(y);
    cudaFree(xq);
    cudaFree(sx);
    cudaFree(lt_ws);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
