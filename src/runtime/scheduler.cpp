// Continuous-batching scheduler; see scheduler.h.
#include "runtime/scheduler.h"

#include <algorithm>
#include <numeric>

#include "dsinfer/error.h"
#include "runtime/kv_cache.h"

namespace dsi {

namespace {

// Pages per rank of one prefix-cache block: the fewest whose 64 x g local tokens are whole groups
// of I, so that the block is the same leading tokens of the sequence on every rank of the group.
int64_t block_pages(const DcpLayout& dcp) {
  return dcp.interleave / std::gcd<int64_t>(kPageTokens, dcp.interleave);
}

}  // namespace

Scheduler::Scheduler(const SchedulerConfig& cfg)
    : cfg_(cfg),
      cache_(cfg.n_pages, block_pages(cfg.dcp), block_pages(cfg.dcp) * kPageTokens * cfg.dcp.size,
             cfg.prefix_caching) {
  DSI_CHECK(cfg.max_num_seqs >= 1, "max_num_seqs = {} must be >= 1", cfg.max_num_seqs);
  DSI_CHECK(cfg.max_num_batched_tokens >= 1 + cfg.speculative_tokens,
            "max_num_batched_tokens = {} must be at least 1 + speculative_tokens = {}",
            cfg.max_num_batched_tokens, 1 + cfg.speculative_tokens);
}

int64_t Scheduler::pages_for(int64_t tokens) const {
  return SequenceKvCache::pages_for(cfg_.dcp, tokens);
}

void Scheduler::add(SchedSeq* seq) { waiting_.push_back(seq); }

void Scheduler::remove(SchedSeq* seq) {
  running_.erase(std::remove(running_.begin(), running_.end(), seq), running_.end());
  waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), seq), waiting_.end());
  give_back(seq);
}

void Scheduler::cache_blocks(SchedSeq* s) {
  if (!cache_.enabled() || s->tokens == nullptr) return;
  // Final entries: the computed tokens' (and with speculation, the MTP layer's at their
  // positions); a block also needs the token after it (its key).
  int64_t final_len = std::min(s->computed, int64_t(s->tokens->size()) - 1);
  if (cfg_.speculative_tokens > 0) final_len = std::min(final_len, s->mtp_computed);
  const int64_t B = cache_.block_tokens(), g = cache_.block_pages();
  const int64_t full = std::max<int64_t>(final_len, 0) / B;
  for (int64_t b = s->cached_blocks; b < full; ++b) {
    DSI_CHECK(int64_t(s->pages.size()) >= (b + 1) * g, "scheduler: sequence {} lacks the pages of block {}",
              s->id, b);
    s->last_block = cache_.insert(s->last_block, s->tokens->data() + b * B, s->pages.data() + b * g);
  }
  s->cached_blocks = std::max(s->cached_blocks, full);
}

void Scheduler::give_back(SchedSeq* s) {
  cache_blocks(s);
  cache_.release(s->pages);
  s->cached_blocks = 0;
  s->last_block = 0;
}

bool Scheduler::ensure_pages(SchedSeq* s, int64_t tokens) {
  return cache_.allocate(pages_for(tokens) - int64_t(s->pages.size()), s->pages);
}

void Scheduler::preempt(SchedSeq* s, StepPlan& plan) {
  running_.erase(std::remove(running_.begin(), running_.end(), s), running_.end());
  give_back(s);
  s->computed = 0;
  s->mtp_computed = 0;
  ++s->preemptions;
  waiting_.push_front(s);
  plan.preempted.push_back(s);
}

// Takes the cached blocks the sequence starts with, then pages for its first chunk; on failure it
// gives the blocks back and stays waiting.
bool Scheduler::admit(SchedSeq* s, int64_t budget, StepPlan& plan) {
  DSI_CHECK(s->pages.empty() && s->computed == 0, "scheduler: sequence {} waits holding pages", s->id);
  PrefixCache::Match hit;
  if (s->tokens != nullptr) {
    // At least one token is left to compute (its logits are the next token's); a sequence that
    // had generated tokens recomputes at least two, so it resumes as a prefill.
    const int64_t most = s->n_tokens - (s->n_generated > 0 ? 2 : 1);
    hit = cache_.match(s->tokens->data(), int64_t(s->tokens->size()), most, s->pages);
  }
  s->computed = s->mtp_computed = hit.tokens;
  s->cached_blocks = hit.tokens / cache_.block_tokens();
  s->last_block = hit.last;
  const int64_t chunk = chunk_for(s, budget);
  const bool last = s->computed + chunk == s->n_tokens;
  if (!ensure_pages(s, s->computed + chunk + (last ? 1 + cfg_.speculative_tokens : 0))) {
    cache_.release(s->pages);
    s->computed = s->mtp_computed = s->cached_blocks = 0;
    s->last_block = 0;
    return false;
  }
  s->cache_hit = hit.tokens;
  if (s->tokens != nullptr && cache_.enabled()) {
    cache_queries_ += s->n_tokens;
    cache_hits_ += hit.tokens;
  }
  plan.prefill.push_back({s, chunk});
  return true;
}

bool Scheduler::waits_for_shared_blocks(const SchedSeq* s) const {
  if (!cache_.enabled() || s->tokens == nullptr) return false;
  const int64_t B = cache_.block_tokens();
  const int64_t most = s->n_tokens - (s->n_generated > 0 ? 2 : 1);  // what admit() may take
  if (most < B) return false;
  for (const SchedSeq* r : running_) {
    // Only a sequence still prefilling makes new blocks; at its end it has cached those whose
    // next token it knows.
    if (r->tokens == nullptr || r->computed >= r->n_tokens) continue;
    const int64_t len = std::min<int64_t>(most, int64_t(r->tokens->size()) - 1);
    if (len < B) continue;
    const auto* a = s->tokens->data();
    const int64_t common = std::mismatch(a, a + len, r->tokens->data()).first - a;
    if (common / B > r->cached_blocks) return true;
  }
  return false;
}

int64_t Scheduler::chunk_for(const SchedSeq* s, int64_t budget) const {
  const int64_t chunk = std::min(s->n_tokens - s->computed, budget);
  return s->max_chunk > 0 ? std::min(chunk, s->max_chunk) : chunk;
}

StepPlan Scheduler::schedule_with(const std::vector<int64_t>& drafts) {
  for (SchedSeq* s : running_) cache_blocks(s);  // what the last step computed
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
  // 3. Admissions, in queue order. A sequence preempted by this very plan waits for the next step;
  // one whose shared blocks a running sequence is computing lets those behind it go first.
  for (auto it = waiting_.begin();
       it != waiting_.end() && int64_t(running_.size()) < cfg_.max_num_seqs && budget > 0;) {
    SchedSeq* s = *it;
    if (std::find(plan.preempted.begin(), plan.preempted.end(), s) != plan.preempted.end()) break;
    if (waits_for_shared_blocks(s)) {
      ++it;
      continue;
    }
    if (!admit(s, budget, plan)) break;
    it = waiting_.erase(it);
    running_.push_back(s);
    budget -= plan.prefill.back().n;
  }
  return plan;
}

}  // namespace dsi
