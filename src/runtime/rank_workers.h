// Persistent thread ranks for the serving engine: T threads, one per tensor-parallel rank, each
// with its communicator, running the same function for every step of the engine. Unlike
// run_on_thread_ranks (ranks.h), the threads live as long as the engine, so a step costs a wake-up,
// not T thread starts. A rank that throws aborts the others (their collectives fail instead of
// waiting) and the first error is rethrown by run(); after that several ranks are unusable (their
// communicators are aborted), while a single rank simply goes on with the next run.
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "comm/local_comm.h"
#include "runtime/parallel.h"

namespace dsi {

class RankWorkers {
 public:
  // With `cuda` and several ranks, rank r computes on GPU r and moves device tensors through NCCL
  // (the thread world stays the host-side group).
  RankWorkers(const ParallelConfig& cfg, const CommOptions& options, bool cuda = false);
  ~RankWorkers();
  RankWorkers(const RankWorkers&) = delete;
  RankWorkers& operator=(const RankWorkers&) = delete;

  int size() const { return int(contexts_.size()); }
  const RankContext& context(int rank) const { return contexts_.at(size_t(rank)); }
  // Runs fn(rank) on every rank (rank 0 on the calling thread) and waits for all.
  void run(const std::function<void(int)>& fn);
  // Set once a rank has failed: every later run() rethrows the first error at once.
  bool failed() const {
    std::lock_guard<std::mutex> lock(mu_);
    return bool(failure_);
  }

 private:
  void loop(int rank);
  void fail(int rank, std::exception_ptr error);
  void stop_threads();

  std::unique_ptr<LocalWorld> world_;
  std::vector<std::unique_ptr<Communicator>> device_comms_;  // [rank] NCCL, when used
  std::vector<RankContext> contexts_;
  std::vector<std::thread> threads_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  const std::function<void(int)>* job_ = nullptr;
  uint64_t generation_ = 0;  // bumped per job
  int pending_ = 0;          // worker threads still running the current job
  bool stop_ = false;
  std::exception_ptr failure_;
};

}  // namespace dsi
