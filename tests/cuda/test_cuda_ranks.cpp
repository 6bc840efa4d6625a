// The engine on GPUs: the serving engine (continuous batching over paged caches, MTP) on one GPU,
// and tensor- and decode-context-parallel ranks on two GPUs (the generator and the
// engine; exact global top-k and both combines), give the greedy tokens of the CPU reference on
// one rank. With one GPU the two ranks share it (logical devices) and talk through the peer
// communicator, whose collectives are captured in the decode graphs (with and without graphs).
#include <gtest/gtest.h>

#include <condition_variable>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "cuda/cuda_test_util.h"
#include "dsinfer/engine.h"
#include "runtime/generator.h"
#include "runtime/ranks.h"
#include "test_util.h"

namespace dsi {
namespace {

const std::vector<std::vector<int32_t>> kPrompts = {
    {5, 9, 2, 7}, {1}, {3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46, 26, 43, 38, 32, 79, 50, 28, 84},
    {100, 200, 300, 310, 315, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27,
     28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50,
     51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71}};

GenerationParams greedy(int n, int K) {
  GenerationParams gp;
  gp.kv_cache_dtype = "f32";  // the CPU reference's cache: GPU and CPU tokens comparable one for one
  gp.max_new_tokens = n;
  gp.ignore_eos = true;
  gp.speculative_tokens = K;
  return gp;
}

std::vector<int32_t> cpu_greedy(const std::string& fixture, const std::vector<int32_t>& prompt, int n) {
  return generate(test::fixture_model(fixture), prompt, greedy(n, 0)).output_ids;
}

// Runs `prompts` through `engine` at once (n greedy tokens each); returns each request's tokens and
// the prompt tokens it took from the prefix cache.
std::vector<std::pair<std::vector<int32_t>, int64_t>> run_wave(Engine& engine,
                                                              const std::vector<std::vector<int32_t>>& prompts,
                                                              int n) {
  struct Out {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<int32_t> ids;
    std::string reason, error;
    int64_t cached = 0;
  };
  std::vector<std::unique_ptr<Out>> outs;
  for (const auto& p : prompts) {
    outs.push_back(std::make_unique<Out>());
    Out* out = outs.back().get();
    EngineRequest r;
    r.prompt = p;
    r.max_new_tokens = n;
    r.ignore_eos = true;
    engine.submit(r, [out](RequestEvent&& ev) {
      std::lock_guard<std::mutex> lock(out->mu);
      for (const auto& t : ev.tokens) out->ids.push_back(t.id);
      if (ev.finished) {
        out->reason = ev.finish_reason;
        out->error = ev.error;
        out->cached = ev.cached_tokens;
        out->cv.notify_all();
      }
    });
  }
  std::vector<std::pair<std::vector<int32_t>, int64_t>> got;
  for (auto& out : outs) {
    std::unique_lock<std::mutex> lock(out->mu);
    EXPECT_TRUE(out->cv.wait_for(lock, std::chrono::seconds(300), [&] { return !out->reason.empty(); }));
    EXPECT_EQ(out->reason, "length") << out->error;
    got.emplace_back(out->ids, out->cached);
  }
  return got;
}

// Runs every prompt through an engine at once; returns each request's tokens (and, if asked, the
// engine's counters at the end).
std::vector<std::vector<int32_t>> engine_outputs(const EngineOptions& o, int n,
                                                 EngineMetrics* metrics = nullptr) {
  auto engine = Engine::start(o);
  std::vector<std::vector<int32_t>> ids;
  for (auto& w : run_wave(*engine, kPrompts, n)) ids.push_back(std::move(w.first));
  EXPECT_EQ(engine->metrics().kv_pages_used, 0);
  if (metrics) *metrics = engine->metrics();
  return ids;
}

class CudaEngine : public test::CudaTest, public ::testing::WithParamInterface<std::string> {};

TEST_P(CudaEngine, BatchedRequestsMatchTheCpu) {
  for (bool graphs : {true, false})
  for (int K : {0, 2}) {
    SCOPED_TRACE(fmt::format("speculative tokens {}, CUDA graphs {}", K, graphs));
    EngineOptions o;
    o.model_dir = test::fixture_dir(GetParam());
    o.device = "cuda";
    o.speculative_tokens = K;
    o.max_num_batched_tokens = 24;  // the long prompt is chunked and mixed with decode rounds
    o.kv_cache_memory = 64 << 20;
    o.kv_cache_dtype = "f32";  // the CPU reference's cache
    o.cuda_graphs = graphs;
    EngineMetrics m;
    const auto got = engine_outputs(o, 12, &m);
    for (size_t i = 0; i < kPrompts.size(); ++i)
      EXPECT_EQ(got[i], cpu_greedy(GetParam(), kPrompts[i], 12)) << "prompt " << i;
    // Decode-only steps replay graphs (the first step of each shape captures instead).
    if (graphs) EXPECT_GT(m.graph_steps, 0);
    else EXPECT_EQ(m.graph_steps, 0);
    EXPECT_LT(m.graph_steps, m.steps);
  }
}

// Prefix caching on the GPU: requests whose prompts start with the block an earlier request
// computed take its pages and still give the tokens of the CPU (f32 cache) or of the same engine
// without the cache (bf16 cache; the fixtures lack the fp8 entry's geometry), with and without MTP.
TEST_P(CudaEngine, PrefixCachedRequestsMatchTheCpu) {
  const std::vector<int32_t>& longest = kPrompts.back();  // 70 tokens: one 64-token block
  ASSERT_GT(longest.size(), 65u);
  auto with = [&](std::vector<int32_t> tail) {
    std::vector<int32_t> p = longest;
    p.insert(p.end(), tail.begin(), tail.end());
    return p;
  };
  const std::vector<int32_t> first = with({4, 5});
  const std::vector<std::vector<int32_t>> second = {with({6, 7, 8}), longest, with({9})};
  for (const char* dtype : {"f32", "bf16"})
  for (int K : {0, 2}) {
    SCOPED_TRACE(fmt::format("speculative tokens {}, KV cache {}", K, dtype));
    EngineOptions o;
    o.model_dir = test::fixture_dir(GetParam());
    o.device = "cuda";
    o.speculative_tokens = K;
    o.max_num_batched_tokens = 24;
    o.kv_cache_memory = 64 << 20;
    o.kv_cache_dtype = dtype;
    auto engine = Engine::start(o);
    EXPECT_EQ(run_wave(*engine, {first}, 8)[0].second, 0);
    const auto got = run_wave(*engine, second, 8);
    const EngineMetrics m = engine->metrics();
    EXPECT_EQ(m.prefix_cache_hits, 3 * 64);
    EXPECT_EQ(m.kv_pages_used, 0);
    engine.reset();
    std::unique_ptr<Engine> plain;
    if (std::string(dtype) != "f32") {
      o.prefix_caching = false;
      plain = Engine::start(o);
    }
    for (size_t i = 0; i < second.size(); ++i) {
      EXPECT_EQ(got[i].second, 64) << "request " << i;
      const std::vector<int32_t> want =
          plain ? run_wave(*plain, {second[i]}, 8)[0].first : cpu_greedy(GetParam(), second[i], 8);
      EXPECT_EQ(got[i].first, want) << "request " << i;
    }
  }
}

// Two ranks: on two GPUs through NCCL (when built) or, with one GPU, on two logical devices of it
// through the peer communicator (GPU sharing, backends/cuda/device.h).
class CudaTwoRanks : public test::CudaTest, public ::testing::WithParamInterface<std::string> {
 protected:
  void SetUp() override {
    test::CudaTest::SetUp();
    if (IsSkipped()) return;
    was_sharing_ = cuda::gpu_sharing();
    if (cuda::device_count() < 2) cuda::set_gpu_sharing(true);
  }
  void TearDown() override { cuda::set_gpu_sharing(was_sharing_); }  // later tests run as alone

