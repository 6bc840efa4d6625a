// `dsinfer bench` (see bench.h): C worker threads, each with its own keep-alive HTTP connection,
// take request indices from a shared counter and stream /v1/completions with
// stream_options.include_usage. Timestamps are taken when each SSE event is parsed; a gap counts
// between events that carry text, so it is an inter-chunk latency when the server batches tokens.
#include "bench.h"

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "bench_core.h"
#include "dsinfer/error.h"

namespace dsi::bench {

struct BenchOptions {
  std::string url = "http://127.0.0.1:8000";
  std::string model;  // "" = the server's model (the field is left out)
  int num_requests = 16;
  int concurrency = 4;
  int prompt_len = 128;
  int shared_prefix_len = 0;  // words every random prompt starts with
  std::string prompt_file;
  int max_tokens = 128;
  double temperature = 0.0;
  bool ignore_eos = false;
  uint64_t seed = 0;
  double timeout_s = 600;
  std::string json_file;
};

namespace {

using Json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

// A fixed vocabulary of common words: prompts are random sequences of them (one word is about one
// token for English BPE vocabularies), deterministic for a seed and request index.
constexpr const char* kWords[] = {
    "the",    "and",     "of",     "to",     "that",  "in",     "he",      "shall", "unto",
    "for",    "i",       "his",    "a",      "lord",  "they",   "be",      "is",    "him",
    "not",    "them",    "it",     "with",   "all",   "thou",   "thy",     "was",   "god",
    "which",  "my",      "me",     "said",   "but",   "ye",     "their",   "have",  "will",
    "thee",   "from",    "as",     "are",    "when",  "this",   "out",     "were",  "upon",
    "man",    "by",      "you",    "israel", "king",  "son",    "up",      "there", "hath",
    "then",   "people",  "came",   "had",    "house", "into",   "on",      "her",   "come",
    "one",    "we",      "children", "heaven", "before", "your",  "also",    "day",   "land",
    "men",    "shalt",   "let",    "go",     "hand",  "us",     "saith",   "made",  "went",
    "even",   "do",      "no",     "now",    "behold", "saying", "therefore", "every", "these",
    "because", "or",     "after",  "our",    "things", "father", "down",   "sons",  "hast",
    "david",  "o",       "make",   "say",    "may",   "over",   "did",     "earth", "what",
    "great",  "name",    "any",    "against", "thine", "so",    "light",   "city",  "heart"};

std::string random_prompt(uint64_t seed, int index, int words) {
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + uint64_t(index) + 1);
  std::uniform_int_distribution<size_t> pick(0, std::size(kWords) - 1);
  std::string out;
  for (int i = 0; i < words; ++i) {
    if (i) out += ' ';
    out += kWords[pick(rng)];
  }
  return out;
}

std::vector<std::string> read_prompt_file(const std::string& path) {
  std::ifstream f(path);
  DSI_CHECK(f.good(), "--prompt-file {}: cannot open", path);
  std::vector<std::string> prompts;
  std::string line;
  while (std::getline(f, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (!line.empty()) prompts.push_back(line);
  }
  DSI_CHECK(!prompts.empty(), "--prompt-file {}: no prompts (one per line expected)", path);
  return prompts;
}

// "http://host:port/prefix" -> ("http://host:port", "/prefix").
std::pair<std::string, std::string> split_url(const std::string& url) {
  const size_t scheme = url.find("://");
  DSI_CHECK(scheme != std::string::npos, "--url '{}': expected http://host:port", url);
  const std::string s = url.substr(0, scheme);
  DSI_CHECK(s == "http" || s == "https", "--url '{}': scheme '{}' is not http or https", url, s);
  const size_t path = url.find('/', scheme + 3);
  DSI_CHECK(path != scheme + 3, "--url '{}': no host", url);
  std::string base = url.substr(0, path);
  std::string prefix = path == std::string::npos ? "" : url.substr(path);
  while (!prefix.empty() && prefix.back() == '/') prefix.pop_back();
  return {base, prefix};
}

struct RequestResult {
  int index = 0;
  bool ok = false;
  std::string error;
  int status = 0;
  int64_t prompt_tokens = -1;      // from the usage chunk (-1: the server sent none)
  int64_t cached_tokens = -1;      // of those, served from the server's prefix cache
  int64_t completion_tokens = -1;
  int64_t chunks = 0;              // events that carried text
  std::string finish_reason;
  double start_s = 0, first_token_s = -1, last_token_s = -1, end_s = 0;  // since the bench start
  std::vector<double> itl_s;       // gaps between text-carrying events
  double decode_tps = std::numeric_limits<double>::quiet_NaN();
};

class Runner {
 public:
  Runner(const BenchOptions& o) : o_(o) {
    std::tie(base_, prefix_) = split_url(o.url);
    if (!o.prompt_file.empty()) prompts_ = read_prompt_file(o.prompt_file);
    if (o.shared_prefix_len > 0) shared_prefix_ = random_prompt(o.seed, -1, o.shared_prefix_len) + " ";
  }

  std::unique_ptr<httplib::Client> client() const {
    auto c = std::make_unique<httplib::Client>(base_);
    DSI_CHECK(c->is_valid(), "--url '{}': not a usable server address", o_.url);
    c->set_keep_alive(true);
    const auto t = std::chrono::duration<double>(o_.timeout_s);
    c->set_connection_timeout(std::chrono::duration_cast<std::chrono::microseconds>(std::min(t, std::chrono::duration<double>(10))));
    c->set_read_timeout(std::chrono::duration_cast<std::chrono::microseconds>(t));
    c->set_write_timeout(std::chrono::duration_cast<std::chrono::microseconds>(t));
    return c;
  }

  // The /metrics page; nullopt (with `why`) when the server has none or cannot be reached.
  std::optional<std::string> metrics(std::string* why) const {
    auto c = client();
    auto res = c->Get(prefix_ + "/metrics");
    if (!res) {
      *why = fmt::format("cannot reach {} ({} error)", o_.url, httplib::to_string(res.error()));
      return std::nullopt;
    }
    if (res->status != 200) {
      *why = fmt::format("GET {}/metrics answered HTTP {}", o_.url, res->status);
      return std::nullopt;
    }
    return res->body;
  }

  std::string prompt(int i) const {
    if (!prompts_.empty()) return prompts_[size_t(i) % prompts_.size()];
    return shared_prefix_ + random_prompt(o_.seed, i, o_.prompt_len);
  }

  RequestResult one(httplib::Client& c, int index, Clock::time_point t0) const {
    RequestResult r;
    r.index = index;
    auto now = [&] { return std::chrono::duration<double>(Clock::now() - t0).count(); };
    Json body = Json::object();
    if (!o_.model.empty()) body["model"] = o_.model;
    body["prompt"] = prompt(index);
    body["max_tokens"] = o_.max_tokens;
    body["temperature"] = o_.temperature;
    body["seed"] = o_.seed + uint64_t(index);
    body["stream"] = true;
    body["stream_options"] = {{"include_usage", true}};
    if (o_.ignore_eos) body["ignore_eos"] = true;

    SseParser sse;
    std::string error_body;  // a non-200 answer's body
    auto on_event = [&](const std::string& data) {
      const double t = now();
      Json j = Json::parse(data, nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded() || !j.is_object()) {
        if (r.error.empty()) r.error = "an SSE event is not a JSON object: " + data.substr(0, 200);
        return;
      }
      if (j.contains("error")) {
        const Json& e = j["error"];
        r.error = e.is_object() && e.contains("message") && e["message"].is_string()
                      ? e["message"].get<std::string>()
                      : e.dump(-1, ' ', false, Json::error_handler_t::replace);
        return;
      }
      if (j.contains("usage") && j["usage"].is_object()) {
        const Json& u = j["usage"];
        if (u.contains("prompt_tokens") && u["prompt_tokens"].is_number_integer())
          r.prompt_tokens = u["prompt_tokens"].get<int64_t>();
        if (u.contains("completion_tokens") && u["completion_tokens"].is_number_integer())
          r.completion_tokens = u["completion_tokens"].get<int64_t>();
        if (u.contains("prompt_tokens_details") && u["prompt_tokens_details"].is_object()) {
          const Json& d = u["prompt_tokens_details"];
          if (d.contains("cached_tokens") && d["cached_tokens"].is_number_integer())
            r.cached_tokens = d["cached_tokens"].get<int64_t>();
        }
      }
      if (!j.contains("choices") || !j["choices"].is_array() || j["choices"].empty()) return;
      const Json& ch = j["choices"][0];
      if (ch.contains("finish_reason") && ch["finish_reason"].is_string())
        r.finish_reason = ch["finish_reason"].get<std::string>();
      const bool text = ch.contains("text") && ch["text"].is_string() && !ch["text"].get_ref<const std::string&>().empty();
      const bool logprobs = ch.contains("logprobs") && ch["logprobs"].is_object();
      if (!text && !logprobs) return;  // the finish chunk, or an empty one
      ++r.chunks;
      if (r.first_token_s < 0) r.first_token_s = t;
      else r.itl_s.push_back(t - r.last_token_s);
      r.last_token_s = t;
    };

    httplib::Request req;
    req.method = "POST";
    req.path = prefix_ + "/v1/completions";
    req.body = body.dump();
    req.set_header("Content-Type", "application/json");
    req.set_header("Accept", "text/event-stream");
    req.response_handler = [&](const httplib::Response& res) {
      r.status = res.status;
      return true;
    };
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      if (r.status != 200) {
        if (error_body.size() < 4096) error_body.append(data, std::min<size_t>(n, 4096));
        return true;
      }
      sse.feed(std::string_view(data, n), on_event);
      return true;
    };
    r.start_s = now();
    const httplib::Result res = c.send(req);
    r.end_s = now();
    if (!res) {
      r.error = fmt::format("HTTP request failed ({} error)", httplib::to_string(res.error()));
      return r;
    }
    if (r.status != 200) {
      std::string msg = error_body;
      Json j = Json::parse(error_body, nullptr, false);
      if (!j.is_discarded() && j.is_object() && j.contains("error") && j["error"].is_object() &&
          j["error"].contains("message") && j["error"]["message"].is_string())
        msg = j["error"]["message"].get<std::string>();
      r.error = fmt::format("HTTP {}: {}", r.status, msg);
      return r;
    }
    if (r.error.empty() && !sse.done())
      r.error = "the stream ended without 'data: [DONE]'";
    if (r.error.empty() && r.first_token_s < 0 && r.completion_tokens != 0)
      r.error = "the stream carried no tokens";
    if (r.completion_tokens < 0) r.completion_tokens = r.chunks;  // no usage chunk: count events
    r.ok = r.error.empty();
    if (r.ok) r.decode_tps = decode_tokens_per_second(r.completion_tokens, r.first_token_s, r.last_token_s);
    return r;
  }

  std::vector<RequestResult> run_all(double* wall_s) const {
    std::vector<RequestResult> results(size_t(o_.num_requests));
    std::atomic<int> next{0};
    const auto t0 = Clock::now();
    auto worker = [&] {
      auto c = client();
      for (int i = next++; i < o_.num_requests; i = next++) {
        results[size_t(i)] = one(*c, i, t0);
        if (!results[size_t(i)].ok) c = client();  // a broken connection is not reused
      }
    };
    std::vector<std::thread> threads;
    const int n = std::min(o_.concurrency, o_.num_requests);
    for (int t = 0; t < n; ++t) threads.emplace_back(worker);
    for (auto& t : threads) t.join();
    *wall_s = std::chrono::duration<double>(Clock::now() - t0).count();
    return results;
  }

 private:
  const BenchOptions& o_;
  std::string base_, prefix_;
  std::vector<std::string> prompts_;
  std::string shared_prefix_;  // --shared-prefix-len words and a space (or empty)
};

Json summary_json(const Summary& s, double scale) {
  return {{"mean", s.mean * scale}, {"median", s.median * scale}, {"min", s.min * scale},
          {"max", s.max * scale},   {"p50", s.median * scale},   {"p90", s.p90 * scale},
          {"p99", s.p99 * scale},   {"count", s.count}};
}

std::string cell(double v) { return std::isnan(v) ? "-" : fmt::format("{:.2f}", v); }
std::string percent(double v) { return std::isnan(v) ? "-" : fmt::format("{:.2f}%", v * 100); }

std::string row(const std::string& name, const Summary& s, double scale) {
  return fmt::format("{:<28}{:>10}{:>10}{:>10}{:>10}{:>10}{:>10}{:>8}\n", name, cell(s.mean * scale),
                     cell(s.median * scale), cell(s.min * scale), cell(s.max * scale),
                     cell(s.p90 * scale), cell(s.p99 * scale), s.count);
}

}  // namespace

