// The pure parts of `dsinfer bench`, kept free of I/O so tests/test_bench.cpp can check them: an
// incremental Server-Sent Events parser (WHATWG "event stream" interpretation: lines end in \n,
// \r\n or \r; "data:" fields join with \n; a blank line dispatches; ':' lines are comments),
// summary statistics (linear-interpolation percentiles, numpy's default), decode tokens/s, and
// the speculative-decoding counters read from a Prometheus text exposition.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dsi::bench {

// Feeds bytes as they arrive (events may be split anywhere, even inside a "\r\n"); calls
// on_data(payload) for each complete event that has data. "data: [DONE]" ends the stream: done()
// turns true and later bytes are ignored.
class SseParser {
 public:
  template <typename OnData>
  void feed(std::string_view bytes, OnData&& on_data) {
    for (char c : bytes) {
      if (done_) return;
      if (skip_lf_) {  // the \n of a \r\n pair was already counted with the \r
        skip_lf_ = false;
        if (c == '\n') continue;
      }
      if (c == '\r' || c == '\n') {
        skip_lf_ = c == '\r';
        end_line(on_data);
      } else {
        line_ += c;
      }
    }
  }
  // The stream ended: a trailing event without its blank line is dropped, as the spec says.
  bool done() const { return done_; }
  // Bytes of an unfinished event are pending (a stream that ended here was cut short).
  bool pending() const { return !line_.empty() || has_data_; }

 private:
  template <typename OnData>
  void end_line(OnData&& on_data) {
    if (line_.empty()) {  // blank line: dispatch
      if (has_data_) {
        has_data_ = false;
        std::string payload = std::move(data_);
        data_.clear();
        if (payload == "[DONE]") {
          done_ = true;
          return;
        }
        on_data(payload);
      }
      return;
    }
    std::string_view line(line_);
    if (line[0] != ':') {  // not a comment
      const size_t colon = line.find(':');
      std::string_view field = line.substr(0, colon);
      std::string_view value = colon == std::string_view::npos ? std::string_view() : line.substr(colon + 1);
      if (!value.empty() && value[0] == ' ') value.remove_prefix(1);
      if (field == "data") {
        if (has_data_) data_ += '\n';
        data_ += value;
        has_data_ = true;
      }  // event, id, retry: not used by the OpenAI streams
    }
    line_.clear();
  }

  std::string line_;
  std::string data_;
  bool has_data_ = false;
  bool skip_lf_ = false;
  bool done_ = false;
};

