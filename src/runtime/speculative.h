// Speculative decoding with the model's MTP layer (DeepSeek-V3 / GLM-5 MTP, dsa-reference semantics
// section 5): each round the drafter proposes K tokens, the model verifies [last token, drafts] in
// one call (each row with its own causal bound), the longest acceptable prefix is kept plus one
// bonus or corrected token, and every cache is cut back to the accepted tokens. Greedy acceptance
// (draft == target argmax) keeps the output identical to plain decoding; with temperature > 0,
// rejection sampling keeps the output distribution exactly the target's.
#pragma once

#include <random>
#include <vector>

#include "dsinfer/sampling.h"
#include "model/dsa_model.h"
#include "ops/sampling.h"

namespace dsi {

struct SpeculativeStats {
  int64_t rounds = 0;    // verification rounds that carried drafts
  int64_t drafted = 0;   // draft tokens proposed
  int64_t accepted = 0;  // draft tokens accepted
  std::vector<int64_t> drafted_at;   // [K]: rounds that proposed a draft at position j
  std::vector<int64_t> accepted_at;  // [K]: rounds that accepted the draft at position j

  double acceptance_rate() const { return drafted ? double(accepted) / double(drafted) : 0.0; }
  double mean_acceptance_length() const {
    return rounds ? 1.0 + double(accepted) / double(rounds) : 0.0;
  }
  std::vector<double> per_position_rates() const;  // accepted_at[j] / drafted_at[j]
};

// What a drafter sees at the start of a round.
struct DraftContext {
  const std::vector<int32_t>& sequence;  // prompt + accepted output; the last is verified first
  Tensor pending_hidden;  // [m, hidden]: the model's states (after the final norm) at positions
                          // [pending_start, pending_start + m) that the drafter has not consumed
  const std::vector<int32_t>& pending_next;  // [m]: the token after each of those positions
  int64_t pending_start;
  int k;                            // drafts wanted, >= 1
  const SamplingParams& sampling;   // temperature > 0: sample drafts, return their distributions
  std::mt19937_64& rng;
  const ops::TokenHistory* history = nullptr;  // the sequence so far, for sampling's penalties
};

struct Draft {
  std::vector<int32_t> tokens;
  // For sampled drafts: the distribution each token was drawn from (vocab probabilities); empty
  // for a drafter that proposes fixed tokens (treated as all mass on the token).
  std::vector<std::vector<double>> dists;
};

// The outcome of verifying one round: `accepted` drafts kept, then `next` (the bonus token when
// every draft was accepted, else the target's choice where the first rejected draft stood).
struct Verdict {
  int accepted = 0;
  int32_t next = -1;
};

// logits: [1 + k, vocab] f32, row j = the model's prediction after the round's j-th token (the
// last accepted token, then the drafts). Greedy (temperature 0): accept while the draft is the
// argmax. Sampling: accept draft d with probability min(1, p(d) / q(d)) and on rejection draw from
// the residual max(p - q, 0), so the emitted tokens are distributed exactly as p (p and q after
// sampling parameters, ops::token_distribution). With a history, row j is penalised over it plus
// the drafts before j (ops::penalized). Draws its uniforms from `rng`.
Verdict verify_drafts(const Tensor& logits, const Draft& draft, const SamplingParams& sampling,
                      std::mt19937_64& rng, const ops::TokenHistory* history = nullptr);

class Drafter {
 public:
  virtual ~Drafter() = default;
  virtual Draft propose(const DraftContext& ctx) = 0;
  // After verification: keep only state for positions < valid_until (rejected drafts vanish).
  virtual void rewind(int64_t valid_until) = 0;
};

// The MTP layer as drafter: consumes the pending rows (target states + next tokens) into its own
// caches, then chains K steps, each feeding back the previous step's shared_head.norm output.
class MtpDrafter final : public Drafter {
 public:
  MtpDrafter(const DsaModel& model, SequenceKvCache& cache) : model_(model), cache_(cache) {}
  Draft propose(const DraftContext& ctx) override;
  void rewind(int64_t valid_until) override { cache_.set_mtp_length(valid_until); }

 private:
  const DsaModel& model_;
  SequenceKvCache& cache_;
};

}  // namespace dsi
