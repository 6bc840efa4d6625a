// What every layer of one forward call shares: the config, the RoPE table, and the rows being run
// (their absolute positions and where they land in the caches).
#pragma once

#include "core/tensor.h"
#include "model/config.h"

namespace dsi {

struct RopeTable {
  Tensor inv_freq;  // [qk_rope_head_dim / 2] f32 (shared by MLA and the indexer, as in HF)
  float attention_factor = 1.0f;
};

struct LayerContext {
  const ModelConfig* cfg = nullptr;
  const RopeTable* rope = nullptr;
  Tensor positions;   // [n] i32: absolute position of each new row
  Tensor bounds;      // [n] i32: causal bound of each row (keys [0, position + 1) are visible)
  int64_t start = 0;  // cache row of the first new token; rows are [start, start + n)
  int64_t n = 0;      // new rows in this call
};

}  // namespace dsi
