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

namespace {

// The i32 inputs of a step (tokens, then the context's tensors) in one host tensor, in the order
// input_views cuts them.
Tensor pack_inputs(const Tensor& tokens, const LayerContext& c) {
  const Tensor* parts[] = {&tokens, &c.positions, &c.store_slots, &c.local_bounds,
                           &c.pages.row_seq, &c.pages.block_tables};
  int64_t total = 0;
  for (const Tensor* t : parts) total += t->numel();
  Tensor packed = Tensor::empty({total}, DType::I32);
  int32_t* dst = packed.i32();
  for (const Tensor* t : parts) {
    const Tensor src = t->contiguous();
    std::copy(src.i32(), src.i32() + src.numel(), dst);
    dst += src.numel();
  }
  return packed;
}

// Points tokens and ctx's tensors (shaped as in `host`) at their parts of the packed device inputs.
void input_views(const Tensor& packed, const LayerContext& host, Tensor& tokens, LayerContext& ctx) {
  ctx = host;
  int64_t at = 0;
  auto cut = [&](const Shape& shape) {
    const int64_t n = shape_numel(shape);
    Tensor v = packed.narrow(0, at, n).view(shape);
    at += n;
    return v;
  };
  tokens = cut({host.n});
  for (Tensor* t : {&ctx.positions, &ctx.store_slots, &ctx.local_bounds, &ctx.pages.row_seq,
                    &ctx.pages.block_tables})
    *t = cut(t->shape());
}

}  // namespace

struct StepGraphs::Entry {
  Entry(Device device, const std::shared_ptr<cuda::BlockPool>& pool) : graph(device, pool) {}
  cuda::StepGraph graph;
  // The graph's inputs on the device, rewritten before every replay in one copy: `inputs` holds
  // them back to back and tokens / ctx's tensors are views of it.
  Tensor inputs;
  LayerContext ctx;
  Tensor tokens;     // [n] i32
  Step out;          // the graph's outputs (tensors of its private pool)
  bool eager = false;  // the step could not be captured: it runs eagerly
};

bool StepGraphs::supported(const DsaModel& model) {
  if (model.device().type != DeviceType::CUDA) return false;
  const RankContext& rc = model.rank();
  if (rc.cfg.tp == 1) return true;
  // Several ranks: their collectives go into the graphs, so the communicator must allow that; and
  // the lockstep guard compares every collective over the host as it is issued, which a replay
  // does not do.
  return rc.comm != nullptr && rc.comm->capturable() && !rc.comm->options().check_lockstep;
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
            "decode graphs need a CUDA model, on one rank or on ranks whose collectives can be captured "
            "without the lockstep guard (this one: {}, tp {}, dcp {})",
            model.device().str(), model.rank().cfg.tp, model.rank().cfg.dcp);
#ifdef DSI_WITH_CUDA
  pool_ = cuda::StepGraph::new_pool(model.device());
#endif
}

StepGraphs::~StepGraphs() = default;

int StepGraphs::graphs() const {
  int n = 0;
  for (const auto& [key, e] : entries_) n += e->eager ? 0 : 1;
  return n;
}

int64_t StepGraphs::batch_bucket(int64_t seqs) {
  DSI_CHECK(seqs >= 1, "decode graphs: a batch of {} sequences", seqs);
  int64_t b = 1;
  while (b < seqs && b < 8) b *= 2;
  if (b >= seqs) return b;
  for (b = 8;; b *= 2) {  // 12, 16, 24, 32, 48, 64, ...: padding is at most a third of a bucket
    if (b + b / 2 >= seqs) return b + b / 2;
    if (2 * b >= seqs) return 2 * b;
  }
}

#ifdef DSI_WITH_CUDA

// Runs the step of `host` eagerly on a new graph's own inputs (the warm-up), then records the same
// calls; returns the warm-up's result (copies of its first `keep` rows).
StepGraphs::Step StepGraphs::add_graph(const Key& key, const LayerContext& host,
                                       const Tensor& tokens_host, SequenceKvCache& cache,
                                       int64_t keep) {
  auto e = std::make_unique<Entry>(model_.device(), pool_);
  e->inputs = to_device(pack_inputs(tokens_host, host), model_.device());
  input_views(e->inputs, host, e->tokens, e->ctx);
  Step warm, result;
  e->graph.warm_up([&] {
    warm.hidden = model_.forward_planned(e->tokens, e->ctx, cache);
    warm.logits = model_.logits(warm.hidden);
  });
  result.hidden = copy_rows(warm.hidden, keep);  // the graph's pool gets its blocks back
  result.logits = copy_rows(warm.logits, keep);
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
  return result;
}

bool StepGraphs::any_rank(bool mine) const {
  const RankContext& rc = model_.rank();
  if (rc.cfg.tp == 1 || rc.comm == nullptr) return mine;
  // On the host communicator: between captures no rank queues a collective kernel, so a rank still
  // instantiating its graph (which may wait for the whole GPU, shared by other ranks' streams)
  // holds up no other rank's waiting kernel.
  Tensor flag = Tensor::from_f32({mine ? 1.0f : 0.0f}, {1});
  rc.comm->host().all_reduce(rc.tp_group, flag);
  return flag.f32()[0] > 0.0f;
}

