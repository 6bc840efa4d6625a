// The peer-to-peer collectives (backends/cuda/comm/peer_collectives.h) on thread ranks with a
// LocalWorld host group: 2, 3, 4 and 8 ranks spread over the visible GPUs (all on one GPU when
// there is one: the protocol and the flags are the same, the copies stay on that device), each on
// its own stream. Against the host reference on the same inputs, bitwise: gathers move bytes, and
// sums are member-order sums (sum_in_member_order, what LocalComm computes). Repeated calls use both
// banks and advance the epochs; calls captured in a CUDA graph replay with new inputs; a member that
// never arrives turns into an error naming it on every member. Every device allocation is made
// before the first collective and freed after the last one on every rank (a cudaFree could
// otherwise wait for a kernel that waits for this rank). Inputs go in and results come out through
// the rank's own stream.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <cstdlib>
#include <functional>
#include <latch>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backends/cuda/comm/peer_collectives.h"
#include "backends/cuda/device.h"
#include "comm/local_comm.h"
#include "comm/lockstep.h"
#include "cuda/cuda_test_util.h"
#include "test_util.h"

namespace dsi {
namespace {

using cuda::PeerGroup;

constexpr size_t kCapacity = 64 << 10;

// Up to 8 ranks share one GPU here, each with its own stream whose kernels must run at the same
// time as the others': more hardware queues than the default 8, and every kernel loaded at start
// (read when CUDA starts, so before main).
const bool kPrepared = [] {
  cuda::prepare_for_spinning_kernels();
  return true;
}();

void ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("{}: {}", what, cudaGetErrorString(e));
}

// Throws (the harness reports it per rank) instead of a gtest assertion that would only return
// from the helper and leave this rank out of the next collectives.
void expect_same(const void* got, const void* want, size_t bytes, const std::string& what) {
  if (std::memcmp(got, want, bytes) != 0) fail("{}: not bitwise equal", what);
}

struct PeerRank {
  int rank = 0, members = 0, device = 0;
  LocalComm* host = nullptr;
  PeerGroup* group = nullptr;
  cudaStream_t stream = nullptr;
  char* in = nullptr;   // device scratch, 2 MiB each
  char* out = nullptr;
};

// Runs fn on n thread ranks (rank r on GPU r mod the visible GPUs), each with a PeerGroup over the
// whole world and its own non-blocking stream; failures are collected per rank.
void run_peer_ranks(int n, double timeout_s, const std::function<void(PeerRank&)>& fn) {
  LocalWorld world(n, CommOptions{false, 30.0});
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::latch done(n);  // unlike the host group's barrier, no abort breaks it
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
        const size_t scratch = size_t(2) << 20;  // >= 8 members x kCapacity + 16; 64 calls x 8 KiB
        ok(cudaMalloc(&pr.in, scratch), "cudaMalloc");
        ok(cudaMalloc(&pr.out, scratch), "cudaMalloc");
        group = PeerGroup::create(world.comm(r), Group{"world", 0, n}, pr.device, kCapacity, timeout_s);
        pr.group = group.get();
        fn(pr);
      } catch (const std::exception& e) {
        errors[size_t(r)] = e.what();
        world.comm(r).abort(e.what());
      }
      if (pr.stream != nullptr) cudaStreamSynchronize(pr.stream);  // bounded by the timeout
      done.arrive_and_wait();  // nobody frees memory a peer still uses
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
std::vector<T> download(const PeerRank& r, const void* p, size_t n) {
  std::vector<T> v(n);
  ok(cudaMemcpyAsync(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost, r.stream), "download");
  ok(cudaStreamSynchronize(r.stream), "download");
  return v;
}

// Ordered before the next collective on the rank's stream (a plain cudaMemcpy from pageable memory
// may return before its copy lands, and the legacy stream is not ordered with this one).
void upload(const PeerRank& r, void* dst, const void* src, size_t bytes) {
  ok(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, r.stream), "upload");
  ok(cudaStreamSynchronize(r.stream), "upload");
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
      upload(r, r.in + misalign, mine.data(), bytes);
      r.group->all_gather(r.in + misalign, bytes, r.out, r.stream);
      ok(cudaStreamSynchronize(r.stream), "all_gather");
      r.group->check();
      const auto got = download<uint8_t>(r, r.out, bytes * size_t(G));
      for (int j = 0; j < G; ++j)
        expect_same(got.data() + size_t(j) * bytes, input_bytes(j, call, bytes).data(), bytes,
                    fmt::format("all_gather of {} B (misaligned {}): member {}'s part, call {}, rank {} of {}",
                                bytes, misalign, j, call, r.rank, G));
    }
  }
  for (size_t m : {size_t(1), size_t(5), size_t(1000), kCapacity / 4}) {
    ++call;
    {  // reduce_scatter: [G m] -> [m]
      std::vector<std::vector<float>> all;
      for (int j = 0; j < G; ++j) all.push_back(input_floats(j, call, m * size_t(G)));
      upload(r, r.in, all[size_t(r.rank)].data(), m * G * 4);
      r.group->reduce_scatter(reinterpret_cast<const float*>(r.in), int64_t(m), reinterpret_cast<float*>(r.out),
                              r.stream);
      ok(cudaStreamSynchronize(r.stream), "reduce_scatter");
      r.group->check();
      const auto got = download<float>(r, r.out, m);
      const auto want = member_sum(all, size_t(r.rank) * m, m);
      expect_same(got.data(), want.data(), m * 4,
                  fmt::format("reduce_scatter of {} floats, call {}, rank {} of {}", m, call, r.rank, G));
    }
    {  // all_reduce in place
      std::vector<std::vector<float>> all;
      for (int j = 0; j < G; ++j) all.push_back(input_floats(j, call + 1000, m));
      upload(r, r.in, all[size_t(r.rank)].data(), m * 4);
      r.group->all_reduce(reinterpret_cast<float*>(r.in), int64_t(m), r.stream);
      ok(cudaStreamSynchronize(r.stream), "all_reduce");
      r.group->check();
      const auto got = download<float>(r, r.in, m);
      const auto want = member_sum(all, 0, m);
      expect_same(got.data(), want.data(), m * 4,
                  fmt::format("all_reduce of {} floats, call {}, rank {} of {}", m, call, r.rank, G));
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
      upload(r, sum, all[size_t(r.rank)].data(), n * 4);
      ok(cudaGraphLaunch(exec, r.stream), "graph launch");
      ok(cudaStreamSynchronize(r.stream), "replay");
      r.group->check();
      const auto want = member_sum(all, 0, n);
      const auto got = download<float>(r, r.out, n * size_t(G));
      for (int j = 0; j < G; ++j)
        expect_same(got.data() + size_t(j) * n, want.data(), n * 4,
                    fmt::format("replay {}, member {}'s copy of the sum, rank {}", replay, j, r.rank));
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  });
}

