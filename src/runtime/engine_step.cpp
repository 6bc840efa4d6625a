// One step of the serving engine (engine_impl.h): plan, draft, run the batched forward, then
// sample or verify each sequence the way the single-sequence generator (generator.cpp) and the MTP
// drafter (speculative.cpp) do, with the same random draws, so a request's tokens do not depend on
// what else is in the batch.
#include <algorithm>
#include <cmath>

#include <spdlog/spdlog.h>

#include "ops/sampling.h"
#include "runtime/engine_impl.h"

namespace dsi {

namespace {

// The rows `rows` of x ([n, d]), stacked: [rows.size(), d].
Tensor gather_rows(const Tensor& x, const std::vector<int64_t>& rows) {
  Tensor out = Tensor::empty({int64_t(rows.size()), x.dim(1)}, DType::F32, x.device());
  for (size_t i = 0; i < rows.size(); ++i) {
    Tensor dst = out.slice(int64_t(i), int64_t(i) + 1);
    dst.copy_from(x.slice(rows[i], rows[i] + 1));
  }
  return out;
}

// Log-probabilities of one logits row (natural log softmax, before temperature / top-p).
std::vector<float> log_softmax(const float* row, int64_t n) {
  float m = -INFINITY;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, row[i]);
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += std::exp(double(row[i]) - double(m));
  const float lse = m + float(std::log(s));
  std::vector<float> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[size_t(i)] = row[i] - lse;
  return out;
}

// A copy of host logits rows [n, V] masked by the constraint: row 0 as it stands, row j + 1 by a
// copy of it that took drafts[0..j] (TokenConstraint::clone; a request speculated only with one).
Tensor constrained(const Tensor& rows, TokenConstraint& c, const std::vector<int32_t>& drafts = {}) {
  const int64_t n = rows.dim(0), V = rows.dim(1);
  DSI_CHECK(int64_t(drafts.size()) >= n - 1, "constrained rows: {} rows for {} drafts", n, drafts.size());
  Tensor out = Tensor::empty(rows.shape(), DType::F32);
  out.copy_from(rows);
  c.mask(out.f32(), V);
  if (n == 1) return out;
  std::unique_ptr<TokenConstraint> after = c.clone();
  DSI_CHECK(after != nullptr, "constrained rows: drafts for a constraint without copies");
  for (int64_t j = 1; j < n; ++j) {
    after->accept(drafts[size_t(j - 1)]);
    after->mask(out.f32() + j * V, V);
  }
  return out;
}

// Token `tok`'s record under one logits row of n: its logprob and the top `top` alternatives (most
// likely first, ties by id).
GeneratedToken token_logprobs(const float* row, int64_t n, int32_t tok, int top) {
  const std::vector<float> lp = log_softmax(row, n);
  GeneratedToken g;
  g.id = tok;
  g.logprob = lp[size_t(tok)];
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) ids[size_t(t)] = int32_t(t);
  const size_t k = std::min<size_t>(size_t(std::max(top, 0)), ids.size());
  std::partial_sort(ids.begin(), ids.begin() + long(k), ids.end(), [&](int32_t a, int32_t b) {
    return lp[size_t(a)] > lp[size_t(b)] || (lp[size_t(a)] == lp[size_t(b)] && a < b);
  });
  for (size_t t = 0; t < k; ++t) g.top.push_back({ids[t], lp[size_t(ids[t])]});
  return g;
}

}  // namespace

int64_t EngineImpl::drafts_for(const EngineSequence& s) const {
  if (!speculated(s)) return 0;
  // Drafts past what this round can still emit, or past the context, are not worth verifying.
  const int64_t room = std::min<int64_t>(s.request.max_new_tokens - s.generated() - 1,
                                         info_.max_model_len - s.sched.computed - 1);
  return std::min<int64_t>(K_, std::max<int64_t>(room, 0));
}

void EngineImpl::reset(EngineSequence& s) {
  s.ranks.clear();
  s.pending_next.clear();
  s.pending_start = 0;
  s.draft = Draft{};
}

// Gives the sequence its caches on this process's ranks (first run) and its current pages.
// A sequence starting from blocks of the prefix cache has their tokens' entries (the MTP layer's
// too) in its first pages: its caches start that long.
void EngineImpl::prepare(EngineSequence& s) {
  const bool first = s.ranks.empty();
  if (first)
    for (int r : ranks_->local())
      s.ranks.emplace_back(SequenceKvCache(pools_[size_t(ranks_->slot(r))], ranks_->context(r).dcp));
  for (EngineRankState& st : s.ranks) {
    st.cache.set_pages(s.sched.pages);
    if (!first) continue;
    st.cache.set_length(s.sched.computed);
    if (st.cache.has_mtp()) st.cache.set_mtp_length(s.sched.computed);
  }
  if (first) s.pending_start = s.sched.computed;
}

