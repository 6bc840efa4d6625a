// The serving engine: many requests at once through continuous batching over paged caches give
// each request exactly the tokens the single-sequence generator gives it (greedy, and sampled with
// a seed, with and without penalties), whatever the batch, the chunking, the preemptions or the
// parallel layout; cancellation, bad requests and the bookkeeping (no page or request left behind).
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include "dsinfer/engine.h"
#include "model/dsa_model.h"
#include "runtime/generator.h"
#include "test_util.h"

namespace dsi {
namespace {

// Collects one request's events; wait() blocks until the final one.
struct Collector {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int32_t> ids;
  std::vector<GeneratedToken> tokens;
  bool done = false;
  std::string reason, error;
  int events = 0;

  EventSink sink() {
    return [this](RequestEvent&& ev) {
      std::lock_guard<std::mutex> lock(mu);
      ++events;
      for (auto& t : ev.tokens) {
        ids.push_back(t.id);
        tokens.push_back(t);
      }
      if (ev.finished) {
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

}  // namespace
}  // namespace dsi
