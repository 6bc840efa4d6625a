// The peer-to-peer collectives (backends/cuda/comm/peer_collectives.h) on thread ranks with a
// LocalWorld host group: 2, 3, 4 and 8 ranks spread over the visible GPUs (all on one GPU when
// there is one: the protocol and the flags are the same, the copies stay on that device), each on
// its own stream. Against the host reference on the same inputs, bitwise: gathers move bytes, and
// sums are member-order sums (sum_in_member_order, what LocalComm computes). Repeated calls use both
// banks and advance the epochs; calls captured in a CUDA graph replay with new inputs; a member that
// never arrives turns into an error naming it. Every device allocation is made before the first
// collective and freed after the last one on every rank (a cudaFree could otherwise wait for a
// kernel that waits for this rank).
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backends/cuda/comm/peer_collectives.h"
#include "backends/cuda/device.h"
#include "comm/local_comm.h"
#include "comm/lockstep.h"
#include "cuda/cuda_test_util.h"

namespace dsi {
namespace {

using cuda::PeerGroup;

constexpr size_t kCapacity = 64 << 10;

void ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("{}: {}", what, cudaGetErrorString(e));
}

struct PeerRank {
  int rank = 0, members = 0, device = 0;
  LocalComm* host = nullptr;
  PeerGroup* group = nullptr;
  cudaStream_t stream = nullptr;
  char* in = nullptr;   // device scratch: kCapacity * members + 16 bytes each
  char* out = nullptr;
};

// Runs fn on n thread ranks (rank r on GPU r mod the visible GPUs), each with a PeerGroup over the
// whole world and its own non-blocking stream; failures are collected per rank.
void run_peer_ranks(int n, double timeout_s, const std::function<void(PeerRank&)>& fn) {
  LocalWorld world(n, CommOptions{false, 30.0});
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      PeerRank pr;
      pr.rank = r;
      pr.members = n;
      pr.device = r % cuda::device_count();
      pr.host = &world.comm(r);
      std::unique_ptr<PeerGroup> group;
      try {
        ok(cudaSetDevice(pr.device), "cudaSetDevice");
        ok(cudaStreamCreateWithFlags(&pr.stream, cudaStreamNonBlocking), "cudaStreamCreate");
        const size_t scratch = kCapacity * size_t(n) + 16;
        ok(cudaMalloc(&pr.in, scratch), "cudaMalloc");
        ok(cudaMalloc(&pr.out, scratch), "cudaMalloc");
        group = PeerGroup::create(world.comm(r), Group{"world", 0, n}, pr.device, kCapacity, timeout_s);
        pr.group = group.get();
        fn(pr);
      } catch (const std::exception& e) {
        errors[size_t(r)] = e.what();
        world.comm(r).abort(e.what());
      }
      try {
        world.comm(r).barrier(Group{"world", 0, n});  // nobody frees memory a peer still uses
      } catch (const std::exception&) {
      }
      group.reset();
      cudaFree(pr.in);
      cudaFree(pr.out);
      if (pr.stream != nullptr) cudaStreamDestroy(pr.stream);
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[size_t(r)], "") << "rank " << r;
}

// Rank r's input of call `call`: bytes, or floats of mixed magnitudes (sums round).
std::vector<uint8_t> input_bytes(int rank, int call, size_t bytes) {
  std::mt19937_64 rng(uint64_t(rank) * 7919 + uint64_t(call) * 104729 + bytes);
  std::vector<uint8_t> v(bytes);
  for (auto& b : v) b = uint8_t(rng() >> 56);
  return v;
}
std::vector<float> input_floats(int rank, int call, size_t n) {
  std::mt19937_64 rng(uint64_t(rank) * 31337 + uint64_t(call) * 7 + n);
  std::vector<float> v(n);
  for (auto& x : v) x = std::ldexp(float(double(rng() >> 11) * 0x1.0p-53 * 2.0 - 1.0), int(rng() % 17) - 8);
  return v;
}

