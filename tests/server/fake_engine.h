// A test double of dsi::Engine: the same contract (one engine thread, sinks called on it, submit
// throws dsi::Error for a request that can never run, cancel -> "abort", page accounting) with
// made-up tokens: a deterministic function of the prompt, the position and (when sampling) the
// seed, so that outputs can be compared across runs and concurrency. Used by the server's tests
// until they run against the real engine, and for what a real model cannot be made to do on cue.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include "dsinfer/engine.h"
#include "dsinfer/error.h"

namespace dsi::test {

struct FakeEngineOptions {
  std::string model_id = "fake-model";
  int64_t max_model_len = 2048;
  int64_t vocab_size = 4096;
  int32_t first_token = 32;    // generated ids lie in [first_token, last_token]
  int32_t last_token = 3999;
  int32_t eos = 4090;
  int eos_every = 0;           // > 0: greedy output hits eos where hash % eos_every == 0
  int max_num_seqs = 8;
  int tokens_per_step = 1;     // > 1: events carry several tokens (as speculative decoding does)
  std::chrono::microseconds step_time{1000};
  int64_t kv_pages_total = 4096;
  std::string failure;         // non-empty: the engine reports itself failed
  std::vector<int32_t> script; // non-empty: every request's first tokens are these
  bool natural_first = false;  // a constrained request takes its natural token wherever the mask allows it
};

class FakeEngine : public Engine {
 public:
  explicit FakeEngine(FakeEngineOptions options = {});
  ~FakeEngine() override;
  uint64_t submit(EngineRequest request, EventSink sink) override;
  void cancel(uint64_t id) override;
  EngineMetrics metrics() const override;
  const ModelInfo& info() const override { return info_; }
  std::string failure() const override { return o_.failure; }

  // The tokens a request would get (without eos / stop ids / cancellation).
  static int32_t token_at(const FakeEngineOptions& o, const EngineRequest& r, size_t i);
  uint64_t submitted() const;

 private:
  struct Seq {
    uint64_t id;
    EngineRequest request;
    EventSink sink;
    int generated = 0;
    int cursor = 0;  // a constrained request: its natural (script or hash) tokens taken so far
    bool cancelled = false;
  };
  // The next token of a constrained request: its natural token where the constraint leaves every
  // token (or, natural_first, where it allows it), else the lowest id it allows (then the natural
  // tokens wait).
  int32_t constrained_token(Seq& s) const;
  void loop();
  int64_t pages_of(const Seq& s) const;

  FakeEngineOptions o_;
  ModelInfo info_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Seq> waiting_;
  std::vector<Seq> running_;
  std::map<uint64_t, bool> cancel_;  // ids to cancel
  uint64_t next_id_ = 1;
  bool stop_ = false;
  EngineMetrics m_;
  std::thread thread_;
};

}  // namespace dsi::test
