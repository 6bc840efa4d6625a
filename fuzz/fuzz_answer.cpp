// Fuzzes the readers of model output in chat answers: the reasoning splitter (server/reasoning.h)
// and the tool-call parser in each format (server/tool_calls.h). They take any text, never throw,
// and give the same result whatever pieces the text arrives in; text without their markers passes
// through unchanged; calls they return have a name and a JSON object of arguments. The first byte
// picks the format and whether the answer starts in a think block, the second where to cut.
// JSON mode's recognizer (server/constraints.h) takes the text byte by byte: what it accepts
// whole as a complete object nlohmann::json reads as an object (or refuses only for a number past a
// double), a refused byte leaves its state as it was, and the closing quote of a key that its
// object has already is refused, no other key's (nlohmann::json's SAX events say which key repeats
// one). The schema recognizer (server/json_schema.h) for {"type": "object"} takes the same bytes.
// The forced tool call's recognizer (server/tool_call_prefix.h): what it takes whole and complete,
// the parser reads back as calls of arguments the schema types, and no content; in auto mode with
// one call allowed, at most one call.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_util.h"
#include "server/constraints.h"
#include "server/reasoning.h"
#include "server/tool_call_prefix.h"
#include "server/tool_calls.h"

using dsi::server::ReasoningSplitter;
using dsi::server::ToolCallParser;
using dsi::server::ToolFormat;

namespace {

// Whether the last byte of a prefix of a JSON text closes a key (nlohmann::json's SAX events up to
// where the prefix ends have one key more than those before that byte), and whether that key
// repeats one of its object's keys before it.
struct KeyEvents : nlohmann::json_sax<nlohmann::json> {
  std::vector<std::vector<std::string>> open;
  size_t keys = 0;
  bool repeated = false;  // the last key
  bool key(string_t& k) override {
    if (open.empty()) return false;
    ++keys;
    repeated = std::find(open.back().begin(), open.back().end(), k) != open.back().end();
    open.back().push_back(k);
    return true;
  }
  bool start_object(std::size_t) override { return open.emplace_back(), true; }
  bool end_object() override { return open.empty() ? false : (open.pop_back(), true); }
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }
};

struct ClosedKey {
  bool key = false, repeated = false;
};

ClosedKey closed_key(std::string_view prefix) {
  if (prefix.empty()) return {};
  KeyEvents with, before;
  nlohmann::json::sax_parse(prefix.begin(), prefix.end(), &with, nlohmann::json::input_format_t::json, false);
  nlohmann::json::sax_parse(prefix.begin(), prefix.end() - 1, &before, nlohmann::json::input_format_t::json, false);
  const bool key = with.keys == before.keys + 1;
  return {key, key && with.repeated};
}

struct Reasoned {
  std::string reasoning, content;
};

Reasoned split(bool in_reasoning, std::string_view a, std::string_view b) {
  ReasoningSplitter s(in_reasoning);
  Reasoned r;
  for (std::string_view piece : {a, b}) {
    const ReasoningSplitter::Split x = s.push(piece);
    r.reasoning += x.reasoning;
    r.content += x.content;
  }
  const ReasoningSplitter::Split x = s.finish();
  r.reasoning += x.reasoning;
  r.content += x.content;
  return r;
}