template <typename T>
std::vector<T> download(const void* p, size_t n) {
  std::vector<T> v(n);
  ok(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy");
  return v;
}

// The reference sums: out = sum over members in member order of part j (j = 0..G-1).
std::vector<float> member_sum(const std::vector<std::vector<float>>& parts, size_t offset, size_t n) {
  std::vector<const float*> ptrs;
  for (const auto& p : parts) ptrs.push_back(p.data() + offset);
  std::vector<float> out(n);
  sum_in_member_order(out.data(), ptrs.data(), int(ptrs.size()), int64_t(n));
  return out;
}

// One all_gather, reduce_scatter and all_reduce of each size, checked; `call` numbers the inputs.
void check_calls(PeerRank& r, int& call) {
  const int G = r.members;
  for (size_t bytes : {size_t(1), size_t(3), size_t(16), size_t(100), size_t(1000), size_t(4101), kCapacity}) {
    for (size_t misalign : {size_t(0), size_t(1)}) {  // 16-byte moves, and byte moves
      if (misalign && bytes == kCapacity) continue;
      ++call;
      const auto mine = input_bytes(r.rank, call, bytes);
      ok(cudaMemcpy(r.in + misalign, mine.data(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
      r.group->all_gather(r.in + misalign, bytes, r.out, r.stream);
      ok(cudaStreamSynchronize(r.stream), "all_gather");
      r.group->check();
      const auto got = download<uint8_t>(r.out, bytes * size_t(G));
      for (int j = 0; j < G; ++j)
        ASSERT_EQ(std::memcmp(got.data() + size_t(j) * bytes, input_bytes(j, call, bytes).data(), bytes), 0)
            << "all_gather of " << bytes << " B (misaligned " << misalign << "): member " << j << "'s part, call "
            << call << ", rank " << r.rank << " of " << G;
    }
  }
  for (size_t m : {size_t(1), size_t(5), size_t(1000), kCapacity / 4}) {
    ++call;
    {  // reduce_scatter: [G m] -> [m]
      std::vector<std::vector<float>> all;
      for (int j = 0; j < G; ++j) all.push_back(input_floats(j, call, m * size_t(G)));
      ok(cudaMemcpy(r.in, all[size_t(r.rank)].data(), m * G * 4, cudaMemcpyHostToDevice), "cudaMemcpy");
      r.group->reduce_scatter(reinterpret_cast<const float*>(r.in), int64_t(m), reinterpret_cast<float*>(r.out),
                              r.stream);
      ok(cudaStreamSynchronize(r.stream), "reduce_scatter");
      r.group->check();
      const auto got = download<float>(r.out, m);
      const auto want = member_sum(all, size_t(r.rank) * m, m);
      ASSERT_EQ(std::memcmp(got.data(), want.data(), m * 4), 0)
          << "reduce_scatter of " << m << " floats, call " << call << ", rank " << r.rank << " of " << G;
    }
    {  // all_reduce in place
      std::vector<std::vector<float>> all;
      for (int j = 0; j < G; ++j) all.push_back(input_floats(j, call + 1000, m));
      ok(cudaMemcpy(r.in, all[size_t(r.rank)].data(), m * 4, cudaMemcpyHostToDevice), "cudaMemcpy");
      r.group->all_reduce(reinterpret_cast<float*>(r.in), int64_t(m), r.stream);
      ok(cudaStreamSynchronize(r.stream), "all_reduce");
      r.group->check();
      const auto got = download<float>(r.in, m);
      const auto want = member_sum(all, 0, m);
      ASSERT_EQ(std::memcmp(got.data(), want.data(), m * 4), 0)
          << "all_reduce of " << m << " floats, call " << call << ", rank " << r.rank << " of " << G;
    }
  }
}

class PeerCollectives : public test::CudaTest {};

TEST_F(PeerCollectives, MatchTheHostReferenceBitwise) {
  for (int n : {2, 3, 4, 8})
    run_peer_ranks(n, 20.0, [](PeerRank& r) {
      int call = 0;
      for (int round = 0; round < 3; ++round) check_calls(r, call);  // both banks, several epochs
      EXPECT_THROW(r.group->all_reduce(reinterpret_cast<float*>(r.in), int64_t(kCapacity / 4) + 1, r.stream),
                   Error);
    });
}

// all_reduce then all_gather of its result, captured once and replayed with new inputs.
TEST_F(PeerCollectives, GraphReplayMatches) {
  run_peer_ranks(4, 20.0, [](PeerRank& r) {
    const int G = r.members;
    const size_t n = 777;
    float* sum = reinterpret_cast<float*>(r.in);
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    ok(cudaStreamBeginCapture(r.stream, cudaStreamCaptureModeThreadLocal), "begin capture");
    r.group->all_reduce(sum, int64_t(n), r.stream);
    r.group->all_gather(sum, n * 4, r.out, r.stream);
    ok(cudaStreamEndCapture(r.stream, &graph), "end capture");
    ok(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
    for (int replay = 0; replay < 5; ++replay) {
      std::vector<std::vector<float>> all;
      for (int j = 0; j < G; ++j) all.push_back(input_floats(j, 5000 + replay, n));
      ok(cudaMemcpy(sum, all[size_t(r.rank)].data(), n * 4, cudaMemcpyHostToDevice), "cudaMemcpy");
      ok(cudaGraphLaunch(exec, r.stream), "graph launch");
      ok(cudaStreamSynchronize(r.stream), "replay");
      r.group->check();
      const auto want = member_sum(all, 0, n);
      const auto got = download<float>(r.out, n * size_t(G));
      for (int j = 0; j < G; ++j)
        ASSERT_EQ(std::memcmp(got.data() + size_t(j) * n, want.data(), n * 4), 0)
            << "replay " << replay << ", member " << j << "'s copy of the sum, rank " << r.rank;
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  });
}

// Member 1 never calls: member 0's all_reduce gives up after the timeout and check() names member 1.
TEST_F(PeerCollectives, MissingMemberIsNamed) {
  run_peer_ranks(2, 0.5, [](PeerRank& r) {
    if (r.rank == 1) return;
    r.group->all_reduce(reinterpret_cast<float*>(r.in), 100, r.stream);
    ok(cudaStreamSynchronize(r.stream), "all_reduce");
    test::expect_error([&] { r.group->check(); }, {"all_reduce", "for member 1", "never arrived"});
  });
}

}  // namespace
}  // namespace dsi
