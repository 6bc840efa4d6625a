// Dispatch of the sampling ops; see sampling.h.
#include "ops/sampling.h"

#include "ops/dispatch.h"

namespace dsi::ops {

void argmax(const Tensor& logits, Tensor& out) { DSI_DISPATCH(logits.device(), argmax, logits, out); }
int32_t sample(const Tensor& logits, float temperature, float top_p, double u) {
  DSI_DISPATCH(logits.device(), sample, logits, temperature, top_p, u);
}

}  // namespace dsi::ops
