// What every layer of one forward call shares: the config, the RoPE table, this rank's place in
// the parallel layout, and the rows being run (their global positions, and which of them this rank
// keeps in its slice of the caches).
#pragma once

#include <vector>

#include "core/tensor.h"
#include "model/config.h"
#include "runtime/parallel.h"

namespace dsi {

struct RopeTable {
  Tensor inv_freq;  // [qk_rope_head_dim / 2] f32 (shared by MLA and the indexer, as in HF)
  float attention_factor = 1.0f;
};

struct LayerContext {
  const ModelConfig* cfg = nullptr;
  const RopeTable* rope = nullptr;
  const RankContext* rank = nullptr;
  Tensor positions;   // [n] i32: global position of each new row
  int64_t start = 0;  // global position of the first new row; rows are [start, start + n)
  int64_t n = 0;      // new rows in this call

  // Under DCP this rank caches only the tokens it owns (identity with one rank):
  std::vector<int32_t> owned_rows;  // rows of this call whose token this rank owns, in order
  int64_t local_start = 0;          // cache slot of the first owned row
  int64_t local_keys = 0;           // cached keys visible to this call: slots [0, local_keys)
  Tensor local_bounds;  // [n] i32: each row's causal bound (position + 1) localised to this rank

  // The layer's own indexer is skipped and the given selection reused (GLM-5.2's
  // index_share_for_mtp_iteration for chained MTP draft steps).
  bool reuse_topk = false;
};

}  // namespace dsi
