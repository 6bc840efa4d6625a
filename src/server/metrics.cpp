// Histograms and the Prometheus text exposition.
#include "server/metrics.h"

#include <fmt/format.h>

#include <algorithm>

namespace dsi::server {

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), buckets_(bounds_.size() + 1) {}

void Histogram::observe(double value) {
  const size_t i = size_t(std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin());
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(value, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
}

std::string Histogram::render(const std::string& name, const std::string& help,
                              const std::string& labels) const {
  std::string out = fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
  const std::string sep = labels.empty() ? "" : ",";
  int64_t cum = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    cum += buckets_[i].load(std::memory_order_relaxed);
    const std::string le = i < bounds_.size() ? fmt::format("{}", bounds_[i]) : "+Inf";
    out += fmt::format("{}_bucket{{{}{}le=\"{}\"}} {}\n", name, labels, sep, le, cum);
  }
  const std::string l = labels.empty() ? "" : "{" + labels + "}";
  out += fmt::format("{}_sum{} {}\n{}_count{} {}\n", name, l, sum_.load(), name, l, cum);
  return out;
}

ServerMetrics::ServerMetrics()
    : ttft({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
            10.0, 20.0, 40.0, 80.0}),
      inter_token({0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1,
                   0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0}),
      e2e({0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
           240.0, 480.0, 960.0}) {}

void ServerMetrics::finished(const std::string& reason) {
  for (size_t i = 0; i < kFinishReasons.size(); ++i)
    if (reason == kFinishReasons[i]) {
      requests_by_reason[i].fetch_add(1);
      return;
    }
  requests_by_reason[3].fetch_add(1);  // unknown reasons count as errors
}

namespace {

void metric(std::string& out, const char* type, const std::string& name, const std::string& help,
            const std::string& labels, double value) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  out += fmt::format("{}{} {}\n", name, labels.empty() ? "" : "{" + labels + "}", value);
}

}  // namespace

std::string render_prometheus(const EngineMetrics& e, ServerMetrics& s, const std::string& model) {
  std::string out;
  const std::string ml = fmt::format("model_name=\"{}\"", model);
  auto gauge = [&](const char* n, const char* help, double v) {
    metric(out, "gauge", std::string("dsinfer:") + n, help, ml, v);
  };
  auto counter = [&](const char* n, const char* help, double v) {
    metric(out, "counter", std::string("dsinfer:") + n + "_total", help, ml, v);
  };
  gauge("num_requests_running", "Requests being prefilled or decoded.", double(e.running));
  gauge("num_requests_waiting", "Requests queued in the engine (new or preempted).", double(e.waiting));
  gauge("num_requests_in_flight", "Requests the HTTP server is handling.", double(s.in_flight.load()));
  gauge("kv_cache_pages_total", "KV cache pages (64 tokens each, per DCP rank) in the pool.",
        double(e.kv_pages_total));
  gauge("kv_cache_pages_used", "KV cache pages in use.", double(e.kv_pages_used));
  gauge("kv_cache_usage_perc", "Fraction of the KV cache pages in use (1 = full).",
        e.kv_pages_total > 0 ? double(e.kv_pages_used) / double(e.kv_pages_total) : 0.0);
  gauge("kv_cache_pages_cached", "KV cache pages of cached prefix blocks that no request holds.",
        double(e.kv_pages_cached));
  gauge("kv_cache_capacity_tokens", "Tokens of one sequence the KV pool can hold.",
        double(e.kv_capacity_tokens));

  out += "# HELP dsinfer:request_success_total Finished requests by finish reason.\n"
         "# TYPE dsinfer:request_success_total counter\n";
  for (size_t i = 0; i < kFinishReasons.size(); ++i)
    out += fmt::format("dsinfer:request_success_total{{{},finished_reason=\"{}\"}} {}\n", ml,
                       kFinishReasons[i], s.requests_by_reason[i].load());
  counter("request_rejected", "Requests refused before reaching the engine (bad input).",
          double(s.rejected.load()));
  counter("engine_requests_finished", "Requests the engine finished (any reason).",
          double(e.requests_finished));
  counter("num_preemptions", "Requests preempted (pages taken back, recomputed later).",
          double(e.preemptions));
  counter("prompt_tokens", "Prompt tokens prefilled (recomputation after preemption included).",
          double(e.prompt_tokens));
  counter("prefix_cache_queries", "Prompt tokens looked up in the prefix cache at admission.",
          double(e.prefix_cache_queries));
  counter("prefix_cache_hits", "Of those, tokens found there (not computed).",
          double(e.prefix_cache_hits));
  counter("generation_tokens", "Tokens generated.", double(e.generation_tokens));
  counter("engine_steps", "Engine steps run.", double(e.steps));
  counter("engine_graph_steps", "Decode steps replayed from CUDA graphs.", double(e.graph_steps));

  // Tokens per second since the previous scrape (since start for the first one).
  const auto now_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::steady_clock::now() - s.started).count();
  const int64_t prev_ns = s.last_scrape_ns.exchange(now_ns);
  const int64_t prev_tokens = s.last_scrape_tokens.exchange(e.generation_tokens);
  const double dt = double(now_ns - prev_ns) * 1e-9;
  gauge("generation_tokens_per_second", "Tokens generated per second since the previous scrape.",
        dt > 0 ? double(e.generation_tokens - prev_tokens) / dt : 0.0);

  out += s.ttft.render("dsinfer:time_to_first_token_seconds", "Time to the first token.", ml);
  out += s.inter_token.render("dsinfer:inter_token_latency_seconds", "Time per output token after the first.", ml);
  out += s.e2e.render("dsinfer:e2e_request_latency_seconds", "Time from submit to finish.", ml);

  counter("spec_decode_num_drafts", "Speculative decoding: draft rounds.", double(e.num_drafts));
  counter("spec_decode_num_draft_tokens", "Speculative decoding: tokens drafted.", double(e.num_draft_tokens));
  counter("spec_decode_num_accepted_tokens", "Speculative decoding: drafted tokens accepted.",
          double(e.num_accepted_tokens));
  out += "# HELP dsinfer:spec_decode_num_accepted_tokens_per_pos_total Speculative decoding: drafted "
         "tokens accepted, by draft position.\n"
         "# TYPE dsinfer:spec_decode_num_accepted_tokens_per_pos_total counter\n";
  for (size_t i = 0; i < e.accepted_per_pos.size(); ++i)
    out += fmt::format("dsinfer:spec_decode_num_accepted_tokens_per_pos_total{{{},position=\"{}\"}} {}\n",
                       ml, i, e.accepted_per_pos[i]);
  return out;
}

}  // namespace dsi::server
