// How a request chooses its tokens and when it stops.
#pragma once

#include <cstdint>
#include <string>

namespace dsi {

struct SamplingParams {
  float temperature = 0.0f;  // 0 = greedy (argmax, lowest id on ties)
  float top_p = 1.0f;        // nucleus sampling mass, (0, 1]
  uint64_t seed = 0;         // seeds the request's random stream: same seed, same tokens
};

struct GenerationParams {
  int max_new_tokens = 16;
  bool ignore_eos = false;  // keep going past the config's eos_token_id
  int prefill_chunk = 0;    // prompt tokens per prefill step; 0 = the whole prompt at once
  int speculative_tokens = 0;  // K > 0: the MTP layer drafts K tokens per round, the model verifies
  SamplingParams sampling;
  bool cuda_graphs = true;  // a CUDA model on one rank replays its decode steps from CUDA graphs
  std::string kv_cache_dtype = "auto";  // as EngineOptions::kv_cache_dtype
};

}  // namespace dsi
