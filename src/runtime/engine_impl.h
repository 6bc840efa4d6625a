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

// The options of the engine's collectives (lockstep check, timeout).
CommOptions comm_options(const EngineOptions& o);

class EngineImpl final : public Engine {
 public:
  // On thread ranks of this process.
  explicit EngineImpl(const EngineOptions& o);
  // On `ranks` (e.g. one rank per MPI process). The leader's engine (rank 0's process) takes the
  // requests and runs its engine thread; every other process calls follow().
  EngineImpl(const EngineOptions& o, std::unique_ptr<RankGroup> ranks);
  ~EngineImpl() override;

  // A process other than the leader: runs the leader's steps on this process's ranks until the
  // leader's engine stops. A failure here ends the whole job (the leader would wait for this rank).
  void follow();

  uint64_t submit(EngineRequest request, EventSink sink) override;
  void cancel(uint64_t id) override;
  EngineMetrics metrics() const override;
  const ModelInfo& info() const override { return info_; }
  std::string failure() const override;

 private:
  void loop();
  // One round of the loop's control message: the leader sends whether it stops, the new requests
  // and the cancelled ids; the other processes receive them.
  bool share_control(bool stop, std::deque<std::unique_ptr<EngineSequence>>& incoming,
                     std::vector<uint64_t>& cancels);
  void share_tokens(std::vector<int32_t>& tokens);  // the leader's decisions, on every process
  // engine_step.cpp
  void step();
  void prepare(EngineSequence& s);
  void draft(const std::vector<EngineSequence*>& seqs);
  void warm_up(int64_t rows);
  Tensor run_forward(const std::vector<StepPlan::Rows>& rows, const std::vector<int64_t>& keep);
  // Prefill chunks of a scored prompt hold at most this many tokens (GLM-5's vocabulary: 79 MB
  // of logits).
  static constexpr int64_t kScoredChunkRows = 128;
  void plan_sequence(EngineSequence& s, bool constrained) const;
  // Whether the MTP layer drafts for the sequence (then it keeps the pending rows the drafter reads).
  bool speculated(const EngineSequence& s) const { return K_ > 0 && s.sched.max_drafts > 0; }
  // The leader's report of a scored prompt's token logprobs for a prefill chunk of n rows whose
  // logits start at row0 (before the chunk's rows count as computed).
  void report_prompt_logprobs(EngineSequence& s, int64_t n, const Tensor& logits, int64_t row0);
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
  std::unique_ptr<RankGroup> ranks_;
  std::vector<std::unique_ptr<DsaModel>> models_;  // [slot of a local rank]
  std::vector<std::unique_ptr<StepGraphs>> graphs_;  // [slot]: decode-only steps from graphs (or none)
  int64_t graph_bytes_ = 0;  // device memory the graphs captured at start-up take (measured)
  std::vector<std::shared_ptr<KvPool>> pools_;     // [slot of a local rank]
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
