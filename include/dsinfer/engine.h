// The serving engine: many requests at once on one model (all of its ranks), scheduled by one
// engine thread with continuous batching over paged KV caches. Requests and results are token
// ids; text (tokenizer, chat templates, stop strings) is the server's business (src/server/).
// Thread-safe: submit / cancel / metrics may be called from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dsinfer/sampling.h"

namespace dsi {

struct EngineOptions {
  std::string model_dir;
  std::string device = "cpu";  // "cpu" or "cuda"
  int tp = 1;                  // tensor-parallel ranks (threads of this process, or MPI processes)
  int dcp = 1;                 // decode-context-parallel group size (divides tp)
  int dcp_interleave = 1;
  std::string dcp_comm = "ag_rs";  // "ag_rs" or "a2a"
  int speculative_tokens = 0;      // MTP drafts per round for every request (0 = off)
  int max_num_seqs = 16;                // requests decoded together
  int max_num_batched_tokens = 2048;    // tokens per engine step (prefill chunks + decode rows)
  int64_t max_model_len = 0;            // prompt + output tokens per request; 0 = the model's limit
  int64_t kv_cache_memory = 0;          // bytes for the KV pages (per rank); 0 = from the fraction
  double kv_cache_fraction = 0.5;       // of free device memory (CPU: of available RAM), shared by the
                                        // local ranks on that memory
  // "auto" (CPU: f32; GPU: fp8 when the model's geometry allows, else bf16), "f32", "bf16", or
  // "fp8" (656-byte MLA entries, e4m3 indexer keys).
  std::string kv_cache_dtype = "auto";
  bool cuda_graphs = true;              // CUDA ranks: decode-only steps replay CUDA graphs (step_graphs.h)
  // Full blocks of computed tokens stay cached (shared while requests run, kept after they end
  // until their pages are needed), and a request whose tokens start with them takes them instead
  // of computing them (runtime/prefix_cache.h).
  bool prefix_caching = true;
  // Collectives between ranks: verify that every rank issues the same ones (debugging), and how
  // long one may wait before it fails with an error naming the rank and the operation.
  bool check_lockstep = false;
  double comm_timeout_seconds = 60.0;
};

// Restricts the tokens a request may generate (structured output, e.g. JSON): asked before each
// token is sampled, told each token emitted. Called on the engine thread of rank 0's process only;
// a constrained request is not speculated (no drafts to verify against it).
class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // Sets the logits of the tokens that may not come next to -inf (at least one must stay).
  virtual void mask(float* logits, int64_t vocab) = 0;
  virtual void accept(int32_t token) = 0;
  // A copy in the same state that goes on alone: with one the engine speculates the request, the
  // drafts and each verified row masked by a copy that took the drafts before it. Null (the
  // default): the request is not speculated.
  virtual std::unique_ptr<TokenConstraint> clone() const { return nullptr; }
};

// One request: a prompt of token ids and how to continue it.
struct EngineRequest {
  std::vector<int32_t> prompt;
  int max_new_tokens = 16;
  bool ignore_eos = false;
  SamplingParams sampling;
  std::vector<int32_t> stop_token_ids;  // stop after emitting any of these (besides the eos ids)
  int logprobs = -1;                    // -1: none; n >= 0: each token's logprob and the top n
  // -1: none; n >= 0: the logprob of each prompt token after the first under the model given the
  // tokens before it, and the top n alternatives (scoring a text: an evaluation's loglikelihood).
  // Such a request computes its whole prompt (it takes nothing from the prefix cache).
  int prompt_logprobs = -1;
  std::shared_ptr<TokenConstraint> constraint;  // null: any token
};

struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0.0f;  // natural log of the model's probability (before temperature / top-p)
};

struct GeneratedToken {
  int32_t id = 0;
  float logprob = 0.0f;              // only when the request asked for logprobs
  std::vector<TokenLogprob> top;     // the top `logprobs` alternatives, most likely first
};

// What the engine reports for a request: new tokens, and at the end a finish reason.
struct RequestEvent {
  std::vector<GeneratedToken> tokens;  // tokens since the previous event (may be empty at the end)
  bool finished = false;
  std::string finish_reason;  // when finished: "stop" (eos / stop id), "length", "abort", "error"
  std::string error;          // when finish_reason == "error": what went wrong
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;  // so far
  int64_t cached_tokens = 0;      // prompt tokens taken from the prefix cache, not computed
  // EngineRequest::prompt_logprobs: the next prompt tokens' records, from prompt token 1 on in
  // order, before any generated token (a long prompt's come over several events).
  std::vector<GeneratedToken> prompt_logprobs;
};

// Called on the engine thread for every event of a request; must be quick and must not throw.
// After the event with `finished` set it is never called again for that request.
using EventSink = std::function<void(RequestEvent&&)>;

struct EngineMetrics {
  int64_t running = 0;          // requests being prefilled or decoded
  int64_t waiting = 0;          // queued requests (new or preempted)
  int64_t kv_pages_total = 0;   // pages of 64 tokens (per DCP rank) in the pool
  int64_t kv_pages_used = 0;     // held by requests
  int64_t kv_pages_cached = 0;   // holding cached blocks that no request holds (evictable)
  int64_t kv_capacity_tokens = 0;  // tokens of one sequence the pool can hold in all
  int64_t requests_finished = 0;
  int64_t preemptions = 0;
  int64_t prompt_tokens = 0;       // processed in prefill (recomputation after preemption included)
  // The prefix cache, as vLLM counts it: tokens of admitted sequences looked up, and found.
  int64_t prefix_cache_queries = 0;
  int64_t prefix_cache_hits = 0;
  int64_t generation_tokens = 0;
  int64_t steps = 0;
  int64_t graph_steps = 0;         // of those, decode steps replayed from CUDA graphs
  // Speculative decoding, named as vLLM names them.
  int64_t num_drafts = 0;
  int64_t num_draft_tokens = 0;
  int64_t num_accepted_tokens = 0;
  std::vector<int64_t> accepted_per_pos;  // [speculative_tokens]
};

struct ModelInfo {
  std::string id;                 // the model directory's base name
  std::string model_dir;
  int64_t max_model_len = 0;
  int64_t vocab_size = 0;
  std::vector<int32_t> eos_token_ids;
  int speculative_tokens = 0;
};

class Engine {
 public:
  // Loads the model on its ranks, sizes the page pool (capacity logged), starts the engine thread.
  // Throws dsi::Error with a one-line message on a bad model, options or device.
  static std::unique_ptr<Engine> start(const EngineOptions& options);
  virtual ~Engine() = default;  // finishes every request with "abort" and joins the engine thread

  // Queues a request; returns its id. A request the engine can never run (empty prompt, token id
  // outside the vocabulary, prompt + max_new_tokens past max_model_len, bad sampling values)
  // throws dsi::Error naming the problem, and nothing is queued.
  virtual uint64_t submit(EngineRequest request, EventSink sink) = 0;
  // Stops a request (its sink gets a final "abort" event unless it already finished) and frees
  // its pages. Unknown or finished ids are ignored.
  virtual void cancel(uint64_t id) = 0;
  virtual EngineMetrics metrics() const = 0;
  virtual const ModelInfo& info() const = 0;
  // Empty while the engine works; after a rank failed (its communicators are aborted, no request
  // can run any more), what went wrong.
  virtual std::string failure() const { return {}; }
};

}  // namespace dsi
