// A step of work captured once from the device's stream and replayed as a whole (a CUDA graph), so
// a decode step costs one launch instead of hundreds, with no host work between its kernels.
//
// What capture changes for the ops inside (plain C++ header: no CUDA types):
// - Memory: every tensor and scratch block the captured ops allocate comes from a pool private to
//   the graph, or to a set of graphs that replay in turn (memory/memory.h), so the addresses baked into the graph stay valid and untouched by
//   other work for every replay; tensors the step returns are read after each replay in place.
// - Input checks: the ops' error flags become slots of the graph's check array, reset at the start
//   of every replay and read back once after it; replay() throws the first that fired, naming the
//   op and what it found (the eager run reports the same inputs with the op's full message).
// - Nothing may synchronise or copy from pageable host memory inside: such a call fails the
//   capture with a dsi::Error naming it, and the graph is not made.
// Warm-up: warm_up(fn) runs the step eagerly with the calls capture(fn) will record. That loads
// every kernel, builds the ops' one-time state (cuBLAS handles, expert tables) and fills the graph's
// pool with every block the step needs: a capture cannot allocate device memory, it only takes
// blocks the warm-up left free. Tensors fn keeps from the warm-up should be released (or copied
// out) before the capture, which wants their blocks back.
#pragma once

#include <functional>
#include <memory>

#include "core/tensor.h"

namespace dsi::cuda {

struct BlockPool;

class StepGraph {
 public:
  // A pool for step graphs to share (memory/memory.h). Graphs of one pool must replay one at a
  // time on the device's stream, and a graph's outputs must be read before another graph of the
  // pool replays or captures: each graph's intermediate blocks are the others' too.
  static std::shared_ptr<BlockPool> new_pool(Device device);
  // pool: null for a pool of the graph's own.
  explicit StepGraph(Device device, std::shared_ptr<BlockPool> pool = nullptr);
  ~StepGraph();
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;

  // Runs fn now, its allocations from the graph's pool (see above).
  void warm_up(const std::function<void()>& fn);
  // Records what fn enqueues on the device's stream (fn's ops do not run). Throws dsi::Error if fn
  // throws or does something a graph cannot hold; the graph stays empty then.
  void capture(const std::function<void()>& fn);
  bool captured() const;
  // Runs the captured work and waits for it; throws the first failed input check.
  void replay();
  // Input checks deferred into the graph.
  int deferred_checks() const;
  // Kernel launches in the captured graph (0 before a capture).
  int kernel_nodes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dsi::cuda
