// Request parsing and validation for /v1/completions and /v1/chat/completions.
#include "server/task.h"

#include "dsinfer/error.h"

#include <cmath>
#include <cstdint>
#include <fmt/format.h>
#include <limits>

namespace dsi::server {

using Json = nlohmann::ordered_json;

Json error_json(const ApiError& e) {
  Json err = Json::object();
  err["message"] = e.message;
  err["type"] = e.type;
  err["param"] = e.param.empty() ? Json(nullptr) : Json(e.param);
  err["code"] = e.code.empty() ? Json(nullptr) : Json(e.code);
  return Json{{"error", std::move(err)}};
}

namespace {

// Thrown inside the parser only; parse_* turn it into the result.
struct Bad {
  ApiError error;
};

[[noreturn]] void bad(const std::string& param, const std::string& message,
                      const std::string& code = "") {
  throw Bad{ApiError{400, message, "invalid_request_error", param, code}};
}

// A client's string quoted in a one-line message: control characters escaped, at most 80 bytes.
std::string client_text(const std::string& s) {
  std::string out;
  for (unsigned char c : s.substr(0, 80)) {
    if (c < 0x20 || c == 0x7f) out += fmt::format("\\x{:02x}", c);
    else out += char(c);
  }
  return out + (s.size() > 80 ? "..." : "");
}

[[noreturn]] void unsupported(const std::string& param, const std::string& message) {
  bad(param, message + " is not supported by this server", "unsupported");
}

const char* type_name(const Json& v) {
  switch (v.type()) {
    case Json::value_t::null: return "null";
    case Json::value_t::boolean: return "a boolean";
    case Json::value_t::string: return "a string";
    case Json::value_t::array: return "an array";
    case Json::value_t::object: return "an object";
    case Json::value_t::number_float: return "a number";
    default: return "an integer";
  }
}

const Json* field(const Json& body, const char* name) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

bool get_bool(const Json& body, const char* name, bool def) {
  const Json* v = field(body, name);
  if (!v) return def;
  if (!v->is_boolean()) bad(name, fmt::format("'{}' must be a boolean, got {}", name, type_name(*v)));
  return v->get<bool>();
}

int64_t as_int(const Json& v, const std::string& name) {
  if (v.is_number_integer() || v.is_number_unsigned()) {
    if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
      bad(name, fmt::format("'{}' is out of range", name));
    return v.get<int64_t>();
  }
  // 16.0 is accepted as 16, as Python's JSON-loading servers do; 16.5 is not.
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9e15) return int64_t(d);
  }
  bad(name, fmt::format("'{}' must be an integer, got {}", name, type_name(v)));
}

std::optional<int64_t> get_int(const Json& body, const char* name) {
  const Json* v = field(body, name);
  if (!v) return std::nullopt;
  return as_int(*v, name);
}

std::optional<double> get_number(const Json& body, const char* name) {
  const Json* v = field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_number())
    bad(name, fmt::format("'{}' must be a number, got {}", name, type_name(*v)));
  return v->get<double>();
}

std::vector<int32_t> as_ids(const Json& v, const std::string& name) {
  std::vector<int32_t> ids;
  for (const Json& x : v) {
    const int64_t id = as_int(x, name);
    if (id < 0 || id > std::numeric_limits<int32_t>::max())
      bad(name, fmt::format("'{}' holds {}, which is not a token id", name, id));
    ids.push_back(int32_t(id));
  }
  return ids;
}

Json parse_body(std::string_view body) {
  Json j;
  try {
    j = Json::parse(body);
  } catch (const std::exception& e) {
    bad("", fmt::format("the request body is not valid JSON: {}", e.what()));
  }
  if (!j.is_object()) bad("", fmt::format("the request body must be a JSON object, got {}", type_name(j)));
  return j;
}

std::string get_model(const Json& j) {
  const Json* m = field(j, "model");
  if (!m) return {};
  if (!m->is_string()) bad("model", fmt::format("'model' must be a string, got {}", type_name(*m)));
  return m->get<std::string>();
}

