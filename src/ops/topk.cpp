// Dispatch of top-k; see topk.h.
#include "ops/topk.h"

#include "ops/dispatch.h"

namespace dsi::ops {

void topk(const Tensor& scores, const Tensor& bounds, int k, Tensor& indices, Tensor* values) {
  DSI_DISPATCH(scores.device(), topk, scores, bounds, k, indices, values);
}

}  // namespace dsi::ops
