// Thread ranks; see ranks.h.
#include "runtime/ranks.h"

#include <algorithm>
#include <exception>
#include <mutex>
#include <thread>

#include "comm/local_comm.h"

#ifdef DSI_WITH_NCCL
#include "backends/cuda/device.h"
#include "comm/nccl_comm.h"
#endif

namespace dsi {

#ifdef DSI_WITH_NCCL
std::unique_ptr<NcclComm> make_thread_rank_nccl(Communicator& host, const ParallelConfig& cfg, int r,
                                                const std::shared_ptr<NcclProcessState>& process) {
  const int n_gpus = cuda::device_count();
  DSI_CHECK(n_gpus >= cfg.tp, "{} ranks on CUDA devices need {} GPUs, {} visible", cfg.tp, cfg.tp,
            n_gpus);
  const RankContext layout = RankContext::make(cfg, r, &host);
  return NcclComm::create(host, NcclSetup{r, {layout.tp_group, layout.dcp_group},
                                          NcclSumOrder::kMemberOrder, process});
}
#endif

void run_on_thread_ranks(const ParallelConfig& cfg, const CommOptions& options,
                         const std::function<void(const RankContext&)>& fn, bool cuda) {
  DSI_CHECK(cfg.tp >= 1, "tp = {} must be >= 1", cfg.tp);
  LocalWorld world(cfg.tp, options);
  std::mutex mu;
  std::exception_ptr first;  // the first error thrown is the root cause; later ones follow it
  std::vector<std::thread> threads;
#ifdef DSI_WITH_NCCL
  // GPU ranks exchange device tensors through NCCL; the thread world stays the host-side group
  // (bootstrap, lockstep checks, barriers, failures).
  auto nccl_process = std::make_shared<NcclProcessState>();
#else
  DSI_CHECK(!cuda || cfg.tp == 1, "{} ranks on CUDA devices need NCCL, and this build has none",
            cfg.tp);
#endif
  for (int r = 0; r < cfg.tp; ++r) {
    threads.emplace_back([&, r] {
      LocalComm& host = world.comm(r);
      Communicator* comm = &host;
#ifdef DSI_WITH_NCCL
      std::unique_ptr<NcclComm> nccl;  // destroyed in this thread, before the world
#endif
      try {
#ifdef DSI_WITH_NCCL
        if (cuda && cfg.tp > 1) {
          nccl = make_thread_rank_nccl(host, cfg, r, nccl_process);
          comm = nccl.get();
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
