// A run-time switch of the CUDA backend (DSI_* comparisons): decided by its set_* call or, until
// then, by the environment, read once.
#pragma once

#include <atomic>

namespace dsi::cuda {

// v: -1 until decided; read(): the environment's value.
template <typename Read>
int switch_value(std::atomic<int>& v, Read read) {
  int x = v.load(std::memory_order_relaxed);
  if (x < 0) {
    int expected = -1;
    v.compare_exchange_strong(expected, read());
    x = v.load();
  }
  return x;
}

}  // namespace dsi::cuda
