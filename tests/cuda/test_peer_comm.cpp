// The peer communicator (comm/peer_comm.h) on thread ranks with a LocalWorld host group: 2, 3 and 4
// ranks on logical CUDA devices (GPU sharing: on one GPU they share it, which is also how the TP/DCP
// engine tests run on one GPU). Every collective against the host group's own result on the same
// inputs, bitwise (gathers move bytes; sums are member-order sums), with slots of 256 bytes so each
// message moves in several pieces, on the world and on sub-groups, with non-contiguous inputs and
// outputs; the lockstep guard; an aborting rank ends the others' waits at once.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backends/cuda/device.h"
#include "comm/local_comm.h"
#include "comm/peer_comm.h"
#include "cuda/cuda_test_util.h"
#include "test_util.h"

namespace dsi {
namespace {

// Several ranks' streams on one GPU must run side by side (device.h; read when CUDA starts, so
// before main).
const bool kPrepared = [] {
  cuda::prepare_for_spinning_kernels();
  return true;
}();

struct Ranks {
  int rank = 0, n = 0;
  LocalComm* host = nullptr;
  PeerComm* comm = nullptr;
  Device device;
};

// Runs fn on n thread ranks, rank r on logical device r, each with a PeerComm (slots of `slot`
// bytes) over its LocalComm. Returns every rank's error ("" for none).
std::vector<std::string> run_ranks(int n, CommOptions opts, size_t slot, const std::function<void(Ranks&)>& fn) {
  const bool was_sharing = cuda::gpu_sharing();
  cuda::set_gpu_sharing(true);
  LocalWorld world(n, opts);
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      Ranks rk;
      rk.rank = r;
      rk.n = n;
      rk.host = &world.comm(r);
      rk.device = Device::cuda(r);
      std::unique_ptr<PeerComm> comm;
      try {
        std::vector<Group> groups;
        if (n == 4) groups = {Group{"pair", r / 2 * 2, 2}};
        comm = PeerComm::create(world.comm(r), PeerSetup{r, groups, slot});
        rk.comm = comm.get();
        fn(rk);
      } catch (const std::exception& e) {
        errors[size_t(r)] = e.what();
        if (comm) comm->abort(e.what());
        else world.comm(r).abort(e.what());
      }
    });
  for (auto& t : threads) t.join();
  cuda::set_gpu_sharing(was_sharing);  // the tests after these run as they would alone
  return errors;
}

Tensor random_tensor(const Shape& shape, DType dtype, uint64_t seed) {
  Tensor t = Tensor::empty(shape, dtype);
  std::mt19937_64 rng(seed);
  if (dtype == DType::F32) {
    float* p = t.f32();
    for (int64_t i = 0; i < t.numel(); ++i)
      p[i] = std::ldexp(float(double(rng() >> 11) * 0x1.0p-53 * 2.0 - 1.0), int(rng() % 17) - 8);
  } else {
    auto* p = static_cast<uint8_t*>(t.raw());
    for (size_t i = 0; i < t.nbytes(); ++i) p[i] = uint8_t(rng() >> 56);
    if (dtype == DType::BF16)  // finite values only: a host copy need not keep NaN payloads
      for (size_t i = 1; i < t.nbytes(); i += 2) p[i] &= 0xbf;
  }
  return t;
}

void expect_same(const Tensor& got_device, const Tensor& want, const std::string& what) {
  const Tensor got = to_host(got_device).contiguous();
  const Tensor w = want.contiguous();
  DSI_CHECK(got.shape() == w.shape(), "{}: {} where the host group has {}", what, got.desc(), w.desc());
  const auto* g = static_cast<const uint8_t*>(got.raw());
  const auto* h = static_cast<const uint8_t*>(w.raw());
  size_t first = w.nbytes(), diffs = 0;
  for (size_t i = 0; i < w.nbytes(); ++i)
    if (g[i] != h[i]) {
      first = std::min(first, i);
      ++diffs;
    }
  if (diffs > 0)
    fail("{}: {} of {} bytes differ from the host group's result, the first at byte {} ({:#04x}, not {:#04x})",
         what, diffs, w.nbytes(), first, g[first], h[first]);
}

