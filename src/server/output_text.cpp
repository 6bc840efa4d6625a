// Stop-string matching and incremental output text.
#include "server/output_text.h"

#include <algorithm>

namespace dsi::server {

size_t partial_match_at_end(std::string_view text, std::string_view s) {
  for (size_t k = std::min(text.size(), s.empty() ? 0 : s.size() - 1); k > 0; --k)
    if (text.substr(text.size() - k) == s.substr(0, k)) return k;
  return 0;
}

StopStringMatcher::StopStringMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  std::erase_if(stops_, [](const std::string& s) { return s.empty(); });
}

std::string StopStringMatcher::push(std::string_view text) {
  if (stopped_) return {};
  held_.append(text);
  if (stops_.empty()) return std::exchange(held_, {});
  // The earliest stop string wins (the longest one at the same place).
  size_t first = std::string::npos;
  for (const std::string& s : stops_) {
    const size_t p = held_.find(s);
    if (p != std::string::npos && (first == std::string::npos || p < first)) first = p;
  }
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = held_.substr(0, first);
    held_.clear();
    return out;
  }
  // Hold back the longest suffix that is a proper prefix of some stop string.
  size_t keep = 0;
  for (const std::string& s : stops_) keep = std::max(keep, partial_match_at_end(held_, s));
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopStringMatcher::flush() {
  if (stopped_) return {};
  return std::exchange(held_, {});
}

TokenRecord token_record(const Tokenizer& tokenizer, const GeneratedToken& t) {
  TokenRecord rec;
  rec.id = t.id;
  rec.text = tokenizer.decode({t.id});
  rec.logprob = t.logprob;
  for (const TokenLogprob& a : t.top) rec.top.emplace_back(tokenizer.decode({a.id}), a.logprob);
  return rec;
}

OutputText::OutputText(const Tokenizer& tokenizer, bool skip_special_tokens,
                       std::vector<std::string> stops, bool with_logprobs, std::vector<int32_t> keep)
    : tokenizer_(tokenizer),
      decoder_(tokenizer.stream_decoder(skip_special_tokens)),
      matcher_(std::move(stops)),
      with_logprobs_(with_logprobs),
      keep_(std::move(keep)) {}

TextDelta OutputText::push(const std::vector<GeneratedToken>& tokens) {
  TextDelta d;
  if (finished_) return d;
  for (const GeneratedToken& t : tokens) {
    if (matcher_.stopped()) break;
    TokenRecord rec;
    rec.id = t.id;
    if (with_logprobs_) rec = token_record(tokenizer_, t);
    rec.text_offset = std::min(decoded_bytes_, text_.size() + d.text.size());
    const bool keep = std::find(keep_.begin(), keep_.end(), t.id) != keep_.end();
    const std::string piece = decoder_.push(t.id, keep);
    decoded_bytes_ += piece.size();
    d.text += matcher_.push(piece);
    d.tokens.push_back(std::move(rec));
    ++consumed_;
  }
  text_ += d.text;
  return d;
}

TextDelta OutputText::finish() {
  TextDelta d;
  if (finished_) return d;
  finished_ = true;
  if (!matcher_.stopped()) {
    d.text = matcher_.push(decoder_.flush());
    d.text += matcher_.flush();
  }
  text_ += d.text;
  return d;
}

}  // namespace dsi::server
