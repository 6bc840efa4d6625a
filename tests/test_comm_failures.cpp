// LocalComm failure handling: the lockstep guard (a skipped, reordered or mismatched collective
// fails every member with the same message, quickly), mismatches without the guard (a clean error,
// no out-of-bounds reads: ASan stays quiet), timeouts naming the missing ranks, and abort().
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "comm/local_comm.h"
#include "test_comm_util.h"
#include "test_util.h"

namespace dsi::test {
namespace {

using Clock = std::chrono::steady_clock;

// Every rank's error must be exactly `want` (the tests also bound the run's time well below the
// timeout, so the guard, not the timeout, stopped it).
void expect_all_fail_with(const std::vector<std::string>& errors, const std::string& want) {
  for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], want) << "rank " << r;
}

void expect_all_contain(const std::vector<std::string>& errors, const std::vector<std::string>& needles) {
  for (size_t r = 0; r < errors.size(); ++r) {
    EXPECT_FALSE(errors[r].empty()) << "rank " << r << " did not fail";
    for (const auto& n : needles)
      EXPECT_NE(errors[r].find(n), std::string::npos) << "rank " << r << ": '" << errors[r] << "' lacks '" << n << "'";
  }
}

const Group kTp{"tp", 0, 4};

void gather(Communicator& c, const Shape& in_shape, DType dt = DType::F32) {
  Tensor in = Tensor::zeros(in_shape, dt);
  Shape out_shape = in_shape;
  out_shape[0] *= 4;
  Tensor out = Tensor::zeros(out_shape, dt);
  c.all_gather(kTp, in, out);
}
void reduce(Communicator& c, const Shape& shape) {
  Tensor x = Tensor::zeros(shape, DType::F32);
  c.all_reduce(kTp, x);
}

constexpr double kGuardTimeout = 2.0;  // each lockstep test must end long before this

TEST(LocalCommLockstep, SkippedCollective) {
  LocalWorld world(4, CommOptions{true, kGuardTimeout});
  const auto t0 = Clock::now();
  auto errors = run_ranks(world, [](LocalComm& c) {
    reduce(c, {2, 8});                    // call #1: everyone
    if (c.rank() != 1) gather(c, {2, 8});  // call #2: rank 1 skips it...
    reduce(c, {2, 8});                    // ...and issues the next one
  });
  EXPECT_LT(seconds_since(t0), kGuardTimeout / 2);
  expect_all_fail_with(errors, "lockstep violation on group tp at call #2: rank 0 issued all_gather F32[2, 8], "
                               "rank 1 issued all_reduce F32[2, 8]");
}

TEST(LocalCommLockstep, ReorderedCollectives) {
  LocalWorld world(4, CommOptions{true, kGuardTimeout});
  const auto t0 = Clock::now();
  auto errors = run_ranks(world, [](LocalComm& c) {
    if (c.rank() == 2) {
      reduce(c, {2, 8});
      gather(c, {2, 8});
    } else {
      gather(c, {2, 8});
      reduce(c, {2, 8});
    }
  });
  EXPECT_LT(seconds_since(t0), kGuardTimeout / 2);
  expect_all_fail_with(errors, "lockstep violation on group tp at call #1: rank 0 issued all_gather F32[2, 8], "
                               "rank 2 issued all_reduce F32[2, 8]");
}

