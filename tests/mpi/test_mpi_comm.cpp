// MpiComm across 4 processes (ctest runs `mpirun -np 4 dsinfer_mpi_tests`): every collective's
// result on the world, halves, a trio and singletons, checked bitwise against member-order sums
// computed here; the lockstep guard seen by every rank, after which all ranks carry on in step.
// Two disabled cases are run by their own ctest entries, because they end the MPI job: a timeout
// and abort().
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "../test_comm_util.h"
#include "comm/mpi_comm.h"
#include "mpi_session.h"

namespace dsi::test {

MpiSession* g_session = nullptr;  // set by main before the tests run

namespace {

const Group kWorld{"world", 0, 4};

TEST(MpiComm, CollectivesOnWorldAndSubGroups) {
  MpiComm comm(*g_session, CommOptions{true, 20.0});
  ASSERT_EQ(comm.world_size(), 4) << "run with mpirun -np 4";
  const int r = comm.rank();
  const Group half{r < 2 ? "dcp0" : "dcp1", r < 2 ? 0 : 2, 2};
  const Group trio{"trio", 1, 3}, self{"self", r, 1};
  uint64_t seed = 1;
  for (CollectiveOp op : kAllOps)
    for (DType dt : {DType::F32, DType::I32}) {
      if (sums(op) && dt != DType::F32) continue;
      for (int64_t rows : {0, 1, 3}) {
        for (int root = 0; root < (op == CollectiveOp::kBroadcast ? 4 : 1); ++root)
          EXPECT_EQ(check_collective(comm, kWorld, op, dt, rows, 5, seed++, root), "");
        // The halves run different operations at the same time.
        const CollectiveOp other = kAllOps[(size_t(op) + (r < 2 ? 0 : 2)) % 6];
        EXPECT_EQ(check_collective(comm, half, other, sums(other) ? DType::F32 : dt, rows, 3, seed++, 1), "");
        if (r >= 1) {
          EXPECT_EQ(check_collective(comm, trio, op, dt, rows, 4, seed, 2), "");
        }
        ++seed;
        EXPECT_EQ(check_collective(comm, self, op, dt, rows, 2, seed++), "");
      }
    }
  // Larger tensors whose element count is not a multiple of the group size (all_reduce pads).
  EXPECT_EQ(check_collective(comm, kWorld, CollectiveOp::kAllReduce, DType::F32, 37, 129, 99), "");
  EXPECT_EQ(check_collective(comm, trio.contains(r) ? trio : self, CollectiveOp::kAllReduce, DType::F32, 5, 7, 98), "");
  // Member order: ((1e8 + 1) - 1e8) + 1 = 1 in fp32.
  const float vals[4] = {1e8f, 1.0f, -1e8f, 1.0f};
  Tensor x = Tensor::from_f32({vals[r], vals[r], vals[r]}, {3});
  comm.all_reduce(kWorld, x);
  EXPECT_EQ(x.f32()[2], 1.0f);
}

// Runs `fn` and returns its dsi::Error message ("" when it succeeded).
std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// How many ranks of the world have `ok` (the comm is still in step after a violation).
int count_ranks(MpiComm& comm, bool ok) {
  Tensor n = Tensor::from_f32({ok ? 1.0f : 0.0f}, {1});
  comm.all_reduce(kWorld, n);
  return int(n.f32()[0]);
}

TEST(MpiComm, LockstepViolationSeenByEveryRank) {
  MpiComm comm(*g_session, CommOptions{true, 20.0});
  const int r = comm.rank();
  const auto t0 = std::chrono::steady_clock::now();
  Tensor a = Tensor::zeros({2, 8}, DType::F32), gathered = Tensor::zeros({8, 8}, DType::F32);
  // Rank 1 skips the all_gather and issues the next collective.
  std::string e = error_of([&] {
    if (r == 1) {
      comm.all_reduce(kWorld, a);
    } else {
      comm.all_gather(kWorld, a, gathered);
    }
  });
  EXPECT_EQ(e, "lockstep violation on group world at call #1: rank 0 issued all_gather F32[2, 8], rank 1 issued "
               "all_reduce F32[2, 8]");
  EXPECT_EQ(count_ranks(comm, e.find("lockstep violation") == 0), 4);

  // Another shape on one member of a half; the other half is unaffected.
  const Group half{r < 2 ? "dcp0" : "dcp1", r < 2 ? 0 : 2, 2};
  e = error_of([&] {
    Tensor x = Tensor::zeros({r == 3 ? 5 : 4}, DType::F32);
    comm.all_reduce(half, x);
  });
  EXPECT_EQ(e, r < 2 ? "" : "lockstep violation on group dcp1 at call #1: rank 2 issued all_reduce F32[4], rank 3 "
                            "issued all_reduce F32[5]");

  // Another dtype, another broadcast root.
  e = error_of([&] {
    Tensor in = Tensor::zeros({4, 2}, r == 2 ? DType::I32 : DType::F32);
    Tensor out = Tensor::zeros({4, 2}, in.dtype());
    comm.all_to_all(kWorld, in, out);
  });
  EXPECT_EQ(e, "lockstep violation on group world at call #3: rank 0 issued all_to_all F32[4, 2], rank 2 issued "
               "all_to_all I32[4, 2]");
  e = error_of([&] { comm.broadcast(kWorld, a, r == 3 ? 2 : 0); });
  EXPECT_EQ(e, "lockstep violation on group world at call #4: rank 0 issued broadcast F32[2, 8] from member 0, "
               "rank 3 issued broadcast F32[2, 8] from member 2");

  // Invalid arguments on one rank fail every rank (none waits for it).
  e = error_of([&] {
    Tensor out = Tensor::zeros({r == 1 ? 7 : 8, 8}, DType::F32);
    comm.all_gather(kWorld, a, out);
  });
  const std::string want =
      r == 1 ? "rank 1: all_gather on group world (call #5, F32[2, 8]): all_gather: output is F32[7, 8], "
               "expected F32[8, 8] for input F32[2, 8] on a group of 4"
             : fmt::format("rank {}: all_gather on group world (call #5, F32[2, 8]) failed: rank 1 passed "
                           "invalid arguments for all_gather F32[2, 8]", r);
  EXPECT_EQ(e, want);

  // Still in step: a correct collective works on every rank.
  EXPECT_EQ(check_collective(comm, kWorld, CollectiveOp::kAllReduce, DType::F32, 3, 3, 7), "");
  EXPECT_EQ(count_ranks(comm, true), 4);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
}

// The node-local rank (which picks a process's GPU under mpirun) comes from the launcher's variable.
TEST(MpiLaunch, LocalRankFromEnvironment) {
  const char* saved = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  const std::string keep = saved ? saved : "";
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "3", 1);
  EXPECT_EQ(local_rank_from_env(), 3);
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "x", 1);
  EXPECT_NE(error_of([] { local_rank_from_env(); }).find("OMPI_COMM_WORLD_LOCAL_RANK=x"), std::string::npos);
  if (saved)
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", keep.c_str(), 1);
  else
    unsetenv("OMPI_COMM_WORLD_LOCAL_RANK");
}

