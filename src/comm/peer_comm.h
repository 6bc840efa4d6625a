// Ranks on the GPUs of one node without NCCL: the Communicator interface for CUDA device tensors
// over the peer-to-peer one-shot kernels of backends/cuda/comm/peer_collectives.h (a few
// microseconds per small collective where NCCL takes 16-18). Built in every CUDA build. Like
// NcclComm it wraps a host-side Communicator (LocalComm for thread ranks, MpiComm for processes)
// that carries the control traffic: the region handles, the lockstep descriptors (check mode),
// barriers and failures. It is also what ranks use when they outnumber the GPUs and share them
// (logical devices, backends/cuda/device.h), which NCCL refuses.
//
// - One PeerGroup per group (first, size) this rank uses, made collectively at start for the
//   groups passed to create() (the world first), else on the group's first collective.
// - Collectives are enqueued on the CUDA backend's stream of this rank's device and return without
//   waiting for the device (stream order makes their results visible to the ops after them), so a
//   decode step with its collectives can be captured in a CUDA graph. A message larger than a
//   slot moves in slot-sized pieces (one kernel each).
// - A member that never arrives: the waiting kernels give up after options().timeout_seconds and
//   fill their outputs with NaN bytes; this rank's next collective (or check()) throws an error
//   naming the group, the operation, the waiting and the missing rank. abort() ends the other
//   members' waits at once (and aborts the host group). After a failure every call fails.
// - Check mode (options().check_lockstep): the members compare their descriptors over the host
//   group before each collective is enqueued, as NcclComm does.
// - Sums (F32) are member-order sums, bitwise LocalComm's; barrier() is host-side only.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace dsi {

struct PeerSetup {
  int device = 0;               // this rank's (logical) CUDA device
  std::vector<Group> groups;    // peer groups made at start, after the world's, in this order
  size_t slot_bytes = 1 << 20;  // bytes one member moves per kernel (larger messages go in pieces)
};

class PeerComm final : public Communicator {
 public:
  // Collective over every rank of `host` (each rank calls it at the same time, thread ranks from
  // their own threads). `host` must outlive the comm; options() are the host's. Throws on every rank
  // alike when a rank cannot map another's memory (no peer access, another node).
  static std::unique_ptr<PeerComm> create(Communicator& host, PeerSetup setup);
  ~PeerComm() override;
  PeerComm(const PeerComm&) = delete;
  PeerComm& operator=(const PeerComm&) = delete;

  int rank() const override;
  int world_size() const override;
  const CommOptions& options() const override;

  // Tensors live on device() (any layout; non-contiguous ones go through a contiguous copy).
  void all_gather(const Group& g, const Tensor& in, Tensor& out) override;
  void reduce_scatter(const Group& g, const Tensor& in, Tensor& out) override;
  void all_reduce(const Group& g, Tensor& inout) override;
  void all_to_all(const Group& g, const Tensor& in, Tensor& out) override;
  void broadcast(const Group& g, Tensor& inout, int root_member) override;
  void barrier(const Group& g) override;  // host-side
  void abort(const std::string& why) override;
  // Throws the failure of an earlier collective of this rank (a member that never arrived or
  // aborted), if any, without waiting for the device.
  void check_async() override;
  bool capturable() const override { return true; }

  int device() const override;
  Communicator& host() const override;

 private:
  struct State;
  explicit PeerComm(std::unique_ptr<State> s);
  std::unique_ptr<State> s_;
};

}  // namespace dsi
