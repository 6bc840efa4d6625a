// The OpenAI endpoints. A request's life: parse (task.h) -> prompt tokens -> EngineRequest ->
// Engine::submit with a sink into its EventQueue -> the handler thread pops events, turns tokens
// into text (output_text.h) and answers with one JSON body or an SSE stream. A stop string, a
// client that goes away or a server shutdown cancels the request in the engine.
#include "server/openai_routes.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <random>

#include "dsinfer/error.h"
#include "server/event_queue.h"
#include "server/constraints.h"
#include "server/output_text.h"
#include "server/reasoning.h"
#include "server/tool_calls.h"
#include "text/utf8.h"

namespace dsi::server {

namespace {

using Json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

std::string random_hex(size_t n) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string s;
  while (s.size() < n) s += fmt::format("{:016x}", rng());
  return s.substr(0, n);
}

uint64_t random_seed() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return rng();
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch()).count();
}

// Text made safe for JSON (nlohmann refuses invalid UTF-8 when dumping).
std::string dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

Json bytes_of(const std::string& s) {
  Json b = Json::array();
  for (unsigned char c : s) b.push_back(int(c));
  return b;
}

// OpenAI's usage object; cached: prompt tokens the prefix cache served.
Json usage_json(int64_t prompt, int64_t completion, int64_t cached) {
  return {{"prompt_tokens", prompt},
          {"completion_tokens", completion},
          {"total_tokens", prompt + completion},
          {"prompt_tokens_details", {{"cached_tokens", cached}}}};
}

// One request in the engine, seen from the handler thread.
class Run {
 public:
  // keep: tokens written into the text even when special tokens are skipped (think tags, call markers).
  Run(Engine& engine, ServerMetrics& metrics, const Tokenizer& tokenizer, const ParsedRequest& r,
      std::vector<int32_t> keep)
      : engine_(engine),
        metrics_(metrics),
        tokenizer_(tokenizer),
        queue_(std::make_shared<EventQueue>()),
        out_(tokenizer, r.skip_special_tokens, r.stop, r.logprobs >= 0, std::move(keep)) {
    metrics_.in_flight.fetch_add(1);
  }
  ~Run() {
    if (submitted_ && !done_) cancel();
    metrics_.in_flight.fetch_sub(1);
  }
  Run(const Run&) = delete;
  Run& operator=(const Run&) = delete;

  // Throws what Engine::submit throws.
  void submit(EngineRequest request) {
    prompt_tokens_ = int64_t(request.prompt.size());
    if (request.prompt_logprobs >= 0 && !request.prompt.empty())  // the first token has no logprob
      prompt_records_.push_back(
          token_record(tokenizer_, GeneratedToken{request.prompt[0], std::numeric_limits<float>::quiet_NaN(), {}}));
    start_ = last_token_ = Clock::now();
    id_ = engine_.submit(std::move(request), EventQueue::sink_for(queue_));
    submitted_ = true;
  }

  // Waits up to `timeout` for engine events; returns the new text and tokens.
  TextDelta poll(std::chrono::milliseconds timeout) {
    TextDelta d;
    if (done_) return d;
    for (RequestEvent& ev : queue_->pop(timeout)) {
      if (ev.prompt_tokens > 0) prompt_tokens_ = ev.prompt_tokens;
      cached_tokens_ = ev.cached_tokens;
      for (const GeneratedToken& t : ev.prompt_logprobs) {
        TokenRecord rec = token_record(tokenizer_, t);
        rec.text_offset = prompt_records_.empty() ? 0
                                                  : prompt_records_.back().text_offset + prompt_records_.back().text.size();
        prompt_records_.push_back(std::move(rec));
      }
      if (!ev.tokens.empty()) {
        const auto now = Clock::now();
        const double dt = std::chrono::duration<double>(now - last_token_).count();
        if (!first_token_seen_) {
          metrics_.ttft.observe(dt);
          first_token_seen_ = true;
        } else {
          for (size_t i = 0; i < ev.tokens.size(); ++i) metrics_.inter_token.observe(dt / double(ev.tokens.size()));
        }
        last_token_ = now;
        append(d, out_.push(ev.tokens));
        if (out_.stopped()) {  // a stop string: the engine need not go on
          engine_.cancel(id_);
          finish(d, "stop", "");
          return d;
        }
      }
      if (ev.finished) {
        finish(d, ev.finish_reason, ev.error);
        return d;
      }
    }
    return d;
  }