BenchCommand::BenchCommand(CLI::App& app) : options_(std::make_unique<BenchOptions>()) {
  BenchOptions& o = *options_;
  sub_ = app.add_subcommand("bench", "load a running server with streamed completions and report latency, "
                                     "throughput and speculative acceptance");
  sub_->add_option("--url", o.url, "server address (default http://127.0.0.1:8000)");
  sub_->add_option("--model", o.model, "model name to send (default: the server's)");
  sub_->add_option("--num-requests", o.num_requests, "requests to send (default 16)")->check(CLI::Range(1, 1 << 24));
  sub_->add_option("--concurrency", o.concurrency, "requests in flight at once (default 4)")->check(CLI::Range(1, 4096));
  auto* len = sub_->add_option("--prompt-len", o.prompt_len,
                               "words per random prompt (about one token each; default 128)")
                  ->check(CLI::Range(1, 1 << 20));
  auto* shared = sub_->add_option("--shared-prefix-len", o.shared_prefix_len,
                                  "words of a random prefix every random prompt starts with, before "
                                  "its own --prompt-len words (default 0)")
                     ->check(CLI::Range(0, 1 << 20));
  auto* file = sub_->add_option("--prompt-file", o.prompt_file, "prompts, one per line (used in turn)");
  len->excludes(file);
  shared->excludes(file);
  sub_->add_option("--max-tokens", o.max_tokens, "max_tokens of each request (default 128)")->check(CLI::Range(1, 1 << 24));
  sub_->add_option("--temperature", o.temperature, "sampling temperature (default 0: greedy)")->check(CLI::Range(0.0, 2.0));
  sub_->add_flag("--ignore-eos", o.ignore_eos, "generate max_tokens even past an eos token");
  sub_->add_option("--seed", o.seed, "prompt and sampling seed (default 0); request i samples with seed + i");
  sub_->add_option("--timeout", o.timeout_s, "seconds without progress before a request fails (default 600)")
      ->check(CLI::Range(0.1, 86400.0));
  sub_->add_option("--json", o.json_file, "also write the results as JSON to this file");
}