ToolCallParser::Result calls(ToolFormat f, const nlohmann::ordered_json& tools, std::string_view a,
                             std::string_view b) {
  ToolCallParser p(f, tools);
  ToolCallParser::Result r;
  for (ToolCallParser::Result part : {p.push(a), p.push(b), p.finish()}) {
    r.content += part.content;
    for (auto& c : part.calls) r.calls.push_back(std::move(c));
  }
  return r;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const uint8_t mode = data[0];
  const std::string_view text(reinterpret_cast<const char*>(data + 2), size - 2);
  const size_t cut = text.empty() ? 0 : data[1] % (text.size() + 1);
  const std::string_view a = text.substr(0, cut), b = text.substr(cut);

  const bool in_reasoning = mode & 1;
  const Reasoned whole = split(in_reasoning, text, {}), pieces = split(in_reasoning, a, b);
  DSI_FUZZ_ASSERT(whole.reasoning == pieces.reasoning && whole.content == pieces.content);
  DSI_FUZZ_ASSERT(whole.reasoning.size() + whole.content.size() <= text.size());
  if (text.find(ReasoningSplitter::kClose) == std::string_view::npos &&
      text.find(ReasoningSplitter::kOpen) == std::string_view::npos)
    DSI_FUZZ_ASSERT((in_reasoning ? whole.reasoning : whole.content) == text);

  static const nlohmann::ordered_json tools = nlohmann::ordered_json::parse(
      R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
          "properties": {"s": {"type": "string"}, "n": {"type": "integer"}}}}}])");
  const ToolFormat formats[] = {ToolFormat::kNone, ToolFormat::kGlm, ToolFormat::kDsml, ToolFormat::kDeepSeekV3};
  const ToolFormat f = formats[(mode >> 1) % 4];
  const ToolCallParser::Result w = calls(f, tools, text, {}), p = calls(f, tools, a, b);
  DSI_FUZZ_ASSERT(w.content == p.content && w.calls.size() == p.calls.size());
  for (size_t i = 0; i < w.calls.size(); ++i) {
    DSI_FUZZ_ASSERT(w.calls[i].name == p.calls[i].name && w.calls[i].arguments == p.calls[i].arguments);
    DSI_FUZZ_ASSERT(!w.calls[i].name.empty());
    const auto args = nlohmann::ordered_json::parse(w.calls[i].arguments, nullptr, false);
    DSI_FUZZ_ASSERT(!args.is_discarded() && args.is_object());
  }
  if (f == ToolFormat::kNone || w.calls.empty())
    DSI_FUZZ_ASSERT(w.calls.empty() && w.content.size() <= text.size());
  if (f == ToolFormat::kNone) DSI_FUZZ_ASSERT(w.content == text);
  if (f != ToolFormat::kNone) {
    // The forced call's recognizer: a text it takes whole and calls complete is read back as calls
    // of `f` with arguments of the schema's types, and nothing else.
    // Bit 3 of the mode: tool_choice "auto" with parallel_tool_calls false instead (free text, at
    // most one call, its values taken as written): what it takes whole holds at most one call.
    const bool one_auto = mode & 8;
    static const auto grammars = [] {
      std::vector<std::shared_ptr<const dsi::server::ToolGrammar>> g;
      for (bool optional : {false, true})
        for (ToolFormat x : {ToolFormat::kGlm, ToolFormat::kDsml, ToolFormat::kDeepSeekV3})
          g.push_back(dsi::server::ToolGrammar::make(x, tools, "", !optional, optional));
      return g;
    }();
    dsi::server::ToolCallPrefix call(grammars[size_t(f) - 1 + (one_auto ? 3 : 0)]);
    size_t took = 0;
    while (took < text.size() && call.push(static_cast<unsigned char>(text[took]))) ++took;
    if (one_auto) {
      if (took == text.size() && call.complete()) DSI_FUZZ_ASSERT(w.calls.size() <= 1);
    } else if (took == text.size() && call.complete()) {
      DSI_FUZZ_ASSERT(!w.calls.empty() && w.content.empty());
      for (const dsi::server::ToolCall& c : w.calls) {
        DSI_FUZZ_ASSERT(c.name == "f");
        const auto args = nlohmann::ordered_json::parse(c.arguments);
        for (const auto& [key, value] : args.items())
          DSI_FUZZ_ASSERT(key == "s" ? value.is_string() : key == "n" ? value.is_number_integer() : true);
      }
    }
  }

  // JSON mode's recognizer, and the schema recognizer for {"type": "object"} with its whitespace
  // limit beside it: the same bytes taken, the same completeness after each. Each key at most once
  // in its object: a quote that closes a key repeating one is refused, and one taken closes none.
  static const auto any_object = dsi::server::JsonSchema::compile(nlohmann::json::parse(R"({"type":"object"})"));
  dsi::server::JsonPrefix json;
  dsi::server::SchemaPrefix schema(any_object, dsi::server::JsonPrefix::kMaxSpaceRun);
  size_t taken = 0;
  for (char c : text) {
    const dsi::server::JsonPrefix before = json;
    const bool took = json.push(static_cast<unsigned char>(c));
    DSI_FUZZ_ASSERT(took == schema.push(static_cast<unsigned char>(c)));
    if (c == '"') {
      const ClosedKey k = closed_key(text.substr(0, taken + 1));
      if (k.key) DSI_FUZZ_ASSERT(took == !k.repeated);
    }
    if (!took) {
      DSI_FUZZ_ASSERT(json.complete() == before.complete());
      break;
    }
    DSI_FUZZ_ASSERT(schema.complete() == json.complete());
    ++taken;
  }
  if (taken == text.size() && json.complete()) {
    // JSON's grammar has numbers of any size; nlohmann::json refuses those past a double (its
    // out_of_range error), and that is the only refusal allowed here.
    bool object = false, too_large = false;
    try {
      object = nlohmann::ordered_json::parse(text).is_object();
    } catch (const nlohmann::ordered_json::out_of_range&) {
      too_large = true;
    } catch (const nlohmann::ordered_json::exception&) {
    }
    DSI_FUZZ_ASSERT(object || too_large);
  }
  return 0;
}