void EngineImpl::append_pending(EngineSequence& s, int64_t first_row, int64_t n) {
  const int64_t p0 = s.sched.computed - n;  // position of the first appended row
  for (int64_t i = 0; i < n; ++i) s.pending_next.push_back(s.tokens[size_t(p0 + i + 1)]);
  for (EngineRankState& st : s.ranks) st.pending_hidden = cat_rows(st.pending_hidden, st.step_hidden.slice(first_row, first_row + n));
}

// The MTP drafter of speculative.cpp, batched: step 1 consumes every sequence's pending rows (its
// last row drafts the first token), then chained steps of one row per sequence. The leader draws
// the draft tokens; every process appends them.
void EngineImpl::draft(const std::vector<EngineSequence*>& seqs) {
  const int64_t V = cfg_.vocab_size;
  int64_t most = 0;
  for (EngineSequence* s : seqs) {
    s->draft = Draft{};
    most = std::max(most, s->drafts);
    // The first step caches the MTP entries of the pending rows for good (the prefix cache's
    // blocks wait for them).
    s->sched.mtp_computed = s->pending_start + int64_t(s->pending_next.size());
  }
  const bool share = cfg_.index_share_for_mtp_iteration;
  Tensor logits;  // rank 0's draft logits of this step, host
  for (int64_t j = 0; j < most; ++j) {
    std::vector<EngineSequence*> active;
    for (EngineSequence* s : seqs)
      if (s->drafts > j) active.push_back(s);
    ranks_->run([&](int r) {
      const size_t slot = size_t(ranks_->slot(r));
      const DsaModel& m = *models_[slot];
      std::vector<BatchSeq> batch;
      std::vector<DcpTopk*> shares;
      std::vector<int32_t> next;
      std::vector<Tensor> inputs;
      for (EngineSequence* s : active) {
        EngineRankState& st = s->ranks[slot];
        if (j == 0) {
          DSI_CHECK(st.cache.mtp_length() == s->pending_start,
                    "MTP drafter: its cache holds {} positions but the pending rows start at {}",
                    st.cache.mtp_length(), s->pending_start);
          st.share = DcpTopk{};
          inputs.push_back(st.pending_hidden);
          next.insert(next.end(), s->pending_next.begin(), s->pending_next.end());
          batch.push_back({&st.cache, st.pending_hidden.dim(0)});
        } else {
          inputs.push_back(st.last);
          next.push_back(s->draft.tokens.back());
          batch.push_back({&st.cache, 1});
        }
        if (share) shares.push_back(&st.share);
      }
      const Tensor hidden = cat_rows(inputs);
      Tensor y = m.mtp_forward(hidden, Tensor::from_i32(next, {int64_t(next.size())}), batch, nullptr,
                               shares);
      std::vector<int64_t> lasts;
      int64_t row = 0;
      for (const BatchSeq& b : batch) lasts.push_back((row += b.n) - 1);
      Tensor last = gather_rows(y, lasts);
      for (size_t i = 0; i < active.size(); ++i)
        active[i]->ranks[slot].last = last.slice(int64_t(i), int64_t(i) + 1);
      Tensor l = m.mtp_logits(last);
      if (r == 0) logits = to_host(l);
    });
    std::vector<int32_t> drawn;
    if (ranks_->leader()) {
      std::uniform_real_distribution<double> uniform(0.0, 1.0);
      for (size_t i = 0; i < active.size(); ++i) {
        EngineSequence& s = *active[i];
        Tensor row = logits.slice(int64_t(i), int64_t(i) + 1);
        // A constrained request drafts what its constraint allows after the drafts before.
        if (s.request.constraint) {
          if (j == 0) s.draft_constraint = s.request.constraint->clone();
          row = constrained(row, *s.draft_constraint);
        }
        row = row.view({V});
        const SamplingParams& sp = s.request.sampling;
        if (const ops::TokenHistory* h = s.penalty_history()) row = ops::penalized(row, sp, *h, s.draft.tokens);
        if (sp.temperature > 0.0f) {
          std::vector<double> q = ops::token_distribution(row, sp);
          drawn.push_back(ops::draw_token(q, uniform(s.rng)));
          s.draft.dists.push_back(std::move(q));
        } else {
          drawn.push_back(ops::sample(row, sp, 0.0));  // greedy (with its logit bias)
        }
      }
    }
    if (ranks_->leader())
      for (size_t i = 0; i < active.size(); ++i)
        if (active[i]->draft_constraint) active[i]->draft_constraint->accept(drawn[i]);
    share_tokens(drawn);
    DSI_CHECK(drawn.size() == active.size(), "draft step: {} tokens for {} sequences", drawn.size(),
              active.size());
    for (size_t i = 0; i < active.size(); ++i) active[i]->draft.tokens.push_back(drawn[i]);
  }
  for (EngineSequence* s : seqs) {  // the drafter consumed the pending rows
    for (EngineRankState& st : s->ranks) st.pending_hidden = Tensor();
    s->pending_next.clear();
    s->draft_constraint.reset();
  }
}

