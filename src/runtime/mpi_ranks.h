// The ranks of a layout as MPI processes (mpirun starts one process per rank): this process runs
// its own rank. The host group is an MpiComm over MPI_COMM_WORLD; with CUDA devices the ranks move
// device tensors through NCCL, bootstrapped over MPI, each process taking the GPU of its node-local
// rank (the peer communicator instead where NCCL is not built, or with DSI_DEVICE_COMM=peer: one
// node only). share() broadcasts the leader's bytes over the host group (with its timeout, so a process
// that died turns into an error instead of a hang). Built with MPI only (DSI_WITH_MPI).
#pragma once

#include <memory>

#include "comm/mpi_comm.h"
#include "runtime/rank_workers.h"

namespace dsi {

class MpiRanks final : public RankGroup {
 public:
  // Collective over every process of `session` (whose count must be cfg.tp).
  MpiRanks(MpiSession& session, const ParallelConfig& cfg, const CommOptions& options, bool cuda);
  ~MpiRanks() override;
  MpiRanks(const MpiRanks&) = delete;
  MpiRanks& operator=(const MpiRanks&) = delete;

  const RankContext& context(int rank) const override;
  void run(const std::function<void(int)>& fn) override;
  bool failed() const override { return failed_; }
  void share(std::vector<uint8_t>& bytes) override;
  int64_t min_over_processes(int64_t v) override;
  [[noreturn]] void abort_job(const std::string& why) override;
  int cuda_device(int rank) const override;

 private:
  std::unique_ptr<MpiComm> host_;
  std::unique_ptr<Communicator> device_;  // NCCL or the peer communicator, for CUDA ranks
  int device_index_ = 0;                  // the GPU of this process's node-local rank
  RankContext context_;
  bool failed_ = false;
};

}  // namespace dsi
