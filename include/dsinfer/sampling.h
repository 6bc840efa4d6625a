// How a request chooses its tokens and when it stops.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace dsi {

// logit_bias is added to the logits first (greedy included). With temperature > 0 a token is then
// drawn from softmax(logits / temperature), cut (in this order, as HF transformers' warpers) to the
// top_k most likely tokens, then to the nucleus of mass top_p, then to the tokens at least min_p
// times as likely as the most likely one, and renormalised.
struct SamplingParams {
  float temperature = 0.0f;  // 0 = greedy (argmax, lowest id on ties)
  float top_p = 1.0f;        // nucleus sampling mass, (0, 1]
  uint64_t seed = 0;         // seeds the request's random stream: same seed, same tokens
  int top_k = 0;             // keep the k most likely tokens (ties: lower id first); 0 = all
  float min_p = 0.0f;        // in [0, 1]: drop tokens below min_p x the top token's probability
  std::vector<std::pair<int32_t, float>> logit_bias;  // (token id, added to its logit)
  // Penalties over the sequence so far (ops::penalized): OpenAI's presence and frequency penalties
  // on generated tokens, and the multiplicative repetition penalty (1 = none) on prompt and output.
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  float repetition_penalty = 1.0f;
};

struct GenerationParams {
  int max_new_tokens = 16;
  bool ignore_eos = false;  // keep going past the config's eos_token_id
  int prefill_chunk = 0;    // prompt tokens per prefill step; 0 = the whole prompt at once
  int speculative_tokens = 0;  // K > 0: the MTP layer drafts K tokens per round, the model verifies
  SamplingParams sampling;
  bool cuda_graphs = true;  // a CUDA model replays its decode steps from CUDA graphs (step_graphs.h)
  std::string kv_cache_dtype = "auto";  // as EngineOptions::kv_cache_dtype
};

}  // namespace dsi
