// The serving engine: many requests at once through continuous batching over paged caches give
// each request exactly the tokens the single-sequence generator gives it (greedy, and sampled with
// a seed, with and without penalties), whatever the batch, the chunking, the preemptions or the
// parallel layout; cancellation, bad requests and the bookkeeping (no page or request left behind).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <fstream>
#include <mutex>
#include <numeric>
#include <string>
#include <thread>

#include "dsinfer/engine.h"
#include "model/dsa_model.h"
#include "runtime/generator.h"
#include "runtime/ranks.h"
#include "test_util.h"
#include "tolerances.h"

namespace dsi {
namespace {

// Collects one request's events; wait() blocks until the final one.
struct Collector {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int32_t> ids;
  std::vector<GeneratedToken> tokens;
  std::vector<GeneratedToken> prompt;  // prompt logprobs, in order
  int prompt_events = 0;
  bool prompt_after_tokens = false;    // a prompt record came after a generated token
  bool done = false;
  std::string reason, error;
  int events = 0;
  int64_t cached = 0;  // prompt tokens from the prefix cache (the final event's count)

  EventSink sink() {
    return [this](RequestEvent&& ev) {
      std::lock_guard<std::mutex> lock(mu);
      ++events;
      if (!ev.prompt_logprobs.empty()) ++prompt_events;
      for (auto& t : ev.prompt_logprobs) {
        if (!tokens.empty()) prompt_after_tokens = true;
        prompt.push_back(t);
      }
      for (auto& t : ev.tokens) {
        ids.push_back(t.id);
        tokens.push_back(t);
      }
      if (ev.finished) {
        cached = ev.cached_tokens;
        done = true;
        reason = ev.finish_reason;
        error = ev.error;
        cv.notify_all();
      }
    };
  }
  bool wait(double seconds = 300) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return done; });
  }
};

struct Case {
  std::vector<int32_t> prompt;
  int max_new = 0;
  float temperature = 0.0f;
  uint64_t seed = 0;
  float presence = 0.0f, frequency = 0.0f, repetition = 1.0f;  // sampling's penalties
};

std::vector<Case> make_cases(int vocab, int count, uint64_t seed, int min_new, bool sampled) {
  std::vector<Case> cases;
  const std::vector<float> r = test::random_floats(size_t(count) * 40, seed);
  for (int i = 0; i < count; ++i) {
    Case c;
    const int len = 1 + int((r[size_t(i)] + 1.0f) * 20.0f);  // 1 .. 40 tokens
    for (int j = 0; j < len; ++j)
      c.prompt.push_back(int32_t((r[size_t(i * 40 + j)] + 1.0f) * 0.5f * float(vocab - 1)));
    c.max_new = min_new + i % 9;
    c.temperature = (sampled && i % 3 == 2) ? 0.9f : 0.0f;
    c.seed = 1000 + uint64_t(i);
    if (i % 4 == 1) {  // penalties over the prompt and the output, greedy and sampled
      c.presence = 0.6f;
      c.frequency = 0.4f;
      c.repetition = 1.3f;
    }
    cases.push_back(c);
  }
  return cases;
}

GenerationResult reference(const std::string& dir, const Case& c, int K) {
  auto model = DsaModel::load(dir);
  GenerationParams gp;
  gp.max_new_tokens = c.max_new;
  gp.ignore_eos = true;
  gp.speculative_tokens = K;
  gp.sampling.temperature = c.temperature;
  gp.sampling.seed = c.seed;
  gp.sampling.presence_penalty = c.presence;
  gp.sampling.frequency_penalty = c.frequency;
  gp.sampling.repetition_penalty = c.repetition;
  return generate(*model, c.prompt, gp);
}

EngineRequest request_of(const Case& c) {
  EngineRequest r;
  r.prompt = c.prompt;
  r.max_new_tokens = c.max_new;
  r.ignore_eos = true;
  r.sampling.temperature = c.temperature;
  r.sampling.seed = c.seed;
  r.sampling.presence_penalty = c.presence;
  r.sampling.frequency_penalty = c.frequency;
  r.sampling.repetition_penalty = c.repetition;
  return r;
}

