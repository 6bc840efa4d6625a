// Dispatch of the sampling ops; see sampling.h.
#include "ops/sampling.h"

#include "ops/dispatch.h"

namespace dsi::ops {

void argmax(const Tensor& logits, Tensor& out) { DSI_DISPATCH(logits.device(), argmax, logits, out); }
std::vector<double> token_distribution(const Tensor& logits, float temperature, float top_p) {
  DSI_DISPATCH(logits.device(), token_distribution, logits, temperature, top_p);
}
int32_t draw_token(const std::vector<double>& p, double u) { return cpu::draw_token(p, u); }
int32_t sample(const Tensor& logits, float temperature, float top_p, double u) {
  DSI_DISPATCH(logits.device(), sample, logits, temperature, top_p, u);
}

}  // namespace dsi::ops
