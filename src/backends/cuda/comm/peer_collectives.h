// Low-latency collectives among the GPUs of one node, for small messages (a decode step's queries,
// top-k candidates, partial outputs): one-shot kernels that write straight into the other members'
// memory over NVLink (peer-to-peer) and signal with flags, instead of NCCL's protocol (16-18 us per
// small collective on two H200s). NCCL stays the path across nodes, for large messages and where
// GPUs have no peer access.
//
// Each member owns one region of device memory: a signal area and two banks of G slots of
// `capacity` bytes (bank = call parity). A call runs kPeerBlocks blocks per member; block b of
// member m copies its share of the payload into slot m of bank (epoch & 1) of every member (itself
// included), then raises flag [b][m] of every member to the call's epoch; it waits until all G
// flags [b][*] of its own region reach the epoch and then reads its share of the G slots: gathers
// copy them out, sums add them in member order (one __fadd_rn after another, so every member gets
// the same bits as LocalComm's member-order sum). Epochs live in the region (one counter per block,
// advanced by the kernel), so calls need no host state and can be captured in CUDA graphs. Two
// banks suffice: a member writes bank e & 1 for epoch e only after every member's block b raised
// epoch e - 1, which each does only once its epoch e - 2 kernel (the last reader of that bank) has
// finished in stream order.
//
// Every call of a member must be ordered on one stream (the epochs are read at a kernel's start and
// written at its end): two streams or parallel graph branches of one member would reuse an epoch.
//
// A member that never arrives: the waiting blocks give up after the timeout and write which member
// waited for which, and in which operation, into every member's region; from then on every call of
// every member skips the exchange and fills its output with NaN bytes, and check() on any member
// throws an error naming them (the group is unusable afterwards). Regions are shared by pointer between thread ranks of one process (peer
// access enabled between their devices; members may even share one device, which the tests use)
// and through CUDA IPC handles between processes.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace dsi::cuda {

inline constexpr int kPeerMaxMembers = 8;
inline constexpr int kPeerBlocks = 8;  // blocks per member and call (each waits for its own flags)

class PeerGroup {
 public:
  // Collective over the members of `g` (each calls it from its own thread or process, with the host
  // group `host` that carries the region handles): allocates this member's region on `device` with
  // `capacity` bytes per slot and maps every other member's. Throws on every member alike when any
  // member cannot map another's (GPUs without peer access, members on other hosts) or the group is
  // larger than kPeerMaxMembers; the caller then keeps NCCL.
  static std::unique_ptr<PeerGroup> create(Communicator& host, const Group& g, int device,
                                           size_t capacity, double timeout_seconds);
  // Frees the region and unmaps the others'. Every member's collectives must have finished (the
  // owner of the ranks joins them first).
  ~PeerGroup();
  PeerGroup(const PeerGroup&) = delete;
  PeerGroup& operator=(const PeerGroup&) = delete;

  int members() const;
  int member() const;       // this rank's index in the group
  size_t capacity() const;  // bytes one member contributes per call, at most

  // Enqueued on `stream` (no host synchronisation; may be captured in a CUDA graph). Device
  // pointers of this member's device (stream null: the CUDA backend's stream of that device);
  // every member calls with the same sizes, each at most capacity() bytes per member. Strides (0: packed) let a caller move a large message in
  // capacity-sized pieces.
  // out [G chunks, out_stride bytes apart] = every member's in [bytes], in member order.
  void all_gather(const void* in, size_t bytes, void* out, cudaStream_t stream, size_t out_stride = 0);
  // in [G chunks of m f32, in_stride elements apart]: chunk j goes to member j; out [m] = sum over
  // members in member order.
  void reduce_scatter(const float* in, int64_t m, float* out, cudaStream_t stream, int64_t in_stride = 0);
  // inout [n] f32 becomes the sum over members in member order (n * 4 <= capacity()).
  void all_reduce(float* inout, int64_t n, cudaStream_t stream);
  // in [G chunks of bytes, in_stride apart]: chunk j goes to member j; out [G chunks, out_stride
  // apart]: chunk i came from member i.
  void all_to_all(const void* in, size_t bytes, void* out, cudaStream_t stream, size_t in_stride = 0,
                  size_t out_stride = 0);
  // out [bytes] on every member = member root's in [bytes] (in is read on the root only).
  void broadcast(const void* in, size_t bytes, void* out, int root, cudaStream_t stream);

  // Whether a call of this member found the group failed (timeout or abort), without synchronising:
  // the kernel raises a host-mapped word. check() then says who and why.
  bool failed() const;
  // Throws dsi::Error naming the operation, the waiting and the missing member once any member of
  // the group timed out, or the member that aborted (reads the region's error word: call after
  // synchronising the stream; later calls then throw at once).
  void check() const;
  // Marks the group failed by this member (from the host, while other members' kernels may be
  // waiting for this one): their waits end at once, and every later call fails. Never throws.
  void abort() noexcept;

 private:
  struct State;
  explicit PeerGroup(std::unique_ptr<State> s);
  void launch_op(int op, const void* in, void* out, size_t bytes, size_t in_stride, size_t out_stride, int root,
                 cudaStream_t stream);
  std::unique_ptr<State> s_;
};

}  // namespace dsi::cuda
