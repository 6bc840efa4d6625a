// The NCCL communicator (src/comm/nccl_comm.h) on thread ranks, one GPU each, with LocalComm as the
// host group: every collective on every group layout and dtype against LocalComm on host copies of
// the same inputs (bitwise: gathers, all-to-all and broadcast always; sums too, since groups of two
// sum in member order under every NcclSumOrder), the lockstep guard, a rank that never joins, an
// aborting rank, device checks. Skipped without NCCL in the build or without enough GPUs.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backends/cuda/device.h"
#include "comm/local_comm.h"
#include "cuda/cuda_test_util.h"

#ifdef DSI_WITH_NCCL
#include "comm/nccl_comm.h"
#endif

namespace dsi {
namespace {

#ifndef DSI_WITH_NCCL

TEST(NcclComm, NotBuilt) { GTEST_SKIP() << "built without NCCL (DSI_NCCL=OFF): NcclComm tests skipped"; }

#else

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Ends the process with a message if a test's rank threads are still running after `limit` s: a
// hang is a failure to diagnose, not something to wait 15 minutes for.
class Watchdog {
 public:
  Watchdog(std::string what, double limit) : what_(std::move(what)) {
    thread_ = std::thread([this, limit] {
      std::unique_lock<std::mutex> lk(mu_);
      if (!cv_.wait_for(lk, std::chrono::duration<double>(limit), [this] { return done_; })) {
        std::fprintf(stderr, "FATAL: %s: rank threads still running after %g s (a hang)\n", what_.c_str(), limit);
        std::fflush(stderr);
        std::abort();
      }
    });
  }
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  std::string what_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

struct RankEnv {
  int rank;
  NcclComm& nccl;
  LocalComm& host;  // the NcclComm's host group; the tests also use it for the reference results
  Device dev;
};

// Runs fn on n thread ranks, rank r on GPU r, each with an NcclComm over a LocalComm host group.
// Errors escaping fn are reported per rank (and abort the others so nothing waits for them).
void run_ranks(int n, CommOptions options, NcclSumOrder sums, const std::vector<Group>& groups,
               const std::function<void(RankEnv&)>& fn, double watchdog_s = 300) {
  Watchdog watchdog(::testing::UnitTest::GetInstance()->current_test_info()->name(), watchdog_s);
  LocalWorld world(n, options);
  auto process = std::make_shared<NcclProcessState>();
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<NcclComm> nccl;
      try {
        std::vector<Group> mine;
        for (const Group& g : groups)
          if (g.contains(r)) mine.push_back(g);
        nccl = NcclComm::create(world.comm(r), NcclSetup{r, mine, sums, process});
        RankEnv env{r, *nccl, world.comm(r), Device::cuda(r)};
        fn(env);
      } catch (const std::exception& e) {
        errors[size_t(r)] = e.what();
        if (nccl)
          nccl->abort(e.what());
        else
          world.comm(r).abort(e.what());
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r)
    EXPECT_EQ(errors[size_t(r)], "") << "rank " << r << " failed (NCCL " << nccl_version() << ")";
}

class NcclCommTest : public ::testing::Test {};

// Skips the test (a macro: GTEST_SKIP returns from the test body itself) without n visible GPUs.
#define DSI_NEED_GPUS(n)                                                                     \
  do {                                                                                       \
    const int dsi_have_ = cuda::device_count();                                              \
    if (dsi_have_ < (n))                                                                     \
      GTEST_SKIP() << "needs " << (n) << " CUDA device(s), this process sees " << dsi_have_; \
  } while (0)

// Deterministic inputs: finite floats in [-1, 1) times 2^e for e in [-8, 8] (so sums round), or
// random bit patterns for BF16/I32 (gathers move bits; NaN payloads included).
Tensor make_input(const Shape& shape, DType dtype, uint64_t seed) {
  Tensor t = Tensor::empty(shape, dtype);
  std::mt19937_64 rng(seed * 0x9e3779b97f4a7c15ull + 12345);
  const int64_t n = t.numel();
  if (dtype == DType::F32) {
    float* p = t.f32();
    for (int64_t i = 0; i < n; ++i) {
      const double u = double(rng() >> 11) * 0x1.0p-53 * 2.0 - 1.0;
      p[i] = float(std::ldexp(u, int(rng() % 17) - 8));
    }
  } else {
    auto* p = static_cast<uint8_t*>(t.raw());
    for (size_t i = 0; i < t.nbytes(); ++i) p[i] = uint8_t(rng() >> 56);
  }
  return t;
}

std::string dtype_str(DType d) { return std::string(dtype_name(d)); }

// The layouts of two ranks: the world, the TP group (same ranks, another name: shares the world's
// NCCL communicator), the DCP groups of size 1 (dcp = 1) and size 2 (dcp = 2).
std::vector<Group> layouts(int n, int rank) {
  std::vector<Group> gs{Group{"world", 0, n}};
  if (n == 2) {
    gs.push_back(Group{"tp", 0, 2});
    gs.push_back(Group{"dcp" + std::to_string(rank), rank, 1});  // dcp = 1: a group per rank
    gs.push_back(Group{"dcp0", 0, 2});                           // dcp = 2
  }
  return gs;
}

const std::vector<int64_t> kSizes{0, 1, 3, 1000, 1 << 20};

// Every collective on every layout, dtype and size: NCCL on device copies == LocalComm on host.
void check_all_collectives(RankEnv& e, int n) {
  const std::vector<DType> dtypes{DType::F32, DType::BF16, DType::I32};
  uint64_t seed = 1000 * uint64_t(e.rank + 1);
  for (const Group& g : layouts(n, e.rank)) {
    const int G = g.size;
    for (int64_t k : kSizes) {
      const std::string where = fmt::format("rank {}, group {} of {}, {} elements", e.rank, g.name, G, k);
      for (DType dt : dtypes) {
        const std::string w = where + ", " + dtype_str(dt);
        {  // all_gather: [k] -> [G k]
          const Tensor h_in = make_input({k}, dt, ++seed);
          Tensor h_out = Tensor::empty({G * k}, dt);
          e.host.all_gather(g, h_in, h_out);
          Tensor d_out = Tensor::empty({G * k}, dt, e.dev);
          e.nccl.all_gather(g, to_device(h_in, e.dev), d_out);
          test::expect_bitwise(to_host(d_out), h_out, "all_gather: " + w);
        }
        {  // all_to_all: [G k] -> [G k]
          const Tensor h_in = make_input({G * k}, dt, ++seed);
          Tensor h_out = Tensor::empty({G * k}, dt);
          e.host.all_to_all(g, h_in, h_out);
          Tensor d_out = Tensor::empty({G * k}, dt, e.dev);
          e.nccl.all_to_all(g, to_device(h_in, e.dev), d_out);
          test::expect_bitwise(to_host(d_out), h_out, "all_to_all: " + w);
        }
        for (int root = 0; root < G; ++root) {  // broadcast from every member
          Tensor h = make_input({k}, dt, ++seed);
          Tensor d = to_device(h, e.dev);
          e.host.broadcast(g, h, root);
          e.nccl.broadcast(g, d, root);
          test::expect_bitwise(to_host(d), h, fmt::format("broadcast from member {}: {}", root, w));
        }
      }
      {  // reduce_scatter: F32 [G k] -> [k]
        const Tensor h_in = make_input({G * k}, DType::F32, ++seed);
        Tensor h_out = Tensor::empty({k}, DType::F32);
        e.host.reduce_scatter(g, h_in, h_out);
        Tensor d_out = Tensor::empty({k}, DType::F32, e.dev);
        e.nccl.reduce_scatter(g, to_device(h_in, e.dev), d_out);
        test::expect_bitwise(to_host(d_out), h_out, "reduce_scatter: " + where);
      }
      {  // all_reduce: F32 [k], in place
        Tensor h = make_input({k}, DType::F32, ++seed);
        Tensor d = to_device(h, e.dev);
        e.host.all_reduce(g, h);
        e.nccl.all_reduce(g, d);
        test::expect_bitwise(to_host(d), h, "all_reduce: " + where);
      }
    }
  }
}

TEST_F(NcclCommTest, OneRankEveryCollectiveMatchesLocalComm) {
  DSI_NEED_GPUS(1);
  run_ranks(1, {}, NcclSumOrder::kMemberOrder, {}, [](RankEnv& e) { check_all_collectives(e, 1); });
}

TEST_F(NcclCommTest, TwoRanksEveryCollectiveMatchesLocalComm) {
  DSI_NEED_GPUS(2);
  run_ranks(2, {}, NcclSumOrder::kMemberOrder, {Group{"tp", 0, 2}},
            [](RankEnv& e) { check_all_collectives(e, 2); });
}

// The exchange + member-order kernel path (what groups of more than two use), forced on two ranks.
TEST_F(NcclCommTest, TwoRanksOrderedSumPathMatchesLocalComm) {
  DSI_NEED_GPUS(2);
  run_ranks(2, {}, NcclSumOrder::kOrderedAlways, {}, [](RankEnv& e) {
    const Group g{"tp", 0, 2};
    uint64_t seed = 77 + uint64_t(e.rank);
    for (int64_t k : {int64_t(0), int64_t(1), int64_t(2), int64_t(3), int64_t(1000), int64_t(1) << 20,
                      (int64_t(1) << 20) + 1}) {
      Tensor h = make_input({k}, DType::F32, ++seed);
      Tensor d = to_device(h, e.dev);
      e.host.all_reduce(g, h);
      e.nccl.all_reduce(g, d);
      test::expect_bitwise(to_host(d), h, fmt::format("ordered all_reduce, rank {}, {} elements", e.rank, k));
      const Tensor h_in = make_input({2 * k}, DType::F32, ++seed);
      Tensor h_out = Tensor::empty({k}, DType::F32);
      e.host.reduce_scatter(g, h_in, h_out);
      Tensor d_out = Tensor::empty({k}, DType::F32, e.dev);
      e.nccl.reduce_scatter(g, to_device(h_in, e.dev), d_out);
      test::expect_bitwise(to_host(d_out), h_out,
                           fmt::format("ordered reduce_scatter, rank {}, {} per member", e.rank, k));
    }
  });
}

// NCCL's own reductions: with two members a + b is the only order, so they too are bitwise equal.
TEST_F(NcclCommTest, TwoRanksNativeSumsMatchLocalCommBitwise) {
  DSI_NEED_GPUS(2);
  run_ranks(2, {}, NcclSumOrder::kNative, {}, [](RankEnv& e) {
    const Group g{"world", 0, 2};
    Tensor h = make_input({1 << 20}, DType::F32, 5 + uint64_t(e.rank));
    Tensor d = to_device(h, e.dev);
    e.host.all_reduce(g, h);
    e.nccl.all_reduce(g, d);
    test::expect_bitwise(to_host(d), h, fmt::format("native all_reduce, rank {}", e.rank));
  });
}

// Strided inputs and outputs, multi-dimensional shapes, in-place forms and aliasing outputs.
TEST_F(NcclCommTest, TwoRanksLayoutsAndAliasing) {
  DSI_NEED_GPUS(2);
  CommOptions opts;
  opts.check_lockstep = true;
  run_ranks(2, opts, NcclSumOrder::kMemberOrder, {}, [](RankEnv& e) {
    const Group g{"tp", 0, 2};
    const int me = e.rank;
    uint64_t seed = 500 + uint64_t(me);
    {  // strided input [3, 5] out of [3, 8], strided output [6, 5] out of [6, 9]
      const Tensor h_full = make_input({3, 8}, DType::BF16, ++seed);
      const Tensor h_in = h_full.narrow(1, 2, 5);
      Tensor h_out = Tensor::empty({6, 5}, DType::BF16);
      e.host.all_gather(g, h_in, h_out);
      const Tensor d_full = to_device(h_full, e.dev);
      Tensor d_out_full = Tensor::zeros({6, 9}, DType::BF16, e.dev);
      Tensor d_out = d_out_full.narrow(1, 1, 5);
      e.nccl.all_gather(g, d_full.narrow(1, 2, 5), d_out);
      test::expect_bitwise(to_host(d_out), h_out, fmt::format("strided all_gather, rank {}", me));
    }
    {  // in-place all_gather: the input is this member's slot of the output
      const Tensor h_in = make_input({4, 7}, DType::F32, ++seed);
      Tensor h_out = Tensor::empty({8, 7}, DType::F32);
      e.host.all_gather(g, h_in, h_out);
      Tensor d_out = Tensor::zeros({8, 7}, DType::F32, e.dev);
      Tensor slot = d_out.slice(4 * me, 4 * me + 4);
      slot.copy_from(h_in);
      e.nccl.all_gather(g, slot, d_out);
      test::expect_bitwise(to_host(d_out), h_out, fmt::format("in-place all_gather, rank {}", me));
    }
    {  // all_to_all with the output overlapping the input (goes through a temporary)
      const Tensor h_in = make_input({6, 3}, DType::I32, ++seed);
      Tensor h_out = Tensor::empty({6, 3}, DType::I32);
      e.host.all_to_all(g, h_in, h_out);
      Tensor d = to_device(h_in, e.dev);
      e.nccl.all_to_all(g, d, d);
      test::expect_bitwise(to_host(d), h_out, fmt::format("aliased all_to_all, rank {}", me));
    }
    {  // in-place reduce_scatter (output = own chunk of the input), 2-D
      const Tensor h_in = make_input({4, 33}, DType::F32, ++seed);
      Tensor h_out = Tensor::empty({2, 33}, DType::F32);
      e.host.reduce_scatter(g, h_in, h_out);
      Tensor d_in = to_device(h_in, e.dev);
      Tensor d_out = d_in.slice(2 * me, 2 * me + 2);
      e.nccl.reduce_scatter(g, d_in, d_out);
      test::expect_bitwise(to_host(d_out), h_out, fmt::format("in-place reduce_scatter, rank {}", me));
    }
    {  // strided all_reduce and broadcast
      Tensor h_full = make_input({5, 6}, DType::F32, ++seed);
      Tensor d_full = to_device(h_full, e.dev);
      Tensor h_view = h_full.narrow(1, 1, 4), d_view = d_full.narrow(1, 1, 4);
      e.host.all_reduce(g, h_view);
      e.nccl.all_reduce(g, d_view);
      test::expect_bitwise(to_host(d_full), h_full, fmt::format("strided all_reduce, rank {}", me));
      e.host.broadcast(g, h_view, 1);
      e.nccl.broadcast(g, d_view, 1);
      test::expect_bitwise(to_host(d_full), h_full, fmt::format("strided broadcast, rank {}", me));
    }
    e.nccl.barrier(g);
  });
}

// Check mode: a mismatched shape fails both ranks before any data moves, with the same message,
// and the group stays usable.
TEST_F(NcclCommTest, LockstepCatchesMismatchedShapeOnBothRanks) {
  DSI_NEED_GPUS(2);
  CommOptions opts;
  opts.check_lockstep = true;
  opts.timeout_seconds = 20;
  std::vector<std::string> msgs(2);
  run_ranks(2, opts, NcclSumOrder::kMemberOrder, {}, [&](RankEnv& e) {
    const Group g{"tp", 0, 2};
    const int64_t rows = e.rank == 0 ? 4 : 5;
    Tensor in = Tensor::zeros({rows, 3}, DType::F32, e.dev);
    Tensor out = Tensor::empty({2 * rows, 3}, DType::F32, e.dev);
    msgs[size_t(e.rank)] = test::error_of([&] { e.nccl.all_gather(g, in, out); });
    // Still in step: a correct collective works afterwards.
    Tensor h = make_input({10}, DType::F32, 3 + uint64_t(e.rank));
    Tensor d = to_device(h, e.dev);
    e.host.all_reduce(g, h);
    e.nccl.all_reduce(g, d);
    test::expect_bitwise(to_host(d), h, "all_reduce after the violation");
  });
  EXPECT_NE(msgs[0].find("lockstep violation on group tp at call #1: rank 0 issued all_gather "
                         "F32[4, 3], rank 1 issued all_gather F32[5, 3]"), std::string::npos)
      << msgs[0];
  EXPECT_EQ(msgs[0], msgs[1]);
}

// A rank that never joins: the other fails within the timeout, naming itself, the operation and
// the group; the process does not hang and later calls fail at once.
TEST_F(NcclCommTest, RankThatNeverJoinsTimesOutNamingTheOperation) {
  DSI_NEED_GPUS(2);
  CommOptions opts;
  opts.timeout_seconds = 2;
  std::string msg, later;
  double took = -1;
  std::atomic<bool> rank0_done{false};
  LocalWorld world(2, opts);
  auto process = std::make_shared<NcclProcessState>();
  Watchdog watchdog("RankThatNeverJoinsTimesOutNamingTheOperation", 60);
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto nccl = NcclComm::create(world.comm(r), NcclSetup{r, {}, NcclSumOrder::kMemberOrder, process});
        const Group g{"world", 0, 2};
        Tensor t = Tensor::zeros({4}, DType::F32, Device::cuda(r));
        nccl->all_reduce(g, t);  // call #1: both ranks
        if (r == 0) {
          const auto t0 = Clock::now();
          msg = test::error_of([&] { nccl->all_reduce(g, t); });  // call #2: rank 1 never comes
          took = seconds_since(t0);
          later = test::error_of([&] { nccl->all_reduce(g, t); });
          rank0_done = true;
        } else {
          // Rank 1 never makes call #2; it keeps its communicator until rank 0 has given up.
          while (!rank0_done) std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
      } catch (const std::exception& e) {
        errors[size_t(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
  EXPECT_NE(msg.find("rank 0: all_reduce on group world (call #2, F32[4]) timed out after 2 s"),
            std::string::npos) << msg;
  EXPECT_GE(took, 1.9) << msg;
  EXPECT_LT(took, 10.0) << msg;
  EXPECT_NE(later.find("rank 0: all_reduce on group world (call #3, F32[4]) failed"), std::string::npos)
      << later;
}

// A rank that fails and aborts: the rank waiting in a collective with it fails at once (long before
// its timeout) with the aborting rank's reason.
TEST_F(NcclCommTest, AbortWakesTheOtherRank) {
  DSI_NEED_GPUS(2);
  CommOptions opts;
  opts.timeout_seconds = 60;
  std::string msg;
  double took = -1;
  LocalWorld world(2, opts);
  auto process = std::make_shared<NcclProcessState>();
  Watchdog watchdog("AbortWakesTheOtherRank", 50);
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto nccl = NcclComm::create(world.comm(r), NcclSetup{r, {}, NcclSumOrder::kMemberOrder, process});
        const Group g{"world", 0, 2};
        Tensor t = Tensor::zeros({1000}, DType::F32, Device::cuda(r));
        nccl->all_reduce(g, t);
        if (r == 0) {
          const auto t0 = Clock::now();
          msg = test::error_of([&] { nccl->all_reduce(g, t); });
          took = seconds_since(t0);
        } else {
          std::this_thread::sleep_for(std::chrono::milliseconds(300));
          nccl->abort("injected failure");
        }
      } catch (const std::exception& e) {
        errors[size_t(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
  EXPECT_NE(msg.find("rank 0: all_reduce on group world (call #2, F32[1000]) failed"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rank 1 aborted: injected failure"), std::string::npos) << msg;
  EXPECT_LT(took, 10.0) << msg;
}

// Tensors on the host or on another rank's GPU are refused with a message naming the device.
TEST_F(NcclCommTest, RejectsTensorsNotOnTheRanksDevice) {
  DSI_NEED_GPUS(1);
  run_ranks(1, {}, NcclSumOrder::kMemberOrder, {}, [](RankEnv& e) {
    const Group g{"world", 0, 1};
    Tensor h = Tensor::zeros({4}, DType::F32);
    const std::string m = test::error_of([&] { e.nccl.all_reduce(g, h); });
    EXPECT_NE(m.find("rank 0: all_reduce on group world (call #1, F32[4]): input F32[4] is on cpu"),
              std::string::npos) << m;
    Tensor d = Tensor::zeros({4}, DType::I32, e.dev);
    const std::string m2 = test::error_of([&] { e.nccl.all_reduce(g, d); });
    EXPECT_NE(m2.find("all_reduce sums F32 tensors only"), std::string::npos) << m2;
  });
}

#endif  // DSI_WITH_NCCL

}  // namespace
}  // namespace dsi
