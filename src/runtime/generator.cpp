// Single-sequence generation; see generator.h.
#include "runtime/generator.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <random>

#include "ops/sampling.h"

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
  if (keep_all) all = Tensor::empty({int64_t(n), model.config().hidden_size}, DType::F32);
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
// Every rank samples from the same gathered logits with the same seed, so they agree already; the
// broadcast from TP rank 0 makes that a guarantee (the ranks' next steps must stay in lockstep).
int32_t agree_on_token(const RankContext& rank, int32_t tok) {
  if (rank.cfg.tp == 1) return tok;
  Tensor t = Tensor::from_i32({tok}, {1});
  rank.comm->broadcast(rank.tp_group, t, 0);
  return t.i32()[0];
}
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
  const ModelConfig& cfg = model.config();
  validate_prompt(cfg, prompt);
  DSI_CHECK(params.max_new_tokens >= 0, "max_new_tokens = {} must be >= 0", params.max_new_tokens);
  DSI_CHECK(params.prefill_chunk >= 0, "prefill_chunk = {} must be >= 0", params.prefill_chunk);
  const SamplingParams& sp = params.sampling;
  DSI_CHECK(sp.temperature >= 0.0f, "temperature = {} must be >= 0", sp.temperature);
  DSI_CHECK(sp.top_p > 0.0f && sp.top_p <= 1.0f, "top_p = {} must be in (0, 1]", sp.top_p);

  GenerationResult res;
  res.stats.prompt_tokens = int64_t(prompt.size());
  const int64_t limit = cfg.max_position_embeddings;
  const int64_t capacity = std::min<int64_t>(limit, int64_t(prompt.size()) + params.max_new_tokens);
  SequenceKvCache cache = model.make_cache(std::max<int64_t>(capacity, 1), /*with_mtp=*/false);
  std::mt19937_64 rng(sp.seed);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);

  const auto t0 = Clock::now();
  Tensor hidden = prefill(model, prompt, params.prefill_chunk, cache, /*keep_all=*/false);
  Tensor logits = model.logits(hidden);
  res.stats.prefill_seconds = seconds_since(t0);

  const auto t1 = Clock::now();
  res.finish_reason = "length";
  while (int64_t(res.output_ids.size()) < params.max_new_tokens) {
    int32_t tok = ops::sample(logits.view({cfg.vocab_size}), sp.temperature, sp.top_p,
                              uniform(rng));
    tok = agree_on_token(model.rank(), tok);
    res.output_ids.push_back(tok);
    const bool eos = std::find(cfg.eos_token_ids.begin(), cfg.eos_token_ids.end(), tok) !=
                     cfg.eos_token_ids.end();
    if (eos && !params.ignore_eos) {
      res.finish_reason = "eos";
      break;
    }
    if (int64_t(res.output_ids.size()) >= params.max_new_tokens) break;
    if (cache.length() >= limit) {
      res.finish_reason = "context";
      break;
    }
    hidden = model.forward(Tensor::from_i32({tok}, {1}), cache);
    logits = model.logits(hidden);
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
  out.logits = model.logits(hidden);
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
