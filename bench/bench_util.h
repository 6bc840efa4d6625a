// Timing shared by the GPU benchmarks: CUDA-graph replay of many launches that rotate over several
// copies of their inputs (so the figures are HBM-bound, not L2-bound), median over replays.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "backends/cuda/cuda_check.h"
#include "bench_options.h"
#include "dsinfer/error.h"

constexpr double kPeakGBs = 4300.0;  // H200 HBM3e, measured copy bandwidth

// One table row: microseconds, achieved GB/s for `bytes` moved, and its share of kPeakGBs.
inline void report(const std::string& name, double us, double bytes) {
  const double gbs = bytes / (us * 1e-6) / 1e9;
  std::printf("%-56s %10.1f us %9.1f GB/s %6.1f %%\n", name.c_str(), us, gbs, 100.0 * gbs / kPeakGBs);
}

// Median microseconds of fn() over `reps` event-timed calls on the legacy stream (no graph).
template <typename Fn>
inline double time_stream(int reps, Fn fn) {
  for (int i = 0; i < 2; ++i) fn();
  DSI_CUDA_CHECK(cudaDeviceSynchronize());
  cudaEvent_t a, b;
  DSI_CUDA_CHECK(cudaEventCreate(&a));
  DSI_CUDA_CHECK(cudaEventCreate(&b));
  std::vector<double> us;
  for (int r = 0; r < reps; ++r) {
    DSI_CUDA_CHECK(cudaEventRecord(a));
    fn();
    DSI_CUDA_CHECK(cudaEventRecord(b));
    DSI_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    DSI_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    us.push_back(double(ms) * 1000.0);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}


// Median over `reps` replays of (a graph of K calls of launch(copy, stream)) / K, in microseconds;
// launch(i, stream) uses input copy i; K is a multiple of `copies`, at least 24. The first call of
// each copy runs once outside the graph (warm-up and first-launch costs).
template <typename Launch>
inline double time_graph(int copies, int reps, Launch launch) {
  cudaStream_t st;
  DSI_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  const int k = copies * std::max(1, (24 + copies - 1) / copies);
  for (int i = 0; i < copies; ++i) launch(i, st);  // warm-up outside the graph
  DSI_CUDA_CHECK(cudaStreamSynchronize(st));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  DSI_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < k; ++i) launch(i % copies, st);
  DSI_CUDA_CHECK(cudaStreamEndCapture(st, &graph));
  DSI_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t a, b;
  DSI_CUDA_CHECK(cudaEventCreate(&a));
  DSI_CUDA_CHECK(cudaEventCreate(&b));
  DSI_CUDA_CHECK(cudaGraphLaunch(exec, st));  // warm replay
  std::vector<double> us;
  for (int r = 0; r < reps; ++r) {
    DSI_CUDA_CHECK(cudaEventRecord(a, st));
    DSI_CUDA_CHECK(cudaGraphLaunch(exec, st));
    DSI_CUDA_CHECK(cudaEventRecord(b, st));
    DSI_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    DSI_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    us.push_back(double(ms) * 1000.0 / k);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(st);
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}
