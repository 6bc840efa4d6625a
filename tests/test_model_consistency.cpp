// Invariants of the model that hold whatever the weights: prefill-then-decode equals one full
// prefill (the caches hold exactly what a recompute would), and chunked prefill equals one chunk,
// for the main model, the MTP layer, and the per-layer top-k selections.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "model/dsa_model.h"
#include "runtime/generator.h"
#include "test_util.h"
#include "tolerances.h"

namespace dsi {
namespace {

// The longest golden prompt of a fixture (several times index_topk).
std::vector<int32_t> long_prompt(const std::string& fixture) {
  const auto m = test::load_manifest(fixture);
  std::vector<int32_t> best;
  for (const auto& p : m.at("prompts")) {
    auto ids = p.at("ids").get<std::vector<int32_t>>();
    if (ids.size() > best.size()) best = ids;
  }
  return best;
}

// Runs the prompt in the given chunk sizes (cycled), returning per-row logits and top-k traces.
struct ChunkedRun {
  Tensor logits;
  std::vector<std::vector<int32_t>> topk;  // per layer: [n * k] flattened over all rows
};

ChunkedRun run_chunked(const DsaModel& model, const std::vector<int32_t>& ids,
                const std::vector<int>& chunks) {
  const ModelConfig& c = model.config();
  const int64_t n = int64_t(ids.size());
  SequenceKvCache cache(c, n, false);
  ChunkedRun run;
  run.logits = Tensor::empty({n, c.vocab_size}, DType::F32);
  run.topk.resize(size_t(c.n_layers));
  int64_t b = 0;
  for (size_t ci = 0; b < n; ++ci) {
    const int64_t e = std::min<int64_t>(n, b + chunks[ci % chunks.size()]);
    ForwardTrace trace;
    Tensor h = model.forward(
        Tensor::from_i32(std::vector<int32_t>(ids.begin() + b, ids.begin() + e), {e - b}), cache,
        &trace);
    Tensor dst = run.logits.slice(b, e);
    dst.copy_from(model.logits(h));
    for (int l = 0; l < c.n_layers; ++l) {
      const Tensor& t = trace.topk[size_t(l)];
      run.topk[size_t(l)].insert(run.topk[size_t(l)].end(), t.i32(), t.i32() + t.numel());
    }
    b = e;
  }
  EXPECT_EQ(cache.length(), n);
  return run;
}

class Consistency : public ::testing::TestWithParam<std::string> {};

TEST_P(Consistency, DecodeTokenByTokenEqualsFullPrefill) {
  const DsaModel& model = test::fixture_model(GetParam());
  const auto ids = long_prompt(GetParam());
  const ChunkedRun full = run_chunked(model, ids, {int(ids.size())});
  const ChunkedRun decode = run_chunked(model, ids, {1});
  EXPECT_LE(test::nmse(decode.logits, full.logits), tol::kSelfConsistencyNmse);
  EXPECT_EQ(decode.topk, full.topk);
}

TEST_P(Consistency, ChunkedPrefillEqualsOneChunk) {
  const DsaModel& model = test::fixture_model(GetParam());
  const auto ids = long_prompt(GetParam());
  const int k = model.config().index_topk;
  const ChunkedRun full = run_chunked(model, ids, {int(ids.size())});
  for (const std::vector<int>& chunks : std::vector<std::vector<int>>{
           {2}, {3}, {k - 1}, {k}, {k + 1}, {5, 1, 11}, {int(ids.size()) - 1}}) {
    SCOPED_TRACE("chunk sizes starting with " + std::to_string(chunks[0]));
    const ChunkedRun r = run_chunked(model, ids, chunks);
    EXPECT_LE(test::nmse(r.logits, full.logits), tol::kSelfConsistencyNmse);
    EXPECT_EQ(r.topk, full.topk);
  }
}

TEST_P(Consistency, ChunkedMtpEqualsOneChunk) {
  const DsaModel& model = test::fixture_model(GetParam());
  const auto ids = long_prompt(GetParam());
  const PromptLogits full = prompt_logits(model, ids, 0, true);
  for (int chunk : {1, 4, 7}) {
    const PromptLogits r = prompt_logits(model, ids, chunk, true);
    EXPECT_LE(test::nmse(r.logits, full.logits), tol::kSelfConsistencyNmse) << chunk;
    EXPECT_LE(test::nmse(r.mtp_logits, full.mtp_logits), tol::kSelfConsistencyNmse) << chunk;
  }
}

TEST_P(Consistency, GenerateIsChunkInvariantAndStopsAtEos) {
  const DsaModel& model = test::fixture_model(GetParam());
  const auto ids = long_prompt(GetParam());
  GenerationParams gp;
  gp.max_new_tokens = 8;
  gp.ignore_eos = true;
  const GenerationResult a = generate(model, ids, gp);
  gp.prefill_chunk = 3;
  const GenerationResult b = generate(model, ids, gp);
  EXPECT_EQ(a.output_ids, b.output_ids);
  ASSERT_EQ(a.output_ids.size(), 8u);


  // With the 3rd greedy token declared an eos id, generation stops right after emitting it.
  ModelConfig cfg = load_config(test::fixture_dir(GetParam()) + "/config.json");
  cfg.eos_token_ids = {a.output_ids[2]};
  const Checkpoint ck = Checkpoint::open(test::fixture_dir(GetParam()));
  ModelWeights w = load_weights(ck, cfg);
  const DsaModel stopping(cfg, std::move(w));
  gp.ignore_eos = false;
  const GenerationResult c = generate(stopping, ids, gp);
  size_t stop = 0;
  while (a.output_ids[stop] != a.output_ids[2]) ++stop;  // the first occurrence may come earlier
  EXPECT_EQ(c.output_ids, std::vector<int32_t>(a.output_ids.begin(), a.output_ids.begin() + long(stop) + 1));
  EXPECT_EQ(c.finish_reason, "eos");
}

TEST_P(Consistency, SeededSamplingIsReproducible) {
  const DsaModel& model = test::fixture_model(GetParam());
  const auto ids = long_prompt(GetParam());
  GenerationParams gp;
  gp.max_new_tokens = 6;
  gp.ignore_eos = true;
  gp.sampling.temperature = 1.0f;
  gp.sampling.top_p = 0.9f;
  gp.sampling.seed = 7;
  const GenerationResult a = generate(model, ids, gp);
  const GenerationResult b = generate(model, ids, gp);
  EXPECT_EQ(a.output_ids, b.output_ids);
  gp.sampling.seed = 8;
  bool differs = false;
  for (uint64_t s = 8; s < 16 && !differs; ++s) {
    gp.sampling.seed = s;
    differs = generate(model, ids, gp).output_ids != a.output_ids;
  }
  EXPECT_TRUE(differs) << "eight other seeds all sampled the same 6 tokens";
}

// Dummy sequences padding a decode batch (DsaModel::Padding, as graph batch buckets use) change
// nothing for the real rows: the same hidden states, the same selections, the same cache bytes;
// the dummy rows select no key.
TEST_P(Consistency, PaddingSequencesLeaveTheRealRowsAlone) {
  const DsaModel& model = test::fixture_model(GetParam());
  const ModelConfig& c = model.config();
  const auto manifest = test::load_manifest(GetParam());
  const auto& prompts = manifest.at("prompts");
  ASSERT_GE(prompts.size(), 2u);
  struct Run {
    Tensor hidden;
    ForwardTrace trace;
    std::shared_ptr<KvPool> pool;
  };
  const DcpLayout dcp;
  auto run = [&](int64_t extra) {
    Run r;
    std::vector<std::vector<int32_t>> ids;
    for (size_t i = 0; i < 2; ++i) ids.push_back(prompts[i].at("ids").get<std::vector<int32_t>>());
    const int64_t pages_each = SequenceKvCache::pages_for(dcp, int64_t(ids[1].size()) + 2) +
                               SequenceKvCache::pages_for(dcp, int64_t(ids[0].size()) + 2);
    r.pool = std::make_shared<KvPool>(c, pages_each, false);
    std::vector<SequenceKvCache> caches(2, SequenceKvCache(r.pool, dcp));
    int32_t next_page = 0;
    std::vector<int32_t> tokens;
    for (size_t i = 0; i < 2; ++i) {
      std::vector<int32_t> pages(size_t(SequenceKvCache::pages_for(dcp, int64_t(ids[i].size()) + 1)));
      for (int32_t& pg : pages) pg = next_page++;
      caches[i].set_pages(pages);
      model.forward(Tensor::from_i32(ids[i], {int64_t(ids[i].size())}), caches[i]);
      tokens.push_back(ids[i].front());
    }
    tokens.resize(size_t(2 + extra), 0);
    DsaModel::Padding pad;
    pad.extra_seqs = extra;
    const LayerContext ctx = model.upload_context(
        model.plan_context({BatchSeq{&caches[0], 1}, BatchSeq{&caches[1], 1}}, false, pad));
    EXPECT_EQ(ctx.n, 2 + extra);
    r.hidden = model.forward_planned(Tensor::from_i32(tokens, {2 + extra}), ctx, caches[0], &r.trace);
    return r;
  };
  const Run plain = run(0);
  for (int64_t extra : {1, 6}) {
    SCOPED_TRACE("padding sequences: " + std::to_string(extra));
    const Run padded = run(extra);
    ASSERT_EQ(padded.hidden.dim(0), 2 + extra);
    EXPECT_LE(test::nmse(padded.hidden.slice(0, 2), plain.hidden), tol::kSelfConsistencyNmse);
    ASSERT_EQ(padded.trace.topk.size(), plain.trace.topk.size());
    for (size_t l = 0; l < plain.trace.topk.size(); ++l) {
      const Tensor& a = plain.trace.topk[l];
      const Tensor& b = padded.trace.topk[l];
      const int64_t k = a.dim(1);
      ASSERT_EQ(b.dim(0), 2 + extra);
      EXPECT_TRUE(std::equal(a.i32(), a.i32() + 2 * k, b.i32())) << "layer " << l;
      EXPECT_TRUE(std::all_of(b.i32() + 2 * k, b.i32() + b.numel(), [](int32_t v) { return v == -1; }))
          << "layer " << l << ": a padding row selected a key";
    }
    for (size_t l = 0; l < plain.pool->layers.size(); ++l)
      EXPECT_LE(test::nmse(padded.pool->layers[l].latent, plain.pool->layers[l].latent),
                tol::kSelfConsistencyNmse)
          << "layer " << l << ": padding changed the cache";
  }
}

// A call of padding alone (no real sequence; dummy sequences of 3 rows) runs, selects no key and
// writes nothing: the shape graphs are captured ahead on.
TEST_P(Consistency, PaddingAloneSelectsNothingAndWritesNothing) {
  const DsaModel& model = test::fixture_model(GetParam());
  const auto pool = std::make_shared<KvPool>(model.config(), 2, false);
  SequenceKvCache any(pool, DcpLayout{});
  DsaModel::Padding pad;
  pad.extra_seqs = 2;
  pad.extra_rows = 3;
  pad.min_pages = 4;
  const LayerContext host = model.plan_context({}, false, pad);
  ASSERT_EQ(host.n, 6);
  EXPECT_EQ(host.pages.block_tables.dim(0), 2);
  EXPECT_EQ(host.pages.block_tables.dim(1), 4);
  ForwardTrace trace;
  const Tensor h = model.forward_planned(Tensor::zeros({6}, DType::I32), model.upload_context(host),
                                         any, &trace);
  EXPECT_EQ(h.dim(0), 6);
  for (const Tensor& t : trace.topk)
    EXPECT_TRUE(std::all_of(t.i32(), t.i32() + t.numel(), [](int32_t v) { return v == -1; }));
  for (const LayerKvCache& l : pool->layers)
    EXPECT_EQ(test::max_abs_diff(l.latent, Tensor::zeros(l.latent.shape(), l.latent.dtype())), 0.0);
  test::expect_error([&] { (void)model.plan_context({}, false, DsaModel::Padding{}); },
                     {"no sequences"});
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Consistency, ::testing::ValuesIn(test::fixture_names()));

}  // namespace
}  // namespace dsi