// Runs every case through one engine at once and checks each against the generator.
void expect_same_as_generator(const std::string& dir, EngineOptions o, int n_cases,
                              bool expect_preemption = false, int min_new = 4,
                              bool sampled = true) {
  o.model_dir = dir;
  const ModelConfig cfg = load_config(dir + "/config.json");
  const std::vector<Case> cases = make_cases(int(cfg.vocab_size), n_cases, 7, min_new, sampled);
  auto engine = Engine::start(o);
  std::vector<std::unique_ptr<Collector>> got;
  for (const Case& c : cases) {
    got.push_back(std::make_unique<Collector>());
    engine->submit(request_of(c), got.back()->sink());
  }
  for (size_t i = 0; i < cases.size(); ++i) {
    ASSERT_TRUE(got[i]->wait()) << "request " << i << " did not finish";
    EXPECT_EQ(got[i]->reason, "length") << got[i]->error;
    const GenerationResult ref = reference(dir, cases[i], o.speculative_tokens);
    EXPECT_EQ(got[i]->ids, ref.output_ids) << "request " << i << " (prompt of "
                                           << cases[i].prompt.size() << " tokens, temperature "
                                           << cases[i].temperature << ")";
  }
  const EngineMetrics m = engine->metrics();
  EXPECT_EQ(m.running, 0);
  EXPECT_EQ(m.waiting, 0);
  EXPECT_EQ(m.kv_pages_used, 0);
  EXPECT_EQ(m.requests_finished, n_cases);
  if (expect_preemption) {
    EXPECT_GT(m.preemptions, 0);
  }
  if (o.speculative_tokens > 0) {
    EXPECT_GT(m.num_drafts, 0);
    EXPECT_EQ(int64_t(m.accepted_per_pos.size()), o.speculative_tokens);
  }
}

// Prompts that share prefixes, in waves: each wave is submitted once the one before it finished,
// so later waves find the earlier waves' blocks in the prefix cache (and requests of one wave find
// each other's once computed). `base` tokens of a random stream; the cases take leading parts of it
// and their own tails, or repeat another case's prompt exactly.
struct Wave {
  std::vector<Case> cases;
};

std::vector<Wave> shared_prefix_waves(int vocab, int64_t block, bool sampled) {
  const std::vector<float> r = test::random_floats(8000, 11);
  size_t at = 0;
  auto tokens = [&](int64_t n) {
    std::vector<int32_t> t;
    for (int64_t i = 0; i < n; ++i) t.push_back(int32_t((r[at++ % r.size()] + 1.0f) * 0.5f * float(vocab - 1)));
    return t;
  };
  const std::vector<int32_t> base = tokens(3 * block + 20);
  auto head = [&](int64_t n, int64_t tail) {
    std::vector<int32_t> t(base.begin(), base.begin() + n);
    const std::vector<int32_t> more = tokens(tail);
    t.insert(t.end(), more.begin(), more.end());
    return t;
  };
  auto c = [&](std::vector<int32_t> prompt, int max_new, float temperature, uint64_t seed) {
    Case k;
    k.prompt = std::move(prompt);
    k.max_new = max_new;
    k.temperature = sampled ? temperature : 0.0f;
    k.seed = seed;
    return k;
  };
  std::vector<Wave> waves(3);
  waves[0].cases = {c(head(2 * block + 5, 7), 6, 0.0f, 1), c(head(block + 3, 2), 9, 0.8f, 2)};
  waves[1].cases = {c(head(2 * block + 5, 9), 7, 0.8f, 3),                 // 2 blocks of wave 0
                    c(std::vector<int32_t>(base.begin(), base.end()), 5, 0.0f, 4),  // all of base
                    c(waves[0].cases[1].prompt, 8, 0.0f, 5),                 // a repeat
                    c(head(block, 4), 6, 0.8f, 6),  // block 0 with another next token: no match
                    c(tokens(block + 9), 5, 0.0f, 7)};
  waves[2].cases = {c(std::vector<int32_t>(base.begin(), base.end()), 6, 0.8f, 8),  // a repeat
                    c(head(3 * block + 1, 3), 4, 0.0f, 9), c(head(block / 2, 30), 5, 0.0f, 10)};
  return waves;
}

// Shared prompt tokens of `c` with any earlier case of the waves (an upper bound on its hit).
int64_t shared_with_earlier(const std::vector<Wave>& waves, size_t w, size_t i) {
  const std::vector<int32_t>& p = waves[w].cases[i].prompt;
  int64_t most = 0;
  for (size_t v = 0; v <= w; ++v)
    for (size_t j = 0; j < waves[v].cases.size() && (v < w || j < i); ++j) {
      const std::vector<int32_t>& q = waves[v].cases[j].prompt;
      const size_t n = std::min(p.size(), q.size());
      most = std::max<int64_t>(most, std::mismatch(p.begin(), p.begin() + long(n), q.begin()).first - p.begin());
    }
  return most;
}

