// A step of work captured once from the device's stream and replayed as a whole (a CUDA graph), so
// a decode step costs one launch instead of hundreds, with no host work between its kernels.
//
// What capture changes for the ops inside (plain C++ header: no CUDA types):
// - Memory: every tensor and scratch block the captured ops allocate comes from a pool private to
//   the graph (memory/memory.h), so the addresses baked into the graph stay valid and untouched by
//   other work for every replay; tensors the step returns are read after each replay in place.
// - Input checks: the ops' error flags become slots of the graph's check array, reset at the start
//   of every replay and read back once after it; replay() throws the first that fired, naming the
//   op and what it found (the eager run reports the same inputs with the op's full message).
// - Nothing may synchronise or copy from pageable host memory inside: such a call fails the
//   capture with a dsi::Error naming it, and the graph is not made.
// Warm-up: run the step eagerly first (with the same shapes), which loads every kernel and builds
// the ops' one-time state (cuBLAS handles, expert tables); capture records, it does not run.
#pragma once

#include <functional>
#include <memory>

#include "core/tensor.h"

namespace dsi::cuda {

class StepGraph {
 public:
  explicit StepGraph(Device device);
  ~StepGraph();
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;

  // Records what fn enqueues on the device's stream (fn's ops do not run). Throws dsi::Error if fn
  // throws or does something a graph cannot hold; the graph stays empty then.
  void capture(const std::function<void()>& fn);
  bool captured() const;
  // Runs the captured work and waits for it; throws the first failed input check.
  void replay();
  // Input checks deferred into the graph.
  int deferred_checks() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dsi::cuda
