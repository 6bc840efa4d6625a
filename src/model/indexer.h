// The lightning indexer of one "full" layer (DeepSeek-V3.2 DSA): index queries from the MLA query
// latent, index keys from the layer input, logits over this rank's cached keys, and the causal
// top-k in the defined order, merged exactly across the DCP group (runtime/dcp.h). "shared" layers
// reuse the result (dsa-reference semantics, section 2).
#pragma once

#include "model/layer_context.h"
#include "model/weights.h"
#include "runtime/dcp.h"

namespace dsi {

// u: [n, hidden] layer input after input_layernorm; c_q: [n, q_lora] after q_a_layernorm;
// key_pool: [n_slots, index_head_dim]: the owned new rows are written to their slots.
// Returns the selection: each row's winners as its sequence's local token indices on this rank
// (DcpTopk::local) and as global positions.
DcpTopk indexer_topk(const LayerContext& ctx, const IndexerWeights& w, const Tensor& u,
                     const Tensor& c_q, Tensor& key_pool);

}  // namespace dsi