// Runs the waves through one engine and checks every request against the generator; returns the
// tokens each request took from the prefix cache, by wave (and the engine's metrics at the end).
std::vector<std::vector<int64_t>> expect_waves_match(const std::string& dir, EngineOptions o,
                                                     const std::vector<Wave>& waves, int64_t block,
                                                     EngineMetrics* metrics = nullptr) {
  o.model_dir = dir;
  auto engine = Engine::start(o);
  std::vector<std::vector<int64_t>> cached(waves.size());
  int64_t finished = 0;
  for (size_t w = 0; w < waves.size(); ++w) {
    std::vector<std::unique_ptr<Collector>> got;
    for (const Case& c : waves[w].cases) {
      got.push_back(std::make_unique<Collector>());
      engine->submit(request_of(c), got.back()->sink());
    }
    for (size_t i = 0; i < got.size(); ++i) {
      const Case& c = waves[w].cases[i];
      SCOPED_TRACE("wave " + std::to_string(w) + " request " + std::to_string(i) + " (prompt of " +
                   std::to_string(c.prompt.size()) + " tokens, temperature " + std::to_string(c.temperature) + ")");
      EXPECT_TRUE(got[i]->wait());
      EXPECT_EQ(got[i]->reason, "length") << got[i]->error;
      EXPECT_EQ(got[i]->ids, reference(dir, c, o.speculative_tokens).output_ids);
      // Whole blocks, never past what the prompt shares with earlier ones, never the whole prompt.
      EXPECT_EQ(got[i]->cached % block, 0);
      EXPECT_LE(got[i]->cached, shared_with_earlier(waves, w, i));
      EXPECT_LT(got[i]->cached, int64_t(c.prompt.size()));
      cached[w].push_back(got[i]->cached);
      ++finished;
    }
  }
  const EngineMetrics m = engine->metrics();
  EXPECT_EQ(m.kv_pages_used, 0);
  EXPECT_EQ(m.requests_finished, finished);
  int64_t hits = 0;
  for (const auto& w : cached) hits = std::accumulate(w.begin(), w.end(), hits);
  EXPECT_EQ(m.prefix_cache_hits, hits);
  if (o.prefix_caching) {
    EXPECT_GT(m.kv_pages_cached, 0);
  }
  if (metrics != nullptr) *metrics = m;
  return cached;
}

TEST(Engine, PrefixCacheServesSharedPromptsAsComputedOnes) {
  const std::string dir = test::fixture_dir("glm_tiny");
  const int vocab = int(load_config(dir + "/config.json").vocab_size);
  EngineOptions o;
  o.max_num_seqs = 4;
  o.max_num_batched_tokens = 48;  // prompts in several chunks
  o.kv_cache_memory = 64 << 20;
  const std::vector<Wave> waves = shared_prefix_waves(vocab, 64, true);
  const auto cached = expect_waves_match(dir, o, waves, 64);
  // The pool is large, so nothing was evicted: the hits are what earlier requests computed.
  EXPECT_EQ(cached[0][1], 64);    // admitted while the first request's prefill passed its block 0
  EXPECT_EQ(cached[1][0], 128);
  EXPECT_EQ(cached[1][1], 128);   // wave 0 computed blocks 0 and 1 of base; this one block 2
  EXPECT_EQ(cached[1][2], 64);    // the repeat of a 67-token prompt
  EXPECT_EQ(cached[1][3], 0);     // block 0 followed by another token
  EXPECT_EQ(cached[1][4], 0);
  EXPECT_EQ(cached[2][0], 192);   // base again: its last block lacks a next token
  EXPECT_EQ(cached[2][1], 192);
  EXPECT_EQ(cached[2][2], 0);

  o.prefix_caching = false;
  for (const auto& w : expect_waves_match(dir, o, waves, 64))
    for (int64_t c : w) EXPECT_EQ(c, 0);
}

// One prompt sent three times at once (a request's n choices): the first computes it, the others
// wait for its blocks and take them (2 of its 2 full blocks with a next token), all sampled
// differently and each the generator's; with chunks smaller than the prompt as well.
TEST(Engine, PrefixCacheSharesAPromptSentTogether) {
  const std::string dir = test::fixture_dir("glm_tiny");
  const int vocab = int(load_config(dir + "/config.json").vocab_size);
  const std::vector<float> r = test::random_floats(150, 21);
  std::vector<int32_t> prompt;
  for (float v : r) prompt.push_back(int32_t((v + 1.0f) * 0.5f * float(vocab - 1)));
  Wave w;
  for (uint64_t seed = 1; seed <= 3; ++seed) {
    Case c;
    c.prompt = prompt;
    c.max_new = 5;
    c.temperature = 0.9f;
    c.seed = seed;
    w.cases.push_back(c);
  }
  for (int64_t budget : {512, 48}) {
    SCOPED_TRACE("max_num_batched_tokens " + std::to_string(budget));
    EngineOptions o;
    o.max_num_seqs = 4;
    o.max_num_batched_tokens = budget;
    o.kv_cache_memory = 64 << 20;
    const auto cached = expect_waves_match(dir, o, {w}, 64);
    EXPECT_EQ(cached[0], (std::vector<int64_t>{0, 128, 128}));
  }
}