BenchCommand::~BenchCommand() = default;

bool BenchCommand::parsed() const { return sub_->parsed(); }

int BenchCommand::run() const {
  const BenchOptions& o = *options_;
  Runner runner(o);

  std::string why;
  const auto before_page = runner.metrics(&why);
  if (!before_page) {
    // No server at all is an error; a server without /metrics only loses the acceptance report.
    DSI_CHECK(why.rfind("cannot reach", 0) != 0, "{}", why);
    std::fprintf(stderr, "warning: %s; speculative acceptance is not reported\n", why.c_str());
  }
  double wall_s = 0;
  const std::vector<RequestResult> results = runner.run_all(&wall_s);
  std::optional<SpecCounters> spec;
  if (before_page) {
    if (const auto after_page = runner.metrics(&why))
      spec = spec_delta(parse_spec_counters(*before_page), parse_spec_counters(*after_page));
    else
      std::fprintf(stderr, "warning: %s; speculative acceptance is not reported\n", why.c_str());
  }

  std::vector<double> tps, ttft, itl, e2e;
  int64_t ok = 0, prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
  bool cached_reported = false;
  for (const RequestResult& r : results) {
    if (!r.ok) {
      std::fprintf(stderr, "request %d failed: %s\n", r.index, r.error.c_str());
      continue;
    }
    ++ok;
    prompt_tokens += std::max<int64_t>(r.prompt_tokens, 0);
    cached_tokens += std::max<int64_t>(r.cached_tokens, 0);
    cached_reported = cached_reported || r.cached_tokens >= 0;
    completion_tokens += r.completion_tokens;
    if (!std::isnan(r.decode_tps)) tps.push_back(r.decode_tps);
    if (r.first_token_s >= 0) ttft.push_back(r.first_token_s - r.start_s);
    itl.insert(itl.end(), r.itl_s.begin(), r.itl_s.end());
    e2e.push_back(r.end_s - r.start_s);
  }
  const int64_t failed = int64_t(results.size()) - ok;
  const Summary s_tps = summarize(tps), s_ttft = summarize(ttft), s_itl = summarize(itl), s_e2e = summarize(e2e);

  std::string out = fmt::format("dsinfer bench: {} requests, concurrency {}, to {}: {} ok, {} failed, {:.2f} s\n",
                                results.size(), o.concurrency, o.url, ok, failed, wall_s);
  out += fmt::format("tokens: {} prompt ({:.1f} per request), {} completion ({:.1f} per request)\n",
                     prompt_tokens, ok ? double(prompt_tokens) / double(ok) : 0.0, completion_tokens,
                     ok ? double(completion_tokens) / double(ok) : 0.0);
  if (cached_reported)
    out += fmt::format("prompt tokens from the server's prefix cache: {} ({})\n", cached_tokens,
                       percent(prompt_tokens > 0 ? double(cached_tokens) / double(prompt_tokens) : std::nan("")));
  out += fmt::format("throughput: {:.2f} output tok/s, {:.2f} total tok/s, {:.3f} requests/s\n\n",
                     double(completion_tokens) / wall_s, double(prompt_tokens + completion_tokens) / wall_s,
                     double(ok) / wall_s);
  out += fmt::format("{:<28}{:>10}{:>10}{:>10}{:>10}{:>10}{:>10}{:>8}\n", "", "mean", "median", "min", "max",
                     "p90", "p99", "n");
  out += row("decode tok/s (per request)", s_tps, 1.0);
  out += row("TTFT (ms)", s_ttft, 1e3);
  out += row("inter-token latency (ms)", s_itl, 1e3);
  out += row("end-to-end latency (ms)", s_e2e, 1e3);
  Json spec_json = nullptr;
  if (spec && spec->present && spec->drafts <= 0) {
    out += "\nspeculative decoding: no drafts during the run\n";
    spec_json = {{"num_drafts", spec->drafts}, {"num_draft_tokens", spec->draft_tokens},
                 {"num_accepted_tokens", spec->accepted_tokens}};
  } else if (spec && spec->present) {
    const SpecCounters& c = *spec;
    const double rate = c.draft_tokens > 0 ? c.accepted_tokens / c.draft_tokens : std::nan("");
    const double mean_len = c.drafts > 0 ? 1.0 + c.accepted_tokens / c.drafts : std::nan("");
    out += fmt::format("\nspeculative decoding: {:.0f} drafts, {:.0f} draft tokens, {:.0f} accepted: "
                       "acceptance {}, mean acceptance length {}\n",
                       c.drafts, c.draft_tokens, c.accepted_tokens, percent(rate), cell(mean_len));
    Json per_pos = Json::array();
    std::string line = "acceptance per position:";
    for (size_t i = 0; i < c.accepted_per_pos.size(); ++i) {
      const double r = c.drafts > 0 ? c.accepted_per_pos[i] / c.drafts : std::nan("");
      line += fmt::format(" [{}] {}", i, percent(r));
      per_pos.push_back(r);
    }
    if (!c.accepted_per_pos.empty()) out += line + "\n";
    spec_json = {{"num_drafts", c.drafts}, {"num_draft_tokens", c.draft_tokens},
                 {"num_accepted_tokens", c.accepted_tokens}, {"acceptance_rate", rate},
                 {"mean_acceptance_length", mean_len}, {"acceptance_rate_per_position", per_pos}};
  } else if (spec) {
    out += "\nspeculative decoding: off (the server reports no spec_decode counters)\n";
  }
  std::fputs(out.c_str(), stdout);
  std::fflush(stdout);

  if (!o.json_file.empty()) {
    Json req = Json::array();
    for (const RequestResult& r : results) {
      Json j = {{"index", r.index}, {"ok", r.ok}};
      if (!r.ok) j["error"] = r.error;
      j["prompt_tokens"] = r.prompt_tokens;
      j["cached_tokens"] = r.cached_tokens;
      j["completion_tokens"] = r.completion_tokens;
      j["finish_reason"] = r.finish_reason;
      j["ttft_s"] = r.first_token_s >= 0 ? Json(r.first_token_s - r.start_s) : Json(nullptr);
      j["e2e_s"] = r.end_s - r.start_s;
      j["decode_tokens_per_second"] = r.decode_tps;  // NaN -> null
      j["chunks"] = r.chunks;
      j["itl_s"] = r.itl_s;
      req.push_back(std::move(j));
    }
    Json all = {
        {"config", {{"url", o.url}, {"model", o.model}, {"num_requests", o.num_requests},
                    {"concurrency", o.concurrency},
                    {"prompt_len", o.prompt_file.empty() ? Json(o.prompt_len) : Json(nullptr)},
                    {"shared_prefix_len", o.prompt_file.empty() ? Json(o.shared_prefix_len) : Json(nullptr)},
                    {"prompt_file", o.prompt_file}, {"max_tokens", o.max_tokens},
                    {"temperature", o.temperature}, {"ignore_eos", o.ignore_eos}, {"seed", o.seed}}},
        {"completed", ok}, {"failed", failed}, {"duration_s", wall_s},
        {"prompt_tokens", prompt_tokens}, {"cached_prompt_tokens", cached_reported ? Json(cached_tokens) : Json(nullptr)},
        {"completion_tokens", completion_tokens},
        {"output_tokens_per_second", double(completion_tokens) / wall_s},
        {"total_tokens_per_second", double(prompt_tokens + completion_tokens) / wall_s},
        {"requests_per_second", double(ok) / wall_s},
        {"decode_tokens_per_second", summary_json(s_tps, 1.0)},
        {"ttft_ms", summary_json(s_ttft, 1e3)},
        {"itl_ms", summary_json(s_itl, 1e3)},
        {"e2e_latency_ms", summary_json(s_e2e, 1e3)},
        {"spec_decode", spec_json},
        {"requests", req}};
    std::ofstream f(o.json_file);
    DSI_CHECK(f.good(), "--json {}: cannot open for writing", o.json_file);
    f << all.dump(2, ' ', false, Json::error_handler_t::replace) << "\n";
    f.close();
    DSI_CHECK(!f.fail(), "--json {}: write failed", o.json_file);
  }
  return failed == 0 ? 0 : 1;
}

}  // namespace dsi::bench
