// Held-out evaluation: token-level cross-entropy and perplexity of the model (and of its MTP head)
// over consecutive windows of a token stream, each window evaluated from scratch, as the training
// script of the bundled model evaluates it (tools/kjv/evaluation.py).
#pragma once

#include <vector>

#include "model/dsa_model.h"

namespace dsi {

struct PerplexityResult {
  int64_t windows = 0;
  int64_t tokens_scored = 0;  // every token but the first of each window
  double ce = 0.0;            // mean natural-log cross-entropy
  double ppl = 0.0;           // exp(ce)
  double top1_acc = 0.0;
  int64_t mtp_tokens_scored = 0;  // MTP row i predicts token i + 2
  double mtp_ce = 0.0;
  double mtp_top1_acc = 0.0;
};

// tokens: the stream; window: tokens per window (the last may be shorter). with_mtp scores the MTP
// head too (the checkpoint must have one).
PerplexityResult perplexity(const DsaModel& model, const std::vector<int32_t>& tokens, int window,
                            bool with_mtp);

}  // namespace dsi
