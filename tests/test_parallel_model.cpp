// The model over thread ranks, for every (tp, dcp, interleave) layout: the same greedy tokens, the
// same per-layer top-k sets as one rank (bit for bit), logits within the model tolerance of the HF
// goldens, and the edge cases of DCP (ranks that own no key of a prompt or of a prefill chunk),
// with the lockstep guard on. ag_rs and a2a give identical logits.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>

#include "core/npy.h"
#include "runtime/ranks.h"
#include "test_util.h"
#include "tolerances.h"

namespace dsi {
namespace {

struct Layout {
  int tp, dcp, interleave;
};

std::string name_of(const Layout& l) {
  return "tp" + std::to_string(l.tp) + "_dcp" + std::to_string(l.dcp) + "_i" +
         std::to_string(l.interleave);
}

const std::vector<Layout> kLayouts = {{1, 1, 1}, {2, 1, 1}, {2, 2, 1}, {4, 2, 1},
                                      {4, 4, 1}, {2, 2, 2}, {4, 2, 2}, {4, 4, 2}};

struct RankRun {
  Tensor logits, mtp_logits;
  std::vector<std::vector<int32_t>> topk;  // per layer: global positions, all rows
  std::vector<int32_t> greedy;
};

// Teacher-forced prompt (in chunks of `chunk`, 0 = all), its per-layer top-k, the MTP logits, and
// `greedy_n` greedy tokens, on the layout; rank 0's results.
RankRun run_layout(const std::string& fixture, const Layout& l, const std::vector<int32_t>& ids,
                   int chunk, int greedy_n, DcpCombine combine = DcpCombine::kAgRs) {
  ParallelConfig pc{l.tp, l.dcp, l.interleave, combine};
  CommOptions opts;
  opts.check_lockstep = true;
  opts.timeout_seconds = 60;
  RankRun out;
  std::mutex mu;
  const std::string dir = test::fixture_dir(fixture);
  run_on_thread_ranks(pc, opts, [&](const RankContext& rank) {
    auto model = load_rank_model(dir, rank);
    const ModelConfig& c = model->config();
    const int64_t n = int64_t(ids.size());
    SequenceKvCache cache = model->make_cache(n, /*with_mtp=*/true);
    RankRun r;
    r.logits = Tensor::empty({n, c.vocab_size}, DType::F32);
    r.topk.resize(size_t(c.n_layers));
    Tensor hidden = Tensor::empty({n, c.hidden_size}, DType::F32);
    const int64_t step = chunk > 0 ? chunk : n;
    for (int64_t b = 0; b < n; b += step) {
      const int64_t e = std::min(n, b + step);
      ForwardTrace trace;
      Tensor h = model->forward(
          Tensor::from_i32(std::vector<int32_t>(ids.begin() + b, ids.begin() + e), {e - b}), cache,
          &trace);
      Tensor dst = hidden.slice(b, e);
      dst.copy_from(h);
      Tensor ldst = r.logits.slice(b, e);
      ldst.copy_from(model->logits(h));
      for (int layer = 0; layer < c.n_layers; ++layer) {
        const Tensor& t = trace.topk[size_t(layer)];
        r.topk[size_t(layer)].insert(r.topk[size_t(layer)].end(), t.i32(), t.i32() + t.numel());
      }
    }
    if (n > 1) {
      Tensor y = model->mtp_forward(hidden.slice(0, n - 1),
                                    Tensor::from_i32(std::vector<int32_t>(ids.begin() + 1, ids.end()),
                                                     {n - 1}),
                                    cache);
      r.mtp_logits = model->mtp_logits(y);
    }
    GenerationParams gp;
    gp.max_new_tokens = greedy_n;
    gp.ignore_eos = true;
    gp.prefill_chunk = chunk;
    r.greedy = generate(*model, ids, gp).output_ids;
    if (rank.is_root()) {
      std::lock_guard<std::mutex> lock(mu);
      out = std::move(r);
    }
  });
  return out;
}

// Golden top-k file [layers, n, k] as per-layer vectors, each selection listed by position.
std::vector<std::vector<int32_t>> golden_topk(const std::string& fixture, const std::string& file) {
  const Tensor g = read_npy(test::fixture_dir(fixture) + "/goldens/" + file);
  const std::vector<int32_t> all = test::golden_topk_by_position(g);
  std::vector<std::vector<int32_t>> out(size_t(g.dim(0)));
  const size_t per = size_t(g.dim(1) * g.dim(2));
  for (size_t l = 0; l < out.size(); ++l) out[l].assign(all.begin() + std::ptrdiff_t(l * per), all.begin() + std::ptrdiff_t((l + 1) * per));
  return out;
}

class ParallelModel : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

// Every layout reproduces the single-rank model (= the HF goldens) on a golden prompt.
TEST_P(ParallelModel, MatchesSingleRankAndGoldens) {
  const auto [fixture, layout_index] = GetParam();
  const Layout l = kLayouts[size_t(layout_index)];
  const auto m = test::load_manifest(fixture);
  for (size_t pi : {m.at("prompts").size() - 1, size_t(1)}) {  // the longest prompt and a short one
    const auto& p = m.at("prompts").at(pi);
    SCOPED_TRACE(fixture + " " + name_of(l) + " prompt " + p.at("name").get<std::string>());
    const auto ids = p.at("ids").get<std::vector<int32_t>>();
    const auto greedy = p.at("greedy").get<std::vector<int32_t>>();
    const RankRun r = run_layout(fixture, l, ids, 0, int(greedy.size()));
    const std::string g = test::fixture_dir(fixture) + "/goldens/";
    EXPECT_LE(test::nmse(r.logits, read_npy(g + p.at("logits").get<std::string>())),
              tol::kGoldenLogitsNmse);
    EXPECT_LE(test::nmse(r.mtp_logits, read_npy(g + p.at("mtp_logits").get<std::string>())),
              tol::kGoldenLogitsNmse);
    EXPECT_EQ(r.topk, golden_topk(fixture, p.at("topk").get<std::string>()));
    EXPECT_EQ(r.greedy, greedy);
  }
}

std::string param_name(const ::testing::TestParamInfo<std::tuple<std::string, int>>& info) {
  return std::get<0>(info.param) + "_" + name_of(kLayouts[size_t(std::get<1>(info.param))]);
}

INSTANTIATE_TEST_SUITE_P(Layouts, ParallelModel,
                         ::testing::Combine(::testing::Values("glm_tiny", "dsv32_tiny", "glm_tiny_fp8"),
                                            ::testing::Range(0, int(kLayouts.size()))),
                         param_name);

// A one-token prompt on four DCP ranks: three ranks own no key at all, yet join every collective.
TEST(ParallelEdge, PromptShorterThanDcpGroup) {
  const auto m = test::load_manifest("glm_tiny");
  const auto& p = m.at("prompts").at(0);  // a single token
  const auto ids = p.at("ids").get<std::vector<int32_t>>();
  ASSERT_EQ(ids.size(), 1u);
  for (const Layout l : {Layout{4, 4, 1}, Layout{4, 4, 2}}) {
    const RankRun r = run_layout("glm_tiny", l, ids, 0, 12);
    EXPECT_EQ(r.greedy, p.at("greedy").get<std::vector<int32_t>>()) << name_of(l);
    EXPECT_LE(test::nmse(r.logits, read_npy(test::fixture_dir("glm_tiny") + "/goldens/" +
                                            p.at("logits").get<std::string>())),
              tol::kGoldenLogitsNmse);
  }
}

// Prefill chunks of 1 and 3 tokens with interleave 2 on four ranks: most chunks hold no key of
// some rank. Results equal the single-rank ones.
TEST(ParallelEdge, ChunksWithoutKeysOfSomeRank) {
  const auto m = test::load_manifest("dsv32_tiny");
  const auto& p = m.at("prompts").at(4);
  const auto ids = p.at("ids").get<std::vector<int32_t>>();
  const auto golden = golden_topk("dsv32_tiny", p.at("topk").get<std::string>());
  for (int chunk : {1, 3}) {
    const RankRun r = run_layout("dsv32_tiny", Layout{4, 4, 2}, ids, chunk, 6);
    EXPECT_EQ(r.topk, golden) << chunk;
    EXPECT_LE(test::nmse(r.logits, read_npy(test::fixture_dir("dsv32_tiny") + "/goldens/" +
                                            p.at("logits").get<std::string>())),
              tol::kGoldenLogitsNmse);
    const auto greedy = p.at("greedy").get<std::vector<int32_t>>();
    EXPECT_EQ(r.greedy, std::vector<int32_t>(greedy.begin(), greedy.begin() + 6)) << chunk;
  }
}

// The two DCP combines give bit-identical logits (same products, summed in the same order).
TEST(ParallelEdge, AgRsAndA2aAgreeBitwise) {
  const auto m = test::load_manifest("glm_tiny");
  const auto ids = m.at("prompts").at(5).at("ids").get<std::vector<int32_t>>();
  for (const Layout l : {Layout{4, 2, 1}, Layout{4, 4, 2}}) {
    const RankRun a = run_layout("glm_tiny", l, ids, 7, 4, DcpCombine::kAgRs);
    const RankRun b = run_layout("glm_tiny", l, ids, 7, 4, DcpCombine::kA2a);
    ASSERT_EQ(a.logits.shape(), b.logits.shape());
    EXPECT_EQ(std::memcmp(a.logits.raw(), b.logits.raw(), a.logits.nbytes()), 0) << name_of(l);
    EXPECT_EQ(a.greedy, b.greedy);
  }
}

// Layouts that cannot work are refused before any rank starts computing.
// Forwards every collective to the rank's communicator, counting those of each group.
class CountingComm final : public Communicator {
 public:
  explicit CountingComm(Communicator* inner) : inner_(inner) {}
  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  const CommOptions& options() const override { return inner_->options(); }
  void all_gather(const Group& g, const Tensor& in, Tensor& out) override {
    ++calls[g.name];
    inner_->all_gather(g, in, out);
  }
  void reduce_scatter(const Group& g, const Tensor& in, Tensor& out) override {
    ++calls[g.name];
    inner_->reduce_scatter(g, in, out);
  }
  void all_reduce(const Group& g, Tensor& inout) override {
    ++calls[g.name];
    inner_->all_reduce(g, inout);
  }
  void all_to_all(const Group& g, const Tensor& in, Tensor& out) override {
    ++calls[g.name];
    inner_->all_to_all(g, in, out);
  }
  void broadcast(const Group& g, Tensor& inout, int root_member) override {
    ++calls[g.name];
    inner_->broadcast(g, inout, root_member);
  }
  void barrier(const Group& g) override {
    ++calls[g.name];
    inner_->barrier(g);
  }
  void abort(const std::string& why) override { inner_->abort(why); }

