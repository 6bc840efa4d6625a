// Continuous-batching scheduler; see scheduler.h.
#include "runtime/scheduler.h"

#include <algorithm>

#include "dsinfer/error.h"
#include "runtime/kv_cache.h"

namespace dsi {

Scheduler::Scheduler(const SchedulerConfig& cfg) : cfg_(cfg) {
  DSI_CHECK(cfg.max_num_seqs >= 1, "max_num_seqs = {} must be >= 1", cfg.max_num_seqs);
  DSI_CHECK(cfg.max_num_batched_tokens >= 1 + cfg.speculative_tokens,
            "max_num_batched_tokens = {} must be at least 1 + speculative_tokens = {}",
            cfg.max_num_batched_tokens, 1 + cfg.speculative_tokens);
  free_.reserve(size_t(cfg.n_pages));
  for (int64_t p = cfg.n_pages - 1; p >= 0; --p) free_.push_back(int32_t(p));
}

int64_t Scheduler::pages_for(int64_t tokens) const {
  return SequenceKvCache::pages_for(cfg_.dcp, tokens);
}

void Scheduler::add(SchedSeq* seq) { waiting_.push_back(seq); }

void Scheduler::remove(SchedSeq* seq) {
  running_.erase(std::remove(running_.begin(), running_.end(), seq), running_.end());
  waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), seq), waiting_.end());
  free_.insert(free_.end(), seq->pages.rbegin(), seq->pages.rend());
  seq->pages.clear();
}

bool Scheduler::ensure_pages(SchedSeq* s, int64_t tokens) {
  const int64_t need = pages_for(tokens) - int64_t(s->pages.size());
  if (need <= 0) return true;
  if (need > int64_t(free_.size())) return false;
  for (int64_t i = 0; i < need; ++i) {
    s->pages.push_back(free_.back());
    free_.pop_back();
  }
  return true;
}

void Scheduler::preempt(SchedSeq* s, StepPlan& plan) {
  running_.erase(std::remove(running_.begin(), running_.end(), s), running_.end());
  free_.insert(free_.end(), s->pages.rbegin(), s->pages.rend());
  s->pages.clear();
  s->computed = 0;
  ++s->preemptions;
  waiting_.push_front(s);
  plan.preempted.push_back(s);
}

int64_t Scheduler::chunk_for(const SchedSeq* s, int64_t budget) const {
  return std::min(s->n_tokens - s->computed, budget);
}

StepPlan Scheduler::schedule_with(const std::vector<int64_t>& drafts) {
  StepPlan plan = plan_once(drafts);
  // Prefilling sequences can hold pages while none can take its next chunk: the newest gives
  // its pages back until something runs (a lone sequence always fits: the engine checks that).
  while (plan.empty() && running_.size() > 1) {
    SchedSeq* victim = running_.back();
    std::vector<int64_t> d(drafts.begin(), drafts.begin() + long(running_.size()) - 1);
    std::vector<SchedSeq*> earlier = plan.preempted;
    preempt(victim, plan);
    earlier.push_back(victim);
    plan = plan_once(d);
    plan.preempted.insert(plan.preempted.begin(), earlier.begin(), earlier.end());
  }
  return plan;
}

StepPlan Scheduler::plan_once(const std::vector<int64_t>& drafts) {
  StepPlan plan;
  int64_t budget = cfg_.max_num_batched_tokens;
  const int64_t K = cfg_.speculative_tokens;
  // 1. Decode rounds, oldest first; the newest running sequences give up their pages if needed.
  std::vector<SchedSeq*> order = running_;
  for (size_t i = 0; i < order.size(); ++i) {
    SchedSeq* s = order[i];
    if (!s->decoding() ||
        std::find(running_.begin(), running_.end(), s) == running_.end())  // preempted meanwhile
      continue;
    const int64_t rows = 1 + drafts[i];
    if (rows > budget) continue;
    bool ok = ensure_pages(s, s->computed + 1 + K);
    while (!ok) {
      SchedSeq* victim = running_.back();
      preempt(victim, plan);
      if (victim == s) break;
      ok = ensure_pages(s, s->computed + 1 + K);
    }
    if (!ok) continue;
    plan.decode.push_back({s, rows});
    budget -= rows;
  }
  // 2. Prefill chunks of admitted sequences.
  for (SchedSeq* s : running_) {
    if (s->decoding() || budget == 0) continue;
    const int64_t chunk = chunk_for(s, budget);
    const bool last = s->computed + chunk == s->n_tokens;
    if (!ensure_pages(s, s->computed + chunk + (last ? 1 + K : 0))) break;
    plan.prefill.push_back({s, chunk});
    budget -= chunk;
  }
  // 3. Admissions. A sequence preempted by this very plan waits for the next step.
  while (!waiting_.empty() && int64_t(running_.size()) < cfg_.max_num_seqs && budget > 0) {
    SchedSeq* s = waiting_.front();
    if (std::find(plan.preempted.begin(), plan.preempted.end(), s) != plan.preempted.end()) break;
    const int64_t chunk = chunk_for(s, budget);
    const bool last = s->computed + chunk == s->n_tokens;
    if (!ensure_pages(s, s->computed + chunk + (last ? 1 + K : 0))) break;
    waiting_.pop_front();
    running_.push_back(s);
    plan.prefill.push_back({s, chunk});
    budget -= chunk;
  }
  return plan;
}

}  // namespace dsi
