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
// The parser takes an answer's content piece by piece: the text before the first call streams out
// as content; from a call's opening marker on, the text is held to the end of the answer, then read
// as calls. Nothing is lost: text around and between calls stays content, and a call that does not
// parse (cut short by max_tokens, malformed) stays content as written.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace dsi::server {

enum class ToolFormat { kNone, kGlm, kDsml, kDeepSeekV3 };

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

  // The next piece of content: what is content for sure.
  std::string push(std::string_view text);

  struct Result {
    std::string content;          // the rest of the content
    std::vector<ToolCall> calls;  // in the order written
  };
  Result finish();

  // The calls in a whole answer's content (push + finish).
  static Result parse(ToolFormat format, const nlohmann::ordered_json& tools, std::string_view text);

 private:
  bool is_string_parameter(const std::string& function, const std::string& key) const;
  std::string value_json(const std::string& function, const std::string& key, const std::string& value,
                         bool marked_string) const;
  // Reads the calls of text that starts at a call marker into `calls`, the rest into `rest`.
  void read_glm(std::string_view text, std::vector<ToolCall>& calls, std::string& rest) const;
  void read_dsml(std::string_view text, std::vector<ToolCall>& calls, std::string& rest) const;
  void read_deepseek_v3(std::string_view text, std::vector<ToolCall>& calls, std::string& rest) const;

  ToolFormat format_;
  nlohmann::ordered_json tools_;
  std::string held_;     // text that may begin a call marker, or (in_calls_) everything from one
  bool in_calls_ = false;
};

}  // namespace dsi::server
