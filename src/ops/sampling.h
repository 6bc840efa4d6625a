// Token choice from logits: greedy argmax (lowest id on ties), penalties over the sequence so far,
// and temperature / top-k / top-p / min-p sampling driven by a caller-supplied uniform number, so
// every backend samples identically given the seed.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/tensor.h"
#include "dsinfer/sampling.h"

namespace dsi::ops {

// logits: [n, vocab] f32; out: [n] i32.
void argmax(const Tensor& logits, Tensor& out);

// What the penalties see of a sequence: its prompt's distinct tokens and how often each token has
// been generated.
struct TokenHistory {
  std::unordered_set<int32_t> prompt;
  std::unordered_map<int32_t, int32_t> generated;

  TokenHistory() = default;
  // tokens: the prompt (its first prompt_len), then what has been generated.
  TokenHistory(const std::vector<int32_t>& tokens, int64_t prompt_len);
  void add(int32_t token) { ++generated[token]; }
};

// True when sp asks for a penalty: presence or frequency not 0, repetition not 1.
bool has_penalties(const SamplingParams& sp);
// Throws unless the penalties are usable: presence and frequency in [-2, 2] (OpenAI's range),
// repetition in (0, 10].
void check_penalties(const SamplingParams& sp);

// logits ([vocab] f32) with sp's penalties applied, as a new host tensor; the logits themselves when
// sp has none. Over the history plus `pending` (tokens generated after it, not yet in it: the drafts
// before a verification row): first the repetition penalty r on every token of the prompt or the
// output (logit / r when positive, logit * r otherwise; HF's and vLLM's), then, per generated token
// with count c, logit -= frequency_penalty * c + presence_penalty (OpenAI's). The bias and the
// rest of the sampling parameters come after (token_distribution).
Tensor penalized(const Tensor& logits, const SamplingParams& sp, const TokenHistory& history,
                 std::span<const int32_t> pending = {});

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
