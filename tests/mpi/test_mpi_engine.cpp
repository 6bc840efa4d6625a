// The serving engine with its ranks in 4 processes (start_engine_processes, as `mpirun -np 4
// dsinfer serve` runs it): the leader's requests, with chunked prefill, MTP drafts and a sampled
// request, come out token for token as on thread ranks of one process, and greedy ones as the HF
// goldens; the processes' pools have the pages of the smallest budget among them. Runs last in the MPI test binary: the other processes leave once the leader's engine
// stops, while the leader still runs its thread-rank reference.
#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

#include "../test_util.h"
#include "mpi_session.h"
#include "runtime/engine_processes.h"

namespace dsi::test {
namespace {

struct Result {
  std::vector<int32_t> tokens;
  std::string reason;
};

// Submits every request, waits until all have finished, returns them in submission order.
std::vector<Result> run_all(Engine& engine, const std::vector<EngineRequest>& requests) {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<Result> out(requests.size());
  size_t done = 0;
  for (size_t i = 0; i < requests.size(); ++i)
    engine.submit(requests[i], [&, i](RequestEvent&& ev) {
      std::lock_guard<std::mutex> lock(mu);
      for (const GeneratedToken& t : ev.tokens) out[i].tokens.push_back(t.id);
      if (ev.finished) {
        out[i].reason = ev.finish_reason;
        ++done;
        cv.notify_all();
      }
    });
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return done == requests.size(); });
  return out;
}

TEST(MpiEngine, ProcessRanksMatchThreadRanksAndGoldens) {
  ASSERT_EQ(g_session->size(), 4) << "run with mpirun -np 4";
  EngineOptions o;
  o.model_dir = fixture_dir("glm_tiny");
  o.tp = 4;
  o.dcp = 2;
  o.speculative_tokens = 2;
  o.max_num_seqs = 4;
  o.max_num_batched_tokens = 16;  // the 40-token prompt is prefilled in chunks
  // Each process offers a different budget, rank 3 the least: every pool takes the least.
  o.kv_cache_memory = (int64_t(11) - g_session->rank()) << 20;
  o.check_lockstep = true;  // every process issues the same collectives, checked on each
  const auto manifest = load_manifest("glm_tiny");
  std::vector<EngineRequest> requests;
  std::vector<std::vector<int32_t>> greedy;
  for (size_t pi : {size_t(1), size_t(4), size_t(5)}) {
    const auto& p = manifest.at("prompts").at(pi);
    EngineRequest r;
    r.prompt = p.at("ids").get<std::vector<int32_t>>();
    greedy.push_back(p.at("greedy").get<std::vector<int32_t>>());
    r.max_new_tokens = int(greedy.back().size());
    r.ignore_eos = true;
    requests.push_back(r);
  }
  EngineRequest sampled = requests[1];
  sampled.sampling.temperature = 0.8f;
  sampled.sampling.seed = 7;
  sampled.max_new_tokens = 10;
  requests.push_back(sampled);

  std::unique_ptr<Engine> engine = start_engine_processes(o, *g_session);
  if (g_session->rank() != 0) {
    EXPECT_EQ(engine, nullptr);  // it ran the leader's steps until the leader stopped
    return;
  }
  ASSERT_NE(engine, nullptr);
  const std::vector<Result> got = run_all(*engine, requests);
  const int64_t pages = engine->metrics().kv_pages_total;
  engine.reset();  // the other processes leave their step loop
  for (size_t i = 0; i < greedy.size(); ++i) {
    EXPECT_EQ(got[i].tokens, greedy[i]) << "request " << i;
    EXPECT_EQ(got[i].reason, "length") << "request " << i;
  }
  ASSERT_EQ(got.back().tokens.size(), 10u);
  // The same requests on 4 thread ranks of this process, with rank 3's budget.
  o.kv_cache_memory = int64_t(8) << 20;
  std::unique_ptr<Engine> threads = Engine::start(o);
  EXPECT_EQ(pages, threads->metrics().kv_pages_total);
  const std::vector<Result> want = run_all(*threads, requests);
  for (size_t i = 0; i < requests.size(); ++i) EXPECT_EQ(got[i].tokens, want[i].tokens) << "request " << i;
}

// Run by the ctest entry MpiEngine.FailingRankEndsTheJob: rank 2's process cannot load the model;
// it ends the job with a message naming itself instead of leaving the leader waiting.
TEST(MpiEngineFailure, DISABLED_RankThatCannotLoadEndsTheJob) {
  EngineOptions o;
  o.model_dir = g_session->rank() == 2 ? "/nonexistent/model" : fixture_dir("glm_tiny");
  o.tp = 4;
  o.kv_cache_memory = int64_t(8) << 20;
  std::unique_ptr<Engine> engine = start_engine_processes(o, *g_session);
  if (engine) {
    EngineRequest r;
    r.prompt = {1, 2, 3};
    r.max_new_tokens = 4;
    run_all(*engine, {r});  // never completes: the job ends first
  }
  ADD_FAILURE() << "rank " << g_session->rank() << " went on after rank 2 failed";
}

}  // namespace
}  // namespace dsi::test