// Every collective once on group g; `seed` varies the inputs per round.
void check_collectives(Ranks& r, const Group& g, uint64_t seed) {
  const int G = g.size;
  const uint64_t s = seed * 1000 + uint64_t(r.rank) * 10;
  const std::string where = fmt::format("rank {} on group {} (round {})", r.rank, g.name, seed);
  {  // all_gather of a non-contiguous BF16 view into a non-contiguous output
    const Tensor in = random_tensor({3, 50}, DType::BF16, s + 1).narrow(1, 5, 37);
    Tensor want = Tensor::empty({G * 3, 37}, DType::BF16);
    r.host->all_gather(g, in, want);
    Tensor out_big = Tensor::zeros({G * 3, 40}, DType::BF16, r.device);
    Tensor out = out_big.narrow(1, 2, 37);
    r.comm->all_gather(g, to_device(in.contiguous(), r.device).narrow(1, 0, 37), out);
    expect_same(out, want, where + ": all_gather");
    Tensor in_big = to_device(random_tensor({3, 50}, DType::BF16, s + 1), r.device);
    Tensor out2 = Tensor::empty({G * 3, 37}, DType::BF16, r.device);
    r.comm->all_gather(g, in_big.narrow(1, 5, 37), out2);
    expect_same(out2, want, where + ": all_gather of a strided view");
  }
  {  // reduce_scatter: [G * 13, 7] -> [13, 7]
    const Tensor in = random_tensor({G * 13, 7}, DType::F32, s + 2);
    Tensor want = Tensor::empty({13, 7}, DType::F32);
    r.host->reduce_scatter(g, in, want);
    Tensor out = Tensor::empty({13, 7}, DType::F32, r.device);
    r.comm->reduce_scatter(g, to_device(in, r.device), out);
    expect_same(out, want, where + ": reduce_scatter");
  }
  {  // all_reduce of 301 floats, and of one
    for (int64_t n : {301, 1}) {
      Tensor want = random_tensor({n}, DType::F32, s + 3 + uint64_t(n));
      Tensor d = to_device(want, r.device);
      r.host->all_reduce(g, want);
      r.comm->all_reduce(g, d);
      expect_same(d, want, where + fmt::format(": all_reduce of {}", n));
    }
  }
  {  // all_to_all: [G * 11, 5] I32
    const Tensor in = random_tensor({G * 11, 5}, DType::I32, s + 4);
    Tensor want = Tensor::empty({G * 11, 5}, DType::I32);
    r.host->all_to_all(g, in, want);
    Tensor out = Tensor::empty({G * 11, 5}, DType::I32, r.device);
    r.comm->all_to_all(g, to_device(in, r.device), out);
    expect_same(out, want, where + ": all_to_all");
  }
  {  // broadcast of 333 bytes from the last member
    Tensor want = random_tensor({333}, DType::U8, s + 5);
    Tensor d = to_device(want, r.device);
    r.host->broadcast(g, want, G - 1);
    r.comm->broadcast(g, d, G - 1);
    expect_same(d, want, where + ": broadcast");
  }
}

class PeerCommTest : public test::CudaTest {};

TEST_F(PeerCommTest, EveryCollectiveMatchesTheHostGroupBitwise) {
  for (int n : {2, 3, 4}) {
    SCOPED_TRACE(fmt::format("{} ranks", n));
    const auto errors = run_ranks(n, CommOptions{false, 30.0}, 256, [](Ranks& r) {
      const Group world{"world", 0, r.n};
      for (uint64_t round = 0; round < 2; ++round) {
        check_collectives(r, world, round);
        if (r.n == 4) check_collectives(r, Group{"pair", r.rank / 2 * 2, 2}, round);
      }
      r.comm->barrier(world);
      r.comm->check_async();
    });
    for (int r = 0; r < n; ++r) EXPECT_EQ(errors[size_t(r)], "") << "rank " << r;
  }
}

TEST_F(PeerCommTest, LockstepGuardNamesTheDivergenceOnEveryRank) {
  const auto errors = run_ranks(2, CommOptions{true, 30.0}, 1 << 16, [](Ranks& r) {
    Tensor t = Tensor::zeros({r.rank == 0 ? 4 : 5}, DType::F32, r.device);
    r.comm->all_reduce(Group{"world", 0, 2}, t);
  });
  for (int r = 0; r < 2; ++r) EXPECT_NE(errors[size_t(r)].find("lockstep violation"), std::string::npos) << errors[size_t(r)];
}

// Rank 1 fails before its all_reduce: rank 0's kernel stops waiting when rank 1 aborts (long before
// the 60 s timeout), and its next check names the aborted rank.
TEST_F(PeerCommTest, AnAbortingRankEndsTheOthersWaitsAtOnce) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto errors = run_ranks(2, CommOptions{false, 60.0}, 1 << 16, [](Ranks& r) {
    Tensor t = Tensor::zeros({64}, DType::F32, r.device);
    if (r.rank == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      fail("rank 1 gave up");
    }
    r.comm->all_reduce(Group{"world", 0, 2}, t);
    (void)to_host(t);  // waits for the kernel: it ends with the abort
    r.comm->check_async();
  });
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(errors[1].find("rank 1 gave up"), std::string::npos) << errors[1];
  EXPECT_NE(errors[0].find("aborted"), std::string::npos) << errors[0];
  EXPECT_LT(s, 20.0);
}

}  // namespace
}  // namespace dsi
