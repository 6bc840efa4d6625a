// Reasoning and content of an answer; see reasoning.h.
#include "server/reasoning.h"

#include "server/output_text.h"

#include <algorithm>

namespace dsi::server {

namespace {

constexpr std::string_view kSpace = " \t\r\n";


}  // namespace

bool ReasoningSplitter::prompt_opens_reasoning(std::string_view prompt) {
  const size_t end = prompt.find_last_not_of(kSpace);
  if (end == std::string_view::npos) return false;
  prompt = prompt.substr(0, end + 1);
  return prompt.size() >= kOpen.size() && prompt.substr(prompt.size() - kOpen.size()) == kOpen;
}

ReasoningSplitter::ReasoningSplitter(bool in_reasoning)
    : state_(in_reasoning ? State::kReasoning : State::kStart) {}

ReasoningSplitter::Split ReasoningSplitter::push(std::string_view text) {
  Split out;
  held_ += text;
  for (;;) {
    if (state_ == State::kStart) {
      const size_t first = held_.find_first_not_of(kSpace);
      if (first == std::string::npos) return out;  // only whitespace so far
      const std::string_view rest = std::string_view(held_).substr(first);
      if (rest.substr(0, kOpen.size()) == kOpen) {
        held_.erase(0, first + kOpen.size());
        state_ = State::kReasoning;
        continue;
      }
      if (rest.size() < kOpen.size() && kOpen.substr(0, rest.size()) == rest) return out;
      state_ = State::kContent;  // the whitespace stays: it is the answer's
    }
    if (state_ == State::kReasoning) {
      const size_t close = held_.find(kClose);
      if (close != std::string::npos) {
        out.reasoning += held_.substr(0, close);
        held_.erase(0, close + kClose.size());
        state_ = State::kContent;
        continue;
      }
      const size_t keep = partial_match_at_end(held_, kClose);
      out.reasoning += held_.substr(0, held_.size() - keep);
      held_.erase(0, held_.size() - keep);
      return out;
    }
    out.content += held_;
    held_.clear();
    return out;
  }
}

ReasoningSplitter::Split ReasoningSplitter::finish() {
  Split out;
  (state_ == State::kReasoning ? out.reasoning : out.content) += held_;
  held_.clear();
  return out;
}

}  // namespace dsi::server
