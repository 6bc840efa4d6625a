// The server's TokenConstraints (dsinfer/engine.h): what a request may generate.
//
// JSON mode (response_format {"type": "json_object"}): a TokenConstraint that lets a request write
// only a JSON object (RFC 8259, UTF-8), then its end of sequence; structured outputs
// (json_schema) the same with a schema's recognizer (json_schema.h); a regular expression or a
// list of choices (vLLM's structured_outputs) with a pattern's (json_pattern.h). Each step the tokens of the
// vocabulary are tried from the text so far (walked as a trie, the masks kept by the state's
// signature): a token's bytes must continue a prefix of an accepted text; special tokens never
// (the end-of-sequence ids only once the text is whole, and then nothing else). A reasoning
// model's think block comes first, unconstrained: from the start when the prompt leaves the answer
// inside it, or when the answer opens it with its first token. The constraints copy themselves
// (clone), so the engine speculates such requests.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dsinfer/engine.h"
#include "server/json_pattern.h"
#include "server/json_scan.h"
#include "server/json_schema.h"
#include "server/key_set.h"
#include "server/tool_call_prefix.h"
#include "text/tokenizer.h"

namespace dsi::server {

// A byte-at-a-time recognizer of one JSON object (and whitespace between its parts, within limits),
// each key at most once in its object (escapes read: "a" and "\u0061" are one key), as the schema
// recognizer has them: names SHOULD be unique (RFC 8259), and parsers read a repeated one
// differently (the last value, the first, an error).
class JsonPrefix {
 public:
  // Takes byte c; false (and the state unchanged) when no JSON object starts with the bytes so
  // far followed by c.
  bool push(unsigned char c);
  bool push(std::string_view bytes);  // all or nothing
  // Takes the bytes; false when they do not fit, and then this state means nothing (for a copy).
  bool advance(std::string_view bytes);
  bool complete() const { return mode_ == Mode::kDone; }
  size_t depth() const { return stack_.size(); }  // containers open
  // Inside a string at rest: every json_string_text() token fits.
  bool takes_string_text() const { return mode_ == Mode::kString && str_.at_rest(); }
  // What decides whether a text of at most max_bytes bytes fits: two states with equal signatures
  // take exactly the same such texts. It holds the state less the containers that so short a
  // text cannot close, and the depth only where so short a text could reach the root or the limit;
  // of the keys written, those so short a text could write again (a state met again with another
  // key written has its own).
  std::string signature(size_t max_bytes) const;

  static constexpr int kMaxDepth = 64;  // nesting beyond this is refused
  // Whitespace between tokens: none before the object, at most this many bytes in a row (so a
  // sampler cannot loop on blank lines).
  static constexpr int kMaxSpaceRun = 32;

 private:
  enum class Mode : uint8_t {
    kStart,       // before the object's '{'
    kValue,       // a value must come (after ':', or ',' in an array)
    kValueOrEnd,  // after '[': a value or ']'
    kKeyOrEnd,    // after '{': a key or '}'
    kKey,         // after ',' in an object: a key
    kColon,       // after a key
    kAfterValue,  // inside a container after a value: ',' or its end
    kString,      // inside a string (key_ says which kind)
    kNumber,      // inside a number
    kLiteral,     // inside true / false / null (lit_ and lit_at_)
    kDone,        // the object is closed
  };
  // The keys of each open object that has any, innermost first. A JsonPrefix is copied for every
  // byte it takes (push) and every byte of a mask's walk of the vocabulary, and a constraint for
  // each of the engine's drafts: a copy costs one shared pointer, however many keys there are
  // (and the text of a key under way, kept in place while it is short).
  // Closing an object drops its keys.
  struct Keys {
    std::shared_ptr<const Keys> outer;  // the enclosing objects' keys
    KeySet keys;
    uint32_t depth;  // the object's: stack_.size() while it is the innermost container
  };
  bool step(unsigned char c);  // with the whitespace rules
  bool step_json(unsigned char c);
  bool value_start(unsigned char c);
  void end_value();  // a value is complete: after it, in its container or at the root
  void close();      // the innermost container closes (and an object's keys go)
  const KeySet* object_keys() const;  // the innermost object's keys (null: none yet)
  bool take_key();   // the key closes: false where its object has it already

  Mode mode_ = Mode::kStart;
  bool key_ = false;  // kString: an object key
  JsonStringScan str_;
  JsonNumberScan num_;
  const char* lit_ = nullptr;  // kLiteral: the literal, and how much of it has come
  uint8_t lit_at_ = 0;
  std::string stack_;         // open containers, '{' or '['
  uint8_t space_run_ = 0;     // whitespace bytes in a row outside strings
  std::string key_text_;      // kString in a key: its characters so far, escapes read, as UTF-8
  std::shared_ptr<const Keys> keys_;  // null: no open object has a key
};

// Plain UTF-8 text that a pattern matches whole (structured outputs' regex and choice), a byte at
// a time: the pattern's DFA steps a character at a time, and a byte is refused when no character
// it can still become keeps a match within reach. The recognizer interface of JsonPrefix.
class TextPattern {
 public:
  explicit TextPattern(std::shared_ptr<const JsonPattern> pattern) : pattern_(std::move(pattern)) {}
  bool push(unsigned char c);
  bool push(std::string_view bytes);  // all or nothing
  bool advance(std::string_view bytes);
  bool complete() const { return utf8_.at_rest() && pattern_->accepts(state_); }
  std::string signature(size_t max_bytes = 0) const;
  bool takes_string_text() const { return false; }

