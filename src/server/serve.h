// Runs the OpenAI-compatible server over an Engine until SIGINT or SIGTERM: the transport, the
// routes and a signal thread that stops them; in-flight requests are cancelled on the way out.
#pragma once

#include <optional>
#include <string>

#include "dsinfer/engine.h"
#include "server/http.h"
#include "server/openai_routes.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace dsi::server {

// Binds host:port (throws dsi::Error when it cannot), logs the address, serves until SIGINT /
// SIGTERM (handled while it runs, on whichever thread the kernel picks). Returns 0.
int serve(Engine& engine, Tokenizer tokenizer, std::optional<ChatTemplate> chat_template,
          const HttpServerOptions& http, const ServiceOptions& service);

// The model directory's chat template, or none (logged) when it has no template.
std::optional<ChatTemplate> load_chat_template(const std::string& model_dir);

}  // namespace dsi::server
