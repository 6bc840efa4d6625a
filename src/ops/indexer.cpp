// Dispatch of the indexer ops; see indexer.h.
#include "ops/indexer.h"

#include "ops/dispatch.h"

namespace dsi::ops {

void indexer_logits(const Tensor& q, const Tensor& weights, const Tensor& keys,
                    const Tensor& bounds, float softmax_scale, Tensor& logits,
                    const KeyPages* pages) {
  DSI_DISPATCH(q.device(), indexer_logits, q, weights, keys, bounds, softmax_scale, logits, pages);
}

}  // namespace dsi::ops