// With MTP drafting, with DCP (blocks of W x 64 tokens, or more when the interleave does not
// divide 64), and with a pool so small that cached blocks are evicted. Verification hides what the
// drafts were, so the drafts' statistics are compared with a run without the cache: a request's
// drafts depend on its own MTP cache only, and cached blocks must hold the MTP entries the request
// would have made (the block's key has the token after it for that).
TEST(Engine, PrefixCacheWithSpeculationRanksAndEviction) {
  struct Layout {
    const char* fixture;
    int tp, dcp, interleave, K;
    int64_t block;
    int64_t pool_pages;  // 0: plenty
  };
  for (const Layout& l : {Layout{"dsv32_tiny", 1, 1, 1, 3, 64, 0}, Layout{"glm_tiny", 2, 2, 1, 2, 128, 0},
                          Layout{"glm_tiny", 4, 2, 3, 1, 384, 0}, Layout{"glm_tiny", 1, 1, 1, 2, 64, 9}}) {
    const std::string dir = test::fixture_dir(l.fixture);
    const ModelConfig cfg = load_config(dir + "/config.json");
    EngineOptions o;
    o.tp = l.tp;
    o.dcp = l.dcp;
    o.dcp_interleave = l.interleave;
    o.speculative_tokens = l.K;
    o.max_num_seqs = 3;
    o.max_num_batched_tokens = 160;
    o.kv_cache_memory = l.pool_pages > 0 ? KvPool::bytes_per_page(cfg, true) * l.pool_pages : (128 << 20) / l.tp;
    SCOPED_TRACE(std::string(l.fixture) + " tp " + std::to_string(l.tp) + " dcp " + std::to_string(l.dcp) +
                 " interleave " + std::to_string(l.interleave) + " K " + std::to_string(l.K));
    const std::vector<Wave> waves = shared_prefix_waves(int(cfg.vocab_size), l.block, true);
    EngineMetrics with, without;
    const auto cached = expect_waves_match(dir, o, waves, l.block, &with);
    if (l.pool_pages == 0) {
      EXPECT_GT(cached[1][1], 0);  // base: wave 0 computed (and drafted past) two of its blocks
      EXPECT_GT(cached[2][0], 0);
    }
    o.prefix_caching = false;
    expect_waves_match(dir, o, waves, l.block, &without);
    EXPECT_EQ(with.num_drafts, without.num_drafts);
    EXPECT_EQ(with.num_draft_tokens, without.num_draft_tokens);
    EXPECT_EQ(with.num_accepted_tokens, without.num_accepted_tokens);
    EXPECT_EQ(with.accepted_per_pos, without.accepted_per_pos);
  }
}

// The same on the bundled trained model, whose MTP drafts are accepted about half the time, so the
// drafts' statistics see any MTP cache entry that differs: natural text from its held-out slice,
// requests sharing passages, submitted together so that some are admitted while the blocks they
// share are computed but not yet drafted from (a block waits for its MTP entries).
TEST(Engine, PrefixCacheKeepsTheBundledModelsDraftsExact) {
  const std::string dir = test::source_dir() + "/models/kjv-dsa";
  std::ifstream f(test::source_dir() + "/tests/data/kjv_eval_slice.json");
  ASSERT_TRUE(f.good());
  const auto text = nlohmann::json::parse(f).at("tokens").get<std::vector<int32_t>>();
  ASSERT_GE(text.size(), 700u);
  auto part = [&](std::initializer_list<std::pair<size_t, size_t>> spans) {
    Case c;
    for (const auto& [from, to] : spans) c.prompt.insert(c.prompt.end(), text.begin() + long(from), text.begin() + long(to));
    c.max_new = 24;
    return c;
  };
  std::vector<Wave> waves(2);
  waves[0].cases = {part({{0, 150}}), part({{0, 140}, {600, 610}}), part({{0, 70}})};
  waves[1].cases = {part({{0, 150}}), part({{0, 129}, {300, 320}}), part({{0, 64}, {500, 530}}),
                    part({{0, 200}}), part({{400, 470}})};
  EngineOptions o;
  o.speculative_tokens = 3;
  o.max_num_seqs = 4;
  o.max_num_batched_tokens = 40;
  o.kv_cache_memory = 32 << 20;
  EngineMetrics with, without;
  const auto cached = expect_waves_match(dir, o, waves, 64, &with);
  EXPECT_GT(cached[1][0], 0);
  EXPECT_GT(cached[1][3], 0);
  o.prefix_caching = false;
  expect_waves_match(dir, o, waves, 64, &without);
  EXPECT_GT(with.num_accepted_tokens, with.num_draft_tokens / 4) << "the drafts are rarely right";
  EXPECT_EQ(with.num_drafts, without.num_drafts);
  EXPECT_EQ(with.num_draft_tokens, without.num_draft_tokens);
  EXPECT_EQ(with.num_accepted_tokens, without.num_accepted_tokens);
  EXPECT_EQ(with.accepted_per_pos, without.accepted_per_pos);
}