  // The client went away or the server is stopping.
  void cancel() {
    if (done_) return;
    if (submitted_) engine_.cancel(id_);
    done_ = true;
    finish_reason_ = "abort";
    record_finish();
  }

  bool done() const { return done_; }
  const std::string& finish_reason() const { return finish_reason_; }
  const std::string& error() const { return error_; }
  int64_t prompt_tokens() const { return prompt_tokens_; }
  int64_t cached_tokens() const { return cached_tokens_; }
  int64_t completion_tokens() const { return out_.tokens_consumed(); }
  const std::string& text() const { return out_.text(); }
  // EngineRequest::prompt_logprobs: the prompt's tokens (the first without a logprob: NaN), with
  // offsets into the prompt's text as these tokens spell it.
  const std::vector<TokenRecord>& prompt_records() const { return prompt_records_; }

 private:
  static void append(TextDelta& d, TextDelta&& more) {
    d.text += more.text;
    for (auto& t : more.tokens) d.tokens.push_back(std::move(t));
  }
  void finish(TextDelta& d, const std::string& reason, const std::string& error) {
    append(d, out_.finish());
    done_ = true;
    finish_reason_ = reason;
    error_ = error;
    record_finish();
  }
  void record_finish() {
    metrics_.finished(finish_reason_);
    metrics_.e2e.observe(std::chrono::duration<double>(Clock::now() - start_).count());
  }

  Engine& engine_;
  ServerMetrics& metrics_;
  const Tokenizer& tokenizer_;
  std::shared_ptr<EventQueue> queue_;
  OutputText out_;
  uint64_t id_ = 0;
  bool submitted_ = false;
  bool done_ = false;
  bool first_token_seen_ = false;
  std::string finish_reason_;
  std::string error_;
  int64_t prompt_tokens_ = 0;
  int64_t cached_tokens_ = 0;
  std::vector<TokenRecord> prompt_records_;
  Clock::time_point start_, last_token_;
};

// The logprobs of some tokens in the legacy completions format.
// prompt: an echoed prompt's tokens first (their own offsets; the first has no logprob: null).
Json completion_logprobs(const std::vector<TokenRecord>& tokens, size_t offset_base,
                         const std::vector<TokenRecord>* prompt = nullptr) {
  Json j = {{"tokens", Json::array()}, {"token_logprobs", Json::array()},
            {"top_logprobs", Json::array()}, {"text_offset", Json::array()}};
  auto add = [&](const TokenRecord& t, size_t offset) {
    j["tokens"].push_back(t.text);
    j["text_offset"].push_back(offset);
    if (std::isnan(t.logprob)) {
      j["token_logprobs"].push_back(nullptr);
      j["top_logprobs"].push_back(nullptr);
      return;
    }
    j["token_logprobs"].push_back(t.logprob);
    Json top = Json::object();
    for (const auto& [text, lp] : t.top) top[text] = lp;
    if (!top.contains(t.text)) top[t.text] = t.logprob;  // the chosen token is always listed
    j["top_logprobs"].push_back(std::move(top));
  };
  if (prompt != nullptr)
    for (const TokenRecord& t : *prompt) add(t, t.text_offset);
  for (const TokenRecord& t : tokens) add(t, offset_base + t.text_offset);
  return j;
}

// The logprobs of some tokens in the chat format.
Json chat_logprobs(const std::vector<TokenRecord>& tokens) {
  Json content = Json::array();
  for (const TokenRecord& t : tokens) {
    Json top = Json::array();
    for (const auto& [text, lp] : t.top)
      top.push_back({{"token", text}, {"logprob", lp}, {"bytes", bytes_of(text)}});
    content.push_back({{"token", t.text}, {"logprob", t.logprob}, {"bytes", bytes_of(t.text)},
                       {"top_logprobs", std::move(top)}});
  }
  return Json{{"content", std::move(content)}};
}

// One chat choice's text on its way out: the reasoning apart (reasoning.h), then the tool calls
// (tool_calls.h); either may be off, and then the text passes through.
class Answer {
 public:
  Answer(bool split_reasoning, bool opens_reasoning, ToolFormat tools, const Json& tool_list)
      : split_(split_reasoning), reasoning_(opens_reasoning), tools_(tools, tool_list) {}

