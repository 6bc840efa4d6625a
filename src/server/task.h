// The task layer: OpenAI request JSON -> a validated request, and the checks that need the model
// (context length, vocabulary). Pure functions, no I/O, no engine: a fuzzer can call them with any
// bytes. Validation mirrors the OpenAI API's documented ranges; anything unsupported (suffix, echo
// with logprobs in a stream, a forced tool call, ...) is a 400 naming the parameter.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "dsinfer/engine.h"
#include "server/json_schema.h"

namespace dsi::server {

// An OpenAI-style error: {"error": {"message", "type", "param", "code"}} with an HTTP status.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // "" -> null
  std::string code;   // "" -> null
  ApiError() = default;
  ApiError(int status_, std::string message_, std::string type_ = "invalid_request_error",
           std::string param_ = "", std::string code_ = "")
      : status(status_), message(std::move(message_)), type(std::move(type_)),
        param(std::move(param_)), code(std::move(code_)) {}
};
nlohmann::ordered_json error_json(const ApiError& e);

enum class Endpoint { kCompletions, kChat };

inline constexpr int kMaxChoices = 16;  // the most choices (n) one request may ask for
inline constexpr int kMaxBatchPrompts = 64;  // the most prompts one /v1/completions request may batch

// One prompt of /v1/completions: text, or token ids.
struct CompletionPrompt {
  std::string text;
  std::vector<int32_t> ids;
  bool is_ids = false;
};

struct ParsedRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;  // "" when not given (the served model)
  // /v1/completions: one prompt or a batch of them. The response's choices are prompt-major: choice
  // p * n + i is prompt p's choice i (OpenAI's order).
  std::vector<CompletionPrompt> prompts;
  bool echo = false;  // with logprobs: the prompt's tokens' logprobs too (not streamed)
  // /v1/chat/completions: rendered by the model's chat template.
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  nlohmann::ordered_json tools = nullptr;
  // "auto", "none" (the answer's tool calls are not read back), "required" (the answer begins with a
  // call) or "function" (a call of tool_name).
  std::string tool_choice = "auto";
  std::string tool_name;
  bool parallel_tool_calls = true;  // false: at most one call (tool_choice "required" or "auto")
  nlohmann::ordered_json chat_template_kwargs = nlohmann::ordered_json::object();
  // Generation.
  std::optional<int64_t> max_tokens;  // max_tokens / max_completion_tokens; none: the default
  float temperature = 1.0f;
  float top_p = 1.0f;
  int top_k = 0;       // vLLM's extension; -1 or 0: every token
  float min_p = 0.0f;  // vLLM's extension
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  float repetition_penalty = 1.0f;  // vLLM's extension
  std::vector<std::pair<int32_t, float>> logit_bias;  // (token id, bias in [-100, 100])
  std::optional<uint64_t> seed;
  int n = 1;  // choices: n engine requests, choice i seeded with seed + i
  bool ignore_eos = false;
  std::vector<std::string> stop;        // stop strings (cut from the text)
  std::vector<int32_t> stop_token_ids;  // stop ids (kept in the output)
  bool skip_special_tokens = true;
  bool json_object = false;  // response_format {"type": "json_object"}: the answer is one JSON object
  // response_format {"type": "json_schema", "json_schema": {"schema": ...}}: a value it accepts.
  std::shared_ptr<const JsonSchema> json_schema;
  // structured_outputs {"regex"} or {"choice"} (vLLM's; guided_regex / guided_choice): text the
  // pattern matches whole.
  std::shared_ptr<const JsonPattern> text_pattern;
  // Output.
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  int logprobs = -1;  // -1: none; else the number of top alternatives (chat: top_logprobs)
};

using ParseResult = std::variant<ParsedRequest, ApiError>;
ParseResult parse_completion_request(std::string_view body);
ParseResult parse_chat_request(std::string_view body);

// POST /tokenize (vLLM's): a prompt, or chat messages rendered by the chat template, to token ids.
struct TokenizeRequest {
  std::string model;
  bool chat = false;  // `messages` given (else `prompt`)
  std::string prompt;
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  nlohmann::ordered_json tools = nullptr;
  nlohmann::ordered_json chat_template_kwargs = nlohmann::ordered_json::object();
  bool add_special_tokens = true;  // the post-processor's special tokens (chat: default false)
  bool add_generation_prompt = true;
};
std::variant<TokenizeRequest, ApiError> parse_tokenize_request(std::string_view body);

// POST /detokenize: token ids to text.
struct DetokenizeRequest {
  std::string model;
  std::vector<int32_t> tokens;
};
std::variant<DetokenizeRequest, ApiError> parse_detokenize_request(std::string_view body);

// The limits of the served model that a request is checked against.
struct ModelLimits {
  std::string id;
  int64_t max_model_len = 0;
  int64_t vocab_size = 0;
};

// The engine request for a parsed request whose prompt is `prompt`: checks the model name (404),
// the prompt (empty, ids outside the vocabulary) and the lengths against max_model_len (400 with
// both lengths named), and fills in the default max_tokens (completions: 16, chat: the rest of the
// context). `default_seed` is used when the request has none.
std::variant<EngineRequest, ApiError> make_engine_request(const ParsedRequest& request,
                                                          std::vector<int32_t> prompt,
                                                          const ModelLimits& limits,
                                                          uint64_t default_seed);

// 404 unless `model` is empty or names the served model.
std::optional<ApiError> check_model(const std::string& model, const ModelLimits& limits);

}  // namespace dsi::server