// vLLM's structured outputs: "structured_outputs": {"json" | "regex" | "choice" | "json_object"},
// and the older top-level "guided_json" / "guided_regex" / "guided_choice". One constraint a
// request, beside no JSON response_format. A regular expression must match the whole answer.
void parse_structured_outputs(const Json& j, ParsedRequest& r) {
  std::vector<std::pair<std::string, const Json*>> given;  // (the field as the request names it, value)
  if (const Json* so = field(j, "structured_outputs")) {
    if (!so->is_object()) bad("structured_outputs", "'structured_outputs' must be an object");
    for (auto it = so->begin(); it != so->end(); ++it) {
      const std::string& k = it.key();
      if (k == "json" || k == "regex" || k == "choice" || k == "json_object") {
        if (!it.value().is_null()) given.emplace_back("structured_outputs." + k, &it.value());
      } else if (k != "disable_fallback" && k != "disable_any_whitespace") {  // hints that change nothing here
        unsupported("structured_outputs", fmt::format("'structured_outputs.{}'", client_text(k)));
      }
    }
  }
  for (const char* k : {"guided_json", "guided_regex", "guided_choice"})
    if (const Json* v = field(j, k); v != nullptr && !v->is_null()) given.emplace_back(k, v);
  for (const char* k : {"guided_grammar", "guided_whitespace_pattern"})
    if (const Json* v = field(j, k); v != nullptr && !v->is_null()) unsupported(k, fmt::format("'{}'", k));
  if (given.empty()) return;
  const std::string& name = given[0].first;
  const std::string param = name.rfind("structured_outputs", 0) == 0 ? "structured_outputs" : name;
  if (given.size() > 1)
    bad(param, fmt::format("'{}' and '{}': one structured output at a time", name, given[1].first));
  if (r.json_object || r.json_schema)
    bad(param, fmt::format("'{}' beside a JSON 'response_format': one structured output at a time", name));
  const Json& v = *given[0].second;
  const std::string kind = name.rfind("guided_", 0) == 0 ? name.substr(7) : name.substr(name.find('.') + 1);
  try {
    if (kind == "json") {
      if (!v.is_object() && !v.is_boolean() && !v.is_string())
        bad(param, fmt::format("'{}' must be a JSON schema (an object, or its text)", name));
      const Json schema = v.is_string() ? Json::parse(v.get<std::string>(), nullptr, false) : v;
      if (schema.is_discarded()) bad(param, fmt::format("'{}' is not valid JSON", name));
      r.json_schema = JsonSchema::compile(nlohmann::json::parse(schema.dump()));
    } else if (kind == "regex") {
      if (!v.is_string()) bad(param, fmt::format("'{}' must be a string", name));
      r.text_pattern = JsonPattern::compile(v.get<std::string>(), "'" + name + "'", JsonPattern::Match::kWhole);
    } else if (kind == "choice") {
      if (!v.is_array() || v.empty()) bad(param, fmt::format("'{}' must be a non-empty array of strings", name));
      std::vector<std::string> texts;
      for (const Json& x : v) {
        if (!x.is_string()) bad(param, fmt::format("'{}' must be a non-empty array of strings", name));
        texts.push_back(x.get<std::string>());
      }
      r.text_pattern = JsonPattern::any_of(texts, "'" + name + "'");
    } else if (v != Json(false)) {  // json_object
      if (!v.is_boolean()) bad(param, fmt::format("'{}' must be a boolean", name));
      r.json_object = true;
    }
  } catch (const dsi::Error& e) {
    bad(param, kind == "json" ? fmt::format("'{}' {}", name, e.what()) : std::string(e.what()));
  }
}

