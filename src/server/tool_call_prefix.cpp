// Tool calls written whole; see tool_call_prefix.h.
#include "server/tool_call_prefix.h"

#include <algorithm>
#include <cstdio>

#include "dsinfer/error.h"
#include "server/json_scan.h"
#include "text/utf8.h"

namespace dsi::server {

namespace {

using namespace tool_markers;

bool is_space(unsigned char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

bool starts_with(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

// The text of plain text inside a JSON string: quote, backslash and control characters escaped.
std::string escaped(std::string_view raw) {
  std::string out;
  for (char ch : raw) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20) {
      char u[8];
      std::snprintf(u, sizeof(u), "\\u%04x", unsigned(c));
      out += u;
    } else {
      out += ch;
    }
  }
  return out;
}

bool is_strict(const nlohmann::ordered_json& function) {
  return function.contains("strict") && function["strict"] == true;
}

std::string_view answer_open(ToolFormat f) {
  return f == ToolFormat::kGlm ? kGlmOpen : f == ToolFormat::kDsml ? kDsmlOpen : kV3Open;
}
// free_call_text: no opening marker completes without its last byte.
static_assert(kGlmOpen.back() == '>' && kDsmlOpen.back() == '>' && kV3Open.back() == '>');

}  // namespace

bool ToolGrammar::any_strict(const nlohmann::ordered_json& tools) {
  if (!tools.is_array()) return false;
  for (const nlohmann::ordered_json& t : tools)
    if (const nlohmann::ordered_json* f = tool_function(t); f != nullptr && is_strict(*f)) return true;
  return false;
}

std::shared_ptr<const ToolGrammar> ToolGrammar::make(ToolFormat format, const nlohmann::ordered_json& tools,
                                                     const std::string& only, bool many, bool optional) {
  DSI_CHECK(format != ToolFormat::kNone, "a tool call grammar needs a tool call format");
  auto g = std::make_shared<ToolGrammar>();
  g->format = format;
  g->many = many;
  g->optional = optional;
  if (tools.is_array())
    for (const nlohmann::ordered_json& t : tools) {
      const nlohmann::ordered_json* f = tool_function(t);
      if (f == nullptr) continue;
      Function fn;
      fn.name = (*f)["name"].get<std::string>();
      if ((!only.empty() && fn.name != only) || fn.name.empty()) continue;
      // A name with the markers' characters or spaces cannot be told from what follows it.
      DSI_CHECK(fn.name.find_first_of("<>\" \t\r\n") == std::string::npos,
                "tool '{}': a name with spaces, quotes or angle brackets cannot be held in a call",
                utf8::shown(fn.name));
      const nlohmann::ordered_json* params = parameters_of(*f);
      const bool held = !optional || is_strict(*f);  // auto: only strict functions' arguments
      const nlohmann::json schema = params != nullptr && held ? nlohmann::json::parse(params->dump())
                                                              : nlohmann::json({{"type", "object"}});
      fn.held = held;
      try {
        // An object schema with properties takes no other keys (OpenAI's strict functions require
        // this, and xgrammar's strict mode reads schemas so): else a model could write keys without end.
        fn.parameters = JsonSchema::compile(schema, /*closed_objects=*/held);
      } catch (const Error& e) {
        throw Error(fmt::format("tool '{}': its parameters cannot hold a call: {}", utf8::shown(fn.name), e.what()));
      }
      if (params != nullptr) fn.string_keys = string_parameters(*params);
      g->functions.push_back(std::move(fn));
    }
  DSI_CHECK(!g->functions.empty(), "a tool call needs a function among the tools{}",
            only.empty() ? std::string() : " named '" + utf8::shown(only) + "'");
  return g;
}

ToolCallPrefix::ToolCallPrefix(std::shared_ptr<const ToolGrammar> grammar) : g_(std::move(grammar)) {
  if (g_->optional) at_ = At::kFree;
  else enter_literal(answer_open(g_->format), Then::kCallOpen);
}

bool ToolCallPrefix::free_step(unsigned char c) {
  const std::string_view open = answer_open(g_->format);
  tail_ += char(c);
  if (tail_.ends_with(open)) {  // a call opens: held from here on
    tail_.clear();
    return reached(Then::kCallOpen);
  }
  size_t s = 0;
  while (s < tail_.size() && !starts_with(open, std::string_view(tail_).substr(s))) ++s;
  tail_.erase(0, s);
  return true;
}

void ToolCallPrefix::enter_choice(std::vector<Alt> alts, bool space) {
  at_ = At::kChoice;
  alts_ = std::move(alts);
  got_.clear();
  space_ok_ = space;
  space_run_ = 0;
  may_end_ = false;
}

void ToolCallPrefix::enter_literal(std::string_view text, Then then, size_t written) {
  at_ = At::kLiteral;
  lit_ = text;
  then_ = then;
  got_.assign(text.substr(0, written));
}

void ToolCallPrefix::enter_raw(std::string_view end, bool key) {
  at_ = At::kRaw;
  raw_end_ = end;
  raw_key_ = key;
  held_.clear();
  key_.clear();
  tail_.clear();
}

void ToolCallPrefix::enter_json(std::string_view end) {
  at_ = At::kJson;
  json_end_ = end;
  jdepth_ = 0;
  jstr_ = jesc_ = jstarted_ = false;
  tail_.clear();
}

void ToolCallPrefix::after_value() {
  const bool glm = g_->format == ToolFormat::kGlm;
  std::vector<Alt> alts;
  SchemaPrefix more = *json_;  // another key can come
  if ((first_key_ || more.push(',')) && more.push('"')) alts.push_back({glm ? kKeyOpen : kParamOpen, Then::kKey});
  SchemaPrefix end = *json_;  // the object can close
  if (end.push('}')) alts.push_back({glm ? kGlmClose : kInvokeClose, Then::kCallEnd});
  enter_choice(std::move(alts), true);
}

bool ToolCallPrefix::reached(Then then) {
  const ToolFormat f = g_->format;
  switch (then) {
    case Then::kCallOpen:
      if (f == ToolFormat::kGlm) return reached(Then::kName);
      enter_choice({{f == ToolFormat::kDsml ? kInvokeOpen : kV3CallOpen, Then::kName}}, true);
      return true;
    case Then::kName: {
      std::vector<Alt> alts;
      for (const ToolGrammar::Function& fn : g_->functions) alts.push_back({fn.name, Then::kNamed});
      enter_choice(std::move(alts), false);
      return true;
    }
    case Then::kNamed: {
      function_ = -1;
      for (size_t i = 0; i < g_->functions.size(); ++i)
        if (g_->functions[i].name == got_) function_ = int32_t(i);
      if (function_ < 0) return false;
      json_.emplace(g_->functions[size_t(function_)].parameters);
      first_key_ = true;
      if (f == ToolFormat::kDeepSeekV3) {
        enter_literal(kV3Sep, Then::kSep);
        return true;
      }
      if (f == ToolFormat::kDsml) {
        enter_literal("\">", Then::kSep);
        return true;
      }
      return reached(Then::kSep);
    }
    case Then::kSep:
      if (f == ToolFormat::kDeepSeekV3) {  // the arguments object, as JSON
        enter_json(kV3CallClose);
        return true;
      }
      if (!json_->push('{')) return false;
      after_value();
      return true;
    case Then::kKey:
      if (!first_key_ && !json_->push(',')) return false;
      if (!json_->push('"')) return false;
      first_key_ = false;
      enter_raw(f == ToolFormat::kGlm ? kKeyClose : kStringAttr, true);
      return true;
    case Then::kValue:
      if (string_value_) {
        if (!json_->push('"')) return false;
        enter_raw(f == ToolFormat::kGlm ? kValueClose : kParamClose, false);
      } else {
        enter_json(f == ToolFormat::kGlm ? kValueClose : kParamClose);
      }
      return true;
    case Then::kAfterValue:
      after_value();
      return true;
    case Then::kCallEnd: {
      if (f != ToolFormat::kDeepSeekV3 && !json_->push('}')) return false;
      if (!json_->complete()) return false;
      json_.reset();
      function_ = -1;
      // Auto mode: free text again. With one call allowed, not so: free text could open a second;
      // the end comes instead, as after a forced call (the choice below is then empty).
      if (g_->optional && g_->many && f == ToolFormat::kGlm) {
        at_ = At::kFree;
        tail_.clear();
        return true;
      }
      std::vector<Alt> alts;
      const std::string_view open = f == ToolFormat::kGlm    ? kGlmOpen
                                    : f == ToolFormat::kDsml ? kInvokeOpen
                                                             : kV3CallOpen;
      if (g_->many) alts.push_back({open, Then::kName});
      if (f != ToolFormat::kGlm) alts.push_back({f == ToolFormat::kDsml ? kDsmlClose : kV3Close, Then::kBlockEnd});
      if (alts.empty()) {
        at_ = At::kEnd;
        space_run_ = 0;
      } else {
        enter_choice(std::move(alts), true);
        may_end_ = f == ToolFormat::kGlm;  // (dsml, v3: the block closes first)
      }
      return true;
    }
    case Then::kBlockEnd:
      // Auto mode: free text again, unless one call is allowed (the block held it; free text
      // could open another block): then the end.
      at_ = g_->optional && g_->many ? At::kFree : At::kEnd;
      space_run_ = 0;
      tail_.clear();
      return true;
  }
  return false;
}

bool ToolCallPrefix::choice_step(unsigned char c) {
  if (got_.empty() && space_ok_ && is_space(c)) {
    if (space_run_ >= kMaxSpaceRun) return false;
    ++space_run_;
    return true;
  }
  std::string g = got_;
  g += char(c);
  const Alt* whole = nullptr;  // an alternative `g` completes
  bool longer = false;         // an alternative `g` begins and does not complete
  for (const Alt& a : alts_) {
    if (!starts_with(a.text, g)) continue;
    if (a.text.size() == g.size()) whole = &a;
    else longer = true;
  }
  if (whole != nullptr && !longer) {  // written: on to what it leads to
    got_ = std::move(g);
    return reached(whole->then);
  }
  if (whole != nullptr || longer) {
    got_ = std::move(g);
    return true;
  }
  // c continues no alternative: what is written must be one whole (a name that is the start of
  // another's), and c is the first byte of what follows it.
  for (const Alt& a : alts_)
    if (!got_.empty() && a.text == got_) return reached(a.then) && step(c);
  return false;
}

bool ToolCallPrefix::raw_may_close(const SchemaPrefix& json) const {
  SchemaPrefix next = json;
  return next.push('"') && (!raw_key_ || next.push(':'));
}

bool ToolCallPrefix::raw_closed() {
  if (!json_->push('"') || (raw_key_ && !json_->push(':'))) return false;
  held_.clear();
  if (!raw_key_) {
    after_value();
    return true;
  }
  const ToolGrammar::Function& fn = g_->functions[size_t(function_)];
  // A function not held takes every value as text, which the parser reads as JSON where it is JSON,
  // else as a string: held to JSON, a value the model writes bare (an enum of strings without
  // "type") would be bent into something else.
  string_value_ = !fn.held || std::find(fn.string_keys.begin(), fn.string_keys.end(), key_) != fn.string_keys.end();
  if (g_->format == ToolFormat::kGlm) enter_choice({{kValueOpen, Then::kValue}}, true);
  else if (!fn.held) enter_choice({{"true\">", Then::kValue}, {"false\">", Then::kValue}}, false);
  else enter_literal(string_value_ ? std::string_view("true\">") : std::string_view("false\">"), Then::kValue);
  return true;
}

bool ToolCallPrefix::body_text(std::string_view bytes) {
  const ToolFormat f = g_->format;
  const std::string_view call_end = f == ToolFormat::kGlm ? kGlmClose : f == ToolFormat::kDsml ? kInvokeClose : kV3CallClose;
  const std::string_view value_end = at_ == At::kJson ? json_end_ : call_end;
  for (char c : bytes) {
    tail_ += c;
    if (tail_.ends_with(call_end) || tail_.ends_with(value_end)) return false;
    // Keep the longest end that begins one of them (usually nothing: both begin with '<').
    size_t s = 0;
    while (s < tail_.size() && !starts_with(call_end, std::string_view(tail_).substr(s)) &&
           !starts_with(value_end, std::string_view(tail_).substr(s)))
      ++s;
    tail_.erase(0, s);
  }
  return true;
}

bool ToolCallPrefix::raw_step(unsigned char c) {
  std::string h = held_;
  h += char(c);
  if (starts_with(raw_end_, h)) {
    if (h.size() == raw_end_.size()) return raw_closed();
    // The closing marker may be starting: the text must be able to end here, or go on with these bytes.
    SchemaPrefix as_text = *json_;
    if (!raw_may_close(*json_) && !as_text.advance(escaped(h))) return false;
    held_ = std::move(h);
    return true;
  }
  // Not the marker: the bytes held are text, less any end of them that may begin the marker again.
  size_t s = 1;
  while (s < h.size() && !starts_with(raw_end_, std::string_view(h).substr(s))) ++s;
  const std::string text = h.substr(0, s), rest = h.substr(s);
  SchemaPrefix next = *json_;
  if (!next.advance(escaped(text))) return false;
  if (!rest.empty()) {
    SchemaPrefix as_text = next;
    if (!raw_may_close(next) && !as_text.advance(escaped(rest))) return false;
  }
  if (!body_text(text)) return false;
  *json_ = std::move(next);
  if (raw_key_) key_ += text;
  held_ = rest;
  return true;
}

bool ToolCallPrefix::json_step(unsigned char c) {
  if (!jstr_ && jdepth_ == 0 && c == static_cast<unsigned char>(json_end_[0])) {
    // The closing marker begins ('<' is no JSON outside strings): the value must be whole.
    bool whole = false;
    if (g_->format == ToolFormat::kDeepSeekV3) {
      whole = json_->complete();
    } else {
      SchemaPrefix more = *json_, end = *json_;
      whole = jstarted_ && (more.push(',') || end.push('}'));
    }
    if (!whole) return false;
    enter_literal(json_end_, g_->format == ToolFormat::kDeepSeekV3 ? Then::kCallEnd : Then::kAfterValue, 1);
    return true;
  }
  // The value's own end: nothing after it closes the arguments object or goes on to another key.
  if (!jstr_ && jdepth_ == 0 && (c == ',' || c == '}' || c == ']')) return false;
  if (!json_->push(c) || !body_text(std::string_view(reinterpret_cast<const char*>(&c), 1))) return false;
  if (jstr_) {
    if (jesc_) jesc_ = false;
    else if (c == '\\') jesc_ = true;
    else if (c == '"') jstr_ = false;
  } else if (c == '"') {
    jstr_ = true;
  } else if (c == '{' || c == '[') {
    ++jdepth_;
  } else if (c == '}' || c == ']') {
    --jdepth_;
  }
  if (!is_space(c)) jstarted_ = true;
  return true;
}

bool ToolCallPrefix::step(unsigned char c) {
  switch (at_) {
    case At::kFree:
      return free_step(c);
    case At::kChoice:
      return choice_step(c);
    case At::kLiteral: {
      if (got_.size() >= lit_.size() || static_cast<unsigned char>(lit_[got_.size()]) != c) return false;
      got_ += char(c);
      return got_.size() < lit_.size() || reached(then_);
    }
    case At::kRaw:
      return raw_step(c);
    case At::kJson:
      return json_step(c);
    case At::kEnd:
      if (!is_space(c) || space_run_ >= kMaxSpaceRun) return false;
      ++space_run_;
      return true;
  }
  return false;
}

bool raw_call_text(std::string_view bytes) {
  Utf8Scan utf8;
  for (char c : bytes)
    if (c == '<' || utf8.step(static_cast<unsigned char>(c)) == Utf8Scan::Step::kReject) return false;
  return utf8.at_rest();
}

bool free_call_text(std::string_view bytes) { return bytes.find('>') == std::string_view::npos; }

bool ToolCallPrefix::takes_raw_text() const {
  return at_ == At::kRaw && !raw_key_ && held_.empty() && tail_.empty() && json_->takes_string_text();
}

bool ToolCallPrefix::takes_special(std::string_view bytes) const {
  const std::span<const std::string_view> markers = format_markers(g_->format);
  return std::find(markers.begin(), markers.end(), bytes) != markers.end();
}

bool ToolCallPrefix::push(unsigned char c) {
  ToolCallPrefix next = *this;
  if (!next.step(c)) return false;
  *this = std::move(next);
  return true;
}

bool ToolCallPrefix::push(std::string_view bytes) {
  ToolCallPrefix next = *this;
  if (!next.advance(bytes)) return false;
  *this = std::move(next);
  return true;
}

bool ToolCallPrefix::advance(std::string_view bytes) {
  for (char c : bytes)
    if (!step(static_cast<unsigned char>(c))) return false;
  return true;
}

bool ToolCallPrefix::complete() const {
  return at_ == At::kFree || at_ == At::kEnd || (at_ == At::kChoice && may_end_ && got_.empty());
}

std::string ToolCallPrefix::signature(size_t max_bytes) const {
  std::string k;
  auto num = [&k](uint64_t v) { k.append(reinterpret_cast<const char*>(&v), sizeof(v)); };
  auto text = [&](std::string_view s) {
    num(s.size());
    k += s;
  };
  num(uint64_t(at_));
  num(uint64_t(function_ + 1));
  num(uint64_t(complete()));
  switch (at_) {
    case At::kFree:
      text(tail_);
      break;
    case At::kChoice:
      num(alts_.size());
      for (const Alt& a : alts_) {
        text(a.text);
        num(uint64_t(a.then));
      }
      text(got_);
      num(uint64_t(may_end_) << 9 | uint64_t(space_ok_) << 8 | space_run_);
      break;
    case At::kLiteral:
      text(lit_);
      num(got_.size());
      num(uint64_t(then_));
      break;
    case At::kRaw:
      text(raw_end_);
      text(held_);
      text(tail_);
      num(uint64_t(raw_key_));
      if (raw_key_) text(key_);
      break;
    case At::kJson:
      text(json_end_);
      text(tail_);
      num(uint64_t(uint32_t(jdepth_)) << 8 | uint64_t(jstr_) << 2 | uint64_t(jesc_) << 1 | uint64_t(jstarted_));
      break;
    case At::kEnd:
      num(space_run_);
      break;
  }
  num(uint64_t(first_key_) << 1 | uint64_t(string_value_));
  if (json_) k += json_->signature(max_bytes);
  return k;
}

}  // namespace dsi::server
