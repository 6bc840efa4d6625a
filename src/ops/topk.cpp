// Dispatch of top-k; see topk.h.
#include "ops/topk.h"

#include "ops/dispatch.h"

namespace dsi::ops {

void topk(const Tensor& scores, const Tensor& bounds, int k, Tensor& indices, Tensor* values) {
  DSI_DISPATCH(scores.device(), topk, scores, bounds, k, indices, values);
}

void topk_merge(const Tensor& scores, const Tensor& positions, int k, Tensor& winners) {
  DSI_DISPATCH(scores.device(), topk_merge, scores, positions, k, winners);
}

}  // namespace dsi::ops
