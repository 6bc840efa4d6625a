// The reasoning splitter (server/reasoning.h): an answer's <think> block as reasoning, the rest as
// content, whichever pieces the text arrives in (every split point, one byte at a time), whether
// the prompt opened the block or the answer does, and when the block never closes.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "server/reasoning.h"

namespace dsi::server {
namespace {

struct Parts {
  std::string reasoning, content;
};

Parts run(bool in_reasoning, const std::vector<std::string>& pieces) {
  ReasoningSplitter s(in_reasoning);
  Parts p;
  for (const std::string& piece : pieces) {
    const ReasoningSplitter::Split x = s.push(piece);
    p.reasoning += x.reasoning;
    p.content += x.content;
  }
  const ReasoningSplitter::Split x = s.finish();
  p.reasoning += x.reasoning;
  p.content += x.content;
  return p;
}

// The text whole, cut at every point into two pieces, and one byte at a time: the same parts.
void expect_split(bool in_reasoning, const std::string& text, const std::string& reasoning,
                  const std::string& content) {
  SCOPED_TRACE((in_reasoning ? "in reasoning: '" : "at the start: '") + text + "'");
  std::vector<std::vector<std::string>> ways = {{text}};
  for (size_t cut = 0; cut <= text.size(); ++cut) ways.push_back({text.substr(0, cut), text.substr(cut)});
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  ways.push_back(bytes);
  for (const auto& pieces : ways) {
    const Parts p = run(in_reasoning, pieces);
    EXPECT_EQ(p.reasoning, reasoning) << pieces.size() << " pieces";
    EXPECT_EQ(p.content, content) << pieces.size() << " pieces";
  }
}

TEST(ReasoningSplitter, PromptThatOpensTheBlock) {
  expect_split(true, "Let me think.</think>The answer is 4.", "Let me think.", "The answer is 4.");
  expect_split(true, "a < b </thin </think>\n\nok </think> still content", "a < b </thin ",
               "\n\nok </think> still content");
  expect_split(true, "</think>", "", "");
  expect_split(true, "never closed </thi", "never closed </thi", "");
  expect_split(true, "", "", "");
}

TEST(ReasoningSplitter, AnswerThatOpensTheBlock) {
  expect_split(false, "<think>hmm</think>yes", "hmm", "yes");
  expect_split(false, " \n<think>hmm</think>yes", "hmm", "yes");
  expect_split(false, "no thinking <think>here</think>", "", "no thinking <think>here</think>");
  expect_split(false, "  plain", "", "  plain");
  expect_split(false, "<thin", "", "<thin");  // ended before the tag was whole
  expect_split(false, " ", "", " ");
  expect_split(false, "</think>text", "", "</think>text");
}

TEST(ReasoningSplitter, PromptsOfTheTemplates) {
  // GLM-5: "<|assistant|><think>" (thinking) or "<|assistant|><think></think>"; DeepSeek-V3.2:
  // "<｜Assistant｜><think>" or "<｜Assistant｜></think>".
  EXPECT_TRUE(ReasoningSplitter::prompt_opens_reasoning("[gMASK]<sop><|user|>hi<|assistant|><think>"));
  EXPECT_TRUE(ReasoningSplitter::prompt_opens_reasoning("<｜User｜>hi<｜Assistant｜><think>\n"));
  EXPECT_FALSE(ReasoningSplitter::prompt_opens_reasoning("<|user|>hi<|assistant|><think></think>"));
  EXPECT_FALSE(ReasoningSplitter::prompt_opens_reasoning("<｜User｜>hi<｜Assistant｜></think>"));
  EXPECT_FALSE(ReasoningSplitter::prompt_opens_reasoning("<|user|>hi<|assistant|>"));
  EXPECT_FALSE(ReasoningSplitter::prompt_opens_reasoning(""));
  EXPECT_FALSE(ReasoningSplitter::prompt_opens_reasoning("think>"));
}

}  // namespace
}  // namespace dsi::server
