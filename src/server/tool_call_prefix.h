// A tool call written whole, a byte at a time: the whole answer where the call is forced
// (tool_choice "required" or a named function), or each call the answer opens where a function is
// strict or only one call is allowed (tool_choice "auto"): the format's markers, the name of a
// function of the request's tools, and arguments that the function's parameters schema accepts
// (json_schema.h). The arguments are read as the JSON object they stand for and handed to a
// SchemaPrefix as that object's text:
//   glm:  NAME <arg_key>K</arg_key> <arg_value>V</arg_value> ... </tool_call>   -> {"K": V, ...}
//   dsml: <｜DSML｜invoke name="NAME"> <｜DSML｜parameter name="K" string="B">V</｜DSML｜parameter> ...
//         </｜DSML｜invoke>                                                       -> {"K": V, ...}
//   deepseek_v3: NAME<｜tool▁sep｜>{JSON arguments}<｜tool▁call▁end｜>            -> the object itself
// A key, and the value of a string parameter (string_parameters, tool_calls.h: declared with a
// string schema, in the properties or in an allOf member's; dsml marks it string="true"), is
// plain text up to its closing marker, escaped into a JSON string on the way; any other value is
// JSON (dsml: string="false"); a function not held to its schema (auto mode, not strict) takes
// every value as text. Whitespace between markers, a few bytes in a row, as the formats'
// templates write it. After a call: another (when `many`) or the end (dsml, deepseek_v3: the
// block's closing marker, then the end); in auto mode, free text where `many`, else the end too.
// What ToolCallParser (tool_calls.h) reads back.
// The recognizer interface of JsonPrefix (constraints.h), with takes_special().
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server/json_schema.h"
#include "server/tool_calls.h"

namespace dsi::server {

// What a call may be: the format, the functions it may call, how many calls, whether it is forced.
struct ToolGrammar {
  struct Function {
    std::string name;
    std::shared_ptr<const JsonSchema> parameters;  // any object where the tool gives none
    std::vector<std::string> string_keys;         // parameters written as plain text (glm, dsml)
    // Its arguments are held to its schema. Not so in auto mode where it is not strict: any object,
    // every value plain text (dsml: marked either way), which the parser reads as JSON where it is.
    bool held = true;
  };
  ToolFormat format = ToolFormat::kNone;
  std::vector<Function> functions;
  bool many = true;  // more than one call may be written
  // tool_choice "auto": the answer is free text until a call opens; each call is then held until
  // it (dsml, v3: its block) closes, and the text is free again where `many`; else (parallel_tool_calls
  // false) the answer ends there, as free text could open a second call.
  bool optional = false;

  // From a request's tools (OpenAI's [{"type": "function", "function": {...}}]): every function,
  // or only `only` when not empty. A parameters schema is compiled as structured outputs compile
  // theirs; one that does not compile (a keyword JsonSchema refuses) is a dsi::Error naming the
  // function and the reason. An object schema with `properties` that says nothing of other keys
  // takes no other keys (as OpenAI's strict functions and xgrammar's strict mode read it).
  // optional (tool_choice "auto"): only the schemas of functions marked "strict": true hold their
  // arguments, the others take any object.
  static std::shared_ptr<const ToolGrammar> make(ToolFormat format, const nlohmann::ordered_json& tools,
                                                 const std::string& only, bool many, bool optional = false);
  // Some function of the tools is marked "strict": true.
  static bool any_strict(const nlohmann::ordered_json& tools);
};

// Plain text that fits a free string parameter's value wherever it stands: whole UTF-8 characters,
// no '<' (with which a closing marker may begin).
bool raw_call_text(std::string_view bytes);
// Text that fits outside a call (auto mode) wherever it stands: no '>', with which every format's
// opening marker ends, so it opens no call (and the bytes after an opening are what may not fit).
bool free_call_text(std::string_view bytes);

class ToolCallPrefix {
 public:
  explicit ToolCallPrefix(std::shared_ptr<const ToolGrammar> grammar);
  bool push(unsigned char c);           // false (and the state unchanged) when c does not fit
  bool push(std::string_view bytes);    // all or nothing
  bool advance(std::string_view bytes);  // false when they do not fit; the state then means nothing
  bool complete() const;                 // a whole answer: its calls closed (and their block)
  // (optional calls) Outside a call: any text that does not open one, or opens one well.
  bool free() const { return at_ == At::kFree; }
  std::string signature(size_t max_bytes = 0) const;
  bool takes_string_text() const { return false; }
  // Inside a string parameter's value where it is free (no limits, no pattern; nothing held back):
  // every raw_call_text() token fits.
  bool takes_raw_text() const;
  // A special token whose bytes are one of the format's markers is written as those bytes (the
  // markers are special tokens in these models' vocabularies); other special tokens never.
  bool takes_special(std::string_view bytes) const;

