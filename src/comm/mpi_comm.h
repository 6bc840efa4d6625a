// Ranks as MPI processes (built when CMake finds MPI; DSI_WITH_MPI is then defined). An MpiSession
// (created once by the program, e.g. the CLI) initialises and finalises MPI; an MpiComm, created
// after it and destroyed before it, wraps MPI_COMM_WORLD. A group's sub-communicator is created
// on its first use with MPI_Comm_create_group (collective over the group's members only) and cached.
// Collectives are non-blocking MPI calls polled with MPI_Test until done or the deadline
// (options.timeout_seconds), so a hang becomes a dsi::Error naming the rank and the operation.
//
// Sums are computed in member order, bitwise equal to LocalComm's: reduce_scatter is an all_to_all
// of the chunks followed by a local sum; all_reduce is that on the flattened tensor padded to a
// multiple of the group size, followed by an all_gather (the same traffic as a ring all_reduce).
// MPI's built-in reductions are not used because MPI does not fix their order of summation.
//
// After a timeout or an MPI error the process cannot continue: requests are left pending (their
// temporaries are kept alive) and every later call fails at once. The caller should report the
// error and exit; the MpiSession's destructor then calls MPI_Abort instead of MPI_Finalize (which
// could wait forever for the other processes). abort(why) prints the reason and MPI_Aborts the world.
//
// With check_lockstep off, members that pass different shapes are not detected (MPI sees mismatched
// counts: an MPI error, truncation or garbage); turn it on while developing and in tests.
// One thread at a time may use an MpiComm (MPI_THREAD_SERIALIZED).
#pragma once

#include <memory>
#include <string>

#include "comm/communicator.h"

namespace dsi {

class MpiSession {
 public:
  // Calls MPI_Init_thread (MPI_THREAD_SERIALIZED) unless MPI is already initialised.
  MpiSession(int* argc, char*** argv);
  // MPI_Finalize (if this session initialised MPI), or MPI_Abort after a communicator broke.
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // Called by a communicator that left MPI requests pending: finalising could hang.
  void mark_broken() { broken_ = true; }
  bool broken() const { return broken_; }

 private:
  bool owns_ = false;
  bool broken_ = false;
  int rank_ = 0;
  int size_ = 1;
};

class MpiComm final : public Communicator {
 public:
  // Duplicates MPI_COMM_WORLD (collective over all processes, with the timeout) so its own traffic
  // cannot match anyone else's. `session` must outlive the comm.
  explicit MpiComm(MpiSession& session, CommOptions options = {});
  ~MpiComm() override;  // frees the communicators (skipped after a failure)
  MpiComm(const MpiComm&) = delete;
  MpiComm& operator=(const MpiComm&) = delete;

  int rank() const override;
  int world_size() const override;
  const CommOptions& options() const override;

  void all_gather(const Group& g, const Tensor& in, Tensor& out) override;
  void reduce_scatter(const Group& g, const Tensor& in, Tensor& out) override;
  void all_reduce(const Group& g, Tensor& inout) override;
  void all_to_all(const Group& g, const Tensor& in, Tensor& out) override;
  void broadcast(const Group& g, Tensor& inout, int root_member) override;
  void barrier(const Group& g) override;
  [[noreturn]] void abort(const std::string& why) override;

 private:
  struct State;  // MPI handles live in the .cpp, so users of this header need no <mpi.h>
  std::unique_ptr<State> s_;
};

// The node-local rank the launcher gives this process (OMPI_COMM_WORLD_LOCAL_RANK, then
// MPI_LOCALRANKID, SLURM_LOCALID, LOCAL_RANK), or -1 when none is set.
int local_rank_from_env();
// How many ranks the launcher started on this node (OMPI_COMM_WORLD_LOCAL_SIZE, then
// MPI_LOCALNRANKS), or -1 when neither is set.
int local_size_from_env();

}  // namespace dsi
