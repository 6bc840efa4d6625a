// Collective latency and bandwidth of the NCCL communicator on thread ranks, one GPU each (as
// `dsinfer generate --device cuda --tp N` runs them): all_gather, reduce_scatter and all_reduce from
// 128 B to 16 MiB, eager (each call blocks until done, as the Communicator interface promises).
// Sums are timed in both forms: the default member-order one (NCCL's own reduction for groups of
// two) and the exchange + member-order kernel that groups of more than two use.
//
//   bench_collectives [--ranks N] [--iters I] [--warmup W] [--max-bytes B]
//
// Per size: microseconds per call (the slowest rank's mean), algorithm bandwidth (bytes / time) and
// bus bandwidth (nccl-tests' convention: x 2(N-1)/N for all_reduce, x (N-1)/N for the others), to
// compare with the NVLink ceiling (H200 NVLink 4: about 450 GB/s per direction).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backends/cuda/device.h"
#include "comm/local_comm.h"
#include "core/tensor.h"

#ifdef DSI_WITH_NCCL
#include "comm/nccl_comm.h"
#endif

namespace {

#ifdef DSI_WITH_NCCL

using Clock = std::chrono::steady_clock;

struct Args {
  int ranks = 2;
  int iters = 200;
  int warmup = 20;
  int64_t max_bytes = int64_t(16) << 20;
};

Args parse(int argc, char** argv) {
  Args a;
  a.ranks = std::min(2, dsi::cuda::device_count());
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_collectives: %s needs a value\n", k.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (k == "--ranks") a.ranks = std::atoi(next());
    else if (k == "--iters") a.iters = std::atoi(next());
    else if (k == "--warmup") a.warmup = std::atoi(next());
    else if (k == "--max-bytes") a.max_bytes = std::atoll(next());
    else {
      std::fprintf(stderr, "usage: bench_collectives [--ranks N] [--iters I] [--warmup W] [--max-bytes B]\n");
      std::exit(2);
    }
  }
  return a;
}

enum class Op { kAllGather, kReduceScatter, kAllReduce };
const char* op_name(Op op) {
  switch (op) {
    case Op::kAllGather: return "all_gather";
    case Op::kReduceScatter: return "reduce_scatter";
    case Op::kAllReduce: return "all_reduce";
  }
  return "?";
}

struct Case {
  Op op;
  bool ordered;     // the exchange + member-order kernel path
  int64_t bytes;    // all_gather: output; reduce_scatter: input; all_reduce: the tensor
};

int run(const Args& a) {
  const int n_dev = dsi::cuda::device_count();
  if (a.ranks < 1 || a.ranks > n_dev) {
    std::fprintf(stderr, "bench_collectives: %d ranks, but %d CUDA device(s) visible\n", a.ranks, n_dev);
    return 1;
  }
  const int N = a.ranks;
  std::vector<int64_t> sizes;
  for (int64_t b = 128; b <= a.max_bytes; b *= 2) sizes.push_back(b);
  std::vector<Case> cases;
  for (Op op : {Op::kAllGather, Op::kReduceScatter, Op::kAllReduce})
    for (bool ordered : {false, true}) {
      if (op == Op::kAllGather && ordered) continue;
      for (int64_t b : sizes) cases.push_back({op, ordered, b});
    }
  // seconds per call, per case and rank
  std::vector<std::vector<double>> secs(cases.size(), std::vector<double>(size_t(N), 0.0));

  dsi::CommOptions opts;
  opts.timeout_seconds = 120;
  dsi::LocalWorld world(N, opts);
  auto process = std::make_shared<dsi::NcclProcessState>();
  std::vector<std::string> errors(static_cast<size_t>(N));
  std::vector<std::thread> threads;
  for (int r = 0; r < N; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<dsi::NcclComm> member_order, ordered;
      try {
        dsi::LocalComm& host = world.comm(r);
        member_order = dsi::NcclComm::create(host, {r, {}, dsi::NcclSumOrder::kMemberOrder, process});
        ordered = dsi::NcclComm::create(host, {r, {}, dsi::NcclSumOrder::kOrderedAlways, process});
        const dsi::Group g{"world", 0, N};
        const dsi::Device dev = dsi::Device::cuda(r);
        for (size_t ci = 0; ci < cases.size(); ++ci) {
          const Case& c = cases[ci];
          dsi::NcclComm& comm = c.ordered ? *ordered : *member_order;
          const int64_t elems = std::max<int64_t>(c.bytes / 4, N);  // F32, a multiple of N below
          const int64_t per = elems / N;
          dsi::Tensor big = dsi::Tensor::zeros({per * N}, dsi::DType::F32, dev);
          dsi::Tensor small = dsi::Tensor::zeros({per}, dsi::DType::F32, dev);
          auto once = [&] {
            switch (c.op) {
              case Op::kAllGather: comm.all_gather(g, small, big); break;
              case Op::kReduceScatter: comm.reduce_scatter(g, big, small); break;
              case Op::kAllReduce: comm.all_reduce(g, big); break;
            }
          };
          for (int i = 0; i < a.warmup; ++i) once();
          host.barrier(g);
          const auto t0 = Clock::now();
          for (int i = 0; i < a.iters; ++i) once();
          secs[ci][size_t(r)] = std::chrono::duration<double>(Clock::now() - t0).count() / a.iters;
          host.barrier(g);
        }
      } catch (const std::exception& e) {
        errors[size_t(r)] = e.what();
        if (member_order) member_order->abort(e.what());
        else world.comm(r).abort(e.what());
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < N; ++r)
    if (!errors[size_t(r)].empty()) {
      std::fprintf(stderr, "bench_collectives: rank %d: %s\n", r, errors[size_t(r)].c_str());
      return 1;
    }

  std::printf("# NCCL %s, %d rank(s): %s", dsi::nccl_version().c_str(), N,
              dsi::cuda::device_description(0).c_str());
  std::printf(", %d iterations after %d warm-up, eager (blocking calls)\n", a.iters, a.warmup);
  std::printf("%-15s %-13s %10s %12s %12s %12s\n", "op", "sum", "bytes", "us/call", "algbw GB/s",
              "busbw GB/s");
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const Case& c = cases[ci];
    const double t = *std::max_element(secs[ci].begin(), secs[ci].end());
    const double bytes = double(std::max<int64_t>(c.bytes / 4, N) / N * N * 4);
    const double alg = bytes / t / 1e9;
    const double factor = c.op == Op::kAllReduce ? 2.0 * (N - 1) / N : double(N - 1) / N;
    const char* sum = c.op == Op::kAllGather ? "-" : c.ordered ? "member-kernel" : "default";
    std::printf("%-15s %-13s %10.0f %12.2f %12.2f %12.2f\n", op_name(c.op), sum, bytes, t * 1e6, alg,
                alg * factor);
  }
  return 0;
}

#endif  // DSI_WITH_NCCL

}  // namespace

int main(int argc, char** argv) {
#ifdef DSI_WITH_NCCL
  try {
    return run(parse(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_collectives: %s\n", e.what());
    return 1;
  }
#else
  (void)argc;
  (void)argv;
  std::fprintf(stderr, "bench_collectives: built without NCCL (configure a CUDA build with NCCL)\n");
  return 0;
#endif
}
