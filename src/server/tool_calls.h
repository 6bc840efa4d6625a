// Tool calls in chat answers, read back from the format the model writes them in (its chat template
// describes the format to the model and renders earlier calls in it):
//   glm  (GLM-4.5 .. GLM-5): <tool_call>NAME<arg_key>KEY</arg_key><arg_value>VALUE</arg_value>...</tool_call>
//   dsml (DeepSeek-V3.2):    <｜DSML｜function_calls> <｜DSML｜invoke name="NAME">
//                              <｜DSML｜parameter name="KEY" string="true|false">VALUE</｜DSML｜parameter> ...
//                            </｜DSML｜invoke> ... </｜DSML｜function_calls>
//   deepseek_v3 (DeepSeek-V3.1, V3.2-Exp): <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>
//                              {JSON arguments}<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>
// A value is a string where the model marks it so (dsml: string="true"; glm: the tool's JSON schema
// types the parameter "string"), else JSON, else (not valid JSON) the text as a string. Arguments
// come out as a JSON object's text, as OpenAI's API carries them.
//
// The parser takes an answer's content piece by piece and hands back each call as soon as its
// closing marker arrives (one call of a DSML or V3 block at a time). Nothing is lost: text around
// and between calls stays content (blank text between or after calls is dropped), and a call that
// does not parse (cut short by max_tokens, malformed) stays content as written, with everything
// after it; calls already handed back stay calls.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace dsi::server {

enum class ToolFormat { kNone, kGlm, kDsml, kDeepSeekV3 };

// The formats' markers.
namespace tool_markers {
// GLM's.
inline constexpr std::string_view kGlmOpen = "<tool_call>", kGlmClose = "</tool_call>";
inline constexpr std::string_view kKeyOpen = "<arg_key>", kKeyClose = "</arg_key>";
inline constexpr std::string_view kValueOpen = "<arg_value>", kValueClose = "</arg_value>";
// DeepSeek-V3.2's DSML markers ("｜" is U+FF5C).
inline constexpr std::string_view kDsmlOpen = "<｜DSML｜function_calls>", kDsmlClose = "</｜DSML｜function_calls>";
inline constexpr std::string_view kInvokeOpen = "<｜DSML｜invoke name=\"", kInvokeClose = "</｜DSML｜invoke>";
inline constexpr std::string_view kParamOpen = "<｜DSML｜parameter name=\"", kParamClose = "</｜DSML｜parameter>";
inline constexpr std::string_view kStringAttr = "\" string=\"";
// DeepSeek-V3.1's ("▁" is U+2581).
inline constexpr std::string_view kV3Open = "<｜tool▁calls▁begin｜>", kV3Close = "<｜tool▁calls▁end｜>";
inline constexpr std::string_view kV3CallOpen = "<｜tool▁call▁begin｜>", kV3Sep = "<｜tool▁sep｜>";
inline constexpr std::string_view kV3CallClose = "<｜tool▁call▁end｜>";
}  // namespace tool_markers

// The markers of a format (none for kNone).
std::span<const std::string_view> format_markers(ToolFormat format);

// A tool's function object (OpenAI's {"type": "function", "function": {...}}, or the function
// itself), null where it has no string name.
const nlohmann::ordered_json* tool_function(const nlohmann::ordered_json& tool);
// A function object's parameters schema (null: not given).
const nlohmann::ordered_json* parameters_of(const nlohmann::ordered_json& function);
// The parameters' schema of `function` among a request's tools (null: not given).
const nlohmann::ordered_json* function_parameters(const nlohmann::ordered_json& tools, const std::string& function);
// A parameter of this schema is written as plain text in GLM's and DSML's formats, not as JSON:
// its type is "string" (alone or with "null").
bool is_string_schema(const nlohmann::ordered_json& schema);
// The parameters of a parameters schema written as plain text: those declared with a string
// schema, in its properties or those of its allOf members and references ("#..."), a property's
// own reference followed too.
std::vector<std::string> string_parameters(const nlohmann::ordered_json& params);

// "glm", "dsml", "deepseek_v3" or "none"; "auto": the format the chat template writes (by its
// markers), if any.
ToolFormat tool_format(const std::string& name, std::string_view chat_template_source);


struct ToolCall {
  std::string name;
  std::string arguments;  // a JSON object, as text
};

class ToolCallParser {
 public:
  // tools: the request's `tools` (OpenAI's [{"type": "function", "function": {...}}]), for the
  // parameters' types.
  ToolCallParser(ToolFormat format, const nlohmann::ordered_json& tools);

  struct Result {
    std::string content;          // content for sure (push), the rest of the content (finish)
    std::vector<ToolCall> calls;  // the calls completed, in the order written
  };
  // The next piece of content.
  Result push(std::string_view text);
  // The end of the answer.
  Result finish();

  // The calls in a whole answer's content (push + finish).
  static Result parse(ToolFormat format, const nlohmann::ordered_json& tools, std::string_view text);

 private:
  enum class State {
    kContent,  // before a call, or after one and some text that is not blank
    kBetween,  // after a call (or a block of them): blank text is held, and dropped before a call
    kCall,     // inside a GLM call (after its opening marker)
    kBlock,    // inside a DSML / V3 block of calls (after its opening marker)
    kFailed,   // a call did not parse: the rest of the answer is content
  };
  bool is_string_parameter(const std::string& function, const std::string& key) const;
  std::string value_json(const std::string& function, const std::string& key, const std::string& value,
                         bool marked_string) const;
  // One call from the text between its markers (GLM: <tool_call> and </tool_call>; DSML: the
  // invoke's `name="` and </｜DSML｜invoke>; V3: <｜tool▁call▁begin｜> and <｜tool▁call▁end｜>); false
  // when it does not parse.
  bool read_call(std::string_view body, ToolCall& call) const;
  // The text of the current call or block that did not parse (and everything held after it) is
  // content from now on.
  void fail(Result& out);

  ToolFormat format_;
  std::map<std::string, std::vector<std::string>> string_keys_;  // per function: string_parameters
  State state_ = State::kContent;
  std::string held_;           // text not yet decided (after the markers already consumed)
  bool block_emitted_ = false;  // kBlock: a call of this block was handed back
};

}  // namespace dsi::server
