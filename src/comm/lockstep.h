// What one collective call is, as the implementations compare it across a group: a fixed-size
// descriptor (operation, group, per-(rank, group) call number, dtype, shape, broadcast root), the
// per-rank argument checks, the member-order reduction, and the messages shared by the local and MPI
// communicators, so both name a divergence, a timeout or a failure in the same words.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace dsi {

inline constexpr int kMaxCollectiveDims = 8;

// Trivially copyable and padding-free (MpiComm exchanges it as raw bytes between processes of the
// same build). Two members agree when every field but world_rank and invalid is equal.
struct CollectiveDesc {
  uint64_t call = 0;        // this rank's call number on the group, 1-based
  int32_t world_rank = -1;  // who issued it (for messages only)
  int32_t group_first = 0;
  int32_t group_size = 0;
  int32_t root = -1;        // broadcast root member; -1 for other operations
  uint8_t op = 0;           // CollectiveOp
  uint8_t dtype = 0;        // DType of the main tensor (0 for barrier)
  uint8_t ndim = 0;
  uint8_t invalid = 0;      // 1: the issuing rank's own argument checks failed
  int32_t reserved = 0;     // keeps the struct free of padding bytes
  int64_t shape[kMaxCollectiveDims] = {};  // main tensor's shape; unused entries 0

  bool same_call(const CollectiveDesc& o) const;  // all fields but world_rank and invalid equal
};
static_assert(sizeof(CollectiveDesc) == 32 + 8 * kMaxCollectiveDims, "CollectiveDesc has padding");

// The main tensor of an operation: all_gather/reduce_scatter/all_to_all: `in`; all_reduce and
// broadcast: `inout`; barrier: none. `root` is the broadcast root member (-1 otherwise).
CollectiveDesc make_desc(CollectiveOp op, const Group& g, int world_rank, uint64_t call,
                         const Tensor* main, int root);

// This rank's own argument checks for one call (dtype, out shape consistent with in, divisibility
// by the group size, host memory, root range, at most kMaxCollectiveDims dimensions). Returns the
// problem, or "" when the arguments are fine. `out` may be null (all_reduce, broadcast, barrier).
std::string check_collective_args(CollectiveOp op, const Group& g, const Tensor* in,
                                  const Tensor* out, int root);

// Throws when `g` is not a valid group of a world of `world_size` ranks containing `world_rank`.
void check_group(const Group& g, int world_rank, int world_size, CollectiveOp op);

// "all_gather F32[2, 8]", "broadcast F32[4] from member 1", "barrier".
std::string describe(const CollectiveDesc& d);
// "rank 2: all_reduce on group tp (call #7, F32[4, 128])" (barrier: "(call #7)").
std::string call_context(const Group& g, const CollectiveDesc& d);

// Compares the members' descriptors (members[i] is member i's). Returns "" when they all agree,
// else "at call #5: rank 0 issued all_gather F32[2, 8], rank 1 issued all_reduce F32[2, 8]"
// naming member 0 and the first member that differs from it; the same text on every member.
std::string find_divergence(const std::vector<CollectiveDesc>& members);
// "lockstep violation on group tp " + divergence.
std::string lockstep_violation(const Group& g, const std::string& divergence);

// Check mode of the communicators that move data through another transport (MPI, NCCL, peer):
// `gather` all-gathers this member's descriptor (U8 [1, sizeof(CollectiveDesc)]) into U8
// [G, sizeof(CollectiveDesc)] over the group; then every member throws the same error when the
// members diverge or any passed invalid arguments (`invalid`: this member's own complaint, "" for
// none; `ctx`: the call, for messages).
void compare_descriptors(const Group& g, const CollectiveDesc& mine, const std::string& ctx,
                         const std::string& invalid, const std::function<void(const Tensor&, Tensor&)>& gather);

// "rank 3", "ranks 1, 3".
std::string rank_list(const std::vector<int>& world_ranks);
// "5", "0.25": a timeout in seconds for messages.
std::string seconds_str(double s);

// out[e] = ((parts[0][e] + parts[1][e]) + parts[2][e]) + ...: the member-order sum every
// implementation uses, so results are bitwise identical across runs, ranks and implementations.
void sum_in_member_order(float* out, const float* const* parts, int n_parts, int64_t n);

}  // namespace dsi
