// Single-sequence generation on one model: chunked prefill, then token-by-token decode from the
// caches, with greedy or seeded temperature/top-p sampling. Also teacher-forced prompt logits.
#pragma once

#include <string>
#include <vector>

#include "dsinfer/sampling.h"
#include "model/dsa_model.h"

namespace dsi {

struct GenerationStats {
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  double prefill_seconds = 0.0;
  double decode_seconds = 0.0;             // the decode steps after the first generated token
  double decode_tokens_per_second = 0.0;   // (generated - 1) / decode_seconds
};

struct GenerationResult {
  std::vector<int32_t> output_ids;  // new tokens only (an eos that stopped generation included)
  std::string finish_reason;        // "eos", "length" (max_new_tokens) or "context" (model limit)
  GenerationStats stats;
};

// Checks a prompt against the model: non-empty, ids inside the vocabulary, within the context.
void validate_prompt(const ModelConfig& cfg, const std::vector<int32_t>& prompt);

GenerationResult generate(const DsaModel& model, const std::vector<int32_t>& prompt,
                          const GenerationParams& params);

struct PromptLogits {
  Tensor logits;      // [n, vocab] f32, teacher-forced main model
  Tensor mtp_logits;  // [n - 1, vocab] f32 (row i: MTP from h_i and token i+1); undefined if absent
};

// Runs the prompt through the model in chunks of `prefill_chunk` tokens (0 = all at once).
PromptLogits prompt_logits(const DsaModel& model, const std::vector<int32_t>& prompt,
                           int prefill_chunk, bool with_mtp);

}  // namespace dsi
