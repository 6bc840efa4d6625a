// Early L2 prefetch of weights; see prefetch.h and ops::prefetch_linear.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>

#include "backends/cuda/common.cuh"
#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/linear/gemv.h"
#include "backends/cuda/linear/gemv_chunk.cuh"
#include "backends/cuda/linear/linear.h"
#include "backends/cuda/linear/prefetch.h"
#include "ops/linear.h"
#include "ops/moe.h"

namespace dsi::cuda {

namespace {

constexpr int kPrefetchThreads = 32;  // a warp per block: the pieces spread over many SMs

// How the pieces are asked for (DSI_PREFETCH_MODE, for comparisons): 0 one bulk request per 32 KiB
// piece, 1 per 4 KiB piece, 2 a prefetch.global.L2 per 128-byte line of 4 KiB pieces.
int prefetch_mode() {
  static const int mode = [] {
    const char* env = std::getenv("DSI_PREFETCH_MODE");
    return env != nullptr ? std::atoi(env) : 0;
  }();
  return mode;
}

// The wait comes first: the bytes then compete with the kernels after this one (which read little
// where callers put it), not with the one before it.
template <bool kLines>
__global__ void __launch_bounds__(kPrefetchThreads)
    prefetch_stretches_kernel(const char* base, int64_t total, int64_t stride, int64_t skip, int64_t len,
                              int64_t per, int64_t piece) {
  pdl_enter();
  const PrefetchPiece p =
      prefetch_piece(int64_t(blockIdx.x) * kPrefetchThreads + threadIdx.x, total, stride, skip, len, per, piece);
  if (p.end <= p.begin) return;
  if constexpr (kLines) {
    for (int64_t o = p.begin; o < p.end; o += 128) prefetch_l2(base + o);
  } else {
    prefetch_l2_bulk(base + p.begin, p.end - p.begin);
  }
}

// The prefetches run on a second stream per device, forked from the device's stream where they are
// asked for: a kernel completes only once the lines it asked for have landed (a 21 MB prefetch
// kernel took 6.8 us under the profiler), so on the device's stream the kernels after it would wait
// for them. join_prefetches() joins them back.
struct SideStream {
  cudaStream_t s = nullptr;
  cudaEvent_t fork = nullptr, done = nullptr;
  bool pending = false;  // prefetches queued since the last join
};
constexpr int kMaxSideStreams = 64;
SideStream g_side[kMaxSideStreams];
std::mutex g_side_mu;

SideStream* side_stream(bool create) {
  const int dev = current_device();
  DSI_CHECK(dev >= 0 && dev < kMaxSideStreams, "cuda:{}: device index beyond {}", dev, kMaxSideStreams);
  std::lock_guard<std::mutex> lock(g_side_mu);
  SideStream& sd = g_side[dev];
  if (sd.s == nullptr && create) {
    DSI_CUDA_CHECK(cudaStreamCreateWithFlags(&sd.s, cudaStreamNonBlocking));
    DSI_CUDA_CHECK(cudaEventCreateWithFlags(&sd.fork, cudaEventDisableTiming));
    DSI_CUDA_CHECK(cudaEventCreateWithFlags(&sd.done, cudaEventDisableTiming));
  }
  return sd.s != nullptr ? &sd : nullptr;
}

// Runs launch(stream) on the side stream, after everything queued on the device's stream so far
// (DSI_PREFETCH_SIDE=0: on the device's stream itself; for comparisons).
template <typename Launch>
void on_side_stream(Launch&& launch) {
  static const bool off = env_switched_off("DSI_PREFETCH_SIDE");
  if (off) {
    launch(stream());
    return;
  }
  SideStream& sd = *side_stream(true);
  DSI_CUDA_CHECK(cudaEventRecord(sd.fork, stream()));
  DSI_CUDA_CHECK(cudaStreamWaitEvent(sd.s, sd.fork, 0));
  launch(sd.s);
  DSI_CUDA_CHECK(cudaEventRecord(sd.done, sd.s));
  sd.pending = true;
}

}  // namespace

void join_prefetches() {
  SideStream* sd = side_stream(false);
  if (sd == nullptr || !sd->pending) return;
  DSI_CUDA_CHECK(cudaStreamWaitEvent(stream(), sd->done, 0));
  sd->pending = false;
}

void forget_prefetches() {
  if (SideStream* sd = side_stream(false)) sd->pending = false;
}

int64_t early_prefetch_budget() {
  static const int64_t env_mb = [] {
    const char* env = std::getenv("DSI_EARLY_PREFETCH_MB");
    return env != nullptr ? std::max<int64_t>(0, std::atoll(env)) : int64_t(-1);
  }();
  if (env_mb >= 0) return env_mb << 20;
  static std::atomic<int64_t> l2[gemv_chunk::kCachedDevices];  // bytes + 1; 0: not asked yet
  int gpu = 0;
  DSI_CUDA_CHECK(cudaGetDevice(&gpu));
  int64_t bytes = gpu < gemv_chunk::kCachedDevices ? l2[gpu].load(std::memory_order_relaxed) - 1 : -1;
  if (bytes < 0) {
    int b = 0;
    DSI_CUDA_CHECK(cudaDeviceGetAttribute(&b, cudaDevAttrL2CacheSize, gpu));
    bytes = b;
    if (gpu < gemv_chunk::kCachedDevices) l2[gpu].store(bytes + 1, std::memory_order_relaxed);
  }
  return int64_t(double(bytes) * kEarlyPrefetchL2Share) / 16 * 16;
}

void launch_prefetch_stretches(const void* base, int64_t total, int64_t stride, int64_t skip, int64_t len,
                               cudaStream_t s) {
  DSI_CHECK(stride > 0 && skip >= 0 && len >= 0 && total >= 0, "prefetch: stretches of {} every {} from {}",
            len, stride, skip);
  const int64_t stretches = (total + stride - 1) / stride;
  len = std::min(len, stride - skip);
  if (stretches == 0 || len < 16) return;
  const int mode = prefetch_mode();
  const int64_t piece = mode == 0 ? 32 << 10 : 4 << 10, per = prefetch_pieces_per_stretch(len, piece);
  launch(mode == 2 ? prefetch_stretches_kernel<true> : prefetch_stretches_kernel<false>,
         unsigned((stretches * per + kPrefetchThreads - 1) / kPrefetchThreads), kPrefetchThreads, 0, s,
         static_cast<const char*>(base), total, stride, skip, len, per, piece);
}

void launch_gemv_prefetch(const GemvParams& p, int64_t budget, cudaStream_t s) {
  if (budget < 16 || !gemv_vector_ok(p)) return;
  const GemvPlan plan = gemv_plan(p, sm_count());
  const int64_t row_bytes = p.in * gemv_chunk::elem_bytes(p.kind), block_bytes = gemv_block_rows(p, plan) * row_bytes;
  const int64_t total = p.out * row_bytes, blocks = (total + block_bytes - 1) / block_bytes;
  // Each block's stretch after what the product's own prologue asks for (plan.prefetch).
  launch_prefetch_stretches(p.w, total, block_bytes, plan.prefetch, budget / blocks / 16 * 16, s);
}

void prefetch_linear(const LinearWeight& w, int64_t rows) {
  if (rows < 1 || rows > kGemvMaxRows || w.out_features() == 0 || w.in_features() == 0) return;
  validate_weight(w, 0, w.out_features());
  DeviceGuard guard(w.weight.device());
  GemvParams p = gemv_weight_params(w);
  p.n = int(rows);
  p.ldx = p.in;  // an aligned, contiguous x, as linear_gemv makes one
  const int64_t budget = early_prefetch_budget();
  if (budget > 0) on_side_stream([&](cudaStream_t s) { launch_gemv_prefetch(p, budget, s); });
}

void prefetch_shared_expert(const MlpWeights& shared, int64_t rows) {
  if (rows < 1 || rows > kGemvMaxRows || !shared.gate_proj.defined() || env_switched_off("DSI_EARLY_PREFETCH_SHARED"))
    return;
  DeviceGuard guard(shared.gate_proj.weight.device());
  const int64_t budget = early_prefetch_budget() / 2;
  if (budget == 0) return;
  for (const LinearWeight* w : {&shared.gate_proj, &shared.up_proj})
    if (w->out_features() > 0 && w->in_features() > 0) validate_weight(*w, 0, w->out_features());
  on_side_stream([&](cudaStream_t s) {
    for (const LinearWeight* w : {&shared.gate_proj, &shared.up_proj}) {
      const int64_t total = w->weight.nbytes() / 16 * 16;  // the grouped launch reads all of it
      if (total > 0) launch_prefetch_stretches(w->weight.raw(), total, total, 0, budget, s);
    }
  });
}

}  // namespace dsi::cuda