// Run by the ctest entry MpiComm.TimeoutNamesTheOperation: rank 1 never joins; the others fail
// after the timeout, and the session then aborts the job (nothing can continue after a timeout).
TEST(MpiCommTimeout, DISABLED_MissingRank) {
  MpiComm comm(*g_session, CommOptions{false, 1.0});
  comm.barrier(kWorld);  // creates the group comm while everyone is here
  if (comm.rank() == 1) {  // hangs (until mpirun kills it when the others abort)
    std::this_thread::sleep_for(std::chrono::seconds(60));
    return;
  }
  const std::string e = error_of([&] {
    Tensor x = Tensor::zeros({4}, DType::F32);
    comm.all_reduce(kWorld, x);
  });
  std::fprintf(stderr, "caught: %s\n", e.c_str());
}

// Run by the ctest entry MpiComm.AbortKillsTheJob: rank 1 aborts; mpirun ends every process.
TEST(MpiCommAbort, DISABLED_RankAborts) {
  MpiComm comm(*g_session, CommOptions{false, 30.0});
  comm.barrier(kWorld);
  if (comm.rank() == 1) comm.abort("injected failure");
  comm.barrier(kWorld);  // never completes
  ADD_FAILURE() << "barrier completed after rank 1 aborted";
}

// Other ranks print only their failures, prefixed with the rank (rank 0 prints the usual report).
class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed())
      std::fprintf(stderr, "[rank %d] %s:%d: failure\n%s\n", rank_, r.file_name() ? r.file_name() : "?",
                   r.line_number(), r.message());
  }

 private:
  int rank_;
};

}  // namespace
}  // namespace dsi::test

int main(int argc, char** argv) {
  dsi::MpiSession session(&argc, &argv);
  dsi::test::g_session = &session;
  ::testing::InitGoogleTest(&argc, argv);
  if (session.rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new dsi::test::FailurePrinter(session.rank()));
  }
  int failed = RUN_ALL_TESTS();
  if (session.broken()) return 1;  // the session's destructor aborts the job
  // Every process exits with the job's result.
  int any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return any;
}
