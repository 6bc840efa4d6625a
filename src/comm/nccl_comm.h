// Ranks on GPUs: the Communicator interface over NCCL, for CUDA device tensors (built when CMake
// finds NCCL in a CUDA build; DSI_WITH_NCCL is then defined). Each NcclComm wraps a host-side
// Communicator (LocalComm for thread ranks in one process, MpiComm for processes) that carries the
// control traffic: the ncclUniqueId of every NCCL communicator, the lockstep descriptors (check mode),
// barriers and failure propagation. The data moves through NCCL on one CUDA stream per rank (the
// CUDA backend's stream, so the model's kernels and the collectives are ordered).
//
// - One NCCL communicator per group (first, size) this rank uses, created collectively over the
//   group's members with an id broadcast by member 0 through the host group: at start for the groups
//   passed to create() (in that order on every rank), else on the group's first collective. A group
//   covering the whole world reuses the world's communicator.
// - Every collective is blocking, as the interface promises: after enqueueing, the host polls the
//   stream and NCCL's error state until the work is done or options().timeout_seconds pass; then
//   the NCCL communicators are aborted (stopping the stuck kernels) and a dsi::Error names the rank,
//   the operation, the group and the call. The communicators are non-blocking NCCL communicators,
//   so their creation and teardown are bounded by the same deadline. After a failure every later
//   call fails at once.
// - Check mode (options().check_lockstep): before any NCCL call the members exchange their
//   descriptors over the host group and compare them with the shared guard (lockstep.h), so a
//   mismatched shape fails every member with the same message instead of corrupting or hanging.
// - barrier() is host-side only (the host group's barrier; nothing is allocated on the device).
// - Sums (reduce_scatter, all_reduce; F32) are bitwise equal to LocalComm's member-order sums by
//   default: for groups of two NCCL's own reduction is used (a + b is commutative, so its order
//   does not matter); for larger groups the chunks are exchanged with grouped send/recv and summed
//   in member order by a kernel (the same traffic as NCCL's ring, one more launch).
//   NcclSumOrder::kNative uses NCCL's reductions at every size (order unspecified: within
//   reduction-order tolerance of the CPU, see docs/parallelism.md).
// - NVLink SHARP (NVLS) is kept off: NCCL_NVLS_ENABLE=0 is set before the first communicator is
//   created unless the environment already says otherwise.
//
// Thread ranks of one process share an NcclProcessState: the first failure (abort or timeout) wakes
// every rank waiting on the device, and a rank's NCCL resources are released only once no other rank
// of the process has NCCL work in flight.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace dsi {

enum class NcclSumOrder : uint8_t {
  kMemberOrder,  // bitwise equal to LocalComm/MpiComm at every group size (default)
  kOrderedAlways,  // the exchange + member-order kernel even for groups of two (tests, benchmarks)
  kNative,       // NCCL's ncclReduceScatter / ncclAllReduce (order unspecified for > 2 members)
};

// Shared by the NcclComms of the thread ranks of one process (null for process ranks).
class NcclProcessState {
 public:
  // Records the first failure (who, why); later ones are ignored. Returns true for the first.
  bool raise(int rank, const std::string& why);
  bool raised() const { return raised_.load(std::memory_order_acquire); }
  std::string failure() const;  // "rank 1 aborted: why" ("" before any failure)

  std::atomic<int> in_flight{0};  // ranks with NCCL work enqueued and not yet finished or aborted

 private:
  std::atomic<bool> raised_{false};
  mutable std::mutex mu_;
  std::string failure_;
};

struct NcclSetup {
  int device = 0;             // this rank's CUDA device
  std::vector<Group> groups;  // NCCL communicators made at start, in this order on every rank
  NcclSumOrder sums = NcclSumOrder::kMemberOrder;
  std::shared_ptr<NcclProcessState> process;  // thread ranks: one per process; processes: null
};

class NcclComm final : public Communicator {
 public:
  // Collective over every rank of `host` (each rank calls it at the same time, thread ranks from
  // their own threads): creates the world's NCCL communicator and those of setup.groups. `host`
  // must outlive the comm; options() are the host's (check_lockstep, timeout_seconds).
  static std::unique_ptr<NcclComm> create(Communicator& host, NcclSetup setup);
  // Releases the NCCL communicators: after a failure (here or, for thread ranks, on any rank of the
  // process) by aborting them, else by finalising them within the timeout.
  ~NcclComm() override;
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

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
  // Marks this rank failed: thread ranks of the process fail their device waits at once; the host
  // group is aborted too (LocalComm: its waiters fail; MpiComm: the job ends).
  void abort(const std::string& why) override;

  int device() const override;
  cudaStream_t stream() const;  // where the collectives run: the CUDA backend's stream
  Communicator& host() const override;

 private:
  struct State;  // NCCL handles live in the .cpp, so users of this header need no <nccl.h>
  explicit NcclComm(std::unique_ptr<State> s);
  std::unique_ptr<State> s_;
};

// The NCCL library's version as "2.21.5" (the linked library, not the header).
std::string nccl_version();

}  // namespace dsi