TEST(Engine, ConcurrentRequestsMatchTheGenerator) {
  EngineOptions o;
  o.max_num_seqs = 5;
  o.max_num_batched_tokens = 24;  // long prompts are chunked and mixed with decode rounds
  o.kv_cache_memory = 64 << 20;
  expect_same_as_generator(test::fixture_dir("glm_tiny"), o, 12);
}

TEST(Engine, SpeculativeDecodingInBatches) {
  EngineOptions o;
  o.speculative_tokens = 3;
  o.max_num_seqs = 4;
  o.max_num_batched_tokens = 32;
  o.kv_cache_memory = 64 << 20;
  expect_same_as_generator(test::fixture_dir("dsv32_tiny"), o, 8);
}

TEST(Engine, FullCachePreemptsAndRecomputes) {
  // A pool of a few pages: requests queue, and decoding ones that outgrow their first page push
  // the newest out to recompute. Greedy only: a recomputed sampled request keeps its distribution
  // but not its exact tokens (its random draws fall into different rounds).
  const std::string dir = test::fixture_dir("glm_tiny");
  const ModelConfig cfg = load_config(dir + "/config.json");
  EngineOptions o;
  o.speculative_tokens = 2;
  o.max_num_seqs = 6;
  o.max_num_batched_tokens = 64;
  o.kv_cache_memory = KvPool::bytes_per_page(cfg, true) * 3;
  expect_same_as_generator(dir, o, 10, /*expect_preemption=*/true, /*min_new=*/40,
                           /*sampled=*/false);
}

// TP2/DCP2 on glm_tiny (5 requests); eight ranks (one attention head and one routed expert each),
// DCP 4 with two tokens per DCP rank in a row, on both fixtures (4 requests).
TEST(Engine, TensorAndContextParallelRanks) {
  struct Layout {
    const char* fixture;
    int tp, dcp, interleave, cases;
  };
  for (const Layout& l : {Layout{"glm_tiny", 2, 2, 1, 5}, Layout{"glm_tiny", 8, 4, 2, 4},
                          Layout{"dsv32_tiny", 8, 4, 2, 4}}) {
    EngineOptions o;
    o.tp = l.tp;
    o.dcp = l.dcp;
    o.dcp_interleave = l.interleave;
    o.speculative_tokens = 2;
    o.max_num_seqs = 3;
    o.max_num_batched_tokens = 16;
    o.kv_cache_memory = (128 << 20) / l.tp;  // 64 MiB per rank at TP2, 16 at TP8
    SCOPED_TRACE(std::string(l.fixture) + " tp " + std::to_string(l.tp) + " dcp " + std::to_string(l.dcp));
    expect_same_as_generator(test::fixture_dir(l.fixture), o, l.cases);
  }
}

// A fraction of free memory belongs to the local ranks together: two thread ranks on the host's RAM
// get about half the pages one rank gets (each pool would otherwise take the whole fraction).
TEST(Engine, AFractionOfFreeMemoryIsSplitBetweenLocalRanks) {
  EngineOptions o;
  o.model_dir = test::fixture_dir("glm_tiny");
  o.max_num_seqs = 1000;  // the cap of max_num_seqs full-length sequences does not bind
  o.kv_cache_fraction = 1e-3;
  const int64_t one = Engine::start(o)->metrics().kv_pages_total;
  o.tp = 2;
  const int64_t two = Engine::start(o)->metrics().kv_pages_total;
  ASSERT_GT(one, 20) << "too little free memory for this test";
  EXPECT_NEAR(double(two) / double(one), 0.5, 0.1) << one << " pages for one rank, " << two << " for two";
}

TEST(Engine, CancelFreesTheRequest) {
  EngineOptions o;
  o.model_dir = test::fixture_dir("glm_tiny");
  o.kv_cache_memory = 64 << 20;
  auto engine = Engine::start(o);
  EngineRequest r;
  r.prompt = {1, 2, 3};
  r.max_new_tokens = int(engine->info().max_model_len) - 3;
  r.ignore_eos = true;
  Collector c;
  const uint64_t id = engine->submit(r, c.sink());
  engine->cancel(id);
  ASSERT_TRUE(c.wait());
  EXPECT_EQ(c.reason, "abort");
  engine->cancel(id);  // finished: ignored
  engine->cancel(12345);
  // A later request still runs.
  Collector d;
  r.max_new_tokens = 3;
  engine->submit(r, d.sink());
  ASSERT_TRUE(d.wait());
  EXPECT_EQ(d.ids.size(), 3u);
  EXPECT_EQ(engine->metrics().kv_pages_used, 0);
}

