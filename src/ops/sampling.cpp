// Dispatch of the sampling ops; see sampling.h.
#include "ops/sampling.h"

#include <algorithm>
#include <cmath>

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

TokenHistory::TokenHistory(const std::vector<int32_t>& tokens, int64_t prompt_len) {
  DSI_CHECK(prompt_len >= 0 && prompt_len <= int64_t(tokens.size()), "TokenHistory: prompt of {} of {} tokens",
            prompt_len, tokens.size());
  prompt.insert(tokens.begin(), tokens.begin() + prompt_len);
  for (size_t i = size_t(prompt_len); i < tokens.size(); ++i) add(tokens[i]);
}

bool has_penalties(const SamplingParams& sp) {
  return sp.presence_penalty != 0.0f || sp.frequency_penalty != 0.0f || sp.repetition_penalty != 1.0f;
}

void check_penalties(const SamplingParams& sp) {
  DSI_CHECK(sp.presence_penalty >= -2.0f && sp.presence_penalty <= 2.0f,
            "presence_penalty = {} must be in [-2, 2]", sp.presence_penalty);
  DSI_CHECK(sp.frequency_penalty >= -2.0f && sp.frequency_penalty <= 2.0f,
            "frequency_penalty = {} must be in [-2, 2]", sp.frequency_penalty);
  DSI_CHECK(sp.repetition_penalty > 0.0f && sp.repetition_penalty <= 10.0f,
            "repetition_penalty = {} must be in (0, 10]", sp.repetition_penalty);
}

Tensor penalized(const Tensor& logits, const SamplingParams& sp, const TokenHistory& history,
                 std::span<const int32_t> pending) {
  if (!has_penalties(sp)) return logits;
  DSI_CHECK(logits.ndim() == 1, "sampling: logits must be [vocab], got {}", logits.desc());
  check_penalties(sp);
  const Tensor src = to_host(logits);
  const int64_t v = src.dim(0);
  Tensor out = Tensor::empty({v}, DType::F32);
  std::copy(src.f32(), src.f32() + v, out.f32());
  float* l = out.f32();
  // Counts of the tokens generated: the history's, plus the pending ones (a few drafts), without
  // copying the history.
  std::unordered_map<int32_t, int32_t> pending_counts;
  for (int32_t t : pending) ++pending_counts[t];
  const auto count = [&](int32_t t) {
    const auto h = history.generated.find(t);
    const auto q = pending_counts.find(t);
    return (h == history.generated.end() ? 0 : h->second) + (q == pending_counts.end() ? 0 : q->second);
  };
  // Every generated token once: the history's, then the pending ones it lacks.
  const auto each_generated = [&](auto&& fn) {
    for (const auto& [t, c] : history.generated) fn(t, count(t));
    for (const auto& [t, c] : pending_counts)
      if (!history.generated.count(t)) fn(t, c);
  };
  const auto check = [&](int32_t t) {
    DSI_CHECK(t >= 0 && t < v, "sampling: token {} of the history is outside the vocabulary [0, {})", t, v);
  };
  if (sp.repetition_penalty != 1.0f) {
    const float r = sp.repetition_penalty;
    const auto repeat = [&](int32_t t) {
      check(t);
      l[t] = l[t] > 0.0f ? l[t] / r : l[t] * r;
    };
    for (int32_t t : history.prompt) repeat(t);
    each_generated([&](int32_t t, int32_t) {
      if (!history.prompt.count(t)) repeat(t);
    });
  }
  each_generated([&](int32_t t, int32_t c) {
    check(t);
    l[t] -= sp.frequency_penalty * float(c) + (c > 0 ? sp.presence_penalty : 0.0f);
  });
  return out;
}
int32_t sample(const Tensor& logits, const SamplingParams& sp, double u) {
  return draw_token(token_distribution(logits, sp), u);
}
int32_t sample(const Tensor& logits, float temperature, float top_p, double u) {
  return draw_token(token_distribution(logits, temperature, top_p), u);
}

}  // namespace dsi::ops
