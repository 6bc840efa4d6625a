// Collective communication between ranks over groups (the TP group and its contiguous DCP
// sub-groups). One interface; implementations: in-process thread ranks (local_comm.h), MPI processes
// (mpi_comm.h), and later NCCL. Every collective is blocking, has a timeout that turns a hang into
// an error naming the rank and the operation, and, in check mode, verifies that all members issue
// the same (operation, group, sequence number, dtype, shape) before any data moves.
#pragma once

#include <cstdint>
#include <string>

#include "core/tensor.h"

namespace dsi {

// A contiguous slice of the world's ranks: world ranks [first, first + size).
struct Group {
  std::string name = "world";  // for messages: "tp", "dcp0", ...
  int first = 0;
  int size = 1;

  bool contains(int world_rank) const { return world_rank >= first && world_rank < first + size; }
  int member(int world_rank) const { return world_rank - first; }  // index within the group
};

struct CommOptions {
  bool check_lockstep = false;    // verify every collective's descriptor across its group
  double timeout_seconds = 60.0;  // a blocking collective waiting longer than this fails
};

enum class CollectiveOp : uint8_t { kAllGather, kReduceScatter, kAllReduce, kAllToAll, kBroadcast, kBarrier };
const char* collective_name(CollectiveOp op);

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;        // this rank's world rank
  virtual int world_size() const = 0;  // number of ranks
  virtual const CommOptions& options() const = 0;

  // Every member passes `in` of the same shape; out: [G * in.dim(0), ...] holds the members'
  // inputs concatenated along dim 0 in member order. Any dtype; host tensors.
  virtual void all_gather(const Group& g, const Tensor& in, Tensor& out) = 0;
  // in: [G * m, ...] F32; out: [m, ...] = sum over members i (in member order) of
  // in_i[member(rank) * m : (member(rank) + 1) * m].
  virtual void reduce_scatter(const Group& g, const Tensor& in, Tensor& out) = 0;
  // inout (F32): replaced by the sum over members, in member order.
  virtual void all_reduce(const Group& g, Tensor& inout) = 0;
  // in: [G * m, ...]: chunk j goes to member j; out: [G * m, ...]: chunk i came from member i.
  virtual void all_to_all(const Group& g, const Tensor& in, Tensor& out) = 0;
  // inout on every member becomes the root member's inout.
  virtual void broadcast(const Group& g, Tensor& inout, int root_member) = 0;
  virtual void barrier(const Group& g) = 0;

  // Marks this rank as failed with `why`: every rank blocked in (or later entering) a collective
  // with it fails with an error naming this rank and `why`, instead of waiting forever.
  virtual void abort(const std::string& why) = 0;

  // Throws the failure of an earlier collective of this rank that returned before its data moved
  // (device communicators whose collectives are only enqueued, peer_comm.h), if any; callers check
  // after reading a step's results on the host. Blocking communicators have nothing to report.
  virtual void check_async() {}
  // Whether collectives on device tensors can be recorded in a CUDA graph (they only enqueue
  // kernels on the device's stream and keep no host state per call).
  virtual bool capturable() const { return false; }
  // The communicator of this rank's host tensors: a device communicator's host-side one (the
  // control plane: agreements that must not queue kernels), else this one.
  virtual Communicator& host() const { return const_cast<Communicator&>(*this); }
  // The (logical) CUDA device a device communicator moves this rank's tensors on; -1 for a host one.
  virtual int device() const { return -1; }
};

}  // namespace dsi
