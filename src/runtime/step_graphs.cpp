// Decode steps from CUDA graphs; see step_graphs.h.
#include "runtime/step_graphs.h"

#include <algorithm>

#include <spdlog/spdlog.h>

#include "dsinfer/error.h"

#ifdef DSI_WITH_CUDA
#include "backends/cuda/graph/step_graph.h"
#endif

namespace dsi {

#ifdef DSI_WITH_CUDA

struct StepGraphs::Entry {
  explicit Entry(Device device) : graph(device) {}
  cuda::StepGraph graph;
  LayerContext ctx;  // the graph's inputs on the device, rewritten before every replay
  Tensor tokens;     // [n] i32 on the device
  Step out;          // the graph's outputs (tensors of its private pool)
  bool eager = false;  // the step could not be captured: it runs eagerly
};

bool StepGraphs::supported(const DsaModel& model) {
  return model.device().type == DeviceType::CUDA && model.rank().cfg.tp == 1 &&
         model.rank().cfg.dcp == 1;
}

#else

struct StepGraphs::Entry {
  bool eager = true;
};

bool StepGraphs::supported(const DsaModel&) { return false; }

#endif

StepGraphs::StepGraphs(const DsaModel& model, int64_t min_pages_bucket)
    : model_(model), min_pages_bucket_(min_pages_bucket) {
  DSI_CHECK(min_pages_bucket >= 1 && (min_pages_bucket & (min_pages_bucket - 1)) == 0,
            "decode graphs: the smallest bucket ({} pages) must be a power of two", min_pages_bucket);
  DSI_CHECK(supported(model),
            "decode graphs need a CUDA model on one rank (this one: {}, tp {}, dcp {})",
            model.device().str(), model.rank().cfg.tp, model.rank().cfg.dcp);
}

StepGraphs::~StepGraphs() = default;

int StepGraphs::graphs() const {
  int n = 0;
  for (const auto& [key, e] : entries_) n += e->eager ? 0 : 1;
  return n;
}

StepGraphs::Step StepGraphs::forward(const std::vector<int32_t>& tokens,
                                     const std::vector<BatchSeq>& seqs) {
#ifdef DSI_WITH_CUDA
  Key key;
  int64_t pages = 1;
  for (const BatchSeq& s : seqs) {
    DSI_CHECK(s.cache != nullptr, "decode graphs: a sequence without a cache");
    key.rows.push_back(s.n);
    pages = std::max<int64_t>(pages, int64_t(s.cache->pages().size()));
  }
  key.pages = min_pages_bucket_;
  while (key.pages < pages) key.pages *= 2;
  const LayerContext host =
      model_.plan_context(seqs, /*mtp=*/false, key.pages, key.pages * int64_t(kPageTokens));
  DSI_CHECK(int64_t(tokens.size()) == host.n, "decode graphs: {} tokens for {} rows", tokens.size(),
            host.n);
  const Tensor tokens_host = Tensor::from_i32(tokens, {host.n});
  SequenceKvCache& cache = *seqs[0].cache;
  auto copy = [&](const Tensor& t) {
    Tensor c = Tensor::empty(t.shape(), t.dtype(), t.device());
    c.copy_from(t);
    return c;
  };
  auto eager = [&]() {  // a step of a shape without a graph
    ++eager_steps_;
    const LayerContext ctx = model_.upload_context(host);
    Step st;
    st.hidden = model_.forward_planned(to_device(tokens_host, model_.device()), ctx, cache);
    st.logits = model_.logits(st.hidden);
    return st;
  };
  Step result;
  auto it = entries_.find(key);
  if (it == entries_.end() && int(entries_.size()) >= kMaxGraphs) {
    result = eager();
  } else if (it == entries_.end()) {
    // First step of this shape: run it eagerly on the graph's own inputs (the warm-up), then
    // record the same calls.
    auto e = std::make_unique<Entry>(model_.device());
    e->ctx = model_.upload_context(host);
    e->tokens = to_device(tokens_host, model_.device());
    Step warm;
    e->graph.warm_up([&] {
      warm.hidden = model_.forward_planned(e->tokens, e->ctx, cache);
      warm.logits = model_.logits(warm.hidden);
    });
    result.hidden = copy(warm.hidden);  // the caller's copies; the graph's pool gets its blocks back
    result.logits = copy(warm.logits);
    warm = Step{};
    Entry& en = *e;
    try {
      en.graph.capture([&] {
        en.out.hidden = model_.forward_planned(en.tokens, en.ctx, cache);
        en.out.logits = model_.logits(en.out.hidden);
      });
    } catch (const Error& err) {
      // The eager run above succeeded, so the inputs are fine: an op of this shape cannot be
      // captured. The shape keeps running eagerly.
      spdlog::warn("decode steps with {} rows run without a graph: {}", host.n, err.what());
      en.eager = true;
    }
    entries_.emplace(key, std::move(e));
  } else if (it->second->eager) {
    result = eager();
  } else {
    Entry& en = *it->second;
    en.tokens.copy_from(tokens_host);
    for (auto [dst, src] : {std::pair{&en.ctx.positions, &host.positions},
                            std::pair{&en.ctx.store_slots, &host.store_slots},
                            std::pair{&en.ctx.local_bounds, &host.local_bounds},
                            std::pair{&en.ctx.pages.row_seq, &host.pages.row_seq},
                            std::pair{&en.ctx.pages.block_tables, &host.pages.block_tables}})
      dst->copy_from(*src);
    en.graph.replay();
    ++replays_;
    result.hidden = copy(en.out.hidden);
    result.logits = copy(en.out.logits);
  }
  for (const BatchSeq& s : seqs) s.cache->set_length(s.cache->length() + s.n);
  return result;
#else
  (void)tokens;
  (void)seqs;
  fail("decode graphs: this build has no CUDA backend");
#endif
}

}  // namespace dsi