TEST(Engine, BadRequestsAreRefused) {
  EngineOptions o;
  o.model_dir = test::fixture_dir("glm_tiny");
  o.max_model_len = 32;
  o.kv_cache_memory = 64 << 20;
  auto engine = Engine::start(o);
  Collector c;
  EngineRequest r;
  test::expect_error([&] { engine->submit(r, c.sink()); }, {"empty"});
  r.prompt = {1, 2, 3};
  r.max_new_tokens = 30;
  test::expect_error([&] { engine->submit(r, c.sink()); }, {"maximum context length is 32", "33"});
  r.max_new_tokens = 0;
  test::expect_error([&] { engine->submit(r, c.sink()); }, {"max_new_tokens"});
  r.max_new_tokens = 4;
  r.prompt = {1, 100000};
  test::expect_error([&] { engine->submit(r, c.sink()); }, {"100000", "vocabulary"});
  r.prompt = {1, 2};
  r.sampling.top_p = 0.0f;
  test::expect_error([&] { engine->submit(r, c.sink()); }, {"top_p"});
  r.sampling.top_p = 1.0f;
  r.sampling.top_k = -2;
  test::expect_error([&] { engine->submit(r, c.sink()); }, {"top_k", "-2"});
  r.sampling.top_k = 0;
  r.sampling.min_p = 2.0f;
  test::expect_error([&] { engine->submit(r, c.sink()); }, {"min_p", "2"});
  r.sampling.min_p = 0.0f;
  r.sampling.logit_bias = {{100000, 1.0f}};
  test::expect_error([&] { engine->submit(r, c.sink()); }, {"logit_bias", "100000", "vocabulary"});
  r.sampling.logit_bias.clear();
  r.sampling.repetition_penalty = 0.0f;
  test::expect_error([&] { engine->submit(r, c.sink()); }, {"repetition_penalty", "(0, 10]"});
  r.sampling.repetition_penalty = 1.0f;
  r.sampling.presence_penalty = 2.5f;
  test::expect_error([&] { engine->submit(r, c.sink()); }, {"presence_penalty", "[-2, 2]"});
  r.sampling.presence_penalty = 0.0f;
  r.stop_token_ids = {-1};
  test::expect_error([&] { engine->submit(r, c.sink()); }, {"stop token id -1"});
  EXPECT_EQ(c.events, 0);
  EngineOptions bad = o;
  bad.max_model_len = 1 << 30;
  test::expect_error([&] { Engine::start(bad); }, {"max_model_len", "context length"});
  bad = o;
  bad.speculative_tokens = 3;
  bad.max_num_batched_tokens = 3;
  test::expect_error([&] { Engine::start(bad); }, {"max_num_batched_tokens"});
}

TEST(Engine, StopTokensAndLogprobs) {
  EngineOptions o;
  o.model_dir = test::fixture_dir("glm_tiny");
  o.kv_cache_memory = 64 << 20;
  auto engine = Engine::start(o);
  const Case c{{5, 9, 2, 7}, 8, 0.0f, 0};
  const GenerationResult ref = reference(o.model_dir, c, 0);
  ASSERT_GE(ref.output_ids.size(), 3u);
  EngineRequest r = request_of(c);
  r.stop_token_ids = {ref.output_ids[2]};
  r.logprobs = 3;
  Collector got;
  engine->submit(r, got.sink());
  ASSERT_TRUE(got.wait());
  EXPECT_EQ(got.reason, "stop");
  // Stops at the first occurrence of the stop id (which may come earlier than index 2).
  const size_t first = size_t(std::find(ref.output_ids.begin(), ref.output_ids.end(), ref.output_ids[2]) -
                              ref.output_ids.begin());
  EXPECT_EQ(got.ids, std::vector<int32_t>(ref.output_ids.begin(), ref.output_ids.begin() + long(first) + 1));
  for (const GeneratedToken& t : got.tokens) {
    ASSERT_EQ(t.top.size(), 3u);
    EXPECT_EQ(t.top[0].id, t.id);  // greedy: the chosen token is the most likely
    EXPECT_FLOAT_EQ(t.top[0].logprob, t.logprob);
    EXPECT_LE(t.logprob, 0.0f);
    EXPECT_GE(t.top[0].logprob, t.top[1].logprob);
    EXPECT_GE(t.top[1].logprob, t.top[2].logprob);
  }
}

