// Multi-head latent attention of one decoder layer (DeepSeek-V2/V3 MLA, absorbed form) over the
// keys the lightning indexer selected (dsa-reference.md section 2).
#pragma once

#include "model/layer_context.h"
#include "model/weights.h"
#include "runtime/kv_cache.h"

namespace dsi {

// u: [n, hidden] after input_layernorm. Appends the new rows' latents (and index keys) to `kv`.
// topk: [n, index_topk] i32; computed here on layers with their own indexer, read on "shared" ones
// (it must then hold the previous full layer's selection). Returns the attention output [n, hidden].
Tensor mla_attention(const LayerContext& ctx, const AttentionWeights& w, const Tensor& u,
                     LayerKvCache& kv, Tensor& topk);

}  // namespace dsi
