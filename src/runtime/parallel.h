// The parallel layout of a run and one rank's place in it: tensor parallelism over T ranks (MLA
// heads, MLP columns, experts and vocabulary split), and decode context parallelism inside
// contiguous groups of W of those ranks (the KV cache of every request split by token).
// With T = W = 1 everything here is the identity. Semantics: docs/parallelism.md.
#pragma once

#include <string>

#include "comm/communicator.h"
#include "model/config.h"

namespace dsi {

enum class DcpCombine { kAgRs, kA2a };  // how partial attention is combined across a DCP group

struct ParallelConfig {
  int tp = 1;              // tensor-parallel ranks
  int dcp = 1;             // decode-context-parallel group size W (divides tp)
  int dcp_interleave = 1;  // I: consecutive tokens per rank before moving to the next
  DcpCombine combine = DcpCombine::kAgRs;

  // Throws dsi::Error naming what does not divide (heads, experts, MLP sizes by tp; tp by dcp).
  void validate(const ModelConfig& cfg) const;
};

DcpCombine parse_dcp_combine(const std::string& name);  // "ag_rs" or "a2a"

// Which tokens one rank of a DCP group owns (dsa-reference semantics, section 4):
//   owner(p) = (p / I) % W;  local(p) = (p / (W I)) I + p % I.
struct DcpLayout {
  int size = 1;        // W
  int rank = 0;        // this rank's index in its DCP group
  int interleave = 1;  // I

  int owner(int64_t p) const { return int((p / interleave) % size); }
  bool owns(int64_t p) const { return owner(p) == rank; }
  int64_t local(int64_t p) const {
    return (p / (int64_t(size) * interleave)) * interleave + p % interleave;
  }
  // Global position of this rank's local slot l.
  int64_t global(int64_t l) const {
    return (l / interleave) * size * interleave + int64_t(rank) * interleave + l % interleave;
  }
  // How many of the tokens [0, L) this rank owns.
  int64_t local_len(int64_t L) const;
};

// One rank: its TP index, its DCP group and layout, and the communicator (null for one rank).
struct RankContext {
  ParallelConfig cfg;
  int tp_rank = 0;
  Group tp_group;   // all T ranks
  Group dcp_group;  // the W ranks sharing this rank's requests' KV caches
  DcpLayout dcp;
  Communicator* comm = nullptr;

  // The context of world rank `rank` in the layout `cfg`, communicating through `comm`.
  static RankContext make(const ParallelConfig& cfg, int rank, Communicator* comm);
  bool is_root() const { return tp_rank == 0; }

  // Sum of a partial result over the TP group (identity for one rank).
  void all_reduce_tp(Tensor& partial) const;
};

}  // namespace dsi