// 64 calls back to back (no synchronisation between them: members drift apart by up to a call, the
// banks alternate under load, each kernel starts while the one before it ends), then one check of
// every output. Call k: all_reduce of (k % 7) * 300 + 1 floats, or all_gather of k * 37 + 5 bytes.
TEST_F(PeerCollectives, BackToBackCallsMatch) {
  run_peer_ranks(3, 20.0, [](PeerRank& r) {
    const int G = r.members, calls = 64;
    const size_t stride = 8192;  // per call in the scratch buffers (ins: r.in, outs: r.out)
    std::vector<std::vector<uint8_t>> inputs;
    for (int k = 0; k < calls; ++k) {
      const size_t bytes = k % 2 == 0 ? ((k % 7) * 300 + 1) * 4 : size_t(k) * 37 + 5;
      std::vector<uint8_t> v(bytes);
      if (k % 2 == 0) {
        const auto f = input_floats(r.rank, 9000 + k, bytes / 4);
        std::memcpy(v.data(), f.data(), bytes);
      } else {
        v = input_bytes(r.rank, 9000 + k, bytes);
      }
      ok(cudaMemcpyAsync(r.in + k * stride, v.data(), bytes, cudaMemcpyHostToDevice, r.stream), "upload");
      inputs.push_back(std::move(v));
    }
    ok(cudaStreamSynchronize(r.stream), "upload");
    for (int k = 0; k < calls; ++k) {
      const size_t bytes = inputs[size_t(k)].size();
      if (k % 2 == 0)
        r.group->all_reduce(reinterpret_cast<float*>(r.in + k * stride), int64_t(bytes / 4), r.stream);
      else
        r.group->all_gather(r.in + k * stride, bytes, r.out + k * stride, r.stream);
    }
    ok(cudaStreamSynchronize(r.stream), "64 calls");
    r.group->check();
    for (int k = 0; k < calls; ++k) {
      const size_t bytes = inputs[size_t(k)].size();
      if (k % 2 == 0) {
        std::vector<std::vector<float>> all;
        for (int j = 0; j < G; ++j) all.push_back(input_floats(j, 9000 + k, bytes / 4));
        const auto want = member_sum(all, 0, bytes / 4);
        const auto got = download<float>(r, r.in + k * stride, bytes / 4);
        expect_same(got.data(), want.data(), bytes, fmt::format("call {} (all_reduce), rank {}", k, r.rank));
      } else {
        const auto got = download<uint8_t>(r, r.out + k * stride, bytes * size_t(G));
        for (int j = 0; j < G; ++j)
          expect_same(got.data() + size_t(j) * bytes, input_bytes(j, 9000 + k, bytes).data(), bytes,
                      fmt::format("call {} (all_gather), member {}'s part, rank {}", k, j, r.rank));
      }
    }
  });
}

// Member 1 never calls: member 0's all_reduce gives up after the timeout; check() names both on
// both members; the output holds NaN, and later calls are refused.
TEST_F(PeerCollectives, MissingMemberIsNamedOnEveryMember) {
  run_peer_ranks(2, 0.5, [](PeerRank& r) {
    if (r.rank == 0) {
      const std::vector<float> ones(100, 1.0f);
      upload(r, r.in, ones.data(), 400);
      r.group->all_reduce(reinterpret_cast<float*>(r.in), 100, r.stream);
      ok(cudaStreamSynchronize(r.stream), "all_reduce");
      const auto got = download<float>(r, r.in, 100);
      for (float v : got)
        if (!std::isnan(v)) fail("rank 0: the failed all_reduce left {} in its output, not NaN", v);
    }
    r.host->barrier(Group{"world", 0, r.members});  // member 0's timeout has happened
    test::expect_error([&] { r.group->check(); },
                       {"member 0 (world rank 0) waited", "in all_reduce for member 1", "never arrived"});
    test::expect_error([&] { r.group->all_gather(r.in, 16, r.out, r.stream); }, {"failed earlier"});
  });
}

}  // namespace
}  // namespace dsi