// Runs every planned row through the model on every rank; returns rank 0's logits of the rows
// `keep` (host, [keep.size(), vocab]) and leaves each sequence's output rows in step_hidden.
Tensor EngineImpl::run_forward(const std::vector<StepPlan::Rows>& rows,
                               const std::vector<int64_t>& keep) {
  std::vector<int32_t> tokens;
  for (const StepPlan::Rows& p : rows) {
    const EngineSequence& s = seq_of(p.seq);
    if (p.seq->decoding()) {
      tokens.push_back(s.tokens.back());
      tokens.insert(tokens.end(), s.draft.tokens.begin(), s.draft.tokens.end());
    } else {
      tokens.insert(tokens.end(), s.tokens.begin() + p.seq->computed,
                    s.tokens.begin() + p.seq->computed + p.n);
    }
  }
  // A decode-only step keeps every row: one rank replays it from a graph (runtime/step_graphs.h).
  const bool graphed = !graphs_.empty() && keep.size() == tokens.size() &&
                       std::all_of(rows.begin(), rows.end(),
                                   [](const StepPlan::Rows& p) { return p.seq->decoding(); });
  Tensor logits;
  ranks_->run([&](int r) {
    const size_t slot = size_t(ranks_->slot(r));
    const DsaModel& m = *models_[slot];
    std::vector<BatchSeq> batch;
    for (const StepPlan::Rows& p : rows) batch.push_back({&seq_of(p.seq).ranks[slot].cache, p.n});
    if (graphed) {
      StepGraphs& g = *graphs_[slot];
      const int64_t replays = g.replays();
      const StepGraphs::Step st = g.forward(tokens, batch);
      if (slot == 0) stats_.graph_steps += g.replays() - replays;
      int64_t row = 0;
      for (const StepPlan::Rows& p : rows) {
        seq_of(p.seq).ranks[slot].step_hidden = st.hidden.slice(row, row + p.n);
        row += p.n;
      }
      if (r == 0) logits = to_host(st.logits);
      if (m.rank().comm != nullptr) m.rank().comm->check_async();
      return;
    }
    Tensor h = m.forward(Tensor::from_i32(tokens, {int64_t(tokens.size())}), batch);
    int64_t row = 0;
    for (const StepPlan::Rows& p : rows) {
      seq_of(p.seq).ranks[slot].step_hidden = h.slice(row, row + p.n);
      row += p.n;
    }
    Tensor l = m.logits(gather_rows(h, keep));
    if (r == 0) logits = to_host(l);
    if (m.rank().comm != nullptr) m.rank().comm->check_async();  // earlier collectives' failures
  });
  return logits;
}