  static constexpr int kMaxSpaceRun = 4;  // whitespace between markers, in bytes in a row

 private:
  // Where the answer is, in its format.
  enum class At : uint8_t {
    kFree,       // (optional calls) text, until a call opens
    kChoice,     // one of a few markers (or function names), after optional whitespace
    kLiteral,    // a fixed text (a marker)
    kRaw,        // plain text up to a closing marker (a key, or a string parameter's value)
    kJson,       // a JSON value up to a closing marker (v3: the arguments object)
    kEnd,        // the calls are closed: only whitespace, then the end
  };
  // What a marker, a name or a fixed text leads to once written.
  enum class Then : uint8_t {
    kCallOpen,    // the answer's opening marker (glm: a call's; dsml, v3: the block's)
    kName,        // a call's opening marker inside the block (dsml, v3): a function's name comes
    kNamed,       // a function's name was written: its arguments begin
    kKey,         // a key comes (glm: after <arg_key>; dsml: after parameter name=")
    kValue,       // a value comes (glm: after <arg_value>; dsml: after string="B">)
    kAfterValue,  // a value's closing marker was written: another key or the call's end
    kCallEnd,     // the call's closing marker was written
    kBlockEnd,    // the block's closing marker was written
    kSep,         // dsml: the name's closing `">`; v3: <｜tool▁sep｜> was written
  };
  struct Alt {
    std::string_view text;
    Then then;
  };

  bool step(unsigned char c);
  bool free_step(unsigned char c);
  void enter_choice(std::vector<Alt> alts, bool space);
  void enter_literal(std::string_view text, Then then, size_t written = 0);
  bool reached(Then then);  // a marker, name or fixed text is written: what comes next
  void after_value();       // the choice after a value (or the name): another key, or the call's end
  bool choice_step(unsigned char c);
  bool raw_step(unsigned char c);
  bool json_step(unsigned char c);
  bool raw_closed();  // kRaw's closing marker is written
  // A key's or value's text goes on with `bytes`: false where they complete the call's closing
  // marker (or, in JSON, the value's), which the parser would take as the end wherever it stands.
  bool body_text(std::string_view bytes);
  void enter_raw(std::string_view end, bool key);  // a key's or string value's text up to `end`
  void enter_json(std::string_view end);           // a JSON value (v3: the arguments) up to `end`
  // May the raw text end where `json` is (its closing marker next): the key or string closes there.
  bool raw_may_close(const SchemaPrefix& json) const;

  std::shared_ptr<const ToolGrammar> g_;
  At at_ = At::kLiteral;
  std::vector<Alt> alts_;      // kChoice: the alternatives (those still possible are those `got_` fits)
  std::string got_;            // kChoice, kLiteral: the bytes written of it so far
  std::string_view lit_;       // kLiteral: the text
  Then then_ = Then::kCallOpen;  // kLiteral: what it leads to
  uint8_t space_run_ = 0;      // kChoice, kEnd: whitespace bytes in a row
  bool space_ok_ = false;      // kChoice: whitespace may come before the marker
  bool may_end_ = false;       // kChoice (glm): after a call, where the answer may end
  // The call being written.
  int32_t function_ = -1;      // its function (an index into g_->functions)
  bool first_key_ = true;      // no key written yet
  std::optional<SchemaPrefix> json_;  // the arguments object's text so far
  // kRaw: the closing marker, the text held back (a prefix of the marker), whether it is a key
  // (else a string value), and the key's text (for its string-ness).
  std::string_view raw_end_;
  std::string held_;
  bool raw_key_ = false;
  std::string key_;
  bool string_value_ = false;  // the key's parameter is written as plain text
  // kJson: the value's own nesting, outside strings; inside a string; after a backslash in one;
  // a byte of the value has come; the closing marker.
  // kRaw, kJson: the end of the text so far that may begin a marker it must not hold; kFree: that
  // may begin the opening marker.
  std::string tail_;
  int32_t jdepth_ = 0;
  bool jstr_ = false, jesc_ = false, jstarted_ = false;
  std::string_view json_end_;
};

}  // namespace dsi::server