// The parameters /v1/completions and /v1/chat/completions share.
void parse_common(const Json& j, ParsedRequest& r) {
  r.model = get_model(j);
  if (auto n = get_int(j, "n")) {
    if (*n < 1 || *n > kMaxChoices)
      bad("n", fmt::format("'n' must be in [1, {}], got {}", kMaxChoices, *n));
    r.n = int(*n);
  }
  if (auto b = get_int(j, "best_of"); b && *b != r.n)
    unsupported("best_of", "best_of other than n (ranking choices by likelihood)");
  for (const auto& [name, value] : {std::pair{"presence_penalty", &r.presence_penalty},
                                     std::pair{"frequency_penalty", &r.frequency_penalty}}) {
    if (const auto v = get_number(j, name)) {
      if (!(*v >= -2.0 && *v <= 2.0)) bad(name, fmt::format("'{}' must be in [-2, 2], got {}", name, *v));
      *value = float(*v);
    }
  }
  if (const auto v = get_number(j, "repetition_penalty")) {  // vLLM's extension
    if (!(*v > 0.0 && *v <= 10.0))
      bad("repetition_penalty", fmt::format("'repetition_penalty' must be in (0, 10], got {}", *v));
    r.repetition_penalty = float(*v);
  }
  if (const Json* lb = field(j, "logit_bias")) {  // {"token id": bias in [-100, 100]}
    if (!lb->is_object()) bad("logit_bias", "'logit_bias' must be an object");
    for (const auto& [key, value] : lb->items()) {
      size_t end = 0;
      long long id = -1;
      try {
        id = std::stoll(key, &end);
      } catch (const std::exception&) {
        end = 0;
      }
      if (end == 0 || end != key.size() || id < 0 || id > INT32_MAX)
        bad("logit_bias", fmt::format("'logit_bias' keys must be token ids, got '{}'", key));
      if (!value.is_number()) bad("logit_bias", fmt::format("'logit_bias.{}' must be a number", key));
      const double b = value.get<double>();
      if (!(b >= -100.0 && b <= 100.0))
        bad("logit_bias", fmt::format("'logit_bias.{}' must be in [-100, 100], got {}", key, b));
      r.logit_bias.emplace_back(int32_t(id), float(b));
    }
  }
  if (const auto t = get_number(j, "temperature")) {
    if (!(*t >= 0.0 && *t <= 2.0))
      bad("temperature", fmt::format("'temperature' must be in [0, 2], got {}", *t));
    r.temperature = float(*t);
  }
  if (const auto p = get_number(j, "top_p")) {
    if (!(*p > 0.0 && *p <= 1.0)) bad("top_p", fmt::format("'top_p' must be in (0, 1], got {}", *p));
    r.top_p = float(*p);
  }
  if (auto k = get_int(j, "top_k")) {  // vLLM's extension: -1 (or 0) keeps every token
    if (*k < -1 || *k > int64_t(1) << 30) bad("top_k", fmt::format("'top_k' must be -1, 0 or positive, got {}", *k));
    r.top_k = *k < 0 ? 0 : int(*k);
  }
  if (const auto m = get_number(j, "min_p")) {  // vLLM's extension
    if (!(*m >= 0.0 && *m <= 1.0)) bad("min_p", fmt::format("'min_p' must be in [0, 1], got {}", *m));
    r.min_p = float(*m);
  }
  if (const Json* s = field(j, "seed")) r.seed = uint64_t(as_int(*s, "seed"));
  r.ignore_eos = get_bool(j, "ignore_eos", false);
  r.skip_special_tokens = get_bool(j, "skip_special_tokens", true);

  if (const Json* s = field(j, "stop")) {
    if (s->is_string()) {
      r.stop.push_back(s->get<std::string>());
    } else if (s->is_array()) {
      for (const Json& x : *s) {
        if (!x.is_string()) bad("stop", "'stop' must be a string or an array of strings");
        r.stop.push_back(x.get<std::string>());
      }
    } else {
      bad("stop", fmt::format("'stop' must be a string or an array of strings, got {}", type_name(*s)));
    }
    if (r.stop.size() > 16) bad("stop", fmt::format("'stop' has {} strings; at most 16", r.stop.size()));
    for (const auto& x : r.stop)
      if (x.empty()) bad("stop", "'stop' strings must not be empty");
  }
  if (const Json* s = field(j, "stop_token_ids")) {
    if (!s->is_array()) bad("stop_token_ids", "'stop_token_ids' must be an array of token ids");
    r.stop_token_ids = as_ids(*s, "stop_token_ids");
  }

  r.stream = get_bool(j, "stream", false);
  if (const Json* so = field(j, "stream_options")) {
    if (!so->is_object())
      bad("stream_options", fmt::format("'stream_options' must be an object, got {}", type_name(*so)));
    if (!r.stream) bad("stream_options", "'stream_options' is only allowed when 'stream' is true");
    r.include_usage = get_bool(*so, "include_usage", false);
  }
  if (const Json* rf = field(j, "response_format")) {
    if (!rf->is_object()) bad("response_format", "'response_format' must be an object");
    const Json type = rf->value("type", Json("text"));
    if (type == Json("json_object")) {
      r.json_object = true;
    } else if (type == Json("json_schema")) {
      // OpenAI's structured outputs: {"name", "schema", "strict", "description"}; no schema: any
      // JSON value. A schema the server cannot enforce is refused (server/json_schema.h).
      const Json* js = field(*rf, "json_schema");
      if (js == nullptr || !js->is_object())
        bad("response_format", "'response_format' of type json_schema needs a 'json_schema' object");
      if (const Json* name = field(*js, "name"); name != nullptr && !name->is_string())
        bad("response_format", "'json_schema.name' must be a string");
      const Json* schema = field(*js, "schema");
      try {
        r.json_schema = JsonSchema::compile(nlohmann::json::parse(schema != nullptr ? schema->dump() : "true"));
      } catch (const dsi::Error& e) {
        bad("response_format", fmt::format("'json_schema.schema' {}", e.what()));
      }
    } else if (type != Json("text")) {
      unsupported("response_format", "a response_format other than text, json_object or json_schema");
    }
  }
  parse_structured_outputs(j, r);
}

