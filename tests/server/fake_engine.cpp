// FakeEngine: a scheduler loop with made-up tokens (see fake_engine.h).
#include "fake_engine.h"

#include <algorithm>
#include <cmath>

namespace dsi::test {

namespace {
uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  h *= 0xff51afd7ed558ccdull;
  return h ^ (h >> 33);
}
}  // namespace

FakeEngine::FakeEngine(FakeEngineOptions options) : o_(std::move(options)) {
  info_.id = o_.model_id;
  info_.model_dir = "/fake/" + o_.model_id;
  info_.max_model_len = o_.max_model_len;
  info_.vocab_size = o_.vocab_size;
  info_.eos_token_ids = {o_.eos};
  info_.speculative_tokens = o_.tokens_per_step - 1;
  m_.kv_pages_total = o_.kv_pages_total;
  m_.kv_capacity_tokens = o_.kv_pages_total * 64;
  m_.accepted_per_pos.assign(size_t(std::max(0, o_.tokens_per_step - 1)), 0);
  thread_ = std::thread([this] { loop(); });
}

FakeEngine::~FakeEngine() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

int32_t FakeEngine::token_at(const FakeEngineOptions& o, const EngineRequest& r, size_t i) {
  if (i < o.script.size()) return o.script[i];
  uint64_t h = 1469598103934665603ull;
  for (int32_t t : r.prompt) h = mix(h, uint64_t(t));
  h = mix(h, i);
  if (r.sampling.temperature > 0) h = mix(h, r.sampling.seed ^ 0x5eedull);
  return o.first_token + int32_t(h % uint64_t(o.last_token - o.first_token + 1));
}

int32_t FakeEngine::constrained_token(Seq& s) const {
  std::vector<float> row(size_t(o_.vocab_size), 0.0f);
  s.request.constraint->mask(row.data(), o_.vocab_size);
  const auto lowest = std::find(row.begin(), row.end(), 0.0f);
  int32_t id = lowest == row.end() ? o_.eos : int32_t(lowest - row.begin());
  const int32_t natural = token_at(o_, s.request, size_t(s.cursor));
  if (std::find(row.begin(), row.end(), -INFINITY) == row.end() ||
      (o_.natural_first && natural >= 0 && natural < o_.vocab_size && row[size_t(natural)] == 0.0f)) {
    id = natural;
    ++s.cursor;
  }
  s.request.constraint->accept(id);
  return id;
}

uint64_t FakeEngine::submit(EngineRequest request, EventSink sink) {
  if (request.prompt.empty()) fail("the prompt is empty");
  for (int32_t id : request.prompt)
    if (id < 0 || id >= o_.vocab_size) fail("token id {} is outside the vocabulary", id);
  if (request.max_new_tokens < 1) fail("max_new_tokens must be at least 1");
  if (int64_t(request.prompt.size()) + request.max_new_tokens > o_.max_model_len)
    fail("prompt ({}) + max_new_tokens ({}) exceeds max_model_len {}", request.prompt.size(),
         request.max_new_tokens, o_.max_model_len);
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t id = next_id_++;
  waiting_.push_back(Seq{id, std::move(request), std::move(sink)});
  m_.waiting = int64_t(waiting_.size());
  cv_.notify_all();
  return id;
}

void FakeEngine::cancel(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  cancel_[id] = true;
  cv_.notify_all();
}

EngineMetrics FakeEngine::metrics() const {
  std::lock_guard<std::mutex> lock(mu_);
  return m_;
}

uint64_t FakeEngine::submitted() const {
  std::lock_guard<std::mutex> lock(mu_);
  return next_id_ - 1;
}

int64_t FakeEngine::pages_of(const Seq& s) const {
  return (int64_t(s.request.prompt.size()) + s.generated + 63) / 64;
}

