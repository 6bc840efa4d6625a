// Single-sequence generation; see generator.h.
#include "runtime/generator.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>
#include <random>

#include "ops/sampling.h"
#include "runtime/step_graphs.h"

namespace dsi {

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

Tensor ids_tensor(const std::vector<int32_t>& ids, size_t begin, size_t end) {
  return Tensor::from_i32(std::vector<int32_t>(ids.begin() + long(begin), ids.begin() + long(end)),
                          {int64_t(end - begin)});
}

// Runs `prompt` through the main model chunk by chunk; returns the final-norm hidden states of
// every row when `keep_all`, else of the last row only.
Tensor prefill(const DsaModel& model, const std::vector<int32_t>& prompt, int chunk,
               SequenceKvCache& cache, bool keep_all) {
  const size_t n = prompt.size();
  const size_t step = chunk > 0 ? size_t(chunk) : n;
  Tensor all;
  if (keep_all) all = Tensor::empty({int64_t(n), model.config().hidden_size}, DType::F32, model.device());
  Tensor last;
  for (size_t b = 0; b < n; b += step) {
    const size_t e = std::min(n, b + step);
    Tensor h = model.forward(ids_tensor(prompt, b, e), cache);
    if (keep_all) {
      Tensor dst = all.slice(int64_t(b), int64_t(e));
      dst.copy_from(h);
    }
    last = h.slice(h.dim(0) - 1, h.dim(0));
  }
  return keep_all ? all : last;
}

// Every rank computes the same logits and draws the same uniforms, so the ranks agree already; the
// broadcast from TP rank 0 makes that a guarantee (their next steps must stay in lockstep).
void agree_on_tokens(const RankContext& rank, Device device, std::vector<int32_t>& tokens,
                     int max_tokens) {
  if (rank.cfg.tp == 1) return;
  Tensor t = Tensor::zeros({max_tokens + 1}, DType::I32);  // [count, tokens...], fixed shape
  t.i32()[0] = int32_t(tokens.size());
  std::copy(tokens.begin(), tokens.end(), t.i32() + 1);
  Tensor d = to_device(t, device);  // the communicator moves the model's device tensors
  rank.comm->broadcast(rank.tp_group, d, 0);
  t = to_host(d);
  rank.comm->check_async();  // the broadcast (and the step's collectives before it) delivered
  tokens.assign(t.i32() + 1, t.i32() + 1 + t.i32()[0]);
}

// Rows not yet consumed by the drafter: model states and the token following each.
struct Pending {
  Tensor hidden;  // [m, hidden]
  std::vector<int32_t> next;
  int64_t start = 0;
  void append(const Tensor& rows, const std::vector<int32_t>& tokens) {
    hidden = cat_rows(hidden, rows);
    next.insert(next.end(), tokens.begin(), tokens.end());
  }
};
}  // namespace

void validate_prompt(const ModelConfig& cfg, const std::vector<int32_t>& prompt) {
  DSI_CHECK(!prompt.empty(), "the prompt is empty");
  for (size_t i = 0; i < prompt.size(); ++i)
    DSI_CHECK(prompt[i] >= 0 && prompt[i] < cfg.vocab_size,
              "prompt token {} (at index {}) is outside the vocabulary [0, {})", prompt[i], i,
              cfg.vocab_size);
  DSI_CHECK(int64_t(prompt.size()) <= cfg.max_position_embeddings,
            "the prompt has {} tokens, more than the model's context length {}", prompt.size(),
            cfg.max_position_embeddings);
}

GenerationResult generate(const DsaModel& model, const std::vector<int32_t>& prompt,
                          const GenerationParams& params) {
  if (params.speculative_tokens <= 0) return generate_with(model, prompt, params, nullptr);
  DSI_CHECK(model.has_mtp(), "speculative decoding needs an MTP layer, and this checkpoint has none");
  return generate_with(model, prompt, params, [&](SequenceKvCache& cache) {
    return std::make_unique<MtpDrafter>(model, cache);
  });
}

