// Tool calls read back from chat answers; see tool_calls.h.
#include "server/tool_calls.h"

#include "server/output_text.h"

#include <algorithm>

#include "dsinfer/error.h"
#include "text/utf8.h"

namespace dsi::server {

namespace {

using Json = nlohmann::ordered_json;

constexpr std::string_view kSpace = " \t\r\n";

// GLM's markers.
constexpr std::string_view kGlmOpen = "<tool_call>", kGlmClose = "</tool_call>";
constexpr std::string_view kKeyOpen = "<arg_key>", kKeyClose = "</arg_key>";
constexpr std::string_view kValueOpen = "<arg_value>", kValueClose = "</arg_value>";
// DeepSeek-V3.2's DSML markers ("｜" is U+FF5C).
constexpr std::string_view kDsmlOpen = "<｜DSML｜function_calls>", kDsmlClose = "</｜DSML｜function_calls>";
constexpr std::string_view kInvokeOpen = "<｜DSML｜invoke name=\"", kInvokeClose = "</｜DSML｜invoke>";
constexpr std::string_view kParamOpen = "<｜DSML｜parameter name=\"", kParamClose = "</｜DSML｜parameter>";
constexpr std::string_view kStringAttr = "\" string=\"";
// DeepSeek-V3.1's ("▁" is U+2581).
constexpr std::string_view kV3Open = "<｜tool▁calls▁begin｜>", kV3Close = "<｜tool▁calls▁end｜>";
constexpr std::string_view kV3CallOpen = "<｜tool▁call▁begin｜>", kV3Sep = "<｜tool▁sep｜>";
constexpr std::string_view kV3CallClose = "<｜tool▁call▁end｜>";

std::string_view trim(std::string_view s) {
  const size_t a = s.find_first_not_of(kSpace);
  if (a == std::string_view::npos) return {};
  return s.substr(a, s.find_last_not_of(kSpace) - a + 1);
}

bool blank(std::string_view s) { return s.find_first_not_of(kSpace) == std::string_view::npos; }


// A cursor over the held text: skips whitespace, takes markers and the text up to a marker.
struct Reader {
  std::string_view s;
  size_t at = 0;
  void skip_space() {
    while (at < s.size() && kSpace.find(s[at]) != std::string_view::npos) ++at;
  }
  bool take(std::string_view marker) {
    if (s.substr(at, marker.size()) != marker) return false;
    at += marker.size();
    return true;
  }
  // The text up to `marker` (which is consumed); false when it does not occur.
  bool until(std::string_view marker, std::string& out) {
    const size_t end = s.find(marker, at);
    if (end == std::string_view::npos) return false;
    out.assign(s.substr(at, end - at));
    at = end + marker.size();
    return true;
  }
};

std::string_view open_marker(ToolFormat f) {
  return f == ToolFormat::kGlm ? kGlmOpen : f == ToolFormat::kDsml ? kDsmlOpen : kV3Open;
}

}  // namespace

ToolFormat tool_format(const std::string& name, std::string_view chat_template_source) {
  if (name == "glm") return ToolFormat::kGlm;
  if (name == "dsml") return ToolFormat::kDsml;
  if (name == "deepseek_v3") return ToolFormat::kDeepSeekV3;
  if (name == "none") return ToolFormat::kNone;
  DSI_CHECK(name == "auto", "tool call parser '{}': expected auto, glm, dsml, deepseek_v3 or none",
            utf8::shown(name));
  if (chat_template_source.find("<arg_key>") != std::string_view::npos) return ToolFormat::kGlm;
  if (chat_template_source.find("DSML") != std::string_view::npos) return ToolFormat::kDsml;
  if (chat_template_source.find(kV3Open) != std::string_view::npos) return ToolFormat::kDeepSeekV3;
  return ToolFormat::kNone;
}

ToolCallParser::ToolCallParser(ToolFormat format, const Json& tools) : format_(format), tools_(tools) {}

std::string ToolCallParser::push(std::string_view text) {
  held_ += text;
  if (in_calls_ || format_ == ToolFormat::kNone) {
    return in_calls_ ? std::string() : std::exchange(held_, {});
  }
  const std::string_view marker = open_marker(format_);
  const size_t at = held_.find(marker);
  if (at != std::string::npos) {
    in_calls_ = true;
    std::string out = held_.substr(0, at);
    held_.erase(0, at);
    return out;
  }
  const size_t keep = partial_match_at_end(held_, marker);
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

ToolCallParser::Result ToolCallParser::finish() {
  Result r;
  const std::string text = std::exchange(held_, {});
  if (!in_calls_) {
    r.content = text;
    return r;
  }
  if (format_ == ToolFormat::kGlm) read_glm(text, r.calls, r.content);
  else if (format_ == ToolFormat::kDsml) read_dsml(text, r.calls, r.content);
  else read_deepseek_v3(text, r.calls, r.content);
  return r;
}

ToolCallParser::Result ToolCallParser::parse(ToolFormat format, const Json& tools, std::string_view text) {
  ToolCallParser p(format, tools);
  std::string content = p.push(text);
  Result r = p.finish();
  r.content.insert(0, content);
  return r;
}

bool ToolCallParser::is_string_parameter(const std::string& function, const std::string& key) const {
  if (!tools_.is_array()) return false;
  for (const Json& t : tools_) {
    const Json* f = t.is_object() && t.contains("function") ? &t["function"] : &t;
    if (!f->is_object() || !f->contains("name") || (*f)["name"] != function) continue;
    const Json* props = f->contains("parameters") && (*f)["parameters"].is_object() &&
                                (*f)["parameters"].contains("properties")
                            ? &(*f)["parameters"]["properties"]
                            : nullptr;
    if (props == nullptr || !props->is_object() || !props->contains(key)) return false;
    const Json& p = (*props)[key];
    if (!p.is_object() || !p.contains("type")) return false;
    const Json& type = p["type"];
    if (type.is_string()) return type == "string";
    return type.is_array() && std::find(type.begin(), type.end(), Json("string")) != type.end() &&
           std::none_of(type.begin(), type.end(), [](const Json& x) { return x != "string" && x != "null"; });
  }
  return false;
}

std::string ToolCallParser::value_json(const std::string& function, const std::string& key,
                                       const std::string& value, bool marked_string) const {
  if (!marked_string && !is_string_parameter(function, key)) {
    const Json parsed = Json::parse(trim(value), nullptr, /*allow_exceptions=*/false);
    if (!parsed.is_discarded()) return parsed.dump(-1, ' ', false, Json::error_handler_t::replace);
  }
  return Json(value).dump(-1, ' ', false, Json::error_handler_t::replace);
}

namespace {

// {"key": value, ...} from (key, value JSON text) pairs, in order.
std::string arguments_object(const std::vector<std::pair<std::string, std::string>>& args) {
  std::string out = "{";
  for (size_t i = 0; i < args.size(); ++i) {
    if (i) out += ", ";
    out += Json(args[i].first).dump(-1, ' ', false, Json::error_handler_t::replace) + ": " + args[i].second;
  }
  return out + "}";
}

}  // namespace

namespace {

// Reads the call blocks of `text` (which holds the rest of an answer from a block's opening marker
// on): `block` reads one block from just after its `open` marker, consuming it, and returns false
// when it is malformed. Text between blocks that is not blank is content; so is everything from a
// malformed block on.
template <typename ReadBlock>
void read_blocks(std::string_view text, std::string_view open, std::vector<ToolCall>& calls,
                 std::string& rest, ReadBlock block) {
  size_t at = 0;
  for (;;) {
    const size_t next = text.find(open, at);
    const std::string_view between =
        text.substr(at, next == std::string_view::npos ? std::string_view::npos : next - at);
    if (!blank(between)) rest += between;
    if (next == std::string_view::npos) return;
    Reader r{text, next + open.size()};
    std::vector<ToolCall> found;
    if (!block(r, found)) {
      rest += text.substr(next);
      return;
    }
    for (ToolCall& c : found) calls.push_back(std::move(c));
    at = r.at;
  }
}

}  // namespace

void ToolCallParser::read_glm(std::string_view text, std::vector<ToolCall>& calls, std::string& rest) const {
  read_blocks(text, kGlmOpen, calls, rest, [&](Reader& r, std::vector<ToolCall>& found) {
    std::string body;
    if (!r.until(kGlmClose, body)) return false;
    ToolCall call;
    const size_t first_key = body.find(kKeyOpen);
    call.name = std::string(trim(std::string_view(body).substr(0, first_key)));
    if (call.name.empty() || call.name.find('<') != std::string::npos) return false;
    Reader b{body, first_key == std::string::npos ? body.size() : first_key};
    std::vector<std::pair<std::string, std::string>> args;
    for (;;) {
      b.skip_space();
      if (b.at >= body.size()) break;
      std::string key, value;
      if (!b.take(kKeyOpen) || !b.until(kKeyClose, key)) return false;
      b.skip_space();
      if (!b.take(kValueOpen) || !b.until(kValueClose, value)) return false;
      key = std::string(trim(key));
      args.emplace_back(key, value_json(call.name, key, value, false));
    }
    call.arguments = arguments_object(args);
    found.push_back(std::move(call));
    return true;
  });
}

void ToolCallParser::read_dsml(std::string_view text, std::vector<ToolCall>& calls, std::string& rest) const {
  read_blocks(text, kDsmlOpen, calls, rest, [&](Reader& r, std::vector<ToolCall>& found) {
    std::string block;
    if (!r.until(kDsmlClose, block)) return false;
    Reader b{block};
    for (;;) {
      b.skip_space();
      if (b.at >= block.size()) return true;
      ToolCall call;
      std::string body;
      if (!b.take(kInvokeOpen) || !b.until("\">", call.name) || call.name.empty() || !b.until(kInvokeClose, body))
        return false;
      Reader p{body};
      std::vector<std::pair<std::string, std::string>> args;
      for (;;) {
        p.skip_space();
        if (p.at >= body.size()) break;
        std::string key, marked, value;
        if (!p.take(kParamOpen) || !p.until(kStringAttr, key) || !p.until("\">", marked) ||
            (marked != "true" && marked != "false") || !p.until(kParamClose, value))
          return false;
        args.emplace_back(key, value_json(call.name, key, value, marked == "true"));
      }
      call.arguments = arguments_object(args);
      found.push_back(std::move(call));
    }
  });
}

void ToolCallParser::read_deepseek_v3(std::string_view text, std::vector<ToolCall>& calls,
                                      std::string& rest) const {
  read_blocks(text, kV3Open, calls, rest, [&](Reader& r, std::vector<ToolCall>& found) {
    std::string block;
    if (!r.until(kV3Close, block)) return false;
    Reader b{block};
    for (;;) {
      b.skip_space();
      if (b.at >= block.size()) return true;
      ToolCall call;
      std::string args;
      if (!b.take(kV3CallOpen) || !b.until(kV3Sep, call.name) || !b.until(kV3CallClose, args)) return false;
      call.name = std::string(trim(call.name));
      // The arguments: a JSON object (in a fenced ```json block in V3's older form).
      std::string_view a = trim(args);
      if (a.substr(0, 7) == "```json" && a.size() >= 10 && a.substr(a.size() - 3) == "```")
        a = trim(a.substr(7, a.size() - 10));
      const Json parsed = Json::parse(a, nullptr, /*allow_exceptions=*/false);
      if (call.name.empty() || !parsed.is_object()) return false;
      call.arguments = parsed.dump(-1, ' ', false, Json::error_handler_t::replace);
      found.push_back(std::move(call));
    }
  });
}

}  // namespace dsi::server