void parse_max_tokens(const Json& j, const char* name, ParsedRequest& r) {
  const auto m = get_int(j, name);
  if (!m) return;
  if (*m < 1) bad(name, fmt::format("'{}' must be at least 1, got {}", name, *m));
  if (*m > std::numeric_limits<int32_t>::max())
    bad(name, fmt::format("'{}' is too large: {}", name, *m));
  r.max_tokens = *m;
}

// Message content: a string, or an array of {"type": "text", "text": ...} parts (joined).
void check_message(Json& m, size_t i) {
  const std::string where = fmt::format("messages[{}]", i);
  if (!m.is_object()) bad("messages", fmt::format("'{}' must be an object, got {}", where, type_name(m)));
  const Json* role = field(m, "role");
  if (!role || !role->is_string())
    bad("messages", fmt::format("'{}' needs a string 'role'", where));
  auto c = m.find("content");
  if (c == m.end() || c->is_null()) {
    const bool may_omit = role->get<std::string>() == "assistant" && m.contains("tool_calls");
    if (!may_omit) bad("messages", fmt::format("'{}' needs a 'content'", where));
    return;
  }
  if (c->is_string()) return;
  if (!c->is_array())
    bad("messages", fmt::format("'{}.content' must be a string or an array of parts, got {}", where,
                                type_name(*c)));
  std::string text;
  for (const Json& part : *c) {
    if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
        !part["text"].is_string())
      unsupported("messages", fmt::format("'{}.content': a part that is not {{\"type\": \"text\", "
                                          "\"text\": string}}", where));
    text += part["text"].get<std::string>();
  }
  *c = text;
}

// What the chat template renders: `messages` (required, checked), `tools` and
// `chat_template_kwargs` (optional).
void parse_chat_input(const Json& j, Json& messages, Json& tools, Json& kwargs) {
  const Json* m = field(j, "messages");
  if (!m) bad("messages", "'messages' is required");
  if (!m->is_array()) bad("messages", fmt::format("'messages' must be an array, got {}", type_name(*m)));
  if (m->empty()) bad("messages", "'messages' is empty");
  messages = *m;
  for (size_t i = 0; i < messages.size(); ++i) check_message(messages[i], i);
  if (const Json* t = field(j, "tools")) {
    if (!t->is_array()) bad("tools", fmt::format("'tools' must be an array, got {}", type_name(*t)));
    if (!t->empty()) tools = *t;
  }
  if (const Json* k = field(j, "chat_template_kwargs")) {
    if (!k->is_object())
      bad("chat_template_kwargs", fmt::format("'chat_template_kwargs' must be an object, got {}", type_name(*k)));
    kwargs = *k;
  }
}

template <typename F>
auto guarded(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const Bad& b) {
    return b.error;
  } catch (const std::exception& e) {
    return ApiError{400, std::string("bad request: ") + e.what()};
  } catch (...) {
    return ApiError{400, "bad request"};
  }
}

}  // namespace

