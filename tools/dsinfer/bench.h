// `dsinfer bench`: a load generator for a running dsinfer server (or any OpenAI-compatible one).
// It streams N /v1/completions requests, C at a time, and reports per-request decode tokens/s,
// TTFT and inter-token latency percentiles, throughput, and the server's speculative-decoding
// acceptance (from /metrics before and after), as a table and optionally as JSON.
#pragma once

#include <memory>

namespace CLI {
class App;
}

namespace dsi::bench {

struct BenchOptions;

// Adds the "bench" subcommand to `app`. After app.parse(): if parsed(), run() does the work and
// returns the exit code (1 when a request failed or the server cannot be reached).
class BenchCommand {
 public:
  explicit BenchCommand(CLI::App& app);
  ~BenchCommand();
  BenchCommand(const BenchCommand&) = delete;
  BenchCommand& operator=(const BenchCommand&) = delete;

  bool parsed() const;
  int run() const;

 private:
  std::unique_ptr<BenchOptions> options_;
  CLI::App* sub_ = nullptr;
};

}  // namespace dsi::bench
