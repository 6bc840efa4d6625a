// Multi-head latent attention of one decoder layer (DeepSeek-V2/V3 MLA, absorbed form) over the
// keys the lightning indexer selected (dsa-reference.md section 2).
#pragma once

#include "model/layer_context.h"
#include "model/weights.h"
#include "runtime/dcp.h"
#include "runtime/kv_cache.h"

namespace dsi {

// u: [n, hidden] after input_layernorm. Stores the owned new rows' latents (and index keys) in `kv`.
// topk: computed here on layers with their own indexer, read on "shared" ones (it must then hold
// the previous full layer's selection). Returns this rank's partial attention output [n, hidden]
// (its heads' share of o_proj; the model sums the partials over the TP group).
Tensor mla_attention(const LayerContext& ctx, const AttentionWeights& w, const Tensor& u,
                     LayerKvCache& kv, DcpTopk& topk);

}  // namespace dsi
