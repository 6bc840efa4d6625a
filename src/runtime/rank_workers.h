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
#include <string>
#include <thread>
#include <vector>

#include "comm/local_comm.h"
#include "runtime/parallel.h"

namespace dsi {

// The ranks an engine runs on: all of them as threads of this process (RankWorkers), or one per
// process started by mpirun (MpiRanks, mpi_ranks.h). The engine keeps per-rank state for the local
// ranks only, indexed by slot(rank); every process runs the same engine steps, and the process of
// rank 0 (the leader) takes the requests and makes the decisions, which share() hands to the others.
class RankGroup {
 public:
  virtual ~RankGroup() = default;
  int size() const { return size_; }  // ranks of the layout (tp)
  // The ranks this process runs, ascending; slot(rank) is a local rank's index in that list.
  const std::vector<int>& local() const { return local_; }
  int slot(int rank) const;
  bool leader() const { return local_.front() == 0; }
  virtual const RankContext& context(int rank) const = 0;  // a local rank's
  // Runs fn(rank) on every local rank and waits for all.
  virtual void run(const std::function<void(int)>& fn) = 0;
  // Set once a rank has failed: every later run() rethrows the first error at once.
  virtual bool failed() const = 0;
  // The leader's bytes, on every process: the leader's call sends them, the others' calls replace
  // theirs with them. Every process calls it at the same point of the same step. One process: a
  // no-op.
  virtual void share(std::vector<uint8_t>& bytes) { (void)bytes; }
  // The smallest of the processes' values of v, on every process (each calls it at the same point;
  // the engine sizes every rank's page pool alike with it). One process: v.
  virtual int64_t min_over_processes(int64_t v) { return v; }
  // Processes: ends every process of the job with `why` (after a failure the processes' steps can
  // no longer agree). Threads of one process: does nothing (the engine reports the failure).
  virtual void abort_job(const std::string& why) { (void)why; }
  bool single_process() const { return int(local_.size()) == size_; }
  // The (logical) CUDA device a local rank computes on: its rank for thread ranks (rank r on
  // device r), the node-local GPU for processes.
  virtual int cuda_device(int rank) const { return rank; }

 protected:
  RankGroup(int size, std::vector<int> local) : size_(size), local_(std::move(local)) {}

 private:
  int size_ = 1;
  std::vector<int> local_;
};

class RankWorkers final : public RankGroup {
 public:
  // With `cuda` and several ranks, rank r computes on CUDA device r and moves device tensors
  // through make_thread_rank_device_comm's communicator (ranks.h; the thread world stays the
  // host-side group).
  RankWorkers(const ParallelConfig& cfg, const CommOptions& options, bool cuda = false);
  ~RankWorkers() override;
  RankWorkers(const RankWorkers&) = delete;
  RankWorkers& operator=(const RankWorkers&) = delete;

  const RankContext& context(int rank) const override { return contexts_.at(size_t(rank)); }
  // Runs fn(rank) on every rank (rank 0 on the calling thread) and waits for all.
  void run(const std::function<void(int)>& fn) override;
  bool failed() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return bool(failure_);
  }

 private:
  void loop(int rank);
  void fail(int rank, std::exception_ptr error);
  void stop_threads();

  std::unique_ptr<LocalWorld> world_;
  std::vector<std::unique_ptr<Communicator>> device_comms_;  // [rank] NCCL or peer, when used
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