// The p-th percentile (p in [0, 100]) with linear interpolation between closest ranks (numpy's
// default); NaN for no values.
inline double percentile(std::vector<double> values, double p) {
  if (values.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::sort(values.begin(), values.end());
  const double rank = std::clamp(p, 0.0, 100.0) / 100.0 * double(values.size() - 1);
  const size_t lo = size_t(std::floor(rank));
  const size_t hi = std::min(lo + 1, values.size() - 1);
  return values[lo] + (rank - double(lo)) * (values[hi] - values[lo]);
}

struct Summary {
  size_t count = 0;
  double mean = std::numeric_limits<double>::quiet_NaN();
  double median = mean, min = mean, max = mean, p90 = mean, p99 = mean;
};

inline Summary summarize(const std::vector<double>& values) {
  Summary s;
  s.count = values.size();
  if (values.empty()) return s;
  double sum = 0;
  for (double v : values) sum += v;
  s.mean = sum / double(values.size());
  s.min = *std::min_element(values.begin(), values.end());
  s.max = *std::max_element(values.begin(), values.end());
  s.median = percentile(values, 50);
  s.p90 = percentile(values, 90);
  s.p99 = percentile(values, 99);
  return s;
}

// Decode speed of one request: the tokens after the first over the time from the first token to
// the last; NaN when it is undefined (fewer than 2 tokens, or all of them arrived at once).
inline double decode_tokens_per_second(int64_t completion_tokens, double first_token_s, double last_token_s) {
  const double span = last_token_s - first_token_s;
  if (completion_tokens < 2 || !(span > 0)) return std::numeric_limits<double>::quiet_NaN();
  return double(completion_tokens - 1) / span;
}

// Speculative-decoding counters of a /metrics page (summed over every label set but position).
struct SpecCounters {
  bool present = false;  // the page has the counters (a server with speculative decoding on)
  double drafts = 0, draft_tokens = 0, accepted_tokens = 0;
  std::vector<double> accepted_per_pos;  // [position]
};

namespace detail {
// The value of label `key` in a Prometheus label set `a="x",b="y"` ("" when absent).
inline std::string label_value(std::string_view labels, std::string_view key) {
  size_t i = 0;
  while (i < labels.size()) {
    while (i < labels.size() && (labels[i] == ',' || labels[i] == ' ')) ++i;
    const size_t eq = labels.find('=', i);
    if (eq == std::string_view::npos || eq + 1 >= labels.size() || labels[eq + 1] != '"') return "";
    const std::string_view name = labels.substr(i, eq - i);
    std::string value;
    size_t j = eq + 2;
    for (; j < labels.size() && labels[j] != '"'; ++j) {
      if (labels[j] == '\\' && j + 1 < labels.size()) {
        ++j;
        value += labels[j] == 'n' ? '\n' : labels[j];
      } else {
        value += labels[j];
      }
    }
    if (name == key) return value;
    i = j + 1;
  }
  return "";
}
}  // namespace detail

// Reads dsinfer:spec_decode_num_{drafts,draft_tokens,accepted_tokens}_total and
// dsinfer:spec_decode_num_accepted_tokens_per_pos_total{position="i"}; other lines are ignored.
inline SpecCounters parse_spec_counters(std::string_view page) {
  SpecCounters c;
  size_t start = 0;
  while (start < page.size()) {
    size_t end = page.find('\n', start);
    if (end == std::string_view::npos) end = page.size();
    std::string_view line = page.substr(start, end - start);
    start = end + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || line[0] == '#') continue;
    const size_t name_end = line.find_first_of("{ \t");
    if (name_end == std::string_view::npos) continue;
    const std::string_view name = line.substr(0, name_end);
    std::string_view labels;
    size_t value_at = name_end;
    if (line[name_end] == '{') {
      const size_t close = line.rfind('}');
      if (close == std::string_view::npos || close < name_end) continue;
      labels = line.substr(name_end + 1, close - name_end - 1);
      value_at = close + 1;
    }
    const std::string rest(line.substr(value_at));
    char* parsed_end = nullptr;
    const double value = std::strtod(rest.c_str(), &parsed_end);
    if (parsed_end == rest.c_str() || !std::isfinite(value)) continue;
    if (name == "dsinfer:spec_decode_num_drafts_total") {
      c.drafts += value;
      c.present = true;
    } else if (name == "dsinfer:spec_decode_num_draft_tokens_total") {
      c.draft_tokens += value;
      c.present = true;
    } else if (name == "dsinfer:spec_decode_num_accepted_tokens_total") {
      c.accepted_tokens += value;
      c.present = true;
    } else if (name == "dsinfer:spec_decode_num_accepted_tokens_per_pos_total") {
      const std::string pos = detail::label_value(labels, "position");
      char* pos_end = nullptr;
      const long p = std::strtol(pos.c_str(), &pos_end, 10);
      if (pos.empty() || *pos_end != '\0' || p < 0 || p > 1024) continue;
      if (c.accepted_per_pos.size() <= size_t(p)) c.accepted_per_pos.resize(size_t(p) + 1, 0.0);
      c.accepted_per_pos[size_t(p)] += value;
      c.present = true;
    }
  }
  return c;
}

// after - before, for the counters of a run between two scrapes.
inline SpecCounters spec_delta(const SpecCounters& before, const SpecCounters& after) {
  SpecCounters d;
  d.present = after.present;
  d.drafts = after.drafts - before.drafts;
  d.draft_tokens = after.draft_tokens - before.draft_tokens;
  d.accepted_tokens = after.accepted_tokens - before.accepted_tokens;
  d.accepted_per_pos = after.accepted_per_pos;
  for (size_t i = 0; i < d.accepted_per_pos.size() && i < before.accepted_per_pos.size(); ++i)
    d.accepted_per_pos[i] -= before.accepted_per_pos[i];
  return d;
}

}  // namespace dsi::bench