void EngineImpl::step() {
  StepPlan plan = sched_->schedule([&](const SchedSeq& s) { return drafts_for(seq_of(&s)); });
  for (SchedSeq* p : plan.preempted) {
    EngineSequence& s = seq_of(p);
    spdlog::info("request {} preempted (KV pages ran out); its {} tokens will be recomputed", p->id,
                 s.tokens.size());
    reset(s);
    ++stats_.preemptions;
  }
  if (plan.empty()) return;
  std::vector<StepPlan::Rows> rows = plan.decode;
  rows.insert(rows.end(), plan.prefill.begin(), plan.prefill.end());
  for (const StepPlan::Rows& p : rows) prepare(seq_of(p.seq));

  // Drafts for the decoding sequences that verify any this round.
  std::vector<EngineSequence*> drafting;
  for (const StepPlan::Rows& p : plan.decode) {
    EngineSequence& s = seq_of(p.seq);
    s.drafts = p.n - 1;
    s.draft = Draft{};
    if (s.drafts > 0) drafting.push_back(&s);
  }
  if (!drafting.empty()) draft(drafting);

  // Logits wanted: every row of a decode round; the last row of a prefill that completes; every
  // row of a prefill chunk whose prompt is scored (EngineRequest::prompt_logprobs).
  std::vector<int64_t> keep, first_kept(rows.size(), -1), scored(rows.size(), -1);
  int64_t row = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const StepPlan::Rows& p = rows[i];
    const bool decode = i < plan.decode.size();
    if (!decode && seq_of(p.seq).request.prompt_logprobs >= 0) {
      scored[i] = int64_t(keep.size());
      for (int64_t j = 0; j < p.n; ++j) keep.push_back(row + j);
      if (p.seq->computed + p.n == p.seq->n_tokens) first_kept[i] = scored[i] + p.n - 1;
    } else if (decode || p.seq->computed + p.n == p.seq->n_tokens) {
      first_kept[i] = int64_t(keep.size());
      for (int64_t j = decode ? 0 : p.n - 1; j < p.n; ++j) keep.push_back(row + j);
    }
    row += p.n;
  }
  const Tensor logits = run_forward(rows, keep);  // the leader's (host); undefined elsewhere
  const int64_t V = cfg_.vocab_size;
  if (logits.defined())  // the leader reports the scored prompts' tokens, before what they generate
    for (size_t i = 0; i < rows.size(); ++i)
      if (scored[i] >= 0) report_prompt_logprobs(seq_of(rows[i].seq), rows[i].n, logits, scored[i]);

  // The leader samples and verifies: per row group, the number of tokens it emits, then them.
  std::vector<int32_t> decided;
  if (ranks_->leader()) {
    std::uniform_real_distribution<double> uniform(0.0, 1.0);
    for (size_t i = 0; i < rows.size(); ++i) {
      const SchedSeq& sch = *rows[i].seq;
      EngineSequence& s = seq_of(&sch);
      const int64_t n = rows[i].n;
      const SamplingParams& sp = s.request.sampling;
      if (i < plan.decode.size()) {  // verify [last token, drafts]
        Tensor rows_i = logits.slice(first_kept[i], first_kept[i] + n);
        if (s.request.constraint) rows_i = constrained(rows_i, *s.request.constraint, s.draft.tokens);
        const Verdict v = verify_drafts(rows_i, s.draft, sp, s.rng, s.penalty_history());
        decided.push_back(int32_t(v.accepted + 1));
        decided.insert(decided.end(), s.draft.tokens.begin(), s.draft.tokens.begin() + v.accepted);
        decided.push_back(v.next);
      } else if (sch.computed + n < sch.n_tokens) {  // more prefill chunks to come
        decided.push_back(0);
      } else {
        Tensor last = logits.slice(first_kept[i], first_kept[i] + 1);
        if (s.request.constraint) last = constrained(last, *s.request.constraint);
        last = last.view({V});
        if (const ops::TokenHistory* h = s.penalty_history()) last = ops::penalized(last, sp, *h);
        decided.push_back(1);
        decided.push_back(ops::sample(last, sp, uniform(s.rng)));
      }
    }
  }
  share_tokens(decided);

  // Every process applies the decisions.
  size_t at = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    SchedSeq& sch = *rows[i].seq;
    EngineSequence& s = seq_of(&sch);
    const int64_t n = rows[i].n;
    DSI_CHECK(at < decided.size(), "engine step: no decision for row group {}", i);
    const int64_t count = decided[at++];
    DSI_CHECK(count >= 0 && at + size_t(count) <= decided.size(), "engine step: bad decision for row group {}", i);
    const std::vector<int32_t> emitted(decided.begin() + std::ptrdiff_t(at),
                                       decided.begin() + std::ptrdiff_t(at + size_t(count)));
    at += size_t(count);
    if (i < plan.decode.size()) {
      // Cut every cache back to the accepted tokens.
      const int64_t L = sch.computed, k = n - 1, accepted = count - 1;
      if (k > 0) {
        ++stats_.num_drafts;
        stats_.num_draft_tokens += k;
        stats_.num_accepted_tokens += accepted;
        for (int64_t j = 0; j < accepted; ++j) ++stats_.accepted_per_pos[size_t(j)];
      }
      for (EngineRankState& st : s.ranks) {
        st.cache.set_length(L + accepted + 1);
        if (k > 0) st.cache.set_mtp_length(L);  // the chained draft steps are dropped
      }
      if (k > 0) s.pending_start = L;
      sch.computed = L + accepted + 1;
      if (emit(s, emitted, logits, first_kept[i]) && speculated(s)) append_pending(s, 0, accepted + 1);
    } else {
      sch.computed += n;
      stats_.prompt_tokens += n;
      if (count == 0) {  // more chunks to come
        if (speculated(s)) append_pending(s, 0, n);
        continue;
      }
      if (emit(s, emitted, logits, first_kept[i]) && speculated(s)) append_pending(s, 0, n);
    }
  }
  ++stats_.steps;
}

