// The serving engine's implementation class (include/dsinfer/engine.h), shared by engine.cpp (the
// queue, the engine thread, set-up) and engine_step.cpp (one step: drafting, the batched forward,
// sampling and verification, events).
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "dsinfer/engine.h"
#include "model/dsa_model.h"
#include "runtime/engine_sequence.h"
#include "runtime/rank_workers.h"
#include "runtime/scheduler.h"
#include "runtime/step_graphs.h"

namespace dsi {

class EngineImpl final : public Engine {
 public:
  explicit EngineImpl(const EngineOptions& o);
  ~EngineImpl() override;

  uint64_t submit(EngineRequest request, EventSink sink) override;
  void cancel(uint64_t id) override;
  EngineMetrics metrics() const override;
  const ModelInfo& info() const override { return info_; }
  std::string failure() const override;

 private:
  void loop();
  // engine_step.cpp
  void step();
  void prepare(EngineSequence& s);
  void draft(const std::vector<EngineSequence*>& seqs);
  void warm_up(int64_t rows);
  Tensor run_forward(const std::vector<StepPlan::Rows>& rows, const std::vector<int64_t>& keep);
  bool emit(EngineSequence& s, const std::vector<int32_t>& tokens, const Tensor& logits, int64_t row0);
  void append_pending(EngineSequence& s, int64_t first_row, int64_t n);
  void reset(EngineSequence& s);
  int64_t drafts_for(const EngineSequence& s) const;
  void finish(EngineSequence& s, const std::string& reason, const std::string& error = {});
  void fail_all(const std::string& error);
  void publish_metrics();
  void sweep();  // forgets finished sequences
  EngineSequence& seq_of(const SchedSeq* s) const { return *seqs_.at(s->id); }

  EngineOptions opt_;
  ModelInfo info_;
  ModelConfig cfg_;
  int K_ = 0;
  KvCacheDtype kv_dtype_ = KvCacheDtype::kF32;  // options.kv_cache_dtype resolved for the device
  std::unique_ptr<RankWorkers> ranks_;
  std::vector<std::unique_ptr<DsaModel>> models_;  // [rank]
  std::unique_ptr<StepGraphs> graphs_;  // decode-only steps of one CUDA rank, from graphs
  int64_t graph_bytes_ = 0;  // device memory the graphs captured at start-up take (measured)
  std::vector<std::shared_ptr<KvPool>> pools_;     // [rank]
  std::unique_ptr<Scheduler> sched_;
  std::unordered_map<uint64_t, std::unique_ptr<EngineSequence>> seqs_;  // engine thread only
  EngineMetrics stats_;  // engine thread's counters, published into metrics_

  // The queue: the only state shared with other threads.
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<EngineSequence>> incoming_;
  std::vector<uint64_t> cancels_;
  uint64_t next_id_ = 1;
  bool stop_ = false;
  std::string failed_;  // set when a rank failed: the engine takes no more work
  EngineMetrics metrics_;
  std::thread thread_;
};

}  // namespace dsi
