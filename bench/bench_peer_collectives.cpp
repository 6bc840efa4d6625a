// Latency of small collectives inside CUDA graphs, as a decode step issues them: the peer-to-peer
// one-shot kernels (backends/cuda/comm/peer_collectives.h) next to NCCL on the same thread ranks.
// Each rank captures K calls of one collective into a graph; after warm-up replays the ranks start
// each timed replay together (host barrier) and the time per call is the slowest rank's replay time
// divided by K.
//
//   bench_peer_collectives [--ranks N] [--calls K] [--iters I] [--max-bytes B]
//
// Rank r runs on GPU r mod the visible GPUs. With fewer GPUs than ranks the peer rows measure the
// protocol on one device (no NVLink) and NCCL, which needs a GPU per rank, is left out.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <latch>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backends/cuda/comm/peer_collectives.h"
#include "backends/cuda/device.h"
#include "comm/local_comm.h"

#ifdef DSI_WITH_NCCL
#include <nccl.h>
#endif

namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  int ranks = 2;
  int calls = 100;
  int iters = 20;
  int64_t max_bytes = 64 << 10;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_peer_collectives: %s needs a value\n", k.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (k == "--ranks") a.ranks = std::atoi(next());
    else if (k == "--calls") a.calls = std::atoi(next());
    else if (k == "--iters") a.iters = std::atoi(next());
    else if (k == "--max-bytes") a.max_bytes = std::atoll(next());
    else {
      std::fprintf(stderr, "usage: bench_peer_collectives [--ranks N] [--calls K] [--iters I] [--max-bytes B]\n");
      std::exit(2);
    }
  }
  return a;
}

void ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) dsi::fail("{}: {}", what, cudaGetErrorString(e));
}

enum Op { kAllGather, kReduceScatter, kAllReduce };
const char* op_name(int op) {
  return op == kAllGather ? "all_gather" : op == kReduceScatter ? "reduce_scatter" : "all_reduce";
}