void EngineImpl::sweep() {
  for (auto it = seqs_.begin(); it != seqs_.end();) it = it->second->finished ? seqs_.erase(it) : ++it;
}

void EngineImpl::report_prompt_logprobs(EngineSequence& s, int64_t n, const Tensor& logits, int64_t row0) {
  // Row j of the chunk (position computed + j) predicts the token at position computed + j + 1.
  RequestEvent ev;
  const int64_t V = logits.dim(1), first = s.sched.computed;
  for (int64_t j = 0; j < n; ++j) {
    const int64_t q = first + j + 1;
    if (q < s.prompt_lp_sent || q >= s.prompt_len) continue;  // reported before a preemption, or not the prompt's
    ev.prompt_logprobs.push_back(
        token_logprobs(logits.f32() + (row0 + j) * V, V, s.tokens[size_t(q)], s.request.prompt_logprobs));
    s.prompt_lp_sent = q + 1;
  }
  if (ev.prompt_logprobs.empty()) return;
  ev.prompt_tokens = s.prompt_len;
  s.sink(std::move(ev));
}

bool EngineImpl::emit(EngineSequence& s, const std::vector<int32_t>& tokens, const Tensor& logits,
                      int64_t row0) {
  const EngineRequest& r = s.request;
  RequestEvent ev;
  std::string reason;
  for (size_t j = 0; j < tokens.size() && reason.empty(); ++j) {
    const int32_t tok = tokens[j];
    if (s.generated() >= r.max_new_tokens) {
      reason = "length";
      break;
    }
    s.tokens.push_back(tok);
    if (s.history) s.history->add(tok);
    ++stats_.generation_tokens;
    GeneratedToken g;
    g.id = tok;
    if (r.logprobs >= 0 && logits.defined()) {  // the leader's: it reports to the client
      const int64_t V = logits.dim(1);
      g = token_logprobs(logits.f32() + (row0 + int64_t(j)) * V, V, tok, r.logprobs);
    }
    ev.tokens.push_back(std::move(g));
    if (r.constraint) r.constraint->accept(tok);
    const bool eos = std::find(cfg_.eos_token_ids.begin(), cfg_.eos_token_ids.end(), tok) !=
                     cfg_.eos_token_ids.end();
    const bool stop_id = std::find(r.stop_token_ids.begin(), r.stop_token_ids.end(), tok) !=
                         r.stop_token_ids.end();
    if ((eos && !r.ignore_eos) || stop_id) reason = "stop";
  }
  if (reason.empty() && s.generated() >= r.max_new_tokens) reason = "length";
  s.sched.n_tokens = int64_t(s.tokens.size());
  s.sched.n_generated = s.generated();
  ev.prompt_tokens = s.prompt_len;
  ev.cached_tokens = s.sched.cache_hit;
  ev.completion_tokens = s.generated();
  if (!reason.empty()) {
    ev.finished = true;
    ev.finish_reason = reason;
    s.finished = true;
    sched_->remove(&s.sched);
    ++stats_.requests_finished;
    publish_metrics();  // a client that saw its last event sees its pages freed
  }
  s.sink(std::move(ev));
  return reason.empty();
}

void EngineImpl::finish(EngineSequence& s, const std::string& reason, const std::string& error) {
  if (s.finished) return;
  RequestEvent ev;
  ev.finished = true;
  ev.finish_reason = reason;
  ev.error = error;
  ev.prompt_tokens = s.prompt_len;
  ev.cached_tokens = s.sched.cache_hit;
  ev.completion_tokens = s.generated();
  s.finished = true;
  sched_->remove(&s.sched);
  ++stats_.requests_finished;
  publish_metrics();
  s.sink(std::move(ev));
}

void EngineImpl::fail_all(const std::string& error) {
  for (auto& [id, s] : seqs_) finish(*s, "error", error);
  seqs_.clear();
  if (ranks_->failed()) {
    std::lock_guard<std::mutex> lock(mu_);
    failed_ = error;
  }
}

void EngineImpl::publish_metrics() {
  stats_.running = int64_t(sched_->running().size());
  stats_.waiting = int64_t(sched_->waiting().size());
  stats_.kv_pages_used = sched_->used_pages();
  stats_.kv_pages_cached = sched_->prefix_cache().evictable_pages();
  stats_.prefix_cache_queries = sched_->cache_queries();
  stats_.prefix_cache_hits = sched_->cache_hits();
  std::lock_guard<std::mutex> lock(mu_);
  metrics_ = stats_;
  metrics_.waiting += int64_t(incoming_.size());
}

}  // namespace dsi