GenerationResult generate_with(const DsaModel& model, const std::vector<int32_t>& prompt,
                               const GenerationParams& params, const DrafterFactory& make_drafter,
                               const RoundObserver& after_round) {
  const ModelConfig& cfg = model.config();
  validate_prompt(cfg, prompt);
  DSI_CHECK(params.max_new_tokens >= 0, "max_new_tokens = {} must be >= 0", params.max_new_tokens);
  DSI_CHECK(params.prefill_chunk >= 0, "prefill_chunk = {} must be >= 0", params.prefill_chunk);
  DSI_CHECK(params.speculative_tokens >= 0, "speculative_tokens = {} must be >= 0",
            params.speculative_tokens);
  const SamplingParams& sp = params.sampling;
  DSI_CHECK(sp.temperature >= 0.0f, "temperature = {} must be >= 0", sp.temperature);
  DSI_CHECK(sp.top_p > 0.0f && sp.top_p <= 1.0f, "top_p = {} must be in (0, 1]", sp.top_p);
  ops::check_penalties(sp);

  const int K = make_drafter ? params.speculative_tokens : 0;
  GenerationResult res;
  res.stats.prompt_tokens = int64_t(prompt.size());
  res.speculative.drafted_at.assign(size_t(K), 0);
  res.speculative.accepted_at.assign(size_t(K), 0);
  const int64_t limit = cfg.max_position_embeddings;
  // Verification writes up to K positions past the last kept token before they are cut back.
  const int64_t capacity =
      std::min<int64_t>(limit, int64_t(prompt.size()) + params.max_new_tokens + K);
  SequenceKvCache cache =
      model.make_cache(std::max<int64_t>(capacity, 1), model.has_mtp() && K > 0,
                       resolve_kv_cache_dtype(params.kv_cache_dtype, cfg, model.device()));
  std::unique_ptr<Drafter> drafter = K > 0 ? make_drafter(cache) : nullptr;
  std::unique_ptr<StepGraphs> graphs;
  if (params.cuda_graphs && StepGraphs::supported(model)) graphs = std::make_unique<StepGraphs>(model);
  std::mt19937_64 rng(sp.seed);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);

  std::vector<int32_t> sequence = prompt;
  std::optional<ops::TokenHistory> history;  // for sampling's penalties
  if (ops::has_penalties(sp)) history.emplace(prompt, int64_t(prompt.size()));
  const ops::TokenHistory* hist = history ? &*history : nullptr;
  // Emits tokens in order; false once generation must stop (eos, or max_new_tokens reached).
  auto emit = [&](const std::vector<int32_t>& tokens) {
    for (int32_t tok : tokens) {
      if (int64_t(res.output_ids.size()) >= params.max_new_tokens) return false;
      res.output_ids.push_back(tok);
      sequence.push_back(tok);
      if (history) history->add(tok);
      const bool eos = std::find(cfg.eos_token_ids.begin(), cfg.eos_token_ids.end(), tok) !=
                       cfg.eos_token_ids.end();
      if (eos && !params.ignore_eos) {
        res.finish_reason = "eos";
        return false;
      }
    }
    return int64_t(res.output_ids.size()) < params.max_new_tokens;
  };

  const auto t0 = Clock::now();
  Tensor hidden = prefill(model, prompt, params.prefill_chunk, cache, /*keep_all=*/drafter != nullptr);
  const int64_t n = hidden.dim(0);
  Tensor logits = model.logits(hidden.slice(n - 1, n));
  res.stats.prefill_seconds = seconds_since(t0);
  res.finish_reason = "length";
  if (params.max_new_tokens == 0) return res;

  const auto t1 = Clock::now();
  Tensor last = logits.view({cfg.vocab_size});
  if (hist) last = ops::penalized(last, sp, *hist);
  std::vector<int32_t> first = {ops::sample(last, sp, uniform(rng))};
  agree_on_tokens(model.rank(), model.device(), first, K + 1);
  Pending pending;
  if (drafter) pending.append(hidden, std::vector<int32_t>(prompt.begin() + 1, prompt.end()));
  if (drafter) pending.next.push_back(first[0]);
  bool more = emit(first);
  if (after_round) after_round(sequence, cache);

  while (more) {
    const int64_t L = cache.length();
    if (L >= limit) {
      res.finish_reason = "context";
      break;
    }
    // Drafts beyond what this round can still emit, or past the context, are not worth verifying.
    const int64_t room = std::min<int64_t>(params.max_new_tokens - int64_t(res.output_ids.size()) - 1,
                                           limit - L - 1);
    const int k = int(std::min<int64_t>(K, std::max<int64_t>(room, 0)));
    Draft draft;
    if (k > 0) {
      const DraftContext ctx{sequence, pending.hidden, pending.next, pending.start, k, sp, rng, hist};
      draft = drafter->propose(ctx);
      DSI_CHECK(int(draft.tokens.size()) == k, "the drafter proposed {} tokens, {} wanted",
                draft.tokens.size(), k);
    }
    // Verify [last token, drafts]: 1 + k rows at positions L .. L + k.
    std::vector<int32_t> rows = {sequence.back()};
    rows.insert(rows.end(), draft.tokens.begin(), draft.tokens.end());
    StepGraphs::Step step;
    if (graphs) {
      step = graphs->forward(rows, {BatchSeq{&cache, int64_t(rows.size())}});
    } else {
      step.hidden = model.forward(Tensor::from_i32(rows, {int64_t(rows.size())}), cache);
      step.logits = model.logits(step.hidden);
    }
    const Tensor& h = step.hidden;
    const Verdict v = verify_drafts(step.logits, draft, sp, rng, hist);
    std::vector<int32_t> emitted(draft.tokens.begin(), draft.tokens.begin() + v.accepted);
    emitted.push_back(v.next);
    agree_on_tokens(model.rank(), model.device(), emitted, K + 1);
    const int accepted = int(emitted.size()) - 1;
    if (k > 0) {
      SpeculativeStats& st = res.speculative;
      ++st.rounds;
      st.drafted += k;
      st.accepted += accepted;
      for (int j = 0; j < k; ++j) ++st.drafted_at[size_t(j)];
      for (int j = 0; j < accepted; ++j) ++st.accepted_at[size_t(j)];
    }
    // Cut every cache back to the accepted tokens: rejected drafts leave no trace.
    cache.set_length(L + accepted + 1);
    if (drafter) {
      if (k > 0) {  // the drafter consumed the pending rows; its chained steps are dropped
        drafter->rewind(L);
        pending = Pending{};
        pending.start = L;
      }
      pending.append(h.slice(0, accepted + 1), emitted);
    }
    more = emit(emitted);
    if (after_round) after_round(sequence, cache);
  }
  res.stats.generated_tokens = int64_t(res.output_ids.size());
  res.stats.decode_seconds = res.output_ids.size() > 1 ? seconds_since(t1) : 0.0;
  if (res.stats.decode_seconds > 0)
    res.stats.decode_tokens_per_second = double(res.output_ids.size() - 1) / res.stats.decode_seconds;
  return res;
}