ParseResult parse_completion_request(std::string_view body) {
  return guarded([&]() -> ParseResult {
    const Json j = parse_body(body);
    ParsedRequest r;
    r.endpoint = Endpoint::kCompletions;
    parse_common(j, r);
    const Json* p = field(j, "prompt");
    if (!p) bad("prompt", "'prompt' is required");
    // A string, an array of ids, or a batch (an array) of either.
    const bool batch = p->is_array() && !p->empty() && (p->front().is_string() || p->front().is_array());
    const size_t count = batch ? p->size() : 1;
    if (count > size_t(kMaxBatchPrompts))
      bad("prompt", fmt::format("a batch of {} prompts; at most {}", count, kMaxBatchPrompts));
    for (size_t i = 0; i < count; ++i) {
      const Json& one = batch ? (*p)[i] : *p;
      const std::string which = batch ? fmt::format("'prompt[{}]'", i) : std::string("'prompt'");
      CompletionPrompt cp;
      if (one.is_string()) {
        cp.text = one.get<std::string>();
      } else if (one.is_array()) {
        cp.ids = as_ids(one, "prompt");
        cp.is_ids = true;
      } else {
        bad("prompt", fmt::format("{} must be a string or an array of token ids, got {}", which, type_name(one)));
      }
      if (cp.is_ids ? cp.ids.empty() : cp.text.empty()) bad("prompt", fmt::format("{} is empty", which));
      r.prompts.push_back(std::move(cp));
    }
    parse_max_tokens(j, "max_tokens", r);
    r.echo = get_bool(j, "echo", false);
    if (const Json* s = field(j, "suffix"))
      if (!s->is_string() || !s->get<std::string>().empty()) unsupported("suffix", "suffix");
    if (const auto lp = get_int(j, "logprobs")) {
      if (*lp < 0 || *lp > 20) bad("logprobs", fmt::format("'logprobs' must be in [0, 20], got {}", *lp));
      r.logprobs = int(*lp);
    }
    return r;
  });
}