  struct Piece {
    std::string reasoning, content;
    std::vector<ToolCall> calls;  // the calls completed with this text
    size_t first_call = 0;        // the answer's number of the first of them (streamed chunks' index)
    bool empty() const { return reasoning.empty() && content.empty() && calls.empty(); }
  };
  // The next text of the choice; done: it is the last.
  Piece push(const std::string& text, bool done) {
    Piece p;
    ReasoningSplitter::Split s = split_ ? reasoning_.push(text) : ReasoningSplitter::Split{{}, text};
    if (done && split_) {
      const ReasoningSplitter::Split rest = reasoning_.finish();
      s.reasoning += rest.reasoning;
      s.content += rest.content;
    }
    p.reasoning = std::move(s.reasoning);
    ToolCallParser::Result r = tools_.push(s.content);
    if (done) {
      ToolCallParser::Result end = tools_.finish();
      r.content += end.content;
      for (ToolCall& c : end.calls) r.calls.push_back(std::move(c));
    }
    p.content = std::move(r.content);
    p.calls = std::move(r.calls);
    p.first_call = calls_;
    calls_ += p.calls.size();
    return p;
  }

 private:
  bool split_;
  ReasoningSplitter reasoning_;
  ToolCallParser tools_;
  size_t calls_ = 0;  // calls handed out so far
};

// OpenAI's tool_calls entries; streamed ones carry their index in the answer's calls (the first of
// these is number first_index).
Json tool_calls_json(const std::vector<ToolCall>& calls, bool with_index, size_t first_index = 0) {
  Json out = Json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    Json c = {{"id", "call_" + random_hex(24)},
              {"type", "function"},
              {"function", {{"name", calls[i].name}, {"arguments", calls[i].arguments}}}};
    if (with_index) c["index"] = first_index + i;
    out.push_back(std::move(c));
  }
  return out;
}

// A choice's finish reason: "tool_calls" for an answer that ended (eos) with calls.
std::string finish_reason_of(const std::string& run_reason, bool called) {
  return called && run_reason == "stop" ? "tool_calls" : run_reason;
}

struct Reply {
  Endpoint endpoint;
  std::string id;
  std::string model;
  int64_t created;
  bool logprobs;
  bool include_usage;
  int n = 1;                     // choices per prompt (choice p * n + i: prompt p's choice i)
  std::vector<size_t> echo_len;  // per choice: bytes of echoed prompt before the completion text

  // A streamed chunk of choice `index` with new text (and the tokens' logprobs) or a finish reason.
  // reasoning: the chat answer's new reasoning text (reasoning.h); calls: its tool calls; prompt:
  // an echoed prompt's records (completions).
  Json chunk(int index, const std::string& text, const std::vector<TokenRecord>* tokens,
             const std::string* finish_reason, bool first_chat_chunk = false,
             const std::string& reasoning = {}, const std::vector<ToolCall>& calls = {},
             size_t first_call = 0, const std::vector<TokenRecord>* prompt = nullptr) const {
    Json choice = {{"index", index}};
    if (endpoint == Endpoint::kChat) {
      Json delta = Json::object();
      if (first_chat_chunk) delta["role"] = "assistant";
      if (!reasoning.empty()) delta["reasoning_content"] = reasoning;
      if (!text.empty() || first_chat_chunk) delta["content"] = text;
      if (!calls.empty()) delta["tool_calls"] = tool_calls_json(calls, true, first_call);
      choice["delta"] = std::move(delta);
      choice["logprobs"] = logprobs && tokens ? chat_logprobs(*tokens) : Json(nullptr);
    } else {
      choice["text"] = text;
      choice["logprobs"] = logprobs && (tokens || prompt)
                               ? completion_logprobs(tokens ? *tokens : std::vector<TokenRecord>{},
                                                     echo_len[size_t(index)], prompt)
                               : Json(nullptr);
    }
    choice["finish_reason"] = finish_reason ? Json(*finish_reason) : Json(nullptr);
    Json j = {{"id", id},
              {"object", endpoint == Endpoint::kChat ? "chat.completion.chunk" : "text_completion"},
              {"created", created},
              {"model", model},
              {"choices", Json::array({std::move(choice)})}};
    if (include_usage) j["usage"] = nullptr;
    return j;
  }

  // The usage of all choices: each prompt once (its first choice's count and cached tokens), the
  // completions summed (OpenAI's accounting).
  Json usage(const std::vector<std::shared_ptr<Run>>& runs) const {
    int64_t prompt = 0, cached = 0, completion = 0;
    for (size_t i = 0; i < runs.size(); ++i) {
      completion += runs[i]->completion_tokens();
      if (i % size_t(n) == 0) prompt += runs[i]->prompt_tokens(), cached += runs[i]->cached_tokens();
    }
    return usage_json(prompt, completion, cached);
  }