PromptLogits prompt_logits(const DsaModel& model, const std::vector<int32_t>& prompt,
                           int prefill_chunk, bool with_mtp) {
  const ModelConfig& cfg = model.config();
  validate_prompt(cfg, prompt);
  DSI_CHECK(!with_mtp || model.has_mtp(), "this checkpoint has no MTP layer");
  const int64_t n = int64_t(prompt.size());
  SequenceKvCache cache = model.make_cache(n, with_mtp);
  PromptLogits out;
  Tensor hidden = prefill(model, prompt, prefill_chunk, cache, /*keep_all=*/true);
  out.logits = to_host(model.logits(hidden));
  if (with_mtp) {
    out.mtp_logits = Tensor::empty({n - 1, cfg.vocab_size}, DType::F32);
    if (n > 1) {
      // Row i: hidden h_i with token i+1, at position i; chunked like the main model.
      const int64_t step = prefill_chunk > 0 ? prefill_chunk : n - 1;
      for (int64_t b = 0; b < n - 1; b += step) {
        const int64_t e = std::min(n - 1, b + step);
        Tensor y = model.mtp_forward(hidden.slice(b, e), ids_tensor(prompt, size_t(b + 1), size_t(e + 1)),
                                     cache);
        Tensor dst = out.mtp_logits.slice(b, e);
        dst.copy_from(model.mtp_logits(y));
      }
    }
  }
  return out;
}

}  // namespace dsi