void FakeEngine::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    // A step takes step_time; with nothing to do, wait for a request.
    if (waiting_.empty() && running_.empty())
      cv_.wait(lock, [&] { return stop_ || !waiting_.empty(); });
    else
      cv_.wait_for(lock, o_.step_time, [&] { return stop_; });
    if (stop_) break;
    // Admit, then step every running sequence; events go out without the lock held.
    while (!waiting_.empty() && int(running_.size()) < o_.max_num_seqs) {
      running_.push_back(std::move(waiting_.front()));
      waiting_.pop_front();
      m_.prompt_tokens += int64_t(running_.back().request.prompt.size());
    }
    std::vector<std::pair<EventSink*, RequestEvent>> out;
    for (Seq& s : running_) {
      RequestEvent ev;
      ev.prompt_tokens = int64_t(s.request.prompt.size());
      if (cancel_.count(s.id)) {
        ev.finished = true;
        ev.finish_reason = "abort";
      } else {
        for (int k = 0; k < o_.tokens_per_step && !ev.finished; ++k) {
          GeneratedToken t;
          const uint64_t pos = uint64_t(s.generated);
          t.id = s.request.constraint ? constrained_token(s) : token_at(o_, s.request, pos);
          if (o_.eos_every > 0 && !s.request.ignore_eos && uint64_t(t.id) % uint64_t(o_.eos_every) == 0)
            t.id = o_.eos;
          if (s.request.logprobs >= 0) {
            t.logprob = -0.25f - 0.01f * float(t.id % 50);
            t.top.push_back({t.id, t.logprob});
            for (int a = 1; a < s.request.logprobs; ++a)
              t.top.push_back({o_.first_token + (t.id + a) % 50, t.logprob - float(a)});
            t.top.resize(size_t(s.request.logprobs));
          }
          ++s.generated;
          ev.tokens.push_back(std::move(t));
          const int32_t id = ev.tokens.back().id;
          const bool stop_id = std::find(s.request.stop_token_ids.begin(), s.request.stop_token_ids.end(),
                                         id) != s.request.stop_token_ids.end();
          if ((id == o_.eos && !s.request.ignore_eos) || stop_id) {
            ev.finished = true;
            ev.finish_reason = "stop";
          } else if (s.generated >= s.request.max_new_tokens) {
            ev.finished = true;
            ev.finish_reason = "length";
          }
        }
        m_.generation_tokens += int64_t(ev.tokens.size());
        if (o_.tokens_per_step > 1) {
          m_.num_drafts += 1;
          m_.num_draft_tokens += o_.tokens_per_step - 1;
          m_.num_accepted_tokens += int64_t(ev.tokens.size()) - 1;
          for (size_t p = 0; p + 1 < ev.tokens.size(); ++p) m_.accepted_per_pos[p] += 1;
        }
      }
      ev.completion_tokens = s.generated;
      out.emplace_back(&s.sink, std::move(ev));
    }
    m_.steps += 1;
    // Finished sequences leave running_ (and the metrics) before their last event goes out, as the
    // real engine does: a client that saw its last event finds no running request in /metrics.
    // Sinks run without the lock (tests may read metrics while they run); only this thread changes
    // running_, so it is read unlocked below.
    std::vector<Seq> keep;
    std::vector<RequestEvent> live;
    std::vector<std::pair<EventSink, RequestEvent>> last;
    for (size_t i = 0; i < running_.size(); ++i) {
      if (!out[i].second.finished) {
        keep.push_back(std::move(running_[i]));
        live.push_back(std::move(out[i].second));
      } else {
        cancel_.erase(running_[i].id);
        m_.requests_finished += 1;
        last.emplace_back(std::move(running_[i].sink), std::move(out[i].second));
      }
    }
    running_ = std::move(keep);
    m_.running = int64_t(running_.size());
    m_.kv_pages_used = 0;
    for (const Seq& q : running_) m_.kv_pages_used += pages_of(q);
    lock.unlock();
    for (size_t i = 0; i < live.size(); ++i) running_[i].sink(std::move(live[i]));
    for (auto& [sink, ev] : last) sink(std::move(ev));
    lock.lock();
    // Cancelled waiting requests finish without running.
    for (auto it = waiting_.begin(); it != waiting_.end();) {
      if (cancel_.count(it->id)) {
        RequestEvent ev;
        ev.finished = true;
        ev.finish_reason = "abort";
        EventSink sink = std::move(it->sink);
        cancel_.erase(it->id);
        it = waiting_.erase(it);
        m_.requests_finished += 1;
        lock.unlock();
        sink(std::move(ev));
        lock.lock();
      } else {
        ++it;
      }
    }
    m_.running = int64_t(running_.size());
    m_.waiting = int64_t(waiting_.size());
    m_.kv_pages_used = 0;
    for (const Seq& s : running_) m_.kv_pages_used += pages_of(s);
  }
  // Shutdown: every request finishes with "abort".
  for (Seq& s : running_) {
    RequestEvent ev;
    ev.finished = true;
    ev.finish_reason = "abort";
    s.sink(std::move(ev));
  }
  for (Seq& s : waiting_) {
    RequestEvent ev;
    ev.finished = true;
    ev.finish_reason = "abort";
    s.sink(std::move(ev));
  }
}

}  // namespace dsi::test
