// The lightning indexer of one "full" layer (DeepSeek-V3.2 DSA): index queries from the MLA query
// latent, index keys from the layer input, and logits over this rank's cached keys. The causal
// top-k over them, in the defined order and merged exactly across the DCP group, is part of the
// layer's DCP exchange (runtime/dcp.h: dcp_exchange). "shared" layers reuse the selection
// (dsa-reference semantics, section 2).
#pragma once

#include "model/layer_context.h"
#include "model/weights.h"
#include "runtime/dcp.h"

namespace dsi {

// u: [n, hidden] layer input after input_layernorm; c_q: [n, q_lora] after q_a_layernorm, or before
// it when q_norm is given (the norm's weight, with eps: the index queries' product applies it);
// k: [n, index_head_dim] = wk u (rows may be strided; the attention's stacked input projection
// computes it), normed and rotated here in place; key_pool: [n_slots, index_head_dim]: the owned
// new rows are written to their slots. Returns the logits [n, ctx.local_keys] f32 over this rank's
// keys (row i's keys [0, ctx.local_bounds[i]) are visible).
Tensor indexer_scores(const LayerContext& ctx, const IndexerWeights& w, const Tensor& u,
                      const Tensor& c_q, const Tensor* q_norm, float eps, Tensor k, Tensor& key_pool);

}  // namespace dsi
