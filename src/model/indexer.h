// The lightning indexer of one "full" layer (DeepSeek-V3.2 DSA): index queries from the MLA query
// latent, index keys from the layer input, logits over the cached keys, and the causal top-k in the
// defined order. "shared" layers reuse the result (dsa-reference.md section 2).
#pragma once

#include "model/layer_context.h"
#include "model/weights.h"

namespace dsi {

// u: [n, hidden] layer input after input_layernorm; c_q: [n, q_lora] after q_a_layernorm;
// key_cache: [capacity, index_head_dim] (rows [ctx.start, ctx.start + n) are written here).
// Returns the selected key positions [n, index_topk] i32, best first, -1 padded.
Tensor indexer_topk(const LayerContext& ctx, const IndexerWeights& w, const Tensor& u,
                    const Tensor& c_q, Tensor& key_cache);

}  // namespace dsi
