// Token choice from logits: greedy argmax (lowest id on ties) and temperature / top-p sampling
// driven by a caller-supplied uniform number, so every backend samples identically given the seed.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace dsi::ops {

// logits: [n, vocab] f32; out: [n] i32.
void argmax(const Tensor& logits, Tensor& out);

// Samples one token from softmax(logits / temperature) restricted to the smallest set of most
// likely tokens whose probability reaches top_p (ties: lower id first); u in [0, 1).
// temperature <= 0 means greedy. logits: [vocab] f32.
int32_t sample(const Tensor& logits, float temperature, float top_p, double u);

}  // namespace dsi::ops
