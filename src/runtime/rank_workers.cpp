// Persistent thread ranks; see rank_workers.h.
#include "runtime/rank_workers.h"

#include <fmt/format.h>

namespace dsi {

RankWorkers::RankWorkers(const ParallelConfig& cfg, const CommOptions& options) {
  DSI_CHECK(cfg.tp >= 1, "tp = {} must be >= 1", cfg.tp);
  if (cfg.tp > 1) world_ = std::make_unique<LocalWorld>(cfg.tp, options);
  for (int r = 0; r < cfg.tp; ++r)
    contexts_.push_back(RankContext::make(cfg, r, world_ ? &world_->comm(r) : nullptr));
  for (int r = 1; r < cfg.tp; ++r) threads_.emplace_back([this, r] { loop(r); });
}

RankWorkers::~RankWorkers() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void RankWorkers::run(const std::function<void(int)>& fn) {
  if (failure_) std::rethrow_exception(failure_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &fn;
    pending_ = size() - 1;
    ++generation_;
  }
  cv_.notify_all();
  try {
    fn(0);
  } catch (...) {
    fail(0, std::current_exception());
  }
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return pending_ == 0; });
  job_ = nullptr;
  if (failure_ && !world_) {  // one rank: no communicator was poisoned, the next run may go on
    std::exception_ptr e = failure_;
    failure_ = nullptr;
    std::rethrow_exception(e);
  }
  if (failure_) std::rethrow_exception(failure_);
}

void RankWorkers::fail(int rank, std::exception_ptr error) {
  // The first error is the root cause: it is recorded before the others are aborted.
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failure_) failure_ = error;
  }
  if (world_) world_->comm(rank).abort(fmt::format("rank {} failed", rank));
}

void RankWorkers::loop(int rank) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int)>* job = nullptr;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
    }
    try {
      (*job)(rank);
    } catch (...) {
      fail(rank, std::current_exception());
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      --pending_;
    }
    cv_.notify_all();
  }
}

}  // namespace dsi
