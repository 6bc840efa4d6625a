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

using namespace tool_markers;

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

// A format's markers: a block's opening and closing ones (GLM has no blocks: each call is opened
// and closed by its own markers, `open` and `call_close`), and a call's inside a block.
struct Syntax {
  std::string_view open, close, call_open, call_close;
};
Syntax syntax(ToolFormat f) {
  if (f == ToolFormat::kGlm) return {kGlmOpen, {}, {}, kGlmClose};
  if (f == ToolFormat::kDsml) return {kDsmlOpen, kDsmlClose, kInvokeOpen, kInvokeClose};
  return {kV3Open, kV3Close, kV3CallOpen, kV3CallClose};
}

bool starts_with(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

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

std::span<const std::string_view> format_markers(ToolFormat format) {
  static constexpr std::string_view kGlm[] = {kGlmOpen, kGlmClose, kKeyOpen, kKeyClose, kValueOpen, kValueClose};
  static constexpr std::string_view kDsml[] = {kDsmlOpen, kDsmlClose, kInvokeOpen, kInvokeClose, kParamOpen, kParamClose};
  static constexpr std::string_view kV3[] = {kV3Open, kV3Close, kV3CallOpen, kV3Sep, kV3CallClose};
  switch (format) {
    case ToolFormat::kGlm:
      return kGlm;
    case ToolFormat::kDsml:
      return kDsml;
    case ToolFormat::kDeepSeekV3:
      return kV3;
    case ToolFormat::kNone:
      break;
  }
  return {};
}

ToolCallParser::ToolCallParser(ToolFormat format, const Json& tools) : format_(format) {
  if (!tools.is_array()) return;
  for (const Json& t : tools)  // the first tool of a name counts, as function_parameters finds it
    if (const Json* f = tool_function(t); f != nullptr)
      if (const Json* params = parameters_of(*f); params != nullptr)
        string_keys_.emplace((*f)["name"].get<std::string>(), string_parameters(*params));
}

ToolCallParser::Result ToolCallParser::push(std::string_view text) {
  Result out;
  held_ += text;
  if (format_ == ToolFormat::kNone || state_ == State::kFailed) {
    out.content = std::exchange(held_, {});
    return out;
  }
  const Syntax sx = syntax(format_);
  for (;;) {
    if (state_ == State::kContent || state_ == State::kBetween) {
      const size_t at = held_.find(sx.open);
      if (at != std::string::npos) {  // a call (GLM) or a block opens: the text before it is decided
        const std::string_view before = std::string_view(held_).substr(0, at);
        if (state_ == State::kContent || !blank(before)) out.content += before;
        held_.erase(0, at + sx.open.size());
        state_ = format_ == ToolFormat::kGlm ? State::kCall : State::kBlock;
        block_emitted_ = false;
        continue;
      }
      const size_t sure = held_.size() - partial_match_at_end(held_, sx.open);
      if (state_ == State::kBetween && blank(std::string_view(held_).substr(0, sure))) return out;
      state_ = State::kContent;  // (text after calls that is not blank is content up to the next call)
      out.content += held_.substr(0, sure);
      held_.erase(0, sure);
      return out;
    }
    if (state_ == State::kCall) {
      const size_t end = held_.find(sx.call_close);
      if (end == std::string::npos) return out;
      ToolCall call;
      if (!read_call(std::string_view(held_).substr(0, end), call)) {
        fail(out);
        return out;
      }
      out.calls.push_back(std::move(call));
      held_.erase(0, end + sx.call_close.size());
      state_ = State::kBetween;
      continue;
    }
    // kBlock: blank text, then the block's end, a whole call, or a prefix of either.
    const size_t i = held_.find_first_not_of(kSpace);
    if (i == std::string::npos) return out;
    const std::string_view rest = std::string_view(held_).substr(i);
    if (starts_with(rest, sx.close)) {
      held_.erase(0, i + sx.close.size());
      state_ = State::kBetween;
      continue;
    }
    if (starts_with(rest, sx.call_open)) {
      const size_t end = rest.find(sx.call_close, sx.call_open.size());
      if (end == std::string_view::npos) return out;
      ToolCall call;
      if (!read_call(rest.substr(sx.call_open.size(), end - sx.call_open.size()), call)) {
        fail(out);
        return out;
      }
      out.calls.push_back(std::move(call));
      held_.erase(0, i + end + sx.call_close.size());
      block_emitted_ = true;
      continue;
    }
    if (starts_with(sx.close, rest) || starts_with(sx.call_open, rest)) return out;  // not all there yet
    fail(out);
    return out;
  }
}

void ToolCallParser::fail(Result& out) {
  // The call or block as written: its opening marker (unless calls of the block went out already).
  if (state_ == State::kCall || (state_ == State::kBlock && !block_emitted_)) out.content += syntax(format_).open;
  out.content += std::exchange(held_, {});
  state_ = State::kFailed;
}

ToolCallParser::Result ToolCallParser::finish() {
  Result r;
  if (state_ == State::kCall || state_ == State::kBlock) fail(r);  // cut short: content as written
  else if (state_ != State::kBetween || !blank(held_)) r.content = std::exchange(held_, {});
  held_.clear();
  return r;
}

ToolCallParser::Result ToolCallParser::parse(ToolFormat format, const Json& tools, std::string_view text) {
  ToolCallParser p(format, tools);
  Result r = p.push(text);
  Result end = p.finish();
  r.content += end.content;
  for (ToolCall& c : end.calls) r.calls.push_back(std::move(c));
  return r;
}

const Json* tool_function(const Json& tool) {
  const Json* f = tool.is_object() && tool.contains("function") ? &tool["function"] : &tool;
  return f->is_object() && f->contains("name") && (*f)["name"].is_string() ? f : nullptr;
}

const Json* parameters_of(const Json& function) {
  return function.contains("parameters") && function["parameters"].is_object() ? &function["parameters"] : nullptr;
}

const Json* function_parameters(const Json& tools, const std::string& function) {
  if (!tools.is_array()) return nullptr;
  for (const Json& t : tools)
    if (const Json* f = tool_function(t); f != nullptr && (*f)["name"] == function) return parameters_of(*f);
  return nullptr;
}

bool is_string_schema(const Json& p) {
  if (!p.is_object() || !p.contains("type")) return false;
  const Json& type = p["type"];
  if (type.is_string()) return type == "string";
  return type.is_array() && std::find(type.begin(), type.end(), Json("string")) != type.end() &&
         std::none_of(type.begin(), type.end(), [](const Json& x) { return x != "string" && x != "null"; });
}

namespace {

// The schema a reference inside `root` points at ("#..."), or null.
const Json* referred(const Json& root, const Json& ref) {
  if (!ref.is_string() || ref.get<std::string>().rfind('#', 0) != 0) return nullptr;
  try {
    const Json::json_pointer ptr(ref.get<std::string>().substr(1));
    return root.contains(ptr) ? &root.at(ptr) : nullptr;
  } catch (const Json::exception&) {
    return nullptr;
  }
}

// Adds to `out` the string parameters that `s` (a schema inside root) declares, through its allOf
// and its reference; depth bounds reference cycles.
void add_string_parameters(const Json& root, const Json& s, int depth, std::vector<std::string>& out) {
  if (!s.is_object() || depth > 16) return;
  if (const auto props = s.find("properties"); props != s.end() && props->is_object())
    for (auto it = props->begin(); it != props->end(); ++it) {
      const Json* p = &it.value();
      for (int hops = 0; p != nullptr && p->is_object() && p->contains("$ref") && hops < 16; ++hops)
        p = referred(root, (*p)["$ref"]);
      if (p != nullptr && is_string_schema(*p) && std::find(out.begin(), out.end(), it.key()) == out.end())
        out.push_back(it.key());
    }
  if (const auto all = s.find("allOf"); all != s.end() && all->is_array())
    for (const Json& member : *all) add_string_parameters(root, member, depth + 1, out);
  if (const auto ref = s.find("$ref"); ref != s.end())
    if (const Json* target = referred(root, *ref)) add_string_parameters(root, *target, depth + 1, out);
}

}  // namespace

std::vector<std::string> string_parameters(const Json& params) {
  std::vector<std::string> out;
  add_string_parameters(params, params, 0, out);
  return out;
}

bool ToolCallParser::is_string_parameter(const std::string& function, const std::string& key) const {
  const auto keys = string_keys_.find(function);
  return keys != string_keys_.end() && std::find(keys->second.begin(), keys->second.end(), key) != keys->second.end();
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

bool ToolCallParser::read_call(std::string_view body, ToolCall& call) const {
  std::vector<std::pair<std::string, std::string>> args;
  if (format_ == ToolFormat::kGlm) {  // NAME<arg_key>KEY</arg_key><arg_value>VALUE</arg_value>...
    const size_t first_key = body.find(kKeyOpen);
    call.name = std::string(trim(body.substr(0, first_key)));
    if (call.name.empty() || call.name.find('<') != std::string::npos) return false;
    Reader b{body, first_key == std::string_view::npos ? body.size() : first_key};
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
  } else if (format_ == ToolFormat::kDsml) {  // NAME"><｜DSML｜parameter name="KEY" string="B">VALUE</｜DSML｜parameter>...
    Reader b{body};
    if (!b.until("\">", call.name) || call.name.empty()) return false;
    for (;;) {
      b.skip_space();
      if (b.at >= body.size()) break;
      std::string key, marked, value;
      if (!b.take(kParamOpen) || !b.until(kStringAttr, key) || !b.until("\">", marked) ||
          (marked != "true" && marked != "false") || !b.until(kParamClose, value))
        return false;
      args.emplace_back(key, value_json(call.name, key, value, marked == "true"));
    }
  } else {  // NAME<｜tool▁sep｜>{JSON arguments} (in a fenced ```json block in V3's older form)
    Reader b{body};
    std::string name;
    if (!b.until(kV3Sep, name)) return false;
    call.name = std::string(trim(name));
    std::string_view a = trim(body.substr(b.at));
    if (a.substr(0, 7) == "```json" && a.size() >= 10 && a.substr(a.size() - 3) == "```")
      a = trim(a.substr(7, a.size() - 10));
    const Json parsed = Json::parse(a, nullptr, /*allow_exceptions=*/false);
    if (call.name.empty() || !parsed.is_object()) return false;
    call.arguments = parsed.dump(-1, ' ', false, Json::error_handler_t::replace);
    return true;
  }
  call.arguments = arguments_object(args);
  return true;
}

}  // namespace dsi::server
