// The GEMV's launch plan (gemv.h): the kernel, rows per warp, split and ring for a product on this
// GPU, and the switches that override it for tests and comparisons.
#include <algorithm>
#include <atomic>
#include <cstdlib>

#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/linear/gemv.h"
#include "backends/cuda/linear/gemv_chunk.cuh"
#include "backends/cuda/switch_value.h"

namespace dsi::cuda {

using namespace gemv_chunk;

namespace {
std::atomic<int> g_tensor_cores{-1};
std::atomic<int> g_mma_one_row{-1};
std::atomic<int> g_tma{-1};
std::atomic<int> g_row_groups_per_warp{-1};
std::atomic<int> g_tma_balance{-1};
}  // namespace

bool gemv_tensor_cores() {
  return switch_value(g_tensor_cores, [] { return env_switched_off("DSI_GEMV_MMA") ? 0 : 1; }) == 1;
}

void set_gemv_tensor_cores(bool on) { g_tensor_cores.store(on ? 1 : 0); }

bool gemv_mma_one_row() {
  return switch_value(g_mma_one_row, [] { return env_switched_on("DSI_GEMV_MMA1") ? 1 : 0; }) == 1;
}

void set_gemv_mma_one_row(bool on) { g_mma_one_row.store(on ? 1 : 0); }

bool gemv_tma() {
  return switch_value(g_tma, [] { return env_switched_off("DSI_GEMV_TMA") ? 0 : 1; }) == 1;
}

void set_gemv_tma(bool on) { g_tma.store(on ? 1 : 0); }

int gemv_tma_balance() {
  return switch_value(g_tma_balance, [] {
    const char* env = std::getenv("DSI_GEMV_TMA_BALANCE");
    return env != nullptr ? std::clamp(std::atoi(env), 0, 100) : kGemvTmaBalance;
  });
}

void set_gemv_tma_balance(int percent) { g_tma_balance.store(std::clamp(percent, 0, 100)); }

int gemv_row_groups_per_warp() {
  return switch_value(g_row_groups_per_warp, [] {
    const char* env = std::getenv("DSI_GEMV_ROW_GROUPS");
    return env != nullptr ? std::max(0, std::atoi(env)) : 0;
  });
}

void set_gemv_row_groups_per_warp(int n) { g_row_groups_per_warp.store(std::max(0, n)); }

bool gemv_pipelined_default() {
  static const bool on = !env_switched_off("DSI_GEMV_PIPE");
  return on;
}

int64_t gemv_prefetch_budget() {
  static const int64_t budget = [] {
    const char* env = std::getenv("DSI_GEMV_PREFETCH_MB");
    return (env != nullptr ? std::max<int64_t>(0, std::atoll(env)) : kGemvPrefetchMB) << 20;
  }();
  return budget;
}

namespace {
// Blocks of plan's vector kernel one SM of the current device holds at once, cached per
// instantiation (kind, rows of x, rows per warp, ring, swiglu).
int vec_blocks_per_sm(const GemvParams& p, const GemvPlan& plan) {
  static std::atomic<int> cache[kCachedDevices][4 * kGemvMaxRows * 3 * 2 * 2];
  const int r = plan.rows_per_warp == 4 ? 2 : plan.rows_per_warp - 1;
  const int key = (((int(p.kind) * kGemvMaxRows + p.n - 1) * 3 + r) * 2 + plan.pipelined) * 2 + p.swiglu;
  return cached_blocks_per_sm(cache, key, [&] { return gemv_fma_blocks_per_sm(p, plan); });
}
}  // namespace

GemvPlan gemv_plan(const GemvParams& p, int num_sms) {
  // The tensor-core kernel for 3..8 rows, and for 2 rows on products of >= 4096 rows (measured,
  // bench_linear --gemv-only, one H200, us FMA -> tensor cores: o_proj 2 rows 39.5 -> 35.1, 4 rows
  // 75.7 -> 35.7, 8 rows 127.1 -> 40.0; the experts' down rows [6144, 2048] 2 rows 7.9 -> 7.5,
  // 4 rows 13.6 -> 7.6; their gate rows [2048, 6144] 2 rows 8.8 -> 11.3: too few warps).
  // Not below 1024 rows, where its 32 rows per warp leave most SMs idle (a router of 256 rows,
  // 4 rows of x: 10.5 us against 3.8 on the FMA kernels).
  if (gemv_tensor_cores() && gemv_mma_ok(p) && (p.n >= 3 || p.out >= 4096) &&
      (p.n > 1 || gemv_mma_one_row()) && p.out * p.n_groups >= 1024)
    return gemv_mma_plan(p, num_sms);
  // One row of fp8 weights: the tensor-map kernel where its plan keeps the SMs busy enough (measured in
  // docs/decode-performance.md, "The one-row GEMV on a tensor-map kernel").
  GemvPlan plan;
  if (gemv_tma() && gemv_tma_ok(p)) {
    plan.tma = gemv_tma_plan(p, num_sms);
    if (plan.tma.warp_tiles > 0) return plan;
  }
  plan.vec = gemv_vector_ok(p);
  if (!plan.vec) return plan;
  // Four rows per warp (each x load serves 4 rows; measured fastest on every GLM-5 / DeepSeek-V3.2
  // shape, one row or several, bench_linear --sweep).
  plan.rows_per_warp = 4;
  // ... except on products of a few hundred rows (the router, the indexer's weights_proj), where
  // four rows per warp leave most SMs idle even with 8 warps per row group: fewer rows per warp
  // until there are warps for half a block per SM, and 8 warps per row group however short their
  // share (swiglu keeps two rows: a gate and an up row). Measured, bench_linear --sweep, one H200:
  // GLM-5's bf16 router [256, 6144] 2.37 us with 2 rows per warp and 8 warps (the best plan),
  // 3.05 with 1 and 4; its indexer weights_proj [32, 6144] 1.74 us with 1 and 8.
  while (plan.rows_per_warp > (p.swiglu ? 2 : 1) &&
         (p.out + plan.rows_per_warp - 1) / plan.rows_per_warp * p.n_groups * kWarps < int64_t(num_sms) * kWarps / 2)
    plan.rows_per_warp /= 2;
  const bool small = plan.rows_per_warp < 4;
  const int64_t row_bytes = p.in * elem_bytes(p.kind);
  const int64_t per_rg = gemv_outputs_per_row_group(p, plan.rows_per_warp);  // outputs per row group
  const int64_t group_rgs = (p.out + per_rg - 1) / per_rg;              // row groups per product
  const int64_t row_groups = group_rgs * p.n_groups;
  // Streaming: a product with at least twice as many row groups as the GPU holds warps of the ring
  // kernel at once gives each warp several row groups, streamed through its ring back to back: the
  // fewest per warp that fit all blocks in one wave (grouped products round per group). Measured,
  // bench_linear --gemv-only, one H200, % of 4.3 TB/s: MoE gate + up 75.4 -> 85.8 (3 per warp),
  // MoE down 61.4 -> 67.7 (5); q_b, 2 per warp, 65.2 -> 50.1, hence the factor two.
  const int64_t resident_blocks = int64_t(num_sms) * kGemvStreamBlocksPerSm;
  int rgw = gemv_row_groups_per_warp();
  if (rgw == 0 && row_groups >= 2 * resident_blocks * kWarps) {
    rgw = 2;
    while (int64_t(kWarps) * rgw < group_rgs &&
           (group_rgs + int64_t(kWarps) * rgw - 1) / (int64_t(kWarps) * rgw) * p.n_groups > resident_blocks)
      ++rgw;
  }
  if (gemv_pipelined_default() && rgw > 1) {
    plan.pipelined = true;
    plan.row_groups_per_warp = rgw;
  } else {
    // Rows are split between warps (split-K) while the GPU has under 32 warps per SM and each warp
    // still streams >= 2 KB of a row.
    while (plan.k_split < kWarps && row_groups * plan.k_split < int64_t(num_sms) * 32 &&
           (small || row_bytes / (2 * plan.k_split) >= 2048))
      plan.k_split *= 2;
    // The shared-memory ring pays off once each warp streams at least 12 stretches of its rows
    // (measured, bench_linear --gemv-only, one H200: MoE gate + up, 12 stretches, 73.5% -> 77.8% of
    // 4.3 TB/s; o_proj, 8 stretches over 4 warps, 76.0% -> 68.6%; q_b and the experts' down rows,
    // 4 stretches, 65.4% -> 48.7% and 61.3% -> 55.2%): with fewer, its start-up and the lower
    // occupancy that its shared memory allows cost more than the steadier stream gains.
    auto ring_pays = [&](int k_split) {
      const int64_t stretches = (row_bytes / 16 + 32 * k_split - 1) / (32 * k_split);
      return gemv_pipelined_default() && stretches >= kGemvPipeMinStretches;
    };
    plan.pipelined = ring_pays(plan.k_split);
    // One wave: where some split, with the register kernel or (rows long enough) the ring kernel,
    // has all its blocks resident at once, take the one with the most warps (ties: the register
    // kernel). The rule above ignores how many blocks an SM holds (two of the 125-register kernel,
    // three of the ring kernel), so a product can end in a partial second wave. Measured,
    // bench_linear --gemv-only, one H200, one fp8 row, the rule above -> this one: GLM-5's o_proj
    // [6144, 16384] 4 warps per row group on registers (768 blocks) 30.8 us -> 2 through the ring
    // (384 blocks) 30.2 us; DeepSeek-V3.2's [7168, 16384] 39.1 us -> 1 on registers (224 blocks)
    // 34.8 us, the --sweep's best plan for both. Where no split fits (q_b: 512 blocks even with 1),
    // the rule above stands; no other decode product changed plan.
    if (!small) {
      int64_t best_warps = 0;
      GemvPlan best = plan;
      for (int k = 1; k <= kWarps && (k == 1 || row_bytes / k >= 2048); k *= 2) {
        for (const bool ring : {false, true}) {
          if (ring && !ring_pays(k)) continue;
          GemvPlan c = plan;
          c.k_split = k;
          c.pipelined = ring;
          const int64_t blocks = (group_rgs + kWarps / k - 1) / (kWarps / k) * p.n_groups;
          if (blocks <= int64_t(num_sms) * vec_blocks_per_sm(p, c) && blocks * kWarps > best_warps) {
            best_warps = blocks * kWarps;
            best = c;
          }
        }
      }
      if (best_warps > 0) plan = best;
    }
  }
  // L2 prefetch before the dependency wait: an equal share of the budget per block, all of a small
  // product. Grouped products cannot (their pointers are data).
  if (p.groups == nullptr) {
    const int64_t rows_per_block = gemv_block_rows(p, plan);
    const int64_t blocks = (p.out + rows_per_block - 1) / rows_per_block * p.n_groups;
    const int64_t share = gemv_prefetch_budget() / std::max<int64_t>(1, blocks);
    plan.prefetch = std::min(share, rows_per_block * row_bytes) / 16 * 16;
  }
  return plan;
}

}  // namespace dsi::cuda