  std::map<std::string, int64_t> calls;  // by group name

 private:
  Communicator* inner_;
};

// Collectives per decoder layer at TP2/DCP2: the DCP group exchanges once before attention (the
// queries, with the top-k candidates on layers with their own indexer) and combines in 2 (ag_rs)
// or 1 (a2a); the TP group sums the attention and the FFN. A prefill chunk and a decode step alike.
TEST(ParallelEdge, CollectivesPerLayer) {
  for (const std::string fixture : {"glm_tiny", "dsv32_tiny"})
    for (DcpCombine combine : {DcpCombine::kAgRs, DcpCombine::kA2a}) {
      const ParallelConfig pc{2, 2, 1, combine};
      CommOptions opts;
      opts.check_lockstep = true;
      opts.timeout_seconds = 60;
      std::mutex mu;
      std::vector<std::map<std::string, int64_t>> per_step;
      int layers = 0;
      run_on_thread_ranks(pc, opts, [&](const RankContext& rank) {
        CountingComm counting(rank.comm);
        RankContext mine = rank;
        mine.comm = &counting;
        auto model = load_rank_model(test::fixture_dir(fixture), mine);
        SequenceKvCache cache = model->make_cache(16, false);
        std::vector<std::map<std::string, int64_t>> mine_steps;
        for (const std::vector<int32_t>& rows : {std::vector<int32_t>{1, 2, 3, 4, 5}, {6}}) {
          counting.calls.clear();
          (void)model->forward(Tensor::from_i32(rows, {int64_t(rows.size())}), cache);
          mine_steps.push_back(counting.calls);
        }
        if (rank.comm->rank() == 0) {
          std::lock_guard<std::mutex> lock(mu);
          per_step = mine_steps;
          layers = model->config().n_layers;
        }
      });
      const int64_t dcp_per_layer = combine == DcpCombine::kAgRs ? 3 : 2;
      for (const auto& calls : per_step) {
        ASSERT_EQ(calls.size(), 2u) << fixture;  // the tp group and one dcp group
        for (const auto& [group, count] : calls) {
          const bool dcp = group.rfind("dcp", 0) == 0;
          EXPECT_EQ(count, layers * (dcp ? dcp_per_layer : 2)) << fixture << " group " << group;
        }
      }
      std::printf("[ info ] %s, %s: %lld DCP + 2 TP collectives per layer\n", fixture.c_str(),
                  combine == DcpCombine::kAgRs ? "ag_rs" : "a2a", static_cast<long long>(dcp_per_layer));
    }
}

TEST(ParallelEdge, InvalidLayoutsAreRefused) {
  const std::vector<int32_t> ids = {5, 6};
  GenerationParams gp;
  test::expect_error([&] { generate_on_ranks(test::fixture_dir("glm_tiny"), ids, gp, {3, 1, 1}); },
                     {"tp = 3", "num_attention_heads"});
  test::expect_error([&] { generate_on_ranks(test::fixture_dir("glm_tiny"), ids, gp, {4, 3, 1}); },
                     {"dcp = 3", "tp = 4"});
  test::expect_error([&] { generate_on_ranks(test::fixture_dir("glm_tiny"), ids, gp, {16, 1, 1}); },
                     {"tp = 16"});
}

}  // namespace
}  // namespace dsi