 private:
  bool was_sharing_ = false;
};

TEST_P(CudaTwoRanks, TensorParallelGenerateMatchesTheCpu) {
  struct Layout {
    int dcp, interleave;
    DcpCombine combine;
  };
  for (const Layout& lay : {Layout{1, 1, DcpCombine::kAgRs}, Layout{2, 1, DcpCombine::kAgRs},
                            Layout{2, 1, DcpCombine::kA2a}, Layout{2, 2, DcpCombine::kAgRs}})
  for (int K : {0, 3})
  for (bool graphs : {true, false}) {
    ParallelConfig cfg;
    cfg.tp = 2;
    cfg.dcp = lay.dcp;
    cfg.dcp_interleave = lay.interleave;
    cfg.combine = lay.combine;
    SCOPED_TRACE(fmt::format("dcp {} interleave {} {}, speculative tokens {}, CUDA graphs {}", lay.dcp,
                             lay.interleave, lay.combine == DcpCombine::kA2a ? "a2a" : "ag_rs", K, graphs));
    std::vector<std::vector<int32_t>> got(kPrompts.size());
    run_on_thread_ranks(
        cfg, CommOptions{},
        [&](const RankContext& rank) {
          auto model = load_rank_model(test::fixture_dir(GetParam()), rank, {},
                                       rank_cuda_device(rank.tp_rank));
          for (size_t i = 0; i < kPrompts.size(); ++i) {
            GenerationParams gp = greedy(10, K);
            gp.cuda_graphs = graphs;  // with the peer communicator the collectives are captured too
            GenerationResult r = generate(*model, kPrompts[i], gp);
            if (rank.is_root()) got[i] = r.output_ids;
          }
        },
        /*cuda=*/true);
    for (size_t i = 0; i < kPrompts.size(); ++i)
      EXPECT_EQ(got[i], cpu_greedy(GetParam(), kPrompts[i], 10)) << "prompt " << i;
  }
}

// DSI_DEVICE_COMM set to `value` ("": unset) for a scope; the device communicator is chosen from
// it when ranks start.
class DeviceCommEnv {
 public:
  explicit DeviceCommEnv(const std::string& value) {
    const char* old = std::getenv("DSI_DEVICE_COMM");
    had_ = old != nullptr;
    if (had_) old_ = old;
    if (value.empty())
      unsetenv("DSI_DEVICE_COMM");
    else
      setenv("DSI_DEVICE_COMM", value.c_str(), 1);
  }
  ~DeviceCommEnv() {
    if (had_)
      setenv("DSI_DEVICE_COMM", old_.c_str(), 1);
    else
      unsetenv("DSI_DEVICE_COMM");
  }

