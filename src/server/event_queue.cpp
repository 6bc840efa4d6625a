// EventQueue: a mutex + condition variable around a deque of engine events.
#include "server/event_queue.h"

namespace dsi::server {

void EventQueue::push(RequestEvent&& event) noexcept {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) return;  // nothing follows a finish (the engine promises it; be safe anyway)
    try {
      finished_ = event.finished;
      events_.push_back(std::move(event));
    } catch (...) {
      // Out of memory: drop the event and remember to finish the request with an error.
      overflowed_ = true;
      finished_ = true;
    }
  }
  cv_.notify_all();
}

std::vector<RequestEvent> EventQueue::pop(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return !events_.empty() || overflowed_; });
  std::vector<RequestEvent> out;
  out.reserve(events_.size() + 1);
  while (!events_.empty()) {
    out.push_back(std::move(events_.front()));
    events_.pop_front();
  }
  if (overflowed_) {
    overflowed_ = false;
    RequestEvent e;
    e.finished = true;
    e.finish_reason = "error";
    e.error = "the server ran out of memory while queueing the request's output";
    out.push_back(std::move(e));
  }
  return out;
}

bool EventQueue::finished() const {
  std::lock_guard<std::mutex> lock(mu_);
  return finished_;
}

EventSink EventQueue::sink_for(std::shared_ptr<EventQueue> queue) {
  return [q = std::move(queue)](RequestEvent&& e) noexcept { q->push(std::move(e)); };
}

}  // namespace dsi::server
