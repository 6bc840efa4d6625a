// Token choice from logits: greedy argmax (lowest id on ties) and temperature / top-p sampling
// driven by a caller-supplied uniform number, so every backend samples identically given the seed.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "dsinfer/sampling.h"

namespace dsi::ops {

// logits: [n, vocab] f32; out: [n] i32.
void argmax(const Tensor& logits, Tensor& out);

// The distribution a token is drawn from: softmax(logits / temperature) restricted to the sp.top_k
// most likely tokens (0: all), then to the nucleus (the smallest set of most likely tokens whose
// probability reaches top_p of what is left), then to the tokens whose probability is at least
// sp.min_p times the largest; ties: lower id first; renormalised. temperature <= 0 puts all mass on
// the argmax. logits: [vocab] f32; returns vocab probabilities on the host (speculative decoding's
// rejection sampling works on these).
std::vector<double> token_distribution(const Tensor& logits, const SamplingParams& sp);
// The same with only a temperature and top_p.
std::vector<double> token_distribution(const Tensor& logits, float temperature, float top_p);

// Inverse CDF of p (need not sum to 1) in the order probability descending, then id ascending;
// u in [0, 1). Tokens with zero probability are never drawn.
int32_t draw_token(const std::vector<double>& p, double u);

// draw_token(token_distribution(logits, sp), u).
int32_t sample(const Tensor& logits, const SamplingParams& sp, double u);
int32_t sample(const Tensor& logits, float temperature, float top_p, double u);

}  // namespace dsi::ops
