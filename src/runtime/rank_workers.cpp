// Persistent thread ranks; see rank_workers.h.
#include "runtime/rank_workers.h"

#include <fmt/format.h>

#include "ops/linear.h"
#include "runtime/ranks.h"
#ifdef DSI_WITH_CUDA
#include "backends/cuda/device.h"
#endif


namespace dsi {

namespace {

std::vector<int> all_ranks(int tp) {
  DSI_CHECK(tp >= 1, "tp = {} must be >= 1", tp);
  std::vector<int> r(static_cast<size_t>(tp));
  for (int i = 0; i < tp; ++i) r[size_t(i)] = i;
  return r;
}

}  // namespace

int RankGroup::slot(int rank) const {
  for (size_t i = 0; i < local_.size(); ++i)
    if (local_[i] == rank) return int(i);
  ::dsi::fail("rank {} is not run by this process", rank);
}

RankWorkers::RankWorkers(const ParallelConfig& cfg, const CommOptions& options, bool cuda)
    : RankGroup(cfg.tp, all_ranks(cfg.tp)) {
  ops::share_host_cores(cfg.tp);
  if (cfg.tp > 1) world_ = std::make_unique<LocalWorld>(cfg.tp, options);
  for (int r = 0; r < cfg.tp; ++r)
    contexts_.push_back(RankContext::make(cfg, r, world_ ? &world_->comm(r) : nullptr));
  for (int r = 1; r < cfg.tp; ++r) threads_.emplace_back([this, r] { loop(r); });
  if (!cuda || cfg.tp == 1) return;
#ifdef DSI_WITH_CUDA
  device_comms_.resize(size_t(cfg.tp));
  const auto shared = make_thread_rank_comms();
  try {
    run([&](int r) {  // creation is collective: every rank at once, from its own thread
      device_comms_[size_t(r)] = make_thread_rank_device_comm(world_->comm(r), cfg, r, shared);
    });
  } catch (...) {
    stop_threads();  // no destructor runs for a constructor that throws
    throw;
  }
  for (int r = 0; r < cfg.tp; ++r)
    contexts_[size_t(r)] = RankContext::make(cfg, r, device_comms_[size_t(r)].get());
#else
  ::dsi::fail("{} ranks on CUDA devices need a CUDA build", cfg.tp);
#endif
}

RankWorkers::~RankWorkers() {
  if (!device_comms_.empty() && !failure_) {
    try {  // NCCL communicators are finalised together, each on its rank's thread
      run([&](int r) { device_comms_[size_t(r)].reset(); });
    } catch (...) {
    }
  }
  device_comms_.clear();
  stop_threads();
}

void RankWorkers::stop_threads() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_)
    if (t.joinable()) t.join();
}

void RankWorkers::run(const std::function<void(int)>& fn) {
  if (failure_) std::rethrow_exception(failure_);
#ifdef DSI_WITH_CUDA
  // Rank 0 runs on the calling thread, which may be new to its device: it prepares before the job
  // goes out to the other ranks (backends/cuda/device.h: prepare_thread).
  if (!device_comms_.empty()) cuda::prepare_thread(rank_cuda_device(0).index);
#endif
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
  Communicator* comm = !device_comms_.empty() && device_comms_[size_t(rank)]
                           ? device_comms_[size_t(rank)].get()
                           : (world_ ? &world_->comm(rank) : nullptr);
  if (comm) comm->abort(fmt::format("rank {} failed", rank));
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