  Json usage_chunk(const std::vector<std::shared_ptr<Run>>& runs) const {
    return {{"id", id},
            {"object", endpoint == Endpoint::kChat ? "chat.completion.chunk" : "text_completion"},
            {"created", created},
            {"model", model},
            {"choices", Json::array()},
            {"usage", usage(runs)}};
  }

  // One choice of a non-streamed answer; reasoning: a chat answer's (null: no reasoning parser);
  // calls: its tool calls (the content is null when they are all it says).
  Json choice(int index, const std::string& text, const std::vector<TokenRecord>& tokens,
              const Run& run, const std::string* reasoning = nullptr,
              const std::vector<ToolCall>& calls = {}) const {
    Json c = {{"index", index}};
    if (endpoint == Endpoint::kChat) {
      c["message"] = {{"role", "assistant"},
                      {"content", calls.empty() || !text.empty() ? Json(text) : Json(nullptr)}};
      if (reasoning != nullptr)
        c["message"]["reasoning_content"] = reasoning->empty() ? Json(nullptr) : Json(*reasoning);
      if (!calls.empty()) c["message"]["tool_calls"] = tool_calls_json(calls, false);
      c["logprobs"] = logprobs ? chat_logprobs(tokens) : Json(nullptr);
    } else {
      c["text"] = text;
      c["logprobs"] = logprobs ? completion_logprobs(tokens, echo_len[size_t(index)], &run.prompt_records())
                               : Json(nullptr);
    }
    c["finish_reason"] = finish_reason_of(run.finish_reason(), !calls.empty());
    return c;
  }

  // The whole answer of a non-streamed request.
  Json full(Json choices, const std::vector<std::shared_ptr<Run>>& runs) const {
    return {{"id", id},
            {"object", endpoint == Endpoint::kChat ? "chat.completion" : "text_completion"},
            {"created", created},
            {"model", model},
            {"choices", std::move(choices)},
            {"usage", usage(runs)}};
  }
};

std::string sse(const Json& j) { return "data: " + dump(j) + "\n\n"; }

HttpResponse json_response(int status, const Json& j) {
  HttpResponse r;
  r.status = status;
  r.body = dump(j);
  return r;
}

}  // namespace

HttpResponse OpenAiService::error_response(const ApiError& e) {
  return json_response(e.status, error_json(e));
}

OpenAiService::OpenAiService(Engine& engine, Tokenizer tokenizer,
                             std::optional<ChatTemplate> chat_template, ServiceOptions options)
    : engine_(engine),
      tokenizer_(std::move(tokenizer)),
      chat_template_(std::move(chat_template)),
      options_(std::move(options)),
      router_([](int status, const std::string& message) {
        ApiError e{status, message, status >= 500 ? "internal_error" : "invalid_request_error"};
        if (status == 404) e.code = "not_found";
        if (status == 405) e.code = "method_not_allowed";
        return error_response(e);
      }),
      created_(unix_now()) {
  const ModelInfo& info = engine_.info();
  limits_.id = options_.served_model_name.empty() ? info.id : options_.served_model_name;
  limits_.max_model_len = info.max_model_len;
  limits_.vocab_size = info.vocab_size;
  const std::string& rp = options_.reasoning_parser;
  DSI_CHECK(rp == "auto" || rp == "think" || rp == "none",
            "reasoning parser '{}': expected auto, think or none", utf8::shown(rp));
  reasoning_ = rp == "think" ||
               (rp == "auto" && chat_template_ &&
                chat_template_->source().find(ReasoningSplitter::kClose) != std::string::npos);
  tool_format_ = tool_format(options_.tool_call_parser, chat_template_ ? chat_template_->source() : "");
  think_open_ = tokenizer_.token_to_id(ReasoningSplitter::kOpen).value_or(-1);
  think_close_ = tokenizer_.token_to_id(ReasoningSplitter::kClose).value_or(-1);
  for (int32_t id : {think_open_, think_close_})
    if (id >= 0) think_tags_.push_back(id);
  for (std::string_view marker : format_markers(tool_format_))  // the call markers that are tokens
    if (const auto id = tokenizer_.token_to_id(marker)) call_markers_.push_back(*id);
  router_.add("GET", "/health", [this](const HttpRequest& r) { return health(r); });
  router_.add("GET", "/v1/models", [this](const HttpRequest& r) { return models(r); });
  router_.add("GET", "/metrics", [this](const HttpRequest& r) { return metrics_page(r); });
  router_.add("POST", "/v1/completions",
              [this](const HttpRequest& r) { return completions(r, Endpoint::kCompletions); });
  router_.add("POST", "/v1/chat/completions",
              [this](const HttpRequest& r) { return completions(r, Endpoint::kChat); });
  router_.add("POST", "/tokenize", [this](const HttpRequest& r) { return tokenize(r); });
  router_.add("POST", "/detokenize", [this](const HttpRequest& r) { return detokenize(r); });
}

