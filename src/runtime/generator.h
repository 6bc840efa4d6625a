// Single-sequence generation on one model: chunked prefill, then decoding from the caches in
// rounds that verify [last token, drafts] (no drafts: plain token-by-token decoding; MTP drafts:
// speculative decoding, runtime/speculative.h), with greedy or seeded temperature/top-p sampling.
// Also teacher-forced prompt logits.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dsinfer/sampling.h"
#include "model/dsa_model.h"
#include "runtime/speculative.h"

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
  SpeculativeStats speculative;     // all zero without speculative decoding
};

// Checks a prompt against the model: non-empty, ids inside the vocabulary, within the context.
void validate_prompt(const ModelConfig& cfg, const std::vector<int32_t>& prompt);

// Generates with plain decoding, or with the MTP layer drafting params.speculative_tokens tokens
// per round (the checkpoint must have an MTP layer).
GenerationResult generate(const DsaModel& model, const std::vector<int32_t>& prompt,
                          const GenerationParams& params);

// The loop with a drafter made by `make_drafter` (given the sequence's caches; tests use their own
// drafters), drafting params.speculative_tokens per round. `after_round`, if set, is called after
// every round with the sequence so far (prompt + output) and the caches.
using DrafterFactory = std::function<std::unique_ptr<Drafter>(SequenceKvCache&)>;
using RoundObserver = std::function<void(const std::vector<int32_t>&, const SequenceKvCache&)>;
GenerationResult generate_with(const DsaModel& model, const std::vector<int32_t>& prompt,
                               const GenerationParams& params, const DrafterFactory& make_drafter,
                               const RoundObserver& after_round = {});

struct PromptLogits {
  Tensor logits;      // [n, vocab] f32, teacher-forced main model
  Tensor mtp_logits;  // [n - 1, vocab] f32 (row i: MTP from h_i and token i+1); undefined if absent
};

// Runs the prompt through the model in chunks of `prefill_chunk` tokens (0 = all at once).
PromptLogits prompt_logits(const DsaModel& model, const std::vector<int32_t>& prompt,
                           int prefill_chunk, bool with_mtp);

}  // namespace dsi
