// The server's own counters (finish reasons, latencies) kept in atomics, and the Prometheus text
// exposition of them together with the engine's EngineMetrics. Metric names follow vLLM's
// (vllm:spec_decode_num_drafts -> dsinfer:spec_decode_num_drafts_total, ...).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "dsinfer/engine.h"

namespace dsi::server {

// A cumulative histogram with fixed upper bounds (seconds); lock-free.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double value);
  // "# TYPE" block lines for a metric named `name` with the given label set ("" or `a="b"`).
  std::string render(const std::string& name, const std::string& help, const std::string& labels) const;
  int64_t count() const { return count_.load(); }

 private:
  std::vector<double> bounds_;
  std::vector<std::atomic<int64_t>> buckets_;  // [bounds + 1], the last one is +Inf
  std::atomic<int64_t> count_{0};
  std::atomic<double> sum_{0.0};
};

inline constexpr std::array<const char*, 4> kFinishReasons = {"stop", "length", "abort", "error"};

struct ServerMetrics {
  ServerMetrics();
  void finished(const std::string& reason);  // one request ended with this finish reason
  std::array<std::atomic<int64_t>, kFinishReasons.size()> requests_by_reason{};
  std::atomic<int64_t> rejected{0};  // requests refused with a 4xx before reaching the engine
  std::atomic<int64_t> in_flight{0};  // requests the server is handling (handlers in progress)
  Histogram ttft;                      // time to first token
  Histogram inter_token;               // time per output token after the first
  Histogram e2e;                       // submit to finish
  // tokens/s between two scrapes
  std::atomic<int64_t> last_scrape_ns{0};
  std::atomic<int64_t> last_scrape_tokens{0};
  const std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();
};

// The /metrics page (Prometheus text format 0.0.4).
std::string render_prometheus(const EngineMetrics& engine, ServerMetrics& server,
                              const std::string& model_name);

}  // namespace dsi::server
