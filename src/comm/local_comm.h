// In-process ranks on threads: a LocalWorld of N ranks hands out one LocalComm per rank, and rank r
// uses its LocalComm from its own thread. Collectives rendezvous per group (keyed by first/size)
// under one mutex and condition variable; data moves by memcpy between the callers' buffers.
//
// Protocol per group and call number k (details in local_comm.cpp):
//   1. wait until round k is the group's open round (every member has left round k - 1);
//   2. post this member's descriptor and input pointer; the last to arrive compares all
//      descriptors (so a mismatched shape or dtype fails every member before any data moves);
//   3. each member reads the others' inputs and writes its own output (into a temporary when the
//      output is the input, e.g. in-place all_reduce), then waits until every member has finished
//      reading; only then are temporaries written back and the member leaves.
// So no member leaves (and no input on a caller's stack dies) while another still reads it.
// Waits for arrival use the deadline options().timeout_seconds and wake on abort(); a member that
// gives up leaves the group unusable, so later calls on it fail at once instead of reading stale
// buffers. Descriptors are always compared (they are in shared memory, so it costs nothing):
// check_lockstep only selects the "lockstep violation" wording, the same text on every member.
#pragma once

#include <memory>
#include <string>

#include "comm/communicator.h"

namespace dsi {

class LocalWorld;

class LocalComm final : public Communicator {
 public:
  LocalComm(const LocalComm&) = delete;
  LocalComm& operator=(const LocalComm&) = delete;

  int rank() const override { return rank_; }
  int world_size() const override;
  const CommOptions& options() const override;

  void all_gather(const Group& g, const Tensor& in, Tensor& out) override;
  void reduce_scatter(const Group& g, const Tensor& in, Tensor& out) override;
  void all_reduce(const Group& g, Tensor& inout) override;
  void all_to_all(const Group& g, const Tensor& in, Tensor& out) override;
  void broadcast(const Group& g, Tensor& inout, int root_member) override;
  void barrier(const Group& g) override;
  void abort(const std::string& why) override;

 private:
  friend class LocalWorld;
  LocalComm(LocalWorld* world, int rank) : world_(world), rank_(rank) {}

  LocalWorld* world_;
  int rank_;
};

// The shared state of N thread ranks. Outlives every thread that uses its comms.
class LocalWorld {
 public:
  explicit LocalWorld(int n_ranks, CommOptions options = {});
  ~LocalWorld();
  LocalWorld(const LocalWorld&) = delete;
  LocalWorld& operator=(const LocalWorld&) = delete;

  int size() const;
  const CommOptions& options() const;
  LocalComm& comm(int rank);  // rank's communicator; use it from that rank's thread only

 private:
  friend class LocalComm;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dsi
