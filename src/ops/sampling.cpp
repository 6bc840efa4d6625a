// Dispatch of the sampling ops; see sampling.h.
#include "ops/sampling.h"

#include "ops/dispatch.h"

namespace dsi::ops {

void argmax(const Tensor& logits, Tensor& out) { DSI_DISPATCH(logits.device(), argmax, logits, out); }
std::vector<double> token_distribution(const Tensor& logits, const SamplingParams& sp) {
  DSI_DISPATCH(logits.device(), token_distribution, logits, sp);
}
std::vector<double> token_distribution(const Tensor& logits, float temperature, float top_p) {
  SamplingParams sp;
  sp.temperature = temperature;
  sp.top_p = top_p;
  return token_distribution(logits, sp);
}
int32_t draw_token(const std::vector<double>& p, double u) { return cpu::draw_token(p, u); }
int32_t sample(const Tensor& logits, const SamplingParams& sp, double u) {
  return draw_token(token_distribution(logits, sp), u);
}
int32_t sample(const Tensor& logits, float temperature, float top_p, double u) {
  return draw_token(token_distribution(logits, temperature, top_p), u);
}

}  // namespace dsi::ops