HttpResponse OpenAiService::health(const HttpRequest&) {
  const std::string failure = engine_.failure();
  if (!failure.empty()) return json_response(503, Json{{"status", "failed"}, {"error", failure}});
  return json_response(200, Json{{"status", "ok"}});
}

HttpResponse OpenAiService::models(const HttpRequest&) {
  Json m = {{"id", limits_.id},
            {"object", "model"},
            {"created", created_},
            {"owned_by", "dsinfer"},
            {"root", engine_.info().model_dir},
            {"max_model_len", limits_.max_model_len}};
  return json_response(200, Json{{"object", "list"}, {"data", Json::array({std::move(m)})}});
}

HttpResponse OpenAiService::metrics_page(const HttpRequest&) {
  HttpResponse r;
  r.content_type = "text/plain; version=0.0.4; charset=utf-8";
  r.body = render_prometheus(engine_.metrics(), metrics_, limits_.id);
  return r;
}

HttpResponse OpenAiService::reject(const ApiError& e) {
  metrics_.rejected.fetch_add(1);
  return error_response(e);
}

std::variant<std::string, ApiError> OpenAiService::render_chat(const Json& messages, const Json& tools,
                                                              bool add_generation_prompt,
                                                              const Json& kwargs) const {
  if (!chat_template_)
    return ApiError{400, "this model has no chat template; use /v1/completions", "invalid_request_error", "messages"};
  try {
    return chat_template_->render(messages, tools, add_generation_prompt, kwargs);
  } catch (const dsi::Error& e) {
    return ApiError{400, fmt::format("the chat template failed on these messages: {}", e.what()),
                    "invalid_request_error", "messages"};
  }
}

