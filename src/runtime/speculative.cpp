// The MTP drafter and speculative statistics; see speculative.h. The verification loop itself is
// the generation loop in generator.cpp (plain decoding is a round with no drafts).
#include "runtime/speculative.h"

#include <algorithm>

#include "ops/sampling.h"

namespace dsi {

std::vector<double> SpeculativeStats::per_position_rates() const {
  std::vector<double> r(drafted_at.size(), 0.0);
  for (size_t j = 0; j < r.size(); ++j)
    if (drafted_at[j] > 0) r[j] = double(accepted_at[j]) / double(drafted_at[j]);
  return r;
}

Verdict verify_drafts(const Tensor& logits, const Draft& draft, const SamplingParams& sp,
                      std::mt19937_64& rng, const ops::TokenHistory* history) {
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  const int k = int(draft.tokens.size());
  const int64_t vocab = logits.dim(1);
  auto row = [&](int j) {
    const Tensor r = logits.slice(j, j + 1).view({vocab});
    if (history == nullptr) return r;
    return ops::penalized(r, sp, *history, std::span<const int32_t>(draft.tokens).first(size_t(j)));
  };
  if (sp.temperature <= 0.0f) {  // greedy: accept while the draft is the target's argmax
    for (int j = 0; j < k; ++j) {
      const int32_t target = ops::sample(row(j), sp, 0.0);
      if (draft.tokens[size_t(j)] != target) return {j, target};
    }
    return {k, ops::sample(row(k), sp, 0.0)};
  }
  // Rejection sampling: accept draft d with probability min(1, p(d) / q(d)); on rejection draw from
  // the residual max(p - q, 0). The emitted tokens are then distributed exactly as p.
  for (int j = 0; j < k; ++j) {
    const std::vector<double> p = ops::token_distribution(row(j), sp);
    const int32_t d = draft.tokens[size_t(j)];
    std::vector<double> q(p.size(), 0.0);
    if (draft.dists.empty()) {
      q[size_t(d)] = 1.0;  // a drafter that proposes fixed tokens
    } else {
      q = draft.dists[size_t(j)];
    }
    if (q[size_t(d)] > 0.0 && uniform(rng) * q[size_t(d)] < p[size_t(d)]) continue;
    std::vector<double> residual(p.size());
    double mass = 0.0;
    for (size_t i = 0; i < p.size(); ++i) mass += residual[i] = std::max(p[i] - q[i], 0.0);
    return {j, ops::draw_token(mass > 0.0 ? residual : p, uniform(rng))};
  }
  return {k, ops::draw_token(ops::token_distribution(row(k), sp),
                             uniform(rng))};
}

Draft MtpDrafter::propose(const DraftContext& ctx) {
  const ModelConfig& cfg = model_.config();
  DSI_CHECK(cache_.mtp_length() == ctx.pending_start,
            "MTP drafter: its cache holds {} positions but the pending rows start at {}",
            cache_.mtp_length(), ctx.pending_start);
  const int64_t m = ctx.pending_hidden.dim(0);
  DSI_CHECK(m >= 1 && int64_t(ctx.pending_next.size()) == m, "MTP drafter: {} pending rows", m);
  const bool sample = ctx.sampling.temperature > 0.0f;
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  DcpTopk shared;  // index_share_for_mtp_iteration: the first step's selection, reused after
  DcpTopk* share = cfg.index_share_for_mtp_iteration ? &shared : nullptr;

  Draft d;
  // Step 1 consumes every pending row (target states, exact); its last row drafts the first token.
  Tensor y = model_.mtp_forward(ctx.pending_hidden, Tensor::from_i32(ctx.pending_next, {m}), cache_,
                                nullptr, share);
  Tensor last = y.slice(m - 1, m);
  for (int j = 0; j < ctx.k; ++j) {
    if (j > 0) {  // chained step: the previous draft and the previous step's post-norm state
      last = model_.mtp_forward(last, Tensor::from_i32({d.tokens.back()}, {1}), cache_, nullptr, share);
    }
    Tensor logits = model_.mtp_logits(last).view({cfg.vocab_size});
    if (ctx.history) logits = ops::penalized(logits, ctx.sampling, *ctx.history, d.tokens);
    if (sample) {
      std::vector<double> q = ops::token_distribution(logits, ctx.sampling);
      d.tokens.push_back(ops::draw_token(q, uniform(ctx.rng)));
      d.dists.push_back(std::move(q));
    } else {
      d.tokens.push_back(ops::sample(logits, ctx.sampling, 0.0));  // greedy (with its logit bias)
    }
  }
  return d;
}

}  // namespace dsi
