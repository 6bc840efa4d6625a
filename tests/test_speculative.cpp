// MTP speculative decoding: greedy output identical to plain decoding for K = 1..3 at several
// parallel layouts; test-only drafters that are always right or wrong at position j (exactly j
// accepted), with the caches holding exactly the accepted tokens after every round; the MTP cache
// equal to a teacher-forced MTP run; and sampling with speculation distributed as without it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <mutex>
#include <numeric>

#include "model/safetensors.h"
#include "ops/sampling.h"
#include "runtime/generator.h"
#include "runtime/ranks.h"
#include "test_util.h"
#include "tolerances.h"

namespace dsi {
namespace {

std::vector<int32_t> prompt_of(const std::string& fixture, size_t index) {
  return test::load_manifest(fixture).at("prompts").at(index).at("ids").get<std::vector<int32_t>>();
}

GenerationParams greedy_params(int max_new, int k) {
  GenerationParams gp;
  gp.max_new_tokens = max_new;
  gp.ignore_eos = true;
  gp.speculative_tokens = k;
  return gp;
}

struct SpecLayout {
  int tp, dcp, interleave;
};

class SpeculativeGreedy
    : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

// Greedy output with K in {1, 2, 3} equals K = 0, at (tp, dcp) in {(1,1), (2,2), (4,4)}.
TEST_P(SpeculativeGreedy, SameTokensAsPlainDecoding) {
  const auto [fixture, li] = GetParam();
  const SpecLayout l = std::vector<SpecLayout>{{1, 1, 1}, {2, 2, 1}, {4, 4, 2}}[size_t(li)];
  const std::vector<int32_t> prompt = prompt_of(fixture, 4);
  const std::vector<int32_t> want =
      generate(test::fixture_model(fixture), prompt, greedy_params(20, 0)).output_ids;
  ParallelConfig pc{l.tp, l.dcp, l.interleave, DcpCombine::kAgRs};
  for (int k : {1, 2, 3}) {
    CommOptions opts{true, 60};
    std::mutex mu;
    GenerationResult got;
    run_on_thread_ranks(pc, opts, [&](const RankContext& rank) {
      auto model = load_rank_model(test::fixture_dir(fixture), rank);
      GenerationResult r = generate(*model, prompt, greedy_params(20, k));
      std::lock_guard<std::mutex> lock(mu);
      if (rank.is_root()) got = std::move(r);
    });
    EXPECT_EQ(got.output_ids, want) << fixture << " K " << k << " tp " << l.tp << " dcp " << l.dcp;
    const SpeculativeStats& st = got.speculative;
    EXPECT_GT(st.rounds, 0);
    EXPECT_EQ(st.drafted_at.size(), size_t(k));
    EXPECT_LE(st.accepted, st.drafted);
    EXPECT_EQ(st.drafted, std::accumulate(st.drafted_at.begin(), st.drafted_at.end(), int64_t(0)));
    EXPECT_EQ(st.accepted, std::accumulate(st.accepted_at.begin(), st.accepted_at.end(), int64_t(0)));
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, SpeculativeGreedy,
                         ::testing::Combine(::testing::Values("glm_tiny", "dsv32_tiny"),
                                            ::testing::Range(0, 3)));

// Greedy decoding with penalties (presence, frequency, repetition): each token is the argmax of
// the teacher-forced logits penalised by this test's own reading of the formulas (prompt set,
// counts of the tokens generated before it), penalties change some choices, and speculative
// decoding with K = 1..3 (the drafts penalised over the drafts before them) emits the same tokens,
// also at tp 2 / dcp 2.
TEST(SpeculativePenalties, GreedyFollowsTheFormulasAndStaysLossless) {
  for (const std::string fixture : {"glm_tiny", "dsv32_tiny"}) {
    const DsaModel& model = test::fixture_model(fixture);
    const std::vector<int32_t> prompt = prompt_of(fixture, 4);
    // A repetition penalty below 1 and a negative presence penalty favour tokens already seen (the
    // tiny models' greedy output rarely repeats one), the frequency penalty then holds repeats back.
    const float presence = -1.5f, frequency = 1.0f, repetition = 0.7f;
    GenerationParams gp = greedy_params(24, 0);
    gp.sampling.presence_penalty = presence;
    gp.sampling.frequency_penalty = frequency;
    gp.sampling.repetition_penalty = repetition;
    const std::vector<int32_t> out = generate(model, prompt, gp).output_ids;
    ASSERT_EQ(out.size(), 24u);

    std::vector<int32_t> seq = prompt;
    seq.insert(seq.end(), out.begin(), out.end() - 1);
    const Tensor logits = prompt_logits(model, seq, 0, false).logits;
    const int64_t V = logits.dim(1), P = int64_t(prompt.size());
    int changed = 0;
    for (size_t i = 0; i < out.size(); ++i) {
      const float* l = logits.f32() + (P - 1 + int64_t(i)) * V;
      std::vector<double> pen(l, l + V);
      std::map<int32_t, int> count;
      for (size_t j = 0; j < i; ++j) ++count[out[j]];
      for (int64_t t = 0; t < V; ++t) {
        const bool seen = count.count(int32_t(t)) ||
                          std::find(prompt.begin(), prompt.end(), int32_t(t)) != prompt.end();
        if (seen) pen[size_t(t)] = l[t] > 0 ? double(l[t]) / repetition : double(l[t]) * repetition;
        if (count.count(int32_t(t))) pen[size_t(t)] -= double(frequency) * count[int32_t(t)] + presence;
      }
      const auto argmax = [&](auto&& x) {
        return int32_t(std::max_element(x.begin(), x.end()) - x.begin());
      };
      EXPECT_EQ(out[i], argmax(pen)) << fixture << " token " << i;
      changed += argmax(std::vector<float>(l, l + V)) != out[i];
    }
    EXPECT_GT(changed, 0) << fixture << ": the penalties never changed a choice; the test is vacuous";

    for (int k : {1, 2, 3}) {
      gp.speculative_tokens = k;
      EXPECT_EQ(generate(model, prompt, gp).output_ids, out) << fixture << " K " << k;
    }
    ParallelConfig pc{2, 2, 1, DcpCombine::kAgRs};
    GenerationResult got;
    std::mutex mu;
    run_on_thread_ranks(pc, CommOptions{true, 60}, [&](const RankContext& rank) {
      auto m = load_rank_model(test::fixture_dir(fixture), rank);
      GenerationResult r = generate(*m, prompt, gp);
      std::lock_guard<std::mutex> lock(mu);
      if (rank.is_root()) got = std::move(r);
    });
    EXPECT_EQ(got.output_ids, out) << fixture << " tp 2 dcp 2 K 3";
  }
}

// Proposes the target's own greedy continuation, optionally wrong at one draft position.
class ScriptedDrafter final : public Drafter {
 public:
  ScriptedDrafter(std::vector<int32_t> continuation, size_t prompt_len, int wrong_at)
      : cont_(std::move(continuation)), prompt_len_(prompt_len), wrong_at_(wrong_at) {}
  Draft propose(const DraftContext& ctx) override {
    Draft d;
    const size_t done = ctx.sequence.size() - prompt_len_;  // output tokens accepted so far
    for (int j = 0; j < ctx.k; ++j) {
      const size_t i = done + size_t(j);
      int32_t tok = cont_.at(i);
      if (j == wrong_at_) tok = tok == 3 ? 4 : 3;  // any other token is wrong
      d.tokens.push_back(tok);
    }
    return d;
  }
  void rewind(int64_t) override {}

 private:
  std::vector<int32_t> cont_;
  size_t prompt_len_;
  int wrong_at_;
};

// Compares every cache row of positions [0, length) with a fresh prefill of the same tokens.
void expect_cache_matches_prefill(const DsaModel& model, const std::vector<int32_t>& tokens,
                                  const SequenceKvCache& cache) {
  const int64_t len = cache.length();
  ASSERT_EQ(len, int64_t(tokens.size()));
  SequenceKvCache ref = model.make_cache(len, false);
  model.forward(Tensor::from_i32(tokens, {len}), ref);
  for (int l = 0; l < model.config().n_layers; ++l) {
    const LayerKvCache& mine = cache.layer(l);
    EXPECT_LE(test::nmse(mine.latent.slice(0, len), ref.layer(l).latent.slice(0, len)),
              tol::kSelfConsistencyNmse)
        << "layer " << l;
    if (mine.index_keys.defined()) {
      EXPECT_LE(test::nmse(mine.index_keys.slice(0, len), ref.layer(l).index_keys.slice(0, len)),
                tol::kSelfConsistencyNmse);
    }
  }
}

// A drafter that is always right: every draft accepted; one wrong at position j: exactly j
// accepted per round. After each round the target caches hold exactly the accepted tokens.
TEST(SpeculativeScripted, AcceptanceIsExactAndCachesHoldOnlyAcceptedTokens) {
  const DsaModel& model = test::fixture_model("glm_tiny");
  const std::vector<int32_t> prompt = prompt_of("glm_tiny", 3);
  const int max_new = 17, K = 3;
  const std::vector<int32_t> cont =
      generate(model, prompt, greedy_params(max_new, 0)).output_ids;
  for (int wrong_at : {-1, 0, 1, 2}) {
    SCOPED_TRACE("wrong at " + std::to_string(wrong_at));
    int rounds_checked = 0;
    const GenerationResult r = generate_with(
        model, prompt, greedy_params(max_new, K),
        [&](SequenceKvCache&) { return std::make_unique<ScriptedDrafter>(cont, prompt.size(), wrong_at); },
        [&](const std::vector<int32_t>& seq, const SequenceKvCache& cache) {
          // Every emitted token but the last is in the caches, and nothing else.
          const std::vector<int32_t> kept(seq.begin(), seq.end() - 1);
          expect_cache_matches_prefill(model, kept, cache);
          ++rounds_checked;
        });
    EXPECT_EQ(r.output_ids, cont);
    const SpeculativeStats& st = r.speculative;
    ASSERT_GT(st.rounds, 0);
    EXPECT_GT(rounds_checked, 1);
    for (size_t j = 0; j < st.drafted_at.size(); ++j) {
      if (st.drafted_at[j] == 0) continue;
      const bool expect_all = wrong_at < 0 || int(j) < wrong_at;
      EXPECT_EQ(st.accepted_at[j], expect_all ? st.drafted_at[j] : 0) << "position " << j;
    }
    if (wrong_at < 0) {
      EXPECT_EQ(st.accepted, st.drafted);
    }
    if (wrong_at >= 0) {  // each full round accepts exactly wrong_at drafts
      EXPECT_LE(st.accepted, int64_t(wrong_at) * st.rounds);
    }
  }
}

// With the MTP drafter, after every round the MTP cache holds exactly the positions whose target
// states are known, each equal to a teacher-forced MTP run over the accepted tokens.
TEST(SpeculativeMtp, DraftCacheHoldsOnlyTeacherForcedRows) {
  const DsaModel& model = test::fixture_model("dsv32_tiny");
  const std::vector<int32_t> prompt = prompt_of("dsv32_tiny", 3);
  int checked = 0;
  generate_with(
      model, prompt, greedy_params(14, 2),
      [&](SequenceKvCache& cache) { return std::make_unique<MtpDrafter>(model, cache); },
      [&](const std::vector<int32_t>& seq, const SequenceKvCache& cache) {
        const int64_t m = cache.mtp_length();
        if (m == 0) return;  // before the first draft
        ASSERT_LE(m, cache.length());
        // Reference: target states of positions [0, m) and the MTP layer over (h_i, t_{i+1}).
        SequenceKvCache ref = model.make_cache(m + 1, true);
        Tensor h = model.forward(Tensor::from_i32(std::vector<int32_t>(seq.begin(), seq.begin() + m), {m}), ref);
        model.mtp_forward(h, Tensor::from_i32(std::vector<int32_t>(seq.begin() + 1, seq.begin() + m + 1), {m}), ref);
        EXPECT_LE(test::nmse(cache.mtp().latent.slice(0, m), ref.mtp().latent.slice(0, m)),
                  tol::kSelfConsistencyNmse);
        EXPECT_LE(test::nmse(cache.mtp().index_keys.slice(0, m), ref.mtp().index_keys.slice(0, m)),
                  tol::kSelfConsistencyNmse);
        ++checked;
      });
  EXPECT_GT(checked, 2);
}

// Drafts by sampling the target model itself at a higher temperature: its proposals overlap the
// target distribution a lot without equalling it, so acceptance, rejection and the residual
// correction all happen often (a random-weight MTP layer is rarely accepted, which would leave the
// test with little power).
class FlattenedSelfDrafter final : public Drafter {
 public:
  explicit FlattenedSelfDrafter(const DsaModel& model) : model_(model) {}
  Draft propose(const DraftContext& ctx) override {
    Draft d;
    std::vector<int32_t> seq = ctx.sequence;
    SequenceKvCache cache = model_.make_cache(int64_t(seq.size()) + ctx.k, false);
    Tensor h = model_.forward(Tensor::from_i32(seq, {int64_t(seq.size())}), cache);
    std::uniform_real_distribution<double> uniform(0.0, 1.0);
    for (int j = 0; j < ctx.k; ++j) {
      const Tensor logits = model_.logits(h.slice(h.dim(0) - 1, h.dim(0))).view({model_.config().vocab_size});
      std::vector<double> q = ops::token_distribution(logits, 2.0f * ctx.sampling.temperature, 1.0f);
      d.tokens.push_back(ops::draw_token(q, uniform(ctx.rng)));
      d.dists.push_back(std::move(q));
      h = model_.forward(Tensor::from_i32({d.tokens.back()}, {1}), cache);
    }
    return d;
  }
  void rewind(int64_t) override {}

 private:
  const DsaModel& model_;
};

// Chi-square test of homogeneity between two samples of token ids (categories seen at least 10
// times in total; the rest pooled). Returns (chi2, critical value at alpha = 0.001, df).
struct ChiSquare {
  double chi2 = 0, critical = 0;
  int df = 0;
};
ChiSquare homogeneity(const std::map<int32_t, int>& a, const std::map<int32_t, int>& b) {
  std::map<int32_t, int> total;
  for (auto [tok, c] : a) total[tok] += c;
  for (auto [tok, c] : b) total[tok] += c;
  auto count = [](const std::map<int32_t, int>& m, int32_t t) {
    auto it = m.find(t);
    return it == m.end() ? 0.0 : double(it->second);
  };
  std::vector<std::pair<double, double>> cells;
  double pooled_a = 0, pooled_b = 0;
  for (auto [tok, c] : total) {
    if (c >= 10) {
      cells.push_back({count(a, tok), count(b, tok)});
    } else {
      pooled_a += count(a, tok);
      pooled_b += count(b, tok);
    }
  }
  if (pooled_a + pooled_b > 0) cells.push_back({pooled_a, pooled_b});
  ChiSquare r;
  for (auto [x, y] : cells) {
    const double e = (x + y) / 2.0;  // equal sample sizes
    r.chi2 += (x - e) * (x - e) / e + (y - e) * (y - e) / e;
  }
  r.df = int(cells.size()) - 1;
  // Critical value at alpha = 0.001 by the Wilson-Hilferty approximation (z = 3.0902).
  const double z = 3.0902, h = 2.0 / (9.0 * r.df);
  r.critical = r.df * std::pow(1.0 - h + z * std::sqrt(h), 3.0);
  return r;
}

// Chi-square goodness of fit of observed counts to probabilities `p` (cells with expected count
// >= 5; the rest pooled). Returns (chi2, critical value at alpha = 0.001, df).
ChiSquare goodness_of_fit(const std::map<int32_t, int>& observed, const std::vector<double>& p,
                          int n) {
  ChiSquare r;
  double pooled_o = 0, pooled_e = 0;
  int cells = 0;
  for (size_t t = 0; t < p.size(); ++t) {
    auto it = observed.find(int32_t(t));
    const double o = it == observed.end() ? 0.0 : double(it->second), e = p[t] * n;
    if (p[t] == 0.0) {
      EXPECT_EQ(o, 0.0) << "token " << t << " has probability 0 but was emitted";
      continue;
    }
    if (e >= 5) {
      r.chi2 += (o - e) * (o - e) / e;
      ++cells;
    } else {
      pooled_o += o;
      pooled_e += e;
    }
  }
  if (pooled_e > 0) {
    r.chi2 += (pooled_o - pooled_e) * (pooled_o - pooled_e) / pooled_e;
    ++cells;
  }
  r.df = cells - 1;
  const double z = 3.0902, h = 2.0 / (9.0 * r.df);
  r.critical = r.df * std::pow(1.0 - h + z * std::sqrt(h), 3.0);
  return r;
}

// The acceptance rule is exact: whatever the draft distribution q, the first emitted token of a
// round is distributed as the target's p_0, and given that the first draft was accepted, the second
// emitted token as p_1. 40000 seeded rounds over a 6-token vocabulary (temperature 0.8 with top_p
// 0.9, with top_k 3, with min_p 0.3), chi-square goodness of fit at alpha = 0.001. Fails when
// acceptance uses 2 p/q instead of p/q, or when a rejection draws from p instead of the residual
// max(p - q, 0).
TEST(SpeculativeSampling, RejectionSamplingEmitsTheTargetDistribution) {
  const int64_t vocab = 6;
  const Tensor logits = Tensor::from_f32({2.0f, 1.5f, 0.3f, -1.0f, 0.8f, 0.0f,    // p_0
                                          0.1f, -0.5f, 1.9f, 0.4f, 1.2f, -2.0f,   // p_1
                                          0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f},    // p_2
                                         {3, vocab});
  for (int setting = 0; setting < 3; ++setting) {
    SCOPED_TRACE("setting " + std::to_string(setting));
    SamplingParams sp;
    sp.temperature = 0.8f;
    if (setting == 0) sp.top_p = 0.9f;
    if (setting == 1) sp.top_k = 3;
    if (setting == 2) sp.min_p = 0.3f;
    auto row = [&](int j) { return logits.slice(j, j + 1).view({vocab}); };
    const std::vector<double> p0 = ops::token_distribution(row(0), sp);
    const std::vector<double> p1 = ops::token_distribution(row(1), sp);
    // Draft distributions that overlap the targets only partly.
    const std::vector<double> q0 = {0.05, 0.10, 0.40, 0.05, 0.30, 0.10};
    const std::vector<double> q1 = {0.30, 0.05, 0.20, 0.05, 0.10, 0.30};
    std::mt19937_64 rng(2024 + uint64_t(setting));
    std::uniform_real_distribution<double> uniform(0.0, 1.0);
    const int n = 40000;
    std::map<int32_t, int> first, second;
    int accepted_first = 0;
    for (int i = 0; i < n; ++i) {
      Draft d;
      d.tokens = {ops::draw_token(q0, uniform(rng)), ops::draw_token(q1, uniform(rng))};
      d.dists = {q0, q1};
      const Verdict v = verify_drafts(logits, d, sp, rng);
      ++first[v.accepted >= 1 ? d.tokens[0] : v.next];
      if (v.accepted >= 1) {
        ++accepted_first;
        ++second[v.accepted >= 2 ? d.tokens[1] : v.next];
      }
    }
    const ChiSquare a = goodness_of_fit(first, p0, n);
    EXPECT_LT(a.chi2, a.critical) << "first token: chi2 " << a.chi2 << " df " << a.df;
    const ChiSquare b = goodness_of_fit(second, p1, accepted_first);
    EXPECT_LT(b.chi2, b.critical) << "second token: chi2 " << b.chi2 << " df " << b.df;
    EXPECT_GT(accepted_first, n / 10);  // both paths (accept and reject) are exercised
    EXPECT_LT(accepted_first, n * 9 / 10);
  }
}

// End to end: sampling with speculation gives the same token distribution as without. 400 seeded
// runs of each (temperature 1, top_p 0.9) generate 3 tokens; the 2nd and 3rd come from speculative
// rounds (K = 2). Their distributions are compared by a chi-square test of homogeneity at
// alpha = 0.001 per test. Seeds are fixed, so the outcome is deterministic. (The 2nd token's
// distribution mixes over the random 1st token, so this test is weaker than the one above; it
// checks that generation wires the drafts, the verification and the caches together correctly.)
TEST(SpeculativeSampling, SameDistributionAsPlainSampling) {
  const DsaModel& model = test::fixture_model("glm_tiny");
  const std::vector<int32_t> prompt = prompt_of("glm_tiny", 2);
  const int runs = 400;
  std::map<int32_t, int> counts[2][2];  // [speculative?][2nd or 3rd token]
  SpeculativeStats stats;
  for (int spec = 0; spec < 2; ++spec)
    for (int s = 0; s < runs; ++s) {
      GenerationParams gp = greedy_params(3, spec ? 2 : 0);
      gp.sampling.temperature = 1.0f;
      gp.sampling.top_p = 0.9f;
      gp.sampling.seed = uint64_t(1000003 * s + 17 * spec);
      const GenerationResult r = generate_with(model, prompt, gp, [&](SequenceKvCache&) {
        return std::make_unique<FlattenedSelfDrafter>(model);
      });
      ASSERT_EQ(r.output_ids.size(), 3u);
      ++counts[spec][0][r.output_ids[1]];
      ++counts[spec][1][r.output_ids[2]];
      stats.drafted += r.speculative.drafted;
      stats.accepted += r.speculative.accepted;
    }
  // The drafter must be neither always right nor always wrong for the test to mean something.
  EXPECT_GT(stats.acceptance_rate(), 0.2);
  EXPECT_LT(stats.acceptance_rate(), 0.9);
  for (int pos = 0; pos < 2; ++pos) {
    const ChiSquare c = homogeneity(counts[0][pos], counts[1][pos]);
    EXPECT_GE(c.df, 3) << "too few categories for a meaningful test";
    EXPECT_LT(c.chi2, c.critical) << "token " << pos + 2 << ": chi2 " << c.chi2 << " df " << c.df;
  }
}

// GLM-5.2's index_share_for_mtp_iteration: a chained draft step skips the MTP indexer and reuses
// the first step's selection; greedy output stays that of plain decoding.
TEST(SpeculativeMtp, IndexShareReusesTheFirstStepSelection) {
  ModelConfig cfg = load_config(test::fixture_dir("glm_tiny") + "/config.json");
  cfg.index_share_for_mtp_iteration = true;
  const Checkpoint ck = Checkpoint::open(test::fixture_dir("glm_tiny"));
  ModelWeights w = load_weights(ck, cfg);
  const DsaModel model(cfg, std::move(w));
  const std::vector<int32_t> prompt = prompt_of("glm_tiny", 4);
  // Direct: step 1 over the prompt's rows fills the shared selection; step 2 reuses it.
  const int64_t n = int64_t(prompt.size());
  SequenceKvCache cache = model.make_cache(n + 2, true);
  Tensor h = model.forward(Tensor::from_i32(prompt, {n}), cache);
  DcpTopk share;
  ForwardTrace t1, t2;
  std::vector<int32_t> next(prompt.begin() + 1, prompt.end());
  next.push_back(7);
  Tensor y = model.mtp_forward(h, Tensor::from_i32(next, {n}), cache, &t1, &share);
  ASSERT_TRUE(share.local.defined());
  model.mtp_forward(y.slice(n - 1, n), Tensor::from_i32({9}, {1}), cache, &t2, &share);
  const Tensor& first_last_row = t1.topk[0];
  const Tensor& second = t2.topk[0];
  ASSERT_EQ(second.dim(0), 1);
  for (int64_t j = 0; j < second.dim(1); ++j)
    EXPECT_EQ(second.i32()[j], first_last_row.i32()[(n - 1) * first_last_row.dim(1) + j]);
  EXPECT_EQ(generate(model, prompt, greedy_params(12, 3)).output_ids,
            generate(model, prompt, greedy_params(12, 0)).output_ids);
}

TEST(SpeculativeErrors, NeedsAnMtpLayer) {
  test::TempDir d;
  // glm_tiny without its MTP layer: copy config and weights minus model.layers.4.*
  auto f = SafetensorsFile::open(test::fixture_dir("glm_tiny") + "/model.safetensors");
  std::vector<std::pair<std::string, Tensor>> t;
  for (const auto& [name, info] : f->tensors())
    if (name.rfind("model.layers.4.", 0) != 0) t.push_back({name, f->get(name).contiguous()});
  write_safetensors(d.path() + "/model.safetensors", t);
  std::filesystem::copy_file(test::fixture_dir("glm_tiny") + "/config.json", d.path() + "/config.json");
  ModelConfig cfg = load_config(d.path() + "/config.json");
  cfg.n_mtp_layers = -1;
  const Checkpoint ck = Checkpoint::open(d.path());
  ModelWeights w = load_weights(ck, cfg);
  const DsaModel model(cfg, std::move(w));
  test::expect_error([&] { generate(model, {5, 6}, greedy_params(4, 2)); }, {"MTP layer"});
}

}  // namespace
}  // namespace dsi
