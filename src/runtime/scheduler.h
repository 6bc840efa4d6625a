// Continuous batching: which sequences take part in the next engine step and with how many rows,
// the pages they hold, and preemption (by recompute) when pages run out. Pure bookkeeping: the
// engine (engine.cpp) runs the plans. Policy, per step, within max_num_batched_tokens rows:
//   1. every decoding sequence, oldest first: 1 + K rows (the last token and K drafts), with pages
//      for 1 + K more tokens; when pages run out the newest running sequence is preempted (its
//      pages freed, its tokens recomputed later), so a full cache queues work instead of failing;
//   2. prefilling sequences, oldest first: the next chunk of their tokens;
//   3. waiting sequences (preempted ones first, then new ones in arrival order) while fewer than
//      max_num_seqs run and pages for their first chunk exist. An admitted sequence first takes
//      the cached blocks its tokens start with (prefix_cache.h): those tokens count as computed.
// Full blocks of computed tokens join the prefix cache at the start of each plan and when their
// sequence ends or is preempted.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "runtime/parallel.h"
#include "runtime/prefix_cache.h"

namespace dsi {

// What the scheduler tracks of one sequence.
struct SchedSeq {
  uint64_t id = 0;
  int64_t n_tokens = 0;    // tokens known: the prompt and those generated so far
  int64_t n_generated = 0;
  int64_t computed = 0;    // tokens whose keys are cached
  int64_t max_drafts = 0;  // drafts the next decode round may verify (0 without speculation)
  int64_t max_chunk = 0;   // > 0: prefill chunks of at most this many tokens
  std::vector<int32_t> pages;
  int64_t preemptions = 0;
  // The prefix cache: the sequence's tokens (null: none of its blocks are cached or looked up),
  // positions whose MTP-layer entries are cached (with speculation, a block joins the cache once
  // they cover it), its leading blocks in the cache (taken from it or given to it) and the entry of
  // the last of them, and the tokens its latest admission took from the cache.
  const std::vector<int32_t>* tokens = nullptr;
  int64_t mtp_computed = 0;
  int64_t cached_blocks = 0;
  uint64_t last_block = 0;
  int64_t cache_hit = 0;

  // Decoding: all tokens but the newest are cached and the newest was generated.
  bool decoding() const { return n_generated > 0 && computed == n_tokens - 1; }
};

struct SchedulerConfig {
  int max_num_seqs = 16;
  int max_num_batched_tokens = 2048;
  int speculative_tokens = 0;  // K: pages for 1 + K tokens are reserved per decode round
  int64_t n_pages = 0;
  DcpLayout dcp;  // pages hold 64 tokens on every rank: a logical page spans W x 64 tokens
  bool prefix_caching = true;
};

struct StepPlan {
  struct Rows {
    SchedSeq* seq;
    int64_t n;  // rows in this step: 1 + drafts (decode) or the prefill chunk
  };
  std::vector<Rows> decode;   // decoding sequences (n = 1 + its drafts)
  std::vector<Rows> prefill;  // chunks of prompts (or of recomputed sequences)
  std::vector<SchedSeq*> preempted;  // sent back to the waiting queue by this plan
  bool empty() const { return decode.empty() && prefill.empty(); }
};

class Scheduler {
 public:
  explicit Scheduler(const SchedulerConfig& cfg);

  // Pages a sequence of `tokens` tokens holds on every rank.
  int64_t pages_for(int64_t tokens) const;
  // Pages an admission can get (free, or cached and held by nobody) and the others.
  int64_t free_pages() const { return cache_.available(); }
  int64_t used_pages() const { return cfg_.n_pages - free_pages(); }
  const SchedulerConfig& config() const { return cfg_; }
  const PrefixCache& prefix_cache() const { return cache_; }
  // Tokens admissions looked up in the prefix cache, and those they found there.
  int64_t cache_queries() const { return cache_queries_; }
  int64_t cache_hits() const { return cache_hits_; }

  void add(SchedSeq* seq);  // a new sequence waits at the back of the queue
  // Drops a sequence wherever it is and frees its pages.
  void remove(SchedSeq* seq);
  // The next step. `drafts(seq)` gives the drafts a decoding sequence verifies this round
  // (<= max_drafts). Pages for the planned rows are in the sequences' page lists afterwards.
  template <typename DraftFn>
  StepPlan schedule(DraftFn drafts);

  const std::vector<SchedSeq*>& running() const { return running_; }
  const std::deque<SchedSeq*>& waiting() const { return waiting_; }

 private:
  bool ensure_pages(SchedSeq* s, int64_t tokens);
  void preempt(SchedSeq* s, StepPlan& plan);
  void give_back(SchedSeq* s);      // its full blocks join the cache, its pages are released
  void cache_blocks(SchedSeq* s);   // its full blocks of final cache entries join the cache
  bool admit(SchedSeq* s, int64_t budget, StepPlan& plan);
  // Whether a running sequence is still computing blocks that s's prompt shares and could take
  // from the cache once they are there (the n choices of one request, identical prompts sent
  // together): s then waits for them rather than computing them a second time.
  bool waits_for_shared_blocks(const SchedSeq* s) const;
  int64_t chunk_for(const SchedSeq* s, int64_t budget) const;
  StepPlan schedule_with(const std::vector<int64_t>& drafts);
  StepPlan plan_once(const std::vector<int64_t>& drafts);  // drafts[i]: of running_[i]

  SchedulerConfig cfg_;
  PrefixCache cache_;  // the page ids: free, held, cached
  int64_t cache_queries_ = 0, cache_hits_ = 0;
  std::vector<SchedSeq*> running_;  // admitted sequences, oldest first
  std::deque<SchedSeq*> waiting_;   // preempted sequences first, then new ones
};

template <typename DraftFn>
StepPlan Scheduler::schedule(DraftFn drafts) {
  std::vector<int64_t> d(running_.size(), 0);
  for (size_t i = 0; i < running_.size(); ++i)
    if (running_[i]->decoding()) d[i] = drafts(*running_[i]);
  return schedule_with(d);
}

}  // namespace dsi