Tensor StepGraphs::copy_rows(const Tensor& t, int64_t rows) {
  const Tensor v = t.slice(0, rows);
  Tensor c = Tensor::empty(v.shape(), v.dtype(), v.device());
  c.copy_from(v);
  return c;
}

#endif

int StepGraphs::capture_batches(SequenceKvCache& cache, int64_t max_seqs, int64_t rows_per_seq) {
  DSI_CHECK(max_seqs >= 1 && rows_per_seq >= 1, "decode graphs: batches of {} x {} rows", max_seqs,
            rows_per_seq);
#ifdef DSI_WITH_CUDA
  int made = 0;
  const int64_t top = batch_bucket(max_seqs);
  for (int64_t b = 1; b <= top && int(entries_.size()) < kMaxGraphs; b = batch_bucket(b + 1)) {
    Key key;
    key.rows.assign(size_t(b), rows_per_seq);
    key.pages = min_pages_bucket_;
    if (entries_.count(key)) continue;
    DsaModel::Padding pad;
    pad.min_pages = key.pages;
    pad.min_keys = key.pages * int64_t(kPageTokens);
    pad.extra_seqs = b;
    pad.extra_rows = rows_per_seq;
    const LayerContext host = model_.plan_context({}, /*mtp=*/false, pad);
    const Tensor tokens = Tensor::zeros({host.n}, DType::I32);
    add_graph(key, host, tokens, cache, /*keep=*/0);
    // Larger batches would not capture either. Every rank stops at the same shape: a rank that
    // went on would run warm-ups (collectives included) the others do not.
    if (any_rank(entries_.at(key)->eager)) break;
    ++made;
  }
  return made;
#else
  (void)cache;
  fail("decode graphs: this build has no CUDA backend");
#endif
}

StepGraphs::Step StepGraphs::forward(const std::vector<int32_t>& tokens,
                                     const std::vector<BatchSeq>& seqs) {
#ifdef DSI_WITH_CUDA
  DSI_CHECK(!seqs.empty(), "decode graphs: no sequences");
  DsaModel::Padding pad;
  Key key;
  int64_t pages = 1, n_real = 0;
  for (const BatchSeq& s : seqs) {
    DSI_CHECK(s.cache != nullptr, "decode graphs: a sequence without a cache");
    key.rows.push_back(s.n);
    n_real += s.n;
    pages = std::max<int64_t>(pages, int64_t(s.cache->pages().size()));
  }
  DSI_CHECK(int64_t(tokens.size()) == n_real, "decode graphs: {} tokens for {} rows", tokens.size(),
            n_real);
  // Dummy sequences fill the batch bucket, with the last sequence's rows: a batch whose sequences
  // all have r rows pads to r-row sequences (the shape capture_batches makes ahead).
  pad.extra_seqs = batch_bucket(int64_t(seqs.size())) - int64_t(seqs.size());
  pad.extra_rows = seqs.back().n;
  key.rows.resize(key.rows.size() + size_t(pad.extra_seqs), pad.extra_rows);
  key.pages = min_pages_bucket_;
  while (key.pages < pages) key.pages *= 2;
  pad.min_pages = key.pages;
  pad.min_keys = key.pages * int64_t(kPageTokens);
  SequenceKvCache& cache = *seqs[0].cache;
  auto finish = [&](Step st) {
    for (const BatchSeq& s : seqs) s.cache->set_length(s.cache->length() + s.n);
    return st;
  };
  auto it = entries_.find(key);
  if ((it == entries_.end() && int(entries_.size()) >= kMaxGraphs) ||
      (it != entries_.end() && it->second->eager)) {
    // A step of a shape without a graph: eager, unpadded.
    ++eager_steps_;
    const LayerContext ctx = model_.upload_context(model_.plan_context(seqs, /*mtp=*/false));
    Step st;
    st.hidden = model_.forward_planned(
        to_device(Tensor::from_i32(tokens, {n_real}), model_.device()), ctx, cache);
    st.logits = model_.logits(st.hidden);
    return finish(std::move(st));
  }
  const LayerContext host = model_.plan_context(seqs, /*mtp=*/false, pad);
  std::vector<int32_t> padded = tokens;
  padded.resize(size_t(host.n), 0);
  const Tensor tokens_host = Tensor::from_i32(padded, {host.n});
  if (it == entries_.end()) return finish(add_graph(key, host, tokens_host, cache, n_real));
  Entry& en = *it->second;
  en.inputs.copy_from(pack_inputs(tokens_host, host));
  en.graph.replay();
  ++replays_;
  Step result;
  result.hidden = copy_rows(en.out.hidden, n_real);
  result.logits = copy_rows(en.out.logits, n_real);
  return finish(std::move(result));
#else
  (void)tokens;
  (void)seqs;
  fail("decode graphs: this build has no CUDA backend");
#endif
}

}  // namespace dsi
