// What every layer of one forward call shares: the config, the RoPE table, this rank's place in
// the parallel layout, and the rows being run (their positions, where this rank stores their keys,
// and where each row finds its sequence's cached keys in the paged pools).
#pragma once

#include <vector>

#include "core/tensor.h"
#include "model/config.h"
#include "ops/indexer.h"
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
  // The rows of one call: the new tokens of one or more sequences, each sequence's rows together
  // and in position order.
  int64_t n = 0;      // rows
  Tensor positions;   // [n] i32: global position of each row in its sequence
  Tensor store_slots;  // [n] i32: pool slot this rank writes the row's keys to, -1 = not its token
  Tensor local_bounds;  // [n] i32: each row's causal bound (position + 1) in this rank's keys
  int64_t local_keys = 0;  // the most keys a row can see on this rank (the logits' width)
  ops::KeyPages pages;     // the sequences' block tables and each row's sequence

  // The layer's own indexer is skipped and the given selection reused (GLM-5.2's
  // index_share_for_mtp_iteration for chained MTP draft steps).
  bool reuse_topk = false;
};

}  // namespace dsi
