// One request inside the serving engine: its tokens, its random stream, the scheduler's view, and
// on every rank of this process its cache (in that rank's page pool) and the MTP drafter's pending
// rows.
#pragma once

#include <optional>
#include <random>
#include <memory>
#include <vector>

#include "dsinfer/engine.h"
#include "ops/sampling.h"
#include "runtime/dcp.h"
#include "runtime/kv_cache.h"
#include "runtime/scheduler.h"
#include "runtime/speculative.h"

namespace dsi {

struct EngineRankState {
  explicit EngineRankState(SequenceKvCache c) : cache(std::move(c)) {}
  SequenceKvCache cache;
  Tensor pending_hidden;  // [m, hidden]: states at [pending_start, + m) the drafter has not consumed
  Tensor step_hidden;     // [rows, hidden]: this step's output rows of the sequence
  Tensor last;            // [1, hidden]: the latest MTP step's output (chained drafting)
  DcpTopk share;          // index_share_for_mtp_iteration: the first draft step's selection
};

struct EngineSequence {
  SchedSeq sched;
  EngineRequest request;
  EventSink sink;
  std::vector<int32_t> tokens;  // the prompt, then the generated tokens
  int64_t prompt_len = 0;
  std::mt19937_64 rng;
  std::vector<EngineRankState> ranks;  // [slot of a local rank]; empty until the sequence first runs
  std::vector<int32_t> pending_next;   // [m]: the token after each pending row
  int64_t pending_start = 0;
  Draft draft;  // this round's drafts
  std::unique_ptr<TokenConstraint> draft_constraint;  // rank 0: the constraint after this round's drafts
  int64_t drafts = 0;  // drafts planned this round
  bool finished = false;
  int64_t prompt_lp_sent = 1;  // prompt positions [1, this) have had their logprobs reported

  std::optional<ops::TokenHistory> history;  // built on first use (penalties), then kept by emit

  int64_t generated() const { return int64_t(tokens.size()) - prompt_len; }
  // The sequence as sampling's penalties see it; null when the request asks for none.
  const ops::TokenHistory* penalty_history() {
    if (!ops::has_penalties(request.sampling)) return nullptr;
    if (!history) history.emplace(tokens, prompt_len);
    return &*history;
  }
};

}  // namespace dsi
