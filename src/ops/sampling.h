// Token choice from logits: greedy argmax (lowest id on ties) and temperature / top-p sampling
// driven by a caller-supplied uniform number, so every backend samples identically given the seed.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace dsi::ops {

// logits: [n, vocab] f32; out: [n] i32.
void argmax(const Tensor& logits, Tensor& out);

// The distribution a token is drawn from: softmax(logits / temperature) restricted to the nucleus
// (the smallest set of most likely tokens whose probability reaches top_p; ties: lower id first),
// renormalised; temperature <= 0 puts all mass on the argmax. logits: [vocab] f32; returns vocab
// probabilities on the host (speculative decoding's rejection sampling works on these).
std::vector<double> token_distribution(const Tensor& logits, float temperature, float top_p);

// Inverse CDF of p (need not sum to 1) in the order probability descending, then id ascending;
// u in [0, 1). Tokens with zero probability are never drawn.
int32_t draw_token(const std::vector<double>& p, double u);

// draw_token(token_distribution(logits, temperature, top_p), u).
int32_t sample(const Tensor& logits, float temperature, float top_p, double u);

}  // namespace dsi::ops
