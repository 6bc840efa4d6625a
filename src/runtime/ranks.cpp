// Thread ranks; see ranks.h.
#include "runtime/ranks.h"

#include <algorithm>
#include <exception>
#include <mutex>
#include <thread>

#include "comm/local_comm.h"
#include "ops/linear.h"
#ifdef DSI_WITH_CUDA
#include <cstdlib>
#include <string_view>

#include "backends/cuda/device.h"
#include "comm/peer_comm.h"
#endif
#ifdef DSI_WITH_NCCL
#include "comm/nccl_comm.h"
#endif

namespace dsi {

#ifdef DSI_WITH_CUDA
Device rank_cuda_device(int r) {
  const int n = cuda::device_count();
  DSI_CHECK(n > 0, "--device cuda: no CUDA device is visible");
  DSI_CHECK(r < n || cuda::gpu_sharing(),
            "rank {} needs CUDA device {}, and this process sees {} GPU(s) (DSI_SHARE_GPUS=1 lets ranks share "
            "GPUs, for tests and development runs)", r, r, n);
  return Device::cuda(r);
}

struct ThreadRankComms {
#ifdef DSI_WITH_NCCL
  std::shared_ptr<NcclProcessState> nccl = std::make_shared<NcclProcessState>();
#endif
};

std::shared_ptr<ThreadRankComms> make_thread_rank_comms() { return std::make_shared<ThreadRankComms>(); }

bool use_peer_comm(bool shared_gpus, bool peer_access) {
  const char* env = std::getenv("DSI_DEVICE_COMM");
  const std::string_view want = env != nullptr ? env : "";
  DSI_CHECK(want.empty() || want == "nccl" || want == "peer", "DSI_DEVICE_COMM={}: expected nccl or peer", want);
#ifdef DSI_WITH_NCCL
  DSI_CHECK(want != "nccl" || !shared_gpus, "DSI_DEVICE_COMM=nccl: ranks share GPUs, which NCCL refuses");
  if (!want.empty()) return want == "peer" || shared_gpus;
  return shared_gpus || peer_access;
#else
  DSI_CHECK(want != "nccl", "DSI_DEVICE_COMM=nccl: this build has no NCCL");
  return true;
#endif
}

std::unique_ptr<Communicator> make_thread_rank_device_comm(Communicator& host, const ParallelConfig& cfg, int r,
                                                           const std::shared_ptr<ThreadRankComms>& shared) {
  const Device device = rank_cuda_device(r);
  const RankContext layout = RankContext::make(cfg, r, &host);
  cuda::prepare_thread(device.index);
  std::unique_ptr<Communicator> comm;
  const bool share_gpus = cfg.tp > cuda::device_count();
  if (use_peer_comm(share_gpus, !share_gpus && cuda::peer_access_among(cfg.tp))) {
    comm = PeerComm::create(host, PeerSetup{device.index, {layout.tp_group, layout.dcp_group}});
  } else {
#ifdef DSI_WITH_NCCL
    comm = NcclComm::create(host, NcclSetup{device.index, {layout.tp_group, layout.dcp_group},
                                            NcclSumOrder::kMemberOrder, shared->nccl});
#else
    (void)shared;
    fail("thread ranks on CUDA: no device communicator");  // unreachable: without NCCL the peer one
#endif
  }
  host.barrier(layout.tp_group);  // every rank prepared before any queues a collective
  return comm;
}
#endif

void run_on_thread_ranks(const ParallelConfig& cfg, const CommOptions& options,
                         const std::function<void(const RankContext&)>& fn, bool cuda) {
  DSI_CHECK(cfg.tp >= 1, "tp = {} must be >= 1", cfg.tp);
  LocalWorld world(cfg.tp, options);
  ops::share_host_cores(cfg.tp);
  std::mutex mu;
  std::exception_ptr first;  // the first error thrown is the root cause; later ones follow it
  std::vector<std::thread> threads;
#ifdef DSI_WITH_CUDA
  // GPU ranks exchange device tensors through a device communicator; the thread world stays the
  // host-side group (bootstrap, lockstep checks, barriers, failures).
  const auto shared = make_thread_rank_comms();
#else
  DSI_CHECK(!cuda || cfg.tp == 1, "{} ranks on CUDA devices need a CUDA build", cfg.tp);
#endif
  for (int r = 0; r < cfg.tp; ++r) {
    threads.emplace_back([&, r] {
      LocalComm& host = world.comm(r);
      Communicator* comm = &host;
      std::unique_ptr<Communicator> device_comm;  // destroyed in this thread, before the world
      try {
#ifdef DSI_WITH_CUDA
        if (cuda && cfg.tp > 1) {
          device_comm = make_thread_rank_device_comm(host, cfg, r, shared);
          comm = device_comm.get();
        }
#endif
        const RankContext rank = RankContext::make(cfg, r, comm);
        fn(rank);
      } catch (const std::exception& e) {
        {
          std::lock_guard<std::mutex> lock(mu);
          if (!first) first = std::current_exception();
        }
        comm->abort(fmt::format("rank {}: {}", r, e.what()));
      }
    });
  }
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

std::unique_ptr<DsaModel> load_rank_model(const std::string& dir, const RankContext& rank,
                                          const ModelOverrides& overrides, Device device) {
  ModelConfig cfg = load_config(dir + "/config.json");
  if (overrides.dense_attention)
    cfg.index_topk = int(std::max<int64_t>(cfg.index_topk, cfg.max_position_embeddings));
  const Checkpoint ck = Checkpoint::open(dir);
  return DsaModel::load(ck, std::move(cfg), rank, device);
}

GenerationResult generate_on_ranks(const std::string& dir, const std::vector<int32_t>& prompt,
                                   const GenerationParams& params, const ParallelConfig& cfg,
                                   const CommOptions& options) {
  GenerationResult result;
  run_on_thread_ranks(cfg, options, [&](const RankContext& rank) {
    auto model = load_rank_model(dir, rank);
    GenerationResult r = generate(*model, prompt, params);
    if (rank.is_root()) result = std::move(r);
  });
  return result;
}

PromptLogits prompt_logits_on_ranks(const std::string& dir, const std::vector<int32_t>& prompt,
                                    int prefill_chunk, bool with_mtp, const ParallelConfig& cfg,
                                    const CommOptions& options) {
  PromptLogits result;
  run_on_thread_ranks(cfg, options, [&](const RankContext& rank) {
    auto model = load_rank_model(dir, rank);
    PromptLogits r = prompt_logits(*model, prompt, prefill_chunk, with_mtp);
    if (rank.is_root()) result = std::move(r);
  });
  return result;
}

}  // namespace dsi
