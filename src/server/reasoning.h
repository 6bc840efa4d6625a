// Reasoning models (GLM-5, DeepSeek-V3.2) think inside <think> ... </think> before they answer.
// The chat endpoint returns the thinking as `reasoning_content` (streamed as
// delta.reasoning_content) and the rest as `content`, as vLLM's reasoning parsers do.
//
// Whether an answer starts inside a think block is the chat template's choice: with thinking on,
// GLM-5's and DeepSeek-V3.2's prompts end with "<think>"; with it off, with "<think></think>" or
// "</think>". An answer that opens the block itself ("<think>" first, after any whitespace) is
// followed too. Text after the closing tag, and any answer that never thinks, is content; the
// tags themselves are left out. Pieces may split a tag anywhere: what could still begin one is
// held back until it is known.
#pragma once

#include <string>
#include <string_view>

namespace dsi::server {

class ReasoningSplitter {
 public:
  static constexpr std::string_view kOpen = "<think>";
  static constexpr std::string_view kClose = "</think>";

  // Whether a rendered chat prompt leaves its answer inside a think block.
  static bool prompt_opens_reasoning(std::string_view prompt);

  explicit ReasoningSplitter(bool in_reasoning);

  struct Split {
    std::string reasoning, content;
    bool empty() const { return reasoning.empty() && content.empty(); }
  };
  // The next piece of the answer's text: what is now known to be reasoning or content.
  Split push(std::string_view text);
  // The end of the answer: what was held back, where it stood.
  Split finish();

 private:
  enum class State { kStart, kReasoning, kContent };
  State state_;
  std::string held_;
};

}  // namespace dsi::server