// EngineRequest::prompt_logprobs: each prompt token after the first gets its logprob under the
// teacher-forced logits of the prompt (log-softmax of DsaModel's logits, to the self-consistency
// tolerance: the engine's chunks and batches only reorder sums) and the top alternatives, in order
// and before the generated tokens, over prefill chunks of 16 (one rank) and of the engine's cap for
// scored prompts, 128 (TP2/DCP2, a budget of 512), next to other requests; the generated tokens stay
// the generator's, and a scored prompt takes nothing from the prefix cache (the same prompt, sent
// again, is computed again).
TEST(Engine, PromptLogprobsAreTheTeacherForcedOnes) {
  const std::string dir = test::fixture_dir("glm_tiny");
  std::vector<int32_t> prompt;
  for (int i = 0; i < 150; ++i) prompt.push_back(int32_t(3 + (i * 37 + i * i * 11) % 250));
  const PromptLogits ref = prompt_logits_on_ranks(dir, prompt, 0, false, ParallelConfig{});
  const int64_t V = ref.logits.dim(1);
  const Case c{prompt, 6, 0.0f, 0};
  const GenerationResult gen = reference(dir, c, 0);
  for (int tp : {1, 2}) {
    SCOPED_TRACE("tp " + std::to_string(tp));
    EngineOptions o;
    o.model_dir = dir;
    o.tp = o.dcp = tp;
    o.max_num_batched_tokens = tp == 1 ? 16 : 512;
    const int chunk = tp == 1 ? 16 : 128;
    o.speculative_tokens = 2;
    o.kv_cache_memory = 64 << 20;
    auto engine = Engine::start(o);
    for (int round = 0; round < 2; ++round) {
      EngineRequest r = request_of(c);
      r.prompt_logprobs = 2;
      Collector got, other;
      engine->submit(request_of(Case{{7, 8, 9, 10, 11}, 12, 0.0f, 0}), other.sink());
      engine->submit(r, got.sink());
      ASSERT_TRUE(got.wait());
      ASSERT_TRUE(other.wait());
      EXPECT_EQ(got.ids, gen.output_ids);
      EXPECT_EQ(got.cached, 0);
      EXPECT_FALSE(got.prompt_after_tokens);
      // One event per chunk: with budget to spare, chunks of the cap (150 tokens: 2); else smaller.
      if (tp == 2) {
        EXPECT_EQ(got.prompt_events, 2);
      }
      EXPECT_GE(got.prompt_events, (int(prompt.size()) + chunk - 1) / chunk);
      ASSERT_EQ(got.prompt.size(), prompt.size() - 1);
      std::vector<float> want(prompt.size() - 1), have(prompt.size() - 1);
      for (size_t q = 1; q < prompt.size(); ++q) {
        const GeneratedToken& t = got.prompt[q - 1];
        EXPECT_EQ(t.id, prompt[q]);
        const float* row = ref.logits.f32() + int64_t(q - 1) * V;
        float m = -INFINITY;
        for (int64_t v = 0; v < V; ++v) m = std::max(m, row[v]);
        double z = 0.0;
        for (int64_t v = 0; v < V; ++v) z += std::exp(double(row[v]) - double(m));
        want[q - 1] = row[prompt[q]] - m - float(std::log(z));
        have[q - 1] = t.logprob;
        ASSERT_EQ(t.top.size(), 2u);
        EXPECT_NEAR(t.top[0].logprob, -float(std::log(z)), 1e-4) << "position " << q;  // the most likely
        EXPECT_GE(t.top[0].logprob, t.top[1].logprob);
        EXPECT_GE(t.top[0].logprob, t.logprob);
      }
      EXPECT_LE(test::nmse(Tensor::from_f32(have, {int64_t(have.size())}), Tensor::from_f32(want, {int64_t(want.size())})),
                tol::kSelfConsistencyNmse);
    }
  }
}

// EngineRequest::constraint: the constrained request samples only what the mask leaves (here even
// ids), greedy among them, and the constraint is told every token emitted; a constraint without
// copies is not speculated (the engine drafts for the others), and an unconstrained request beside
// it keeps the generator's tokens.
TEST(Engine, ConstrainedRequestsSampleWhatTheMaskLeaves) {
  struct EvenIds : TokenConstraint {
    std::vector<int32_t> seen;
    int masks = 0;
    void mask(float* logits, int64_t vocab) override {
      ++masks;
      for (int64_t i = 1; i < vocab; i += 2) logits[i] = -INFINITY;
    }
    void accept(int32_t token) override { seen.push_back(token); }
  };
  const std::string dir = test::fixture_dir("glm_tiny");
  EngineOptions o;
  o.model_dir = dir;
  o.speculative_tokens = 2;
  o.kv_cache_memory = 64 << 20;
  auto engine = Engine::start(o);
  const Case plain{{5, 9, 2, 7, 11, 13}, 10, 0.0f, 0};
  const GenerationResult ref = reference(dir, plain, 2);
  auto even = std::make_shared<EvenIds>();
  EngineRequest r = request_of(Case{{3, 4, 5}, 12, 0.0f, 0});
  r.constraint = even;
  r.logprobs = 1;
  Collector got, other;
  engine->submit(r, got.sink());
  engine->submit(request_of(plain), other.sink());
  ASSERT_TRUE(got.wait());
  ASSERT_TRUE(other.wait());
  EXPECT_EQ(other.ids, ref.output_ids);
  ASSERT_EQ(got.ids.size(), 12u);
  for (int32_t id : got.ids) EXPECT_EQ(id % 2, 0) << id;
  EXPECT_EQ(even->seen, got.ids);
  EXPECT_EQ(even->masks, 12);  // one sampled row a step: no drafts
  // Greedy among the even ids: the chosen one is the most likely even token of the model's row
  // (the logprobs reported are the model's, before the mask).
  for (const GeneratedToken& t : got.tokens) {
    ASSERT_EQ(t.top.size(), 1u);
    if (t.top[0].id % 2 == 0) {
      EXPECT_EQ(t.top[0].id, t.id);
    }
  }
  const EngineMetrics m = engine->metrics();
  EXPECT_GT(m.num_drafts, 0);  // the other request was speculated
}