 private:
  bool had_ = false;
  std::string old_;
};

// The communicators thread ranks get: the peer one whenever GPUs are shared or reach each other;
// NCCL (when built) for GPUs without peer access or when asked for.
TEST(DeviceComm, ChoiceFollowsSharingPeerAccessAndTheEnvironment) {
  {
    DeviceCommEnv env("");
    EXPECT_TRUE(use_peer_comm(true, false));
    EXPECT_TRUE(use_peer_comm(false, true));
#ifdef DSI_WITH_NCCL
    EXPECT_FALSE(use_peer_comm(false, false));
#else
    EXPECT_TRUE(use_peer_comm(false, false));
#endif
  }
  {
    DeviceCommEnv env("peer");
    EXPECT_TRUE(use_peer_comm(false, false));
  }
#ifdef DSI_WITH_NCCL
  {
    DeviceCommEnv env("nccl");
    EXPECT_FALSE(use_peer_comm(false, true));
    EXPECT_THROW(use_peer_comm(true, false), Error);  // NCCL refuses ranks sharing a GPU
  }
#endif
  {
    DeviceCommEnv env("mpi");
    EXPECT_THROW(use_peer_comm(false, false), Error);
  }
}

TEST_P(CudaTwoRanks, TensorParallelEngineMatchesTheCpu) {
  // With two GPUs and NCCL built, the default communicator (the peer one where the GPUs reach each
  // other) and NCCL both; with one GPU the peer one (the ranks share it).
  std::vector<std::string> comms = {""};
#ifdef DSI_WITH_NCCL
  if (cuda::device_count() >= 2) comms.push_back("nccl");
#endif
  for (const std::string& comm : comms)
  for (bool graphs : {true, false}) {
  SCOPED_TRACE(fmt::format("DSI_DEVICE_COMM '{}', CUDA graphs {}", comm, graphs));
  DeviceCommEnv env(comm);
  EngineOptions o;
  o.cuda_graphs = graphs;
  o.model_dir = test::fixture_dir(GetParam());
  o.device = "cuda";
  o.tp = 2;
  o.dcp = 2;
  o.speculative_tokens = 2;
  o.max_num_batched_tokens = 24;
  o.kv_cache_memory = 64 << 20;
  o.kv_cache_dtype = "f32";
  EngineMetrics m;
  const auto got = engine_outputs(o, 10, &m);
  for (size_t i = 0; i < kPrompts.size(); ++i)
    EXPECT_EQ(got[i], cpu_greedy(GetParam(), kPrompts[i], 10)) << "prompt " << i;
  // The peer communicator's collectives are captured with the rest of a decode step; NCCL's are
  // not (its collectives wait on the host), so with it every step runs eagerly.
  const bool share = cuda::device_count() < 2;
  const bool capturable = use_peer_comm(share, !share && cuda::peer_access_among(2));
  if (graphs && capturable) EXPECT_GT(m.graph_steps, 0);
  else EXPECT_EQ(m.graph_steps, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaEngine, ::testing::Values("glm_tiny", "dsv32_tiny", "glm_tiny_fp8"));
INSTANTIATE_TEST_SUITE_P(Fixtures, CudaTwoRanks, ::testing::Values("glm_tiny", "dsv32_tiny", "glm_tiny_fp8"));

}  // namespace
}  // namespace dsi