ParseResult parse_chat_request(std::string_view body) {
  return guarded([&]() -> ParseResult {
    const Json j = parse_body(body);
    ParsedRequest r;
    r.endpoint = Endpoint::kChat;
    parse_common(j, r);
    parse_chat_input(j, r.messages, r.tools, r.chat_template_kwargs);
    if (const Json* c = field(j, "tool_choice")) {
      // "auto", "none", "required", or {"type": "function", "function": {"name": ...}} (a call of it).
      if (c->is_string() && (*c == "auto" || *c == "none" || *c == "required")) {
        r.tool_choice = c->get<std::string>();
      } else if (c->is_object() && c->value("type", Json()) == Json("function") && c->contains("function") &&
                 (*c)["function"].is_object() && (*c)["function"].contains("name") &&
                 (*c)["function"]["name"].is_string()) {
        r.tool_choice = "function";
        r.tool_name = (*c)["function"]["name"].get<std::string>();
      } else {
        bad("tool_choice", "'tool_choice' must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", "
                           "\"function\": {\"name\": ...}}");
      }
      const bool has_tools = r.tools.is_array() && !r.tools.empty();
      if ((r.tool_choice == "required" || r.tool_choice == "function") && !has_tools)
        bad("tool_choice", fmt::format("'tool_choice' \"{}\" needs 'tools'", r.tool_choice));
      if (r.tool_choice == "function") {
        bool known = false;
        for (const Json& t : r.tools)
          if (t.is_object() && t.contains("function") && t["function"].is_object() &&
              t["function"].value("name", Json()) == Json(r.tool_name))
            known = true;
        if (!known) bad("tool_choice", fmt::format("'tool_choice' names '{}', which is not in 'tools'", client_text(r.tool_name)));
      }
      if (r.tool_choice != "auto" && r.tool_choice != "none" && (r.json_object || r.json_schema || r.text_pattern))
        unsupported("tool_choice", "a forced tool call together with a structured output");
    }
    if (const Json* p = field(j, "parallel_tool_calls")) {
      if (!p->is_boolean()) bad("parallel_tool_calls", "'parallel_tool_calls' must be a boolean");
      r.parallel_tool_calls = p->get<bool>();
    }
    parse_max_tokens(j, "max_tokens", r);
    parse_max_tokens(j, "max_completion_tokens", r);  // the newer name wins when both are given
    const bool logprobs = get_bool(j, "logprobs", false);
    const auto top = get_int(j, "top_logprobs");
    if (top && (*top < 0 || *top > 20))
      bad("top_logprobs", fmt::format("'top_logprobs' must be in [0, 20], got {}", *top));
    if (top && !logprobs) bad("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    if (logprobs) r.logprobs = int(top.value_or(0));
    return r;
  });
}

std::variant<TokenizeRequest, ApiError> parse_tokenize_request(std::string_view body) {
  return guarded([&]() -> std::variant<TokenizeRequest, ApiError> {
    const Json j = parse_body(body);
    TokenizeRequest r;
    r.model = get_model(j);
    const Json* p = field(j, "prompt");
    if ((p == nullptr) == (field(j, "messages") == nullptr)) bad("prompt", "give either 'prompt' or 'messages'");
    if (p) {
      if (!p->is_string()) bad("prompt", fmt::format("'prompt' must be a string, got {}", type_name(*p)));
      r.prompt = p->get<std::string>();
    } else {
      r.chat = true;
      parse_chat_input(j, r.messages, r.tools, r.chat_template_kwargs);
      r.add_generation_prompt = get_bool(j, "add_generation_prompt", true);
    }
    r.add_special_tokens = get_bool(j, "add_special_tokens", !r.chat);
    return r;
  });
}

std::variant<DetokenizeRequest, ApiError> parse_detokenize_request(std::string_view body) {
  return guarded([&]() -> std::variant<DetokenizeRequest, ApiError> {
    const Json j = parse_body(body);
    DetokenizeRequest r;
    r.model = get_model(j);
    const Json* t = field(j, "tokens");
    if (!t) bad("tokens", "'tokens' is required");
    if (!t->is_array()) bad("tokens", fmt::format("'tokens' must be an array of token ids, got {}", type_name(*t)));
    r.tokens = as_ids(*t, "tokens");
    return r;
  });
}

std::optional<ApiError> check_model(const std::string& model, const ModelLimits& limits) {
  if (model.empty() || model == limits.id) return std::nullopt;
  return ApiError{404, fmt::format("The model '{}' does not exist (this server serves '{}')", client_text(model), limits.id),
                  "invalid_request_error", "model", "model_not_found"};
}

std::variant<EngineRequest, ApiError> make_engine_request(const ParsedRequest& r,
                                                          std::vector<int32_t> prompt,
                                                          const ModelLimits& limits,
                                                          uint64_t default_seed) {
  if (auto e = check_model(r.model, limits)) return *e;
  const std::string param = r.endpoint == Endpoint::kChat ? "messages" : "prompt";
  if (prompt.empty()) return ApiError{400, "the prompt is empty (it encodes to no tokens)", "invalid_request_error", param};
  for (int32_t id : prompt)
    if (id < 0 || id >= limits.vocab_size)
      return ApiError{400, fmt::format("token id {} is outside the vocabulary (size {})", id, limits.vocab_size),
                      "invalid_request_error", param};
  for (int32_t id : r.stop_token_ids)
    if (id >= limits.vocab_size)
      return ApiError{400, fmt::format("stop token id {} is outside the vocabulary (size {})", id, limits.vocab_size),
                      "invalid_request_error", "stop_token_ids"};
  const int64_t n = int64_t(prompt.size());
  const int64_t ctx = limits.max_model_len;
  const std::string max_name = r.endpoint == Endpoint::kChat ? "max_completion_tokens" : "max_tokens";
  if (n >= ctx)
    return ApiError{400, fmt::format("This model's maximum context length is {} tokens, but the prompt "
                                     "has {} tokens (no room for any output token)", ctx, n),
                    "invalid_request_error", param, "context_length_exceeded"};
  int64_t max_tokens = r.max_tokens.value_or(r.endpoint == Endpoint::kChat ? ctx - n : 16);
  if (!r.max_tokens) max_tokens = std::min(max_tokens, ctx - n);
  if (n + max_tokens > ctx)
    return ApiError{400, fmt::format("This model's maximum context length is {} tokens, but {} tokens "
                                     "were requested ({} in the prompt, {} for the completion); "
                                     "reduce the prompt or '{}'", ctx, n + max_tokens, n, max_tokens, max_name),
                    "invalid_request_error", max_name, "context_length_exceeded"};
  EngineRequest e;
  e.prompt = std::move(prompt);
  e.max_new_tokens = int(max_tokens);
  e.ignore_eos = r.ignore_eos;
  e.sampling.temperature = r.temperature;
  e.sampling.top_p = r.top_p;
  e.sampling.top_k = r.top_k;
  e.sampling.min_p = r.min_p;
  e.sampling.presence_penalty = r.presence_penalty;
  e.sampling.frequency_penalty = r.frequency_penalty;
  e.sampling.repetition_penalty = r.repetition_penalty;
  e.sampling.logit_bias = r.logit_bias;
  e.sampling.seed = r.seed.value_or(default_seed);
  e.stop_token_ids = r.stop_token_ids;
  e.logprobs = r.logprobs;
  if (r.echo && r.logprobs >= 0) e.prompt_logprobs = r.logprobs;  // the echoed prompt's logprobs too
  return e;
}

}  // namespace dsi::server