// Captures `calls` x enqueue() on the stream, replays, returns seconds per call (this rank).
double time_graph(dsi::LocalComm& host, const dsi::Group& g, cudaStream_t s, int calls, int iters,
                  const std::function<void()>& enqueue) {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ok(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "begin capture");
  for (int i = 0; i < calls; ++i) enqueue();
  ok(cudaStreamEndCapture(s, &graph), "end capture");
  ok(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  for (int i = 0; i < 3; ++i) ok(cudaGraphLaunch(exec, s), "warm-up");
  ok(cudaStreamSynchronize(s), "warm-up");
  double best = 1e30;
  for (int i = 0; i < iters; ++i) {
    host.barrier(g);
    const auto t0 = Clock::now();
    ok(cudaGraphLaunch(exec, s), "replay");
    ok(cudaStreamSynchronize(s), "replay");
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return best / calls;
}

int run(const Args& a) {
  const int n_dev = dsi::cuda::device_count();
  const int N = a.ranks;
  if (n_dev < 1 || N < 1 || N > dsi::cuda::kPeerMaxMembers) {
    std::fprintf(stderr, "bench_peer_collectives: %d ranks on %d visible GPU(s)\n", N, n_dev);
    return 1;
  }
  bool with_nccl = false;
#ifdef DSI_WITH_NCCL
  with_nccl = N <= n_dev;
#endif
  std::vector<int64_t> sizes;
  for (int64_t b = 128; b <= a.max_bytes; b *= 2) sizes.push_back(b);
  struct Row {
    int op;
    int64_t bytes;  // per member: all_gather input, reduce_scatter output, all_reduce tensor
    std::vector<double> peer, nccl;
  };
  std::vector<Row> rows;
  for (int op : {kAllGather, kReduceScatter, kAllReduce})
    for (int64_t b : sizes) rows.push_back({op, b, std::vector<double>(size_t(N)), std::vector<double>(size_t(N))});

  dsi::LocalWorld world(N, dsi::CommOptions{false, 120.0});
  const dsi::Group g{"world", 0, N};
  std::vector<std::string> errors(static_cast<size_t>(N));
  std::latch done(N);
  std::vector<std::thread> threads;
  for (int r = 0; r < N; ++r)
    threads.emplace_back([&, r] {
      dsi::LocalComm& host = world.comm(r);
      const int dev = r % n_dev;
      cudaStream_t s = nullptr;
      char* in = nullptr;
      char* out = nullptr;
      std::unique_ptr<dsi::cuda::PeerGroup> peers;
      try {
        ok(cudaSetDevice(dev), "cudaSetDevice");
        ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
        ok(cudaMalloc(&in, size_t(a.max_bytes) * N), "cudaMalloc");
        ok(cudaMalloc(&out, size_t(a.max_bytes) * N), "cudaMalloc");
        ok(cudaMemset(in, 0, size_t(a.max_bytes) * N), "cudaMemset");
        peers = dsi::cuda::PeerGroup::create(host, g, dev, size_t(a.max_bytes), 30.0);
        for (Row& row : rows) {
          const size_t bytes = size_t(row.bytes);
          row.peer[size_t(r)] = time_graph(host, g, s, a.calls, a.iters, [&] {
            if (row.op == kAllGather) peers->all_gather(in, bytes, out, s);
            else if (row.op == kReduceScatter)
              peers->reduce_scatter(reinterpret_cast<float*>(in), int64_t(bytes / 4), reinterpret_cast<float*>(out), s);
            else peers->all_reduce(reinterpret_cast<float*>(in), int64_t(bytes / 4), s);
          });
          peers->check();
        }
#ifdef DSI_WITH_NCCL
        if (with_nccl) {
          auto nccl_ok = [](ncclResult_t e, const char* what) {
            if (e != ncclSuccess) dsi::fail("{}: {}", what, ncclGetErrorString(e));
          };
          ncclUniqueId id{};
          if (r == 0) nccl_ok(ncclGetUniqueId(&id), "ncclGetUniqueId");
          dsi::Tensor t = dsi::Tensor::empty({int64_t(sizeof id)}, dsi::DType::U8);
          std::memcpy(t.raw(), &id, sizeof id);
          host.broadcast(g, t, 0);
          std::memcpy(&id, t.raw(), sizeof id);
          ncclComm_t comm = nullptr;
          nccl_ok(ncclCommInitRank(&comm, N, id, r), "ncclCommInitRank");
          for (Row& row : rows) {
            const size_t bytes = size_t(row.bytes);
            row.nccl[size_t(r)] = time_graph(host, g, s, a.calls, a.iters, [&] {
              if (row.op == kAllGather)
                nccl_ok(ncclAllGather(in, out, bytes, ncclUint8, comm, s), "ncclAllGather");
              else if (row.op == kReduceScatter)
                nccl_ok(ncclReduceScatter(in, out, bytes / 4, ncclFloat32, ncclSum, comm, s), "ncclReduceScatter");
              else
                nccl_ok(ncclAllReduce(in, in, bytes / 4, ncclFloat32, ncclSum, comm, s), "ncclAllReduce");
            });
          }
          ncclCommDestroy(comm);
        }
#endif
      } catch (const std::exception& e) {
        errors[size_t(r)] = e.what();
        host.abort(e.what());
      }
      if (s != nullptr) cudaStreamSynchronize(s);  // bounded by the peer timeout
      done.arrive_and_wait();  // nobody frees memory a peer still uses (no abort breaks this)
      peers.reset();
      cudaFree(in);
      cudaFree(out);
      if (s != nullptr) cudaStreamDestroy(s);
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < N; ++r)
    if (!errors[size_t(r)].empty()) {
      std::fprintf(stderr, "bench_peer_collectives: rank %d: %s\n", r, errors[size_t(r)].c_str());
      return 1;
    }
  std::printf("# %d rank(s) on %d GPU(s) (%s); %d calls per graph, best of %d replays%s\n", N,
              std::min(N, n_dev), dsi::cuda::device_description(0).c_str(), a.calls, a.iters,
              N > n_dev ? "; ranks share GPUs: no NVLink, no NCCL" : "");
  std::printf("%-15s %10s %14s %14s\n", "op", "bytes", "peer us/call", "NCCL us/call");
  for (const Row& row : rows) {
    const double p = *std::max_element(row.peer.begin(), row.peer.end());
    const double n = *std::max_element(row.nccl.begin(), row.nccl.end());
    if (with_nccl)
      std::printf("%-15s %10lld %14.2f %14.2f\n", op_name(row.op), static_cast<long long>(row.bytes), p * 1e6, n * 1e6);
    else
      std::printf("%-15s %10lld %14.2f %14s\n", op_name(row.op), static_cast<long long>(row.bytes), p * 1e6, "-");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Ranks sharing a GPU need their streams' kernels to run at once: more hardware queues than the
  // default 8 (read when CUDA starts).
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
  try {
    return run(parse(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_peer_collectives: %s\n", e.what());
    return 1;
  }
}
