// Thread ranks; see ranks.h.
#include "runtime/ranks.h"

#include <algorithm>
#include <exception>
#include <mutex>
#include <thread>

#include "comm/local_comm.h"

namespace dsi {

void run_on_thread_ranks(const ParallelConfig& cfg, const CommOptions& options,
                         const std::function<void(const RankContext&)>& fn) {
  DSI_CHECK(cfg.tp >= 1, "tp = {} must be >= 1", cfg.tp);
  LocalWorld world(cfg.tp, options);
  std::mutex mu;
  std::exception_ptr first;  // the first error thrown is the root cause; later ones follow it
  std::vector<std::thread> threads;
  for (int r = 0; r < cfg.tp; ++r) {
    threads.emplace_back([&, r] {
      LocalComm& comm = world.comm(r);
      try {
        const RankContext rank = RankContext::make(cfg, r, &comm);
        fn(rank);
      } catch (const std::exception& e) {
        {
          std::lock_guard<std::mutex> lock(mu);
          if (!first) first = std::current_exception();
        }
        comm.abort(fmt::format("rank {}: {}", r, e.what()));
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
