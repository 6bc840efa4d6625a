// The per-request event queue between the engine thread (its EventSink pushes) and the HTTP handler
// thread (it pops). With the metrics' atomics this is the server's only shared state, and the only
// place in src/server/ that holds a mutex (the layering of llama.cpp's server: handlers never touch
// engine state, they wait on their queue).
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "dsinfer/engine.h"

namespace dsi::server {

class EventQueue {
 public:
  // Engine thread. Never throws (an event that cannot be stored is turned into an error finish).
  void push(RequestEvent&& event) noexcept;
  // Handler thread: waits up to `timeout` for events and returns all that are queued, oldest first
  // (empty when none came).
  std::vector<RequestEvent> pop(std::chrono::milliseconds timeout);
  // True once the event with `finished` has been pushed.
  bool finished() const;

  // A sink for Engine::submit that pushes into `queue` (shared, so a late event finds it alive).
  static EventSink sink_for(std::shared_ptr<EventQueue> queue);

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<RequestEvent> events_;
  bool finished_ = false;
  bool overflowed_ = false;  // push could not allocate: report an error finish once
};

}  // namespace dsi::server