 private:
  std::shared_ptr<const JsonPattern> pattern_;
  int32_t state_ = 0;
  Utf8Scan utf8_;
};

// What the constraints below share: a reasoning model's think block comes first, unmasked
// (from the start when the prompt leaves the answer inside it, or when the answer's first token
// opens it); then each step the answer's tokens are masked to those that fit(). eos: the ids that
// end a sequence; think_open / think_close: the reasoning tags' ids (-1: none).
class AnswerConstraint : public TokenConstraint {
 public:
  void mask(float* logits, int64_t vocab) final;
  void accept(int32_t token) final;

  using Bits = std::vector<uint64_t>;  // bit id: the token fits

 protected:
  AnswerConstraint(const Tokenizer& tokenizer, std::vector<int32_t> eos, int32_t think_open, int32_t think_close,
                   bool in_reasoning);
  virtual bool fits(int32_t id) const = 0;       // may this token of the answer come next
  virtual void take(int32_t id) = 0;             // this token of the answer was emitted
  // The tokens below vocab that fit now, as bits (default: fits() of each).
  virtual const Bits& fitting(int64_t vocab);
  void fill(Bits& bits, int64_t vocab) const;  // fits() of each id
  bool is_eos(int32_t id) const;

  const Tokenizer& tokenizer_;
  std::vector<int32_t> eos_;

 private:
  int32_t think_open_, think_close_;
  Bits bits_;          // fitting()'s answer by default
  bool reasoning_;     // inside the think block: unconstrained
  bool first_ = true;  // no token of the answer yet
};

// A text through a byte recognizer (JsonPrefix, SchemaPrefix for a schema, TextPattern for a
// regular expression, ToolCallPrefix for tool calls): each step a token fits when its
// bytes continue the text; the end of sequence only once the text is whole. Special tokens never,
// but those the recognizer's takes_special(bytes) names, if it has one (then as their bytes), and
// any while it is free() (tool calls in auto mode, outside a call: they leave its text alone).
template <class Recognizer>
class TextConstraint : public AnswerConstraint {
 public:
  TextConstraint(const Tokenizer& tokenizer, std::vector<int32_t> eos, int32_t think_open, int32_t think_close,
                     bool in_reasoning, Recognizer start)
      : AnswerConstraint(tokenizer, std::move(eos), think_open, think_close, in_reasoning),
        json_(std::move(start)) {}
  const Recognizer& state() const { return json_; }
  std::unique_ptr<TokenConstraint> clone() const override;  // (the masks kept are shared)

 private:
  bool fits(int32_t id) const override;
  void take(int32_t id) override;
  // The answer for the state's signature: the same few states come back step after step (inside
  // a string, after a value), so each is computed once, not once per step over the vocabulary.
  const Bits& fitting(int64_t vocab) override;

  static constexpr size_t kCachedMasks = 16;
  bool wrote_ = false;  // a token of the JSON text has been written (spaced tokenizers)
  Recognizer json_;
  std::vector<Recognizer> states_;  // the fill's states after each prefix of a token
  // Signature -> bits, the most recent last; shared with the copies (the engine's drafts).
  using Masks = std::vector<std::pair<std::string, Bits>>;
  std::shared_ptr<Masks> masks_ = std::make_shared<Masks>();
};

// JSON mode (response_format json_object): one JSON object.
class JsonConstraint : public TextConstraint<JsonPrefix> {
 public:
  JsonConstraint(const Tokenizer& tokenizer, std::vector<int32_t> eos, int32_t think_open, int32_t think_close,
                 bool in_reasoning)
      : TextConstraint(tokenizer, std::move(eos), think_open, think_close, in_reasoning, JsonPrefix()) {}
};

// Structured outputs (response_format json_schema): a value the schema accepts (json_schema.h).
class SchemaConstraint : public TextConstraint<SchemaPrefix> {
 public:
  SchemaConstraint(const Tokenizer& tokenizer, std::shared_ptr<const JsonSchema> schema, std::vector<int32_t> eos,
                   int32_t think_open, int32_t think_close, bool in_reasoning, int space_run = 0)
      : TextConstraint(tokenizer, std::move(eos), think_open, think_close, in_reasoning,
                           SchemaPrefix(std::move(schema), space_run)) {}
};

// A regular expression or a list of choices (vLLM's structured_outputs regex / choice): text that
// the pattern matches whole (JsonPattern::Match::kWhole, or JsonPattern::any_of).
class PatternConstraint : public TextConstraint<TextPattern> {
 public:
  PatternConstraint(const Tokenizer& tokenizer, std::shared_ptr<const JsonPattern> pattern, std::vector<int32_t> eos,
                    int32_t think_open, int32_t think_close, bool in_reasoning)
      : TextConstraint(tokenizer, std::move(eos), think_open, think_close, in_reasoning,
                       TextPattern(std::move(pattern))) {}
};

// A forced tool call (tool_choice "required" or a named function): the answer is the call (or
// calls) written whole in the model's format, with arguments the function's parameters schema
// accepts (tool_call_prefix.h); the markers' special tokens fit where their text does. With an
// optional grammar (tool_choice "auto", strict functions) the answer is free until a call opens.
class ToolCallConstraint : public TextConstraint<ToolCallPrefix> {
 public:
  ToolCallConstraint(const Tokenizer& tokenizer, std::shared_ptr<const ToolGrammar> grammar, std::vector<int32_t> eos,
                     int32_t think_open, int32_t think_close, bool in_reasoning)
      : TextConstraint(tokenizer, std::move(eos), think_open, think_close, in_reasoning,
                       ToolCallPrefix(std::move(grammar))) {}
};

}  // namespace dsi::server
