// The DSA causal LM (GlmMoeDsaForCausalLM / DeepseekV32ForCausalLM) and its MTP layer, written once
// against the op API: the device of the weights picks the backend. One DsaModel per rank: under
// tensor / decode-context parallelism every rank runs the same calls on its shard and the
// collectives make the ranks act as one model (runtime/parallel.h, runtime/dcp.h).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/layer_context.h"
#include "model/weights.h"
#include "runtime/dcp.h"
#include "runtime/kv_cache.h"

namespace dsi {

// Optional record of a forward call, for tests and debugging.
struct ForwardTrace {
  std::vector<Tensor> topk;  // per layer run: [n, index_topk] i32 selected global positions
};

// The rows of one sequence in a batched forward call: `n` new tokens at positions
// [cache->length(), + n) (main model) or [cache->mtp_length(), + n) (MTP layer).
struct BatchSeq {
  SequenceKvCache* cache = nullptr;
  int64_t n = 0;
};

class DsaModel {
 public:
  // Reads config.json and the safetensors weights of a checkpoint directory (one rank).
  static std::unique_ptr<DsaModel> load(const std::string& dir);
  // This rank's shard of an opened checkpoint (`cfg` from its config.json), with its weights on
  // `device` (the backend of every op follows from it).
  static std::unique_ptr<DsaModel> load(const Checkpoint& ck, ModelConfig cfg,
                                        const RankContext& rank, Device device = Device::cpu());
  DsaModel(ModelConfig cfg, ModelWeights weights, RankContext rank = {},
           Device device = Device::cpu());

  const ModelConfig& config() const { return cfg_; }
  const RankContext& rank() const { return rank_; }
  Device device() const { return device_; }
  bool has_mtp() const { return weights_.mtp.has_value(); }
  // A cache for `capacity` tokens holding this rank's share of them.
  SequenceKvCache make_cache(int64_t capacity, bool with_mtp,
                             KvCacheDtype dtype = KvCacheDtype::kF32) const;

  // Runs the main model over `tokens` ([n] i32) at positions [cache.length(), + n) and appends them
  // to the caches. Returns the hidden states after the final norm, [n, hidden] f32.
  Tensor forward(const Tensor& tokens, SequenceKvCache& cache, ForwardTrace* trace = nullptr) const;
  // The same for several sequences at once (continuous batching): tokens [sum n] i32 holds each
  // sequence's rows in turn; all caches share one pool. Returns [sum n, hidden] f32.
  Tensor forward(const Tensor& tokens, const std::vector<BatchSeq>& seqs,
                 ForwardTrace* trace = nullptr) const;
  // The two halves of forward(), for callers that replay steps from graphs (runtime/step_graphs.h):
  // plan_context makes a call's inputs on the host, and forward_planned runs the main model on them
  // once they are on the device (upload_context) — tokens [n] i32 on the device, n counting the
  // padding rows. forward_planned writes the new keys into the caches but leaves the sequences'
  // lengths to the caller; it never reads the host.
  struct Padding {
    int64_t min_pages = 0;  // block-table columns at least (the extra ones are -1)
    int64_t min_keys = 0;   // logits width at least
    // Dummy sequences of extra_rows rows each after the real ones (or alone, with no real one):
    // position 0, no key stored, no key seen (their attention output is 0), no pages. Their rows'
    // results are to be ignored.
    int64_t extra_seqs = 0;
    int64_t extra_rows = 1;
  };
  // Padding leaves the real rows' results as they are, up to the summation order of ops whose
  // blocking depends on the row count (bitwise the same for the attention and cache writes).
  LayerContext plan_context(const std::vector<BatchSeq>& seqs, bool mtp, const Padding& pad) const;
  LayerContext plan_context(const std::vector<BatchSeq>& seqs, bool mtp) const {
    return plan_context(seqs, mtp, Padding{});
  }
  LayerContext upload_context(const LayerContext& host) const;
  Tensor forward_planned(const Tensor& tokens, const LayerContext& ctx, SequenceKvCache& cache,
                         ForwardTrace* trace = nullptr) const;
  // lm_head: [n, hidden] -> [n, vocab] f32 (vocabulary-parallel, gathered on every rank).
  Tensor logits(const Tensor& hidden) const;

  // The MTP layer (dsa-reference.md section 5): row i combines hidden[i] (the main model's state
  // after the final norm, or the previous draft step's) with next_tokens[i] (the token after it),
  // x = eh_proj([enorm(embed(next)); hnorm(hidden)]), runs at positions [cache.mtp_length(), + n)
  // and appends to the MTP caches. Returns shared_head.norm(y), [n, hidden] f32.
  // `share` (optional) implements index_share_for_mtp_iteration across chained draft steps: when
  // it holds a selection, the MTP indexer is skipped and that selection reused; when empty, it is
  // filled with this call's selection for the last row.
  Tensor mtp_forward(const Tensor& hidden, const Tensor& next_tokens, SequenceKvCache& cache,
                     ForwardTrace* trace = nullptr, DcpTopk* share = nullptr) const;
  // Batched: rows of every sequence in turn; `shares` (empty, or one per sequence) as above, per
  // sequence; either every share holds a selection (one row per sequence) or none does.
  Tensor mtp_forward(const Tensor& hidden, const Tensor& next_tokens,
                     const std::vector<BatchSeq>& seqs, ForwardTrace* trace = nullptr,
                     const std::vector<DcpTopk*>& shares = {}) const;
  // The MTP head: [n, hidden] -> draft logits [n, vocab] f32.
  Tensor mtp_logits(const Tensor& mtp_hidden) const;

 private:
  // One pre-norm decoder layer over h ([n, hidden]): first h += pending (the previous layer's MLP
  // output, when defined; fused into the input norm), then the attention's residual add; returns
  // this layer's MLP output, which the caller adds (again fused into the norm that follows).
  Tensor decoder_layer(const LayerContext& ctx, const LayerWeights& w, Tensor& h, LayerKvCache& kv,
                       DcpTopk& topk, const Tensor& pending) const;
  // The context of a call over `seqs`, whose rows start at each cache's length (or MTP length).
  LayerContext make_context(const std::vector<BatchSeq>& seqs, bool mtp) const {
    return upload_context(plan_context(seqs, mtp));
  }
  Tensor vocab_parallel_logits(const Tensor& hidden, const LinearWeight& head) const;

  ModelConfig cfg_;
  ModelWeights weights_;
  RankContext rank_;
  Device device_;
  RopeTable rope_;
};

}  // namespace dsi
