// Decode steps replayed from CUDA graphs (runtime/step_graphs.h, backends/cuda/graph/): replay
// equals the eager forward bitwise across steps, row counts and block-table buckets; replays
// allocate no device memory; the ops' input checks still fire inside a replayed graph; and the
// experts of a decode batch are routed on the device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "backends/cuda/device.h"
#include "backends/cuda/graph/step_graph.h"
#include "cuda/cuda_test_util.h"
#include "ops/elementwise.h"
#include "ops/sampling.h"
#include "runtime/generator.h"
#include "runtime/ranks.h"
#include "runtime/step_graphs.h"
#include "test_util.h"

namespace dsi {
namespace {

class StepGraphModel : public test::CudaTest, public ::testing::WithParamInterface<std::string> {
 protected:
  const DsaModel& gpu_model() { return test::gpu_fixture_model(GetParam()); }
};

int32_t argmax_of(const Tensor& logits_row) {
  const Tensor h = to_host(logits_row);
  int32_t best = 0;
  for (int64_t i = 1; i < h.numel(); ++i)
    if (h.f32()[i] > h.f32()[best]) best = int32_t(i);
  return best;
}

void expect_same_bits(const Tensor& a, const Tensor& b, const std::string& what) {
  const Tensor ha = to_host(a).contiguous(), hb = to_host(b).contiguous();
  ASSERT_EQ(ha.shape(), hb.shape()) << what;
  EXPECT_EQ(std::memcmp(ha.raw(), hb.raw(), ha.nbytes()), 0) << what;
}

// Two sequences fed the same tokens: one by eager forwards, one by replayed graphs, each in its
// own paged pool, pages given as the context grows (as the engine does) in a scrambled physical
// order. One-row steps cross block-table buckets (1 -> 2 -> 4 pages); 4-row verification steps,
// cut back by 2 as a rejection would, replay at shifting positions.
TEST_P(StepGraphModel, ReplayEqualsEagerAcrossStepsAndBuckets) {
  const DsaModel& model = gpu_model();
  const auto manifest = test::load_manifest(GetParam());
  const auto prompt = manifest.at("prompts").back().at("ids").get<std::vector<int32_t>>();
  const int64_t steps = 150, n_pages = 8;
  ASSERT_LE(int64_t(prompt.size()) + steps * 2, n_pages * kPageTokens);
  const DcpLayout dcp;
  SequenceKvCache eager(std::make_shared<KvPool>(model.config(), n_pages, false, test::gpu()), dcp);
  SequenceKvCache graphed(std::make_shared<KvPool>(model.config(), n_pages, false, test::gpu()),
                          dcp);
  const std::vector<int32_t> order_a = {0, 1, 2, 3, 4, 5, 6, 7}, order_b = {6, 2, 7, 0, 5, 3, 1, 4};
  auto grow = [&](SequenceKvCache& c, const std::vector<int32_t>& order, int64_t tokens) {
    const int64_t m = SequenceKvCache::pages_for(dcp, tokens);
    c.set_pages(std::vector<int32_t>(order.begin(), order.begin() + m));
  };
  const int64_t np = int64_t(prompt.size());
  grow(eager, order_a, np);
  grow(graphed, order_b, np);
  const Tensor p = Tensor::from_i32(prompt, {np});
  model.forward(p, eager);
  model.forward(p, graphed);
  StepGraphs graphs(model, /*min_pages_bucket=*/1);
  int32_t tok = prompt.back();
  for (int64_t s = 0; s < steps; ++s) {
    const std::string what = GetParam() + " step " + std::to_string(s);
    const bool verify = s % 10 == 9;
    std::vector<int32_t> rows = {tok};
    if (verify) rows.insert(rows.end(), {int32_t(s % 7), int32_t(s % 5), int32_t(s % 3)});
    const int64_t n = int64_t(rows.size()), L = eager.length();
    grow(eager, order_a, L + n);
    grow(graphed, order_b, L + n);
    const Tensor h = model.forward(Tensor::from_i32(rows, {n}), eager);
    const Tensor lg = model.logits(h);
    const StepGraphs::Step g = graphs.forward(rows, {BatchSeq{&graphed, n}});
    expect_same_bits(g.hidden, h, what + " hidden");
    expect_same_bits(g.logits, lg, what + " logits");
    ASSERT_EQ(graphed.length(), eager.length()) << what;
    if (verify) {  // keep 2 of the 4 rows
      eager.set_length(L + 2);
      graphed.set_length(L + 2);
    }
    tok = argmax_of(lg.slice(verify ? 1 : 0, verify ? 2 : 1));
  }
  // Shapes: 1 row and 4 rows, each in the buckets of 1..4 pages the context went through.
  EXPECT_GE(graphs.graphs(), 4);
  EXPECT_EQ(graphs.eager_steps(), 0);
  EXPECT_EQ(graphs.replays(), steps - graphs.graphs());
}

// Batches padded to their bucket with dummy sequences (3 -> 4, 5 -> 8; 2 stays 2): the graphs,
// which share one pool and replay in turn, give the eager forward's results over the same padded
// batch bitwise, step after step.
TEST_P(StepGraphModel, PaddedBatchesReplayLikeEagerPaddedSteps) {
  const DsaModel& model = gpu_model();
  const auto manifest = test::load_manifest(GetParam());
  const auto& prompts = manifest.at("prompts");
  const int n_seqs = 5, steps = 12;
  const DcpLayout dcp;
  std::vector<std::vector<int32_t>> ids;
  int64_t pages_each = 0;
  for (int i = 0; i < n_seqs; ++i) {
    auto p = prompts[size_t(i) % prompts.size()].at("ids").get<std::vector<int32_t>>();
    p.resize(p.size() > size_t(i) ? p.size() - size_t(i) : 1);  // different lengths
    pages_each = std::max(pages_each, SequenceKvCache::pages_for(dcp, int64_t(p.size()) + steps));
    ids.push_back(std::move(p));
  }
  auto make = [&](bool reversed) {
    auto pool = std::make_shared<KvPool>(model.config(), pages_each * n_seqs, false, test::gpu());
    std::vector<SequenceKvCache> seqs(size_t(n_seqs), SequenceKvCache(pool, dcp));
    for (int i = 0; i < n_seqs; ++i) {
      std::vector<int32_t> pages(static_cast<size_t>(pages_each), 0);
      for (int64_t j = 0; j < pages_each; ++j)
        pages[size_t(j)] = int32_t(reversed ? (n_seqs - 1 - i) * pages_each + (pages_each - 1 - j)
                                            : i * pages_each + j);
      seqs[size_t(i)].set_pages(pages);
      model.forward(Tensor::from_i32(ids[size_t(i)], {int64_t(ids[size_t(i)].size())}),
                    seqs[size_t(i)]);
    }
    return seqs;
  };
  std::vector<SequenceKvCache> eager = make(false), graphed = make(true);
  std::vector<int32_t> next(static_cast<size_t>(n_seqs), 0);
  for (int i = 0; i < n_seqs; ++i) next[size_t(i)] = ids[size_t(i)].back();
  StepGraphs graphs(model, /*min_pages_bucket=*/1);
  const std::vector<std::vector<int>> batches = {{0, 1, 2}, {0, 1, 2, 3, 4}, {3, 4}};
  for (int s = 0; s < steps; ++s) {
    const std::vector<int>& b = batches[size_t(s) % batches.size()];
    const int64_t B = int64_t(b.size());
    const std::string what = GetParam() + " step " + std::to_string(s) + " batch " + std::to_string(B);
    std::vector<BatchSeq> e_seqs, g_seqs;
    std::vector<int32_t> tokens;
    for (int i : b) {
      e_seqs.push_back({&eager[size_t(i)], 1});
      g_seqs.push_back({&graphed[size_t(i)], 1});
      tokens.push_back(next[size_t(i)]);
    }
    DsaModel::Padding pad;
    pad.extra_seqs = StepGraphs::batch_bucket(B) - B;
    std::vector<int32_t> padded = tokens;
    padded.resize(size_t(B + pad.extra_seqs), 0);
    const LayerContext ctx = model.upload_context(model.plan_context(e_seqs, false, pad));
    const Tensor h = model.forward_planned(
        test::dev(Tensor::from_i32(padded, {int64_t(padded.size())})), ctx, eager[size_t(b[0])]);
    const Tensor lg = model.logits(h);
    for (const BatchSeq& e : e_seqs) e.cache->set_length(e.cache->length() + 1);
    const StepGraphs::Step g = graphs.forward(tokens, g_seqs);
    ASSERT_EQ(g.hidden.dim(0), B) << what;
    expect_same_bits(g.hidden, h.slice(0, B), what + " hidden");
    expect_same_bits(g.logits, lg.slice(0, B), what + " logits");
    for (int64_t j = 0; j < B; ++j) {
      EXPECT_EQ(graphed[size_t(b[size_t(j)])].length(), eager[size_t(b[size_t(j)])].length()) << what;
      next[size_t(b[size_t(j)])] = argmax_of(lg.slice(j, j + 1));
    }
  }
  EXPECT_EQ(graphs.graphs(), 3);  // batches of 4, 8 and 2
  EXPECT_EQ(graphs.replays(), steps - 3);
  EXPECT_EQ(graphs.eager_steps(), 0);
}

// Graphs captured ahead on dummy sequences (StepGraphs::capture_batches, as the engine does at
// start-up) are the graphs the steps would capture: a batch of 3 replays from its first step,
// bitwise as lazily captured graphs compute it, and the capture wrote nothing to the pool.
TEST_P(StepGraphModel, BatchesCapturedAheadReplayFromTheFirstStep) {
  const DsaModel& model = gpu_model();
  const auto manifest = test::load_manifest(GetParam());
  const auto& prompts = manifest.at("prompts");
  const int n_seqs = 3, steps = 5;
  const DcpLayout dcp;
  auto make = [&]() {
    auto pool = std::make_shared<KvPool>(model.config(), n_seqs * 4, false, test::gpu());
    std::vector<SequenceKvCache> seqs(size_t(n_seqs), SequenceKvCache(pool, dcp));
    for (int i = 0; i < n_seqs; ++i) {
      const auto p = prompts[size_t(i) % prompts.size()].at("ids").get<std::vector<int32_t>>();
      seqs[size_t(i)].set_pages({4 * i, 4 * i + 1, 4 * i + 2, 4 * i + 3});
      model.forward(Tensor::from_i32(p, {int64_t(p.size())}), seqs[size_t(i)]);
    }
    return seqs;
  };
  std::vector<SequenceKvCache> a = make(), b = make();
  StepGraphs ahead(model), lazy(model);
  SequenceKvCache any(a[0].shared_pool(), dcp);
  EXPECT_EQ(ahead.capture_batches(any, n_seqs, 1), 3);  // batches of 1, 2 and 4
  EXPECT_EQ(ahead.graphs(), 3);
  expect_same_bits(a[0].layer(0).latent, b[0].layer(0).latent, "the pool after capturing ahead");
  std::vector<int32_t> tokens = {3, 5, 7};
  for (int s = 0; s < steps; ++s) {
    std::vector<BatchSeq> sa, sb;
    for (int i = 0; i < n_seqs; ++i) {
      sa.push_back({&a[size_t(i)], 1});
      sb.push_back({&b[size_t(i)], 1});
    }
    const StepGraphs::Step ga = ahead.forward(tokens, sa), gb = lazy.forward(tokens, sb);
    expect_same_bits(ga.logits, gb.logits, GetParam() + " step " + std::to_string(s));
    for (int i = 0; i < n_seqs; ++i) tokens[size_t(i)] = argmax_of(ga.logits.slice(i, i + 1));
  }
  EXPECT_EQ(ahead.replays(), steps);
  EXPECT_EQ(ahead.graphs(), 3);
  EXPECT_EQ(lazy.replays(), steps - 1);
}

TEST(StepGraphBuckets, BatchBucketsPadByAtMostAThird) {
  const std::vector<int64_t> want = {1, 2, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12, 16, 16, 16, 16, 24};
  for (int64_t n = 1; n <= int64_t(want.size()); ++n)
    EXPECT_EQ(StepGraphs::batch_bucket(n), want[size_t(n - 1)]) << n;
  for (int64_t n = 9; n <= 5000; ++n) {
    const int64_t b = StepGraphs::batch_bucket(n);
    EXPECT_GE(b, n);
    EXPECT_LE(3 * (b - n), b) << n;
  }
}

TEST_P(StepGraphModel, ReplaysAllocateNoDeviceMemory) {
  const DsaModel& model = gpu_model();
  const auto manifest = test::load_manifest(GetParam());
  const auto prompt = manifest.at("prompts").back().at("ids").get<std::vector<int32_t>>();
  SequenceKvCache cache = model.make_cache(int64_t(prompt.size()) + 64, false);
  model.forward(Tensor::from_i32(prompt, {int64_t(prompt.size())}), cache);
  StepGraphs graphs(model);
  int32_t tok = prompt.back();
  for (int s = 0; s < 3; ++s)  // capture, then replays whose result copies fill the cache
    tok = argmax_of(graphs.forward({tok}, {BatchSeq{&cache, 1}}).logits);
  const cuda::MemoryStats before = cuda::memory_stats(0);
  for (int s = 0; s < 20; ++s) tok = argmax_of(graphs.forward({tok}, {BatchSeq{&cache, 1}}).logits);
  const cuda::MemoryStats after = cuda::memory_stats(0);
  EXPECT_EQ(after.device_allocations, before.device_allocations);
  EXPECT_EQ(after.reserved_bytes, before.reserved_bytes);
  EXPECT_EQ(graphs.graphs(), 1);
}

TEST_P(StepGraphModel, GenerateWithGraphsEqualsWithout) {
  const DsaModel& model = gpu_model();
  const auto manifest = test::load_manifest(GetParam());
  for (const auto& pr : manifest.at("prompts")) {
    const auto ids = pr.at("ids").get<std::vector<int32_t>>();
    GenerationParams gp;
    gp.kv_cache_dtype = "f32";  // the reference's cache: outputs comparable token for token
    gp.max_new_tokens = 24;
    gp.ignore_eos = true;
    for (int k : {0, 3}) {
      if (k > 0 && !model.has_mtp()) continue;
      gp.speculative_tokens = k;
      gp.cuda_graphs = false;
      const GenerationResult plain = generate(model, ids, gp);
      gp.cuda_graphs = true;
      const GenerationResult graphed = generate(model, ids, gp);
      EXPECT_EQ(graphed.output_ids, plain.output_ids) << pr.at("name") << " K " << k;
      EXPECT_EQ(graphed.speculative.accepted, plain.speculative.accepted) << pr.at("name");
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, StepGraphModel,
                         ::testing::Values("glm_tiny", "dsv32_tiny", "glm_tiny_fp8"));

class StepGraphOps : public test::CudaTest {};

// A bad token id written into a captured step's input is reported by the replay, naming the op;
// with the input mended the graph replays correctly again.
TEST_F(StepGraphOps, InputChecksFireInsideReplays) {
  const Tensor table = test::dev(test::rand_tensor({10, 8}, 3));
  Tensor ids = test::dev(Tensor::from_i32({1, 2, 3}, {3}));
  Tensor out;
  cuda::StepGraph g(test::gpu());
  const auto step = [&] {
    out = Tensor();  // the previous output's block goes back first
    out = Tensor::empty({3, 8}, DType::F32, test::gpu());
    ops::embedding(table, ids, out);
  };
  g.warm_up(step);
  g.capture(step);
  ASSERT_TRUE(g.captured());
  EXPECT_EQ(g.deferred_checks(), 1);
  g.replay();
  const Tensor t = to_host(table);
  EXPECT_EQ(std::memcmp(to_host(out).raw(), t.f32() + 8, 3 * 8 * sizeof(float)), 0);
  ids.copy_from(Tensor::from_i32({4, 12, 5}, {3}));
  const std::string msg = test::error_of([&] { g.replay(); });
  EXPECT_NE(msg.find("embedding"), std::string::npos) << msg;
  EXPECT_NE(msg.find("item 1"), std::string::npos) << msg;
  ids.copy_from(Tensor::from_i32({7, 0, 9}, {3}));
  g.replay();
  const Tensor o = to_host(out);
  EXPECT_EQ(std::memcmp(o.f32(), t.f32() + 7 * 8, 8 * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(o.f32() + 16, t.f32() + 9 * 8, 8 * sizeof(float)), 0);
}

// A host read inside a capture, or an allocation the warm-up did not leave a block for, fails the
// capture with an error, not a hang or a broken stream; the stream works eagerly afterwards.
TEST_F(StepGraphOps, HostReadOrUnplannedAllocationInsideCaptureIsAnError) {
  const Tensor x = test::dev(test::rand_tensor({4}, 5));
  cuda::StepGraph g(test::gpu());
  const std::string msg = test::error_of([&] { g.capture([&] { (void)to_host(x); }); });
  EXPECT_FALSE(msg.empty());
  EXPECT_FALSE(g.captured());
  cuda::StepGraph h(test::gpu());
  const std::string big = test::error_of(
      [&] { h.capture([&] { (void)Tensor::empty({(int64_t(1) << 28) + 123}, DType::U8, test::gpu()); }); });
  EXPECT_NE(big.find("warm-up"), std::string::npos) << big;
  EXPECT_FALSE(h.captured());
  const Tensor back = to_host(x);
  EXPECT_EQ(std::memcmp(back.raw(), test::rand_tensor({4}, 5).raw(), 4 * sizeof(float)), 0);
}

}  // namespace
}  // namespace dsi
