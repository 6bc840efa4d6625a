// Synthetic checkpoints: every tensor a config's model needs (checkpoint names of dsa-reference.md
// section 3), filled with deterministic pseudo-random values, for benchmarks at real geometries
// without the real weights (GLM-5.2 and DeepSeek-V3.2 shapes under configs/). Projection weights are
// bf16 or fp8 e4m3 with 128x128 block scales; norms, router, indexer weights_proj, embeddings and
// lm_head are bf16 (fp32 for the router's correction bias), as in the released checkpoints.
#pragma once

#include <cstdint>

#include "model/config.h"
#include "model/safetensors.h"

namespace dsi {

// cfg.quant.fp8 picks fp8 projections. Values are small (|w| <= 0.05 after scaling, norms near 1),
// so activations stay finite through any number of layers.
Checkpoint synthetic_checkpoint(const ModelConfig& cfg, uint64_t seed = 1);

// Bytes of the weights one batch-1 decode step of layer `layer` reads (attention, its indexer if
// any, and the MLP: for MoE the router, n_experts_active routed experts and the shared expert).
int64_t decode_weight_bytes(const ModelConfig& cfg, int layer);

}  // namespace dsi
