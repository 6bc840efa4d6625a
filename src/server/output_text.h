// Generated tokens -> the text a client sees: incremental detokenisation (never half a UTF-8
// character, via Tokenizer::StreamDecoder), stop strings (text that could still begin a stop string
// is held back; the output is cut where one appears), and per-token logprob records.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dsinfer/engine.h"
#include "text/tokenizer.h"

namespace dsi::server {

// The length of the longest suffix of `text` that is a proper prefix of `s`: what a stream must
// hold back because it may still become `s` (stop strings, think tags, tool-call markers).
size_t partial_match_at_end(std::string_view text, std::string_view s);

// Finds the first of several stop strings in a stream of text pieces.
class StopStringMatcher {
 public:
  explicit StopStringMatcher(std::vector<std::string> stops);
  // Adds text; returns the text now known not to be part of a stop string. Once a stop string is
  // found, returns the text before it, stopped() turns true and later input is ignored.
  std::string push(std::string_view text);
  // The end of the stream: the text still held back (it did not become a stop string).
  std::string flush();
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
};

struct TokenRecord {
  int32_t id = 0;
  std::string text;  // the token on its own, decoded (special tokens included)
  float logprob = 0.0f;
  std::vector<std::pair<std::string, float>> top;  // decoded alternatives, most likely first
  size_t text_offset = 0;  // where the token's text starts in the output text
};

// A token's record with its logprob and its decoded alternatives (the token's text on its own).
TokenRecord token_record(const Tokenizer& tokenizer, const GeneratedToken& t);

struct TextDelta {
  std::string text;                 // new output text
  std::vector<TokenRecord> tokens;  // tokens consumed by this delta (with logprobs if asked)
};

class OutputText {
 public:
  // `keep`: tokens written out even when special tokens are skipped (a reasoning model's think
  // tags, which the reasoning splitter reads and takes out).
  OutputText(const Tokenizer& tokenizer, bool skip_special_tokens, std::vector<std::string> stops,
             bool with_logprobs, std::vector<int32_t> keep = {});
  // Consumes tokens until a stop string completes (the tokens after it are dropped).
  TextDelta push(const std::vector<GeneratedToken>& tokens);
  // The end of generation: flushes the decoder and the held-back text.
  TextDelta finish();
  bool stopped() const { return matcher_.stopped(); }  // a stop string ended the output
  int64_t tokens_consumed() const { return consumed_; }
  const std::string& text() const { return text_; }  // everything emitted so far

 private:
  const Tokenizer& tokenizer_;
  Tokenizer::StreamDecoder decoder_;
  StopStringMatcher matcher_;
  bool with_logprobs_;
  std::vector<int32_t> keep_;
  std::string text_;
  size_t decoded_bytes_ = 0;  // decoded text so far, before stop-string handling
  int64_t consumed_ = 0;
  bool finished_ = false;
};

}  // namespace dsi::server