TEST(LocalCommLockstep, DifferentShapeDtypeOrRoot) {
  LocalWorld world(4, CommOptions{true, kGuardTimeout});
  const auto t0 = Clock::now();
  auto errors = run_ranks(world, [](LocalComm& c) { gather(c, {c.rank() == 3 ? 3 : 2, 8}); });
  expect_all_fail_with(errors, "lockstep violation on group tp at call #1: rank 0 issued all_gather F32[2, 8], "
                               "rank 3 issued all_gather F32[3, 8]");
  errors = run_ranks(world, [](LocalComm& c) { gather(c, {2, 8}, c.rank() == 1 ? DType::I32 : DType::F32); });
  expect_all_fail_with(errors, "lockstep violation on group tp at call #2: rank 0 issued all_gather F32[2, 8], "
                               "rank 1 issued all_gather I32[2, 8]");
  errors = run_ranks(world, [](LocalComm& c) {
    Tensor x = Tensor::zeros({5}, DType::F32);
    c.broadcast(kTp, x, c.rank() == 2 ? 1 : 0);
  });
  expect_all_fail_with(errors, "lockstep violation on group tp at call #3: rank 0 issued broadcast F32[5] from "
                               "member 0, rank 2 issued broadcast F32[5] from member 1");
  // Every member consumed the failed calls: the group is still in step.
  errors = run_ranks(world, [](LocalComm& c) {
    Tensor x = Tensor::from_f32({float(c.rank())}, {1});
    c.all_reduce(kTp, x);
    EXPECT_EQ(x.f32()[0], 6.0f);
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
  EXPECT_LT(seconds_since(t0), kGuardTimeout / 2);
}

TEST(LocalCommLockstep, SubGroupViolationLeavesTheOtherHalfAlone) {
  LocalWorld world(4, CommOptions{true, kGuardTimeout});
  auto errors = run_ranks(world, [](LocalComm& c) {
    const Group half{c.rank() < 2 ? "dcp0" : "dcp1", c.rank() < 2 ? 0 : 2, 2};
    Tensor x = Tensor::zeros({c.rank() == 3 ? 4 : 2}, DType::F32);
    c.all_reduce(half, x);
  });
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
  const std::string want = "lockstep violation on group dcp1 at call #1: rank 2 issued all_reduce F32[2], "
                           "rank 3 issued all_reduce F32[4]";
  EXPECT_EQ(errors[2], want);
  EXPECT_EQ(errors[3], want);
}

// Without the guard a member with a larger tensor must not make the others read or write past
// their buffers: every member fails with the disagreement (ASan checks the "no out-of-bounds").
TEST(LocalCommLockstep, MismatchWithoutCheckFailsCleanly) {
  LocalWorld world(4, CommOptions{false, kGuardTimeout});
  const auto t0 = Clock::now();
  auto errors = run_ranks(world, [](LocalComm& c) { gather(c, {c.rank() == 3 ? 64 : 2, 8}); });
  expect_all_contain(errors, {"all_gather on group tp (call #1", "failed: members disagree at call #1: rank 0 "
                              "issued all_gather F32[2, 8], rank 3 issued all_gather F32[64, 8]"});
  errors = run_ranks(world, [](LocalComm& c) {
    const int64_t rows = c.rank() == 0 ? 400 : 4;
    Tensor in = Tensor::zeros({rows, 3}, DType::F32), out = Tensor::zeros({rows / 4, 3}, DType::F32);
    c.reduce_scatter(kTp, in, out);
  });
  expect_all_contain(errors, {"members disagree", "reduce_scatter F32[400, 3]"});
  errors = run_ranks(world, [](LocalComm& c) {
    const int64_t rows = c.rank() == 1 ? 4 : 400;
    Tensor in = Tensor::zeros({rows, 3}, DType::F32), out = Tensor::zeros({rows, 3}, DType::F32);
    c.all_to_all(kTp, in, out);
  });
  expect_all_contain(errors, {"members disagree", "rank 1 issued all_to_all F32[4, 3]"});
  errors = run_ranks(world, [](LocalComm& c) {
    Tensor x = Tensor::zeros({c.rank() == 0 ? 1000 : 10}, DType::F32);
    c.broadcast(kTp, x, 0);
  });
  expect_all_contain(errors, {"members disagree", "broadcast F32[1000] from member 0"});
  errors = run_ranks(world, [](LocalComm& c) { reduce(c, {c.rank() == 2 ? 7 : 8}); });
  expect_all_contain(errors, {"members disagree", "rank 2 issued all_reduce F32[7]"});
  errors = run_ranks(world, [](LocalComm& c) {
    if (c.rank() == 1) {
      gather(c, {2, 2});
    } else {
      reduce(c, {8, 2});
    }
  });
  expect_all_contain(errors, {"members disagree", "rank 0 issued all_reduce F32[8, 2], rank 1 issued all_gather F32[2, 2]"});
  EXPECT_LT(seconds_since(t0), kGuardTimeout / 2);
}

TEST(LocalCommTimeout, MissingRanksAreNamed) {
  constexpr double kTimeout = 0.3;
  LocalWorld world(4, CommOptions{true, kTimeout});
  std::vector<double> took(4, 0.0);
  std::atomic<int> gave_up{0};
  auto errors = run_ranks(world, [&](LocalComm& c) {
    const auto t0 = Clock::now();
    if (c.rank() == 3) {
      // Never joins call #1 in time; arriving once the others gave up, it fails at once instead
      // of reading their long-gone buffers.
      while (gave_up.load() < 3 && seconds_since(t0) < 10) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      const auto t1 = Clock::now();
      try {
        reduce(c, {4, 128});
      } catch (...) {
        took[3] = seconds_since(t1);
        throw;
      }
      return;
    }
    try {
      reduce(c, {4, 128});
    } catch (...) {
      took[size_t(c.rank())] = seconds_since(t0);
      ++gave_up;
      throw;
    }
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(errors[size_t(r)], fmt::format("rank {}: all_reduce on group tp (call #1, F32[4, 128]) timed out "
                                             "after 0.3 s: rank 3 never arrived", r));
    EXPECT_GE(took[size_t(r)], kTimeout * 0.9);
    EXPECT_LT(took[size_t(r)], kTimeout + 1.0);
  }
  EXPECT_NE(errors[3].find("rank 3: all_reduce on group tp (call #1, F32[4, 128]) failed: group tp is unusable: "
                           "rank "), std::string::npos) << errors[3];
  EXPECT_NE(errors[3].find("timed out at call #1 waiting for rank 3"), std::string::npos) << errors[3];
  EXPECT_LT(took[3], 0.1);
}

TEST(LocalCommTimeout, TwoMissingRanksInASubGroup) {
  constexpr double kTimeout = 0.25;
  LocalWorld world(6, CommOptions{false, kTimeout});
  const Group dcp{"dcp1", 2, 4};  // ranks 2..5; ranks 3 and 5 never come
  const auto t0 = Clock::now();
  auto errors = run_ranks(world, [&](LocalComm& c) {
    if (c.rank() < 2) {  // another group keeps working meanwhile
      for (int i = 0; i < 50; ++i) c.barrier(Group{"dcp0", 0, 2});
      return;
    }
    if (c.rank() == 3 || c.rank() == 5) return;
    Tensor in = Tensor::zeros({1, 4}, DType::I32), out = Tensor::zeros({4, 4}, DType::I32);
    c.all_gather(dcp, in, out);
  });
  EXPECT_LT(seconds_since(t0), kTimeout + 1.0);
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
  EXPECT_EQ(errors[3], "");
  EXPECT_EQ(errors[5], "");
  for (int r : {2, 4})
    EXPECT_EQ(errors[size_t(r)], fmt::format("rank {}: all_gather on group dcp1 (call #1, I32[1, 4]) timed out after "
                                             "0.25 s: ranks 3, 5 never arrived", r));
}

TEST(LocalCommAbort, OthersFailWithTheReason) {
  LocalWorld world(4, CommOptions{true, 30.0});  // a long timeout: abort, not the timeout, ends it
  const Group dcp1{"dcp1", 2, 2};
  const auto t0 = Clock::now();
  std::vector<double> took(4, 0.0);
  std::atomic<bool> aborted{false};
  auto errors = run_ranks(world, [&](LocalComm& c) {
    const int r = c.rank();
    if (r == 2) {
      try {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));  // rank 3 is waiting by now
        fail("bad checkpoint shard {}", 3);
      } catch (const Error& e) {
        c.abort(e.what());
        aborted = true;
        throw;
      }
    }
    if (r == 3) {  // blocked in a collective with rank 2 when it aborts
      Tensor in = Tensor::zeros({2, 4}, DType::F32), out = Tensor::zeros({4, 4}, DType::F32);
      c.all_gather(dcp1, in, out);
      return;
    }
    // Ranks 0 and 1: their own half keeps working; the whole group fails once rank 2 aborted.
    const Group dcp0{"dcp0", 0, 2};
    Tensor x = Tensor::from_f32({1.0f}, {1});
    c.all_reduce(dcp0, x);
    EXPECT_EQ(x.f32()[0], 2.0f);
    while (!aborted.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    const auto t1 = Clock::now();
    try {
      c.barrier(kTp);
    } catch (...) {
      took[size_t(r)] = seconds_since(t1);
      throw;
    }
  });
  EXPECT_LT(seconds_since(t0), 5.0);
  EXPECT_EQ(errors[2], "bad checkpoint shard 3");
  EXPECT_EQ(errors[3], "rank 3: all_gather on group dcp1 (call #1, F32[2, 4]) failed: rank 2 aborted: "
                       "bad checkpoint shard 3");
  for (int r : {0, 1}) {
    EXPECT_EQ(errors[size_t(r)], fmt::format("rank {}: barrier on group tp (call #1) failed: rank 2 aborted: "
                                             "bad checkpoint shard 3", r));
    EXPECT_LT(took[size_t(r)], 0.1);  // immediately, not after a timeout
  }
}

}  // namespace
}  // namespace dsi::test