// A constraint that can be copied (TokenConstraint::clone) is speculated: the drafts and each
// verified row are masked by copies that took the drafts before them. With a constraint whose mask
// changes every token (ids congruent to the step mod 3), the greedy tokens are those of the same
// request unspeculated, and drafts were accepted.
TEST(Engine, CopyableConstraintsAreSpeculated) {
  struct Cycle : TokenConstraint {
    int step = 0;
    std::shared_ptr<int> copies = std::make_shared<int>(0);
    void mask(float* logits, int64_t vocab) override {
      for (int64_t i = 0; i < vocab; ++i)
        if (i % 3 != step % 3) logits[i] = -INFINITY;
    }
    void accept(int32_t) override { ++step; }
    std::unique_ptr<TokenConstraint> clone() const override {
      ++*copies;
      return std::make_unique<Cycle>(*this);
    }
  };
  struct Uncopied : Cycle {
    std::unique_ptr<TokenConstraint> clone() const override { return nullptr; }
  };
  EngineOptions o;
  o.model_dir = test::fixture_dir("glm_tiny");
  o.speculative_tokens = 3;
  o.kv_cache_memory = 64 << 20;
  auto engine = Engine::start(o);
  const Case c{{3, 4, 5, 9}, 24, 0.0f, 0};
  EngineRequest plain = request_of(c), speculated = request_of(c);
  plain.constraint = std::make_shared<Uncopied>();
  auto cycle = std::make_shared<Cycle>();
  speculated.constraint = cycle;
  Collector ref;
  engine->submit(plain, ref.sink());
  ASSERT_TRUE(ref.wait());
  EXPECT_EQ(engine->metrics().num_drafts, 0);
  Collector got;
  engine->submit(speculated, got.sink());
  ASSERT_TRUE(got.wait());
  ASSERT_EQ(got.ids.size(), 24u);
  EXPECT_EQ(got.ids, ref.ids);
  for (size_t i = 0; i < got.ids.size(); ++i) EXPECT_EQ(got.ids[i] % 3, int32_t(i % 3)) << i;
  EXPECT_EQ(cycle->step, 24);  // the request's own constraint took each emitted token once
  const EngineMetrics m = engine->metrics();
  EXPECT_GT(m.num_drafts, 0);
  EXPECT_GT(m.num_accepted_tokens, 0);
  EXPECT_GT(*cycle->copies, m.num_drafts);  // a copy to draft and one to verify, each round

  // A constraint that leaves one token a step: the drafts, masked as the verified rows are, are
  // that token, and every one of them is accepted.
  struct Script : TokenConstraint {
    std::vector<int32_t> ids;
    size_t at = 0;
    void mask(float* logits, int64_t vocab) override {
      for (int64_t i = 0; i < vocab; ++i)
        if (at >= ids.size() || i != ids[at]) logits[i] = -INFINITY;
    }
    void accept(int32_t) override { ++at; }
    std::unique_ptr<TokenConstraint> clone() const override { return std::make_unique<Script>(*this); }
  };
  auto script = std::make_shared<Script>();
  for (int i = 0; i < 20; ++i) script->ids.push_back(int32_t(7 + 13 * i));
  EngineRequest forced = request_of(Case{{6, 2, 8}, 20, 0.7f, 5});
  forced.constraint = script;
  Collector f;
  engine->submit(forced, f.sink());
  ASSERT_TRUE(f.wait());
  EXPECT_EQ(f.ids, script->ids);
  const EngineMetrics after = engine->metrics();
  EXPECT_GT(after.num_draft_tokens, m.num_draft_tokens);
  EXPECT_EQ(after.num_accepted_tokens - m.num_accepted_tokens, after.num_draft_tokens - m.num_draft_tokens);
}

}  // namespace
}  // namespace dsi