// vLLM's /tokenize: {"count", "max_model_len", "tokens"} for a prompt or chat messages.
HttpResponse OpenAiService::tokenize(const HttpRequest& http) {
  auto parsed = parse_tokenize_request(http.body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return reject(*e);
  const TokenizeRequest& req = std::get<TokenizeRequest>(parsed);
  if (auto e = check_model(req.model, limits_)) return reject(*e);
  std::string text = req.prompt;
  if (req.chat) {
    auto rendered = render_chat(req.messages, req.tools, req.add_generation_prompt, req.chat_template_kwargs);
    if (auto* e = std::get_if<ApiError>(&rendered)) return reject(*e);
    text = std::get<std::string>(rendered);
  }
  const std::vector<int32_t> ids = tokenizer_.encode(text, req.add_special_tokens);
  return json_response(200, Json{{"count", ids.size()}, {"max_model_len", limits_.max_model_len}, {"tokens", ids}});
}

// vLLM's /detokenize: {"prompt"}, the ids' text (special tokens included).
HttpResponse OpenAiService::detokenize(const HttpRequest& http) {
  auto parsed = parse_detokenize_request(http.body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return reject(*e);
  const DetokenizeRequest& req = std::get<DetokenizeRequest>(parsed);
  if (auto e = check_model(req.model, limits_)) return reject(*e);
  for (int32_t id : req.tokens)
    if (id >= limits_.vocab_size)
      return reject(ApiError{400, fmt::format("token id {} is outside the vocabulary [0, {})", id, limits_.vocab_size),
                             "invalid_request_error", "tokens"});
  return json_response(200, Json{{"prompt", tokenizer_.decode(req.tokens, /*skip_special_tokens=*/false)}});
}

HttpResponse OpenAiService::completions(const HttpRequest& http, Endpoint endpoint) {
  ParseResult parsed = endpoint == Endpoint::kChat ? parse_chat_request(http.body)
                                                   : parse_completion_request(http.body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return reject(*e);
  const ParsedRequest& req = std::get<ParsedRequest>(parsed);
  if (auto e = check_model(req.model, limits_)) return reject(*e);

  // The prompts' tokens. Chat: the template's text already holds its special tokens, so it is
  // encoded without the post-processor's (as HF apply_chat_template(tokenize=True) does).
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::string> echo_texts;  // per prompt
  const bool split = endpoint == Endpoint::kChat && reasoning_;  // reasoning_content apart
  bool opens_reasoning = false;  // the chat prompt leaves the answer inside a think block
  if (endpoint == Endpoint::kChat) {
    auto rendered = render_chat(req.messages, req.tools, /*add_generation_prompt=*/true, req.chat_template_kwargs);
    if (auto* e = std::get_if<ApiError>(&rendered)) return reject(*e);
    const std::string& text = std::get<std::string>(rendered);
    prompts.push_back(tokenizer_.encode(text, /*add_special_tokens=*/false));
    echo_texts.emplace_back();
    opens_reasoning = ReasoningSplitter::prompt_opens_reasoning(text);
  } else {
    for (const CompletionPrompt& p : req.prompts) {
      prompts.push_back(p.is_ids ? p.ids : tokenizer_.encode(p.text, /*add_special_tokens=*/true));
      echo_texts.push_back(!req.echo ? std::string()
                           : p.is_ids ? tokenizer_.decode(p.ids, req.skip_special_tokens)
                                      : p.text);
    }
  }
  // Every prompt's engine request is checked before any runs.
  std::vector<EngineRequest> bases;
  for (size_t p = 0; p < prompts.size(); ++p) {
    auto made = make_engine_request(req, std::move(prompts[p]), limits_, random_seed());
    if (auto* e = std::get_if<ApiError>(&made)) {
      if (prompts.size() > 1) e->message = fmt::format("prompt {} of the batch: {}", p, e->message);
      return reject(*e);
    }
    bases.push_back(std::move(std::get<EngineRequest>(made)));
  }

  // tool_choice "required" or a named function: the answer is a call (or calls, where parallel calls
  // are allowed; a named function: one call).
  const bool forced_call = req.tool_choice == "required" || req.tool_choice == "function";
  if (forced_call && tool_format_ == ToolFormat::kNone)
    return reject(ApiError{400, "this model's chat template writes no tool calls this server reads, so none can be forced",
                           "invalid_request_error", "tool_choice"});
  // The call written whole: its markers, a function's name, arguments its parameters accept. With
  // tool_choice "auto", where a function is "strict" or parallel_tool_calls is false: the answer is
  // free, a call once opened held (a strict function's arguments to its schema, another's values
  // taken as written), and with parallel_tool_calls false the answer ends after the first call.
  const bool auto_calls = endpoint == Endpoint::kChat && req.tool_choice == "auto" && tool_format_ != ToolFormat::kNone &&
                          req.tools.is_array() && !req.tools.empty() && !req.json_object && !req.json_schema &&
                          !req.text_pattern;
  const bool strict_calls = auto_calls && ToolGrammar::any_strict(req.tools);
  const bool one_call = auto_calls && !req.parallel_tool_calls;
  std::shared_ptr<const ToolGrammar> call_grammar;
  if (forced_call || strict_calls || one_call) {
    try {
      call_grammar = ToolGrammar::make(tool_format_, req.tools, req.tool_choice == "function" ? req.tool_name : "",
                                       req.parallel_tool_calls && req.tool_choice != "function", auto_calls);
    } catch (const dsi::Error& err) {
      // One call asked and no function strict: tools a call cannot be held to (a name with a
      // space) are no reason to refuse the request; it goes on unheld, its calls read as written.
      if (forced_call || strict_calls) return reject(ApiError{400, err.what(), "invalid_request_error", "tools"});
    }
  }

  // A failed engine is the server's fault, not the request's: 503, as /health says.
  if (const std::string failure = engine_.failure(); !failure.empty())
    return reject(ApiError{503, "the engine has failed: " + failure, "server_error"});
  // Each choice's text: the reasoning apart and the tool calls read back when asked (chat only;
  // tool calls when the request has tools and allows calling them). The think tags and the call
  // markers stay in the text even where special tokens are skipped: their readers need them.
  const bool call_tools = endpoint == Endpoint::kChat && req.tools.is_array() && !req.tools.empty() &&
                          req.tool_choice != "none";
  std::vector<int32_t> kept_tokens = split ? think_tags_ : std::vector<int32_t>{};
  if (call_tools) kept_tokens.insert(kept_tokens.end(), call_markers_.begin(), call_markers_.end());

  // n choices of each prompt: n engine requests, choice i with seed + i (so sampled choices differ,
  // and a prompt's choices in a batch are those of a request of that prompt alone).
  std::vector<std::shared_ptr<Run>> runs;
  std::vector<std::string> echoes;  // per choice
  for (size_t p = 0; p < bases.size(); ++p)
    for (int i = 0; i < req.n; ++i) {
      runs.push_back(std::make_shared<Run>(engine_, metrics_, tokenizer_, req, kept_tokens));
      echoes.push_back(echo_texts[p]);
      EngineRequest e = bases[p];
      e.sampling.seed = bases[p].sampling.seed + uint64_t(i);
      // Each choice its own constraint; a reasoning model thinks first.
      const int32_t think_open = split ? think_open_ : -1, think_close = split ? think_close_ : -1;
      if (req.json_object)
        e.constraint = std::make_shared<JsonConstraint>(tokenizer_, engine_.info().eos_token_ids, think_open,
                                                        think_close, opens_reasoning);
      if (req.json_schema)
        e.constraint = std::make_shared<SchemaConstraint>(tokenizer_, req.json_schema, engine_.info().eos_token_ids,
                                                          think_open, think_close, opens_reasoning);
      if (req.text_pattern)
        e.constraint = std::make_shared<PatternConstraint>(tokenizer_, req.text_pattern, engine_.info().eos_token_ids,
                                                           think_open, think_close, opens_reasoning);
      if (call_grammar)
        e.constraint = std::make_shared<ToolCallConstraint>(tokenizer_, call_grammar, engine_.info().eos_token_ids,
                                                            think_open, think_close, opens_reasoning);
      try {
        runs.back()->submit(std::move(e));
      } catch (const dsi::Error& err) {
        return reject(ApiError{400, err.what()});  // the runs submitted so far are cancelled
      }
    }
  std::vector<size_t> echo_len;
  for (const std::string& t : echoes) echo_len.push_back(t.size());
  Reply reply{endpoint,
              (endpoint == Endpoint::kChat ? "chatcmpl-" : "cmpl-") + random_hex(24),
              limits_.id,
              unix_now(),
              req.logprobs >= 0,
              req.include_usage,
              req.n,
              std::move(echo_len)};
  const auto all_done = [](const std::vector<std::shared_ptr<Run>>& rs) {
    return std::all_of(rs.begin(), rs.end(), [](const auto& r) { return r->done(); });
  };
  // The choices' events come from the same engine steps: one poll waits (on the first choice still
  // running), the others only take what has arrived.
  const auto waits = [](const std::vector<std::shared_ptr<Run>>& rs, size_t i) {
    for (size_t j = 0; j < i; ++j)
      if (!rs[j]->done()) return false;
    return true;
  };

  auto answers = std::make_shared<std::vector<Answer>>();
  for (size_t i = 0; i < runs.size(); ++i)
    answers->emplace_back(split, opens_reasoning, call_tools ? tool_format_ : ToolFormat::kNone, req.tools);

  if (!req.stream) {
    std::vector<std::string> texts = echoes, reasoning(runs.size());
    std::vector<std::vector<TokenRecord>> tokens(runs.size());
    std::vector<std::vector<ToolCall>> calls(runs.size());
    while (!all_done(runs)) {
      for (size_t i = 0; i < runs.size(); ++i) {
        if (stopping_.load()) runs[i]->cancel();
        if (runs[i]->done()) continue;
        TextDelta d = runs[i]->poll(std::chrono::milliseconds(waits(runs, i) ? 200 : 0));
        Answer::Piece s = (*answers)[i].push(d.text, runs[i]->done());
        texts[i] += s.content;
        reasoning[i] += s.reasoning;
        for (ToolCall& c : s.calls) calls[i].push_back(std::move(c));
        for (auto& t : d.tokens) tokens[i].push_back(std::move(t));
      }
    }
    Json choices = Json::array();
    for (size_t i = 0; i < runs.size(); ++i) {
      const Run& run = *runs[i];
      if (run.finish_reason() == "error")
        return error_response(ApiError{500, "generation failed: " + run.error(), "internal_error"});
      if (run.finish_reason() == "abort")
        return error_response(ApiError{503, "the request was aborted (the server is stopping)", "internal_error"});
      choices.push_back(reply.choice(int(i), texts[i], tokens[i], run, split ? &reasoning[i] : nullptr, calls[i]));
    }
    return json_response(200, reply.full(std::move(choices), runs));
  }

  // Streaming: Server-Sent Events, one `data: {chunk}` per piece of a choice, each choice's finish
  // reason when it ends, `data: [DONE]` after the last.
  struct StreamState {
    std::vector<std::shared_ptr<Run>> runs;
    Reply reply;
    std::vector<std::string> echoes;  // per choice
    std::vector<bool> echo_waits;     // the echo goes out with its prompt's logprobs, once they came
    bool started = false;
    std::vector<bool> finished;
    std::vector<bool> called;  // the choice's answer had tool calls
    Clock::time_point last_write = Clock::now();
  };
  std::vector<bool> echo_waits(runs.size(), false);
  for (size_t i = 0; i < runs.size(); ++i) echo_waits[i] = reply.logprobs && !echoes[i].empty();
  auto st = std::make_shared<StreamState>(StreamState{runs, reply, std::move(echoes), std::move(echo_waits), false,
                                                      std::vector<bool>(runs.size(), false),
                                                      std::vector<bool>(runs.size(), false)});
  HttpResponse r;
  r.content_type = "text/event-stream";
  r.headers.emplace_back("Cache-Control", "no-cache");
  r.stream = [this, st, all_done, waits, answers](const ChunkWriter& write) -> bool {
    const Reply& rep = st->reply;
    auto send = [&](const std::string& s) {
      st->last_write = Clock::now();
      return write(s);
    };
    if (!st->started) {
      st->started = true;
      for (int i = 0; i < int(st->runs.size()); ++i) {
        if (rep.endpoint == Endpoint::kChat && !send(sse(rep.chunk(i, "", nullptr, nullptr, true)))) return false;
        const std::string& echo = st->echoes[size_t(i)];
        if (!echo.empty() && !st->echo_waits[size_t(i)] && !send(sse(rep.chunk(i, echo, nullptr, nullptr))))
          return false;
      }
    }
    bool wrote = false;
    for (size_t i = 0; i < st->runs.size(); ++i) {
      Run& run = *st->runs[i];
      if (st->finished[i]) continue;
      if (stopping_.load()) run.cancel();
      TextDelta d = run.poll(std::chrono::milliseconds(waits(st->runs, i) ? 100 : 0));
      // An echoed prompt with logprobs: its chunk once every prompt token's record came (the engine
      // reports them before the first generated token), or the run ended without them.
      if (st->echo_waits[i] && (int64_t(run.prompt_records().size()) >= run.prompt_tokens() || run.done())) {
        st->echo_waits[i] = false;
        if (!send(sse(rep.chunk(int(i), st->echoes[i], nullptr, nullptr, false, {}, {}, 0, &run.prompt_records()))))
          return false;
        wrote = true;
      }
      const Answer::Piece s = (*answers)[i].push(d.text, run.done());
      if (!s.empty() || (rep.logprobs && !d.tokens.empty())) {
        if (!send(sse(rep.chunk(int(i), s.content, &d.tokens, nullptr, false, s.reasoning, s.calls, s.first_call))))
          return false;
        wrote = true;
      }
      if (!s.calls.empty()) st->called[i] = true;
      if (!run.done()) continue;
      st->finished[i] = true;
      if (run.finish_reason() == "error") {
        send(sse(error_json(ApiError{500, "generation failed: " + run.error(), "internal_error"})));
        send("data: [DONE]\n\n");
        return false;
      }
      const std::string reason = finish_reason_of(run.finish_reason(), st->called[i]);
      if (!send(sse(rep.chunk(int(i), "", nullptr, &reason)))) return false;
      wrote = true;
    }
    if (!all_done(st->runs)) {
      if (!wrote && Clock::now() - st->last_write > std::chrono::milliseconds(options_.heartbeat_ms))
        if (!send(": keep-alive\n\n")) return false;  // an SSE comment: finds a client that is gone
      return true;
    }
    if (rep.include_usage && !send(sse(rep.usage_chunk(st->runs)))) return false;
    send("data: [DONE]\n\n");
    return false;
  };
  r.on_close = [st] {  // no-op for the choices that finished; else the client left
    for (const auto& run : st->runs) run->cancel();
  };
  return r;
}

}  // namespace dsi::server
