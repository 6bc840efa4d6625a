// The OpenAI-compatible endpoints over an Engine: /v1/completions, /v1/chat/completions (JSON or
// SSE streams), /v1/models, /health and /metrics. Text lives here: prompts are tokenized (chat:
// rendered by the model's chat template first), output is detokenized incrementally and cut at
// stop strings. Each request talks to the engine only through submit / cancel and its EventQueue.
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <string>

#include "dsinfer/engine.h"
#include "server/http.h"
#include "server/metrics.h"
#include "server/task.h"
#include "server/tool_calls.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace dsi::server {

struct ServiceOptions {
  std::string served_model_name;  // "" = the engine's ModelInfo::id
  int heartbeat_ms = 1000;        // SSE comment sent to an idle stream (detects disconnects)
  // Chat answers' <think> blocks as `reasoning_content` (server/reasoning.h): "think", "none", or
  // "auto" (think when the chat template writes "</think>").
  std::string reasoning_parser = "auto";
  // Chat answers' tool calls read back (server/tool_calls.h) when the request has tools: "glm",
  // "dsml", "deepseek_v3", "none", or "auto" (the format the chat template writes, if any).
  std::string tool_call_parser = "auto";
};

class OpenAiService {
 public:
  // `chat_template` may be empty: /v1/chat/completions then answers 400.
  OpenAiService(Engine& engine, Tokenizer tokenizer, std::optional<ChatTemplate> chat_template,
                ServiceOptions options = {});
  // Streams handed to the transport refer to the service: it must outlive the HttpServer's serve().
  OpenAiService(const OpenAiService&) = delete;
  OpenAiService& operator=(const OpenAiService&) = delete;

  // The router with every endpoint (errors formatted as OpenAI error JSON).
  const Router& router() const { return router_; }
  // Makes in-flight handlers cancel their requests and return (call before stopping the transport).
  void shutdown() { stopping_.store(true); }
  ServerMetrics& metrics() { return metrics_; }
  const ModelLimits& limits() const { return limits_; }

  static HttpResponse error_response(const ApiError& error);

 private:
  HttpResponse health(const HttpRequest&);
  HttpResponse models(const HttpRequest&);
  HttpResponse metrics_page(const HttpRequest&);
  HttpResponse completions(const HttpRequest&, Endpoint endpoint);
  HttpResponse tokenize(const HttpRequest&);
  HttpResponse detokenize(const HttpRequest&);
  HttpResponse reject(const ApiError& error);
  // The chat template's text for these messages, or the 400 for a template that fails on them.
  std::variant<std::string, ApiError> render_chat(const nlohmann::ordered_json& messages,
                                                  const nlohmann::ordered_json& tools, bool add_generation_prompt,
                                                  const nlohmann::ordered_json& kwargs) const;

  Engine& engine_;
  Tokenizer tokenizer_;
  std::optional<ChatTemplate> chat_template_;
  ServiceOptions options_;
  ModelLimits limits_;
  bool reasoning_ = false;            // the reasoning parser is on
  ToolFormat tool_format_ = ToolFormat::kNone;
  std::vector<int32_t> think_tags_;   // the tokenizer's <think> and </think> tokens, if it has them
  std::vector<int32_t> call_markers_;  // the tokens of the tool call format's markers, if it has them
  int32_t think_open_ = -1, think_close_ = -1;  // the same, each (-1: none)
  ServerMetrics metrics_;
  std::atomic<bool> stopping_{false};
  Router router_;
  int64_t created_ = 0;  // unix time the service started (/v1/models "created")
};

}  // namespace dsi::server
