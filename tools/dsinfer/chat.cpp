// `dsinfer chat`: a conversation on stdin/stdout. Each non-empty input line is a user message; the
// whole conversation is rendered by the model's chat template, run through the serving engine, and
// the reply is printed as it is generated (one line per reply; stop strings as in the server).
// Works with piped stdin (one reply per line, then exit at end of input).
#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <iostream>
#include <nlohmann/json.hpp>

#include "dsinfer/error.h"
#include "engine_flags.h"
#include "sampling_flags.h"
#include "serve.h"
#include "server/event_queue.h"
#include "server/output_text.h"
#include "server/serve.h"

namespace dsi::cli {

struct ChatOptions {
  EngineFlags flags;
  int max_tokens = 256;
  SamplingParams sampling;
  std::string system;
  std::vector<std::string> stop;
  std::string template_kwargs = "{}";
};

ChatCommand::ChatCommand(CLI::App& app) : options_(std::make_unique<ChatOptions>()) {
  sub_ = app.add_subcommand("chat", "chat with the model: user lines on stdin, replies on stdout");
  ChatOptions& o = *options_;
  add_engine_flags(sub_, o.flags);
  sub_->add_option("--max-tokens", o.max_tokens, "tokens per reply at most (default 256)")
      ->check(CLI::PositiveNumber);
  add_sampling_flags(sub_, o.sampling);
  sub_->add_option("--system", o.system, "a system message that starts the conversation");
  sub_->add_option("--stop", o.stop, "stop strings (repeatable)");
  sub_->add_option("--chat-template-kwargs", o.template_kwargs,
                   "JSON object of extra template variables, e.g. '{\"enable_thinking\": false}'");
}

ChatCommand::~ChatCommand() = default;
bool ChatCommand::parsed() const { return sub_->parsed(); }

int ChatCommand::run() const {
  const ChatOptions& o = *options_;
  using Json = nlohmann::ordered_json;
  Json kwargs;
  try {
    kwargs = Json::parse(o.template_kwargs);
  } catch (const std::exception& e) {
    fail("--chat-template-kwargs: not JSON: {}", e.what());
  }
  if (!kwargs.is_object()) fail("--chat-template-kwargs: must be a JSON object");
  const std::string& dir = o.flags.engine.model_dir;
  const Tokenizer tokenizer = Tokenizer::load(dir + "/tokenizer.json");
  const ChatTemplate chat_template = ChatTemplate::load(dir);
  std::unique_ptr<Engine> engine = start_engine(o.flags);
  const int64_t max_len = engine->info().max_model_len;

  const bool interactive = isatty(STDIN_FILENO);
  Json messages = Json::array();
  if (!o.system.empty()) messages.push_back({{"role", "system"}, {"content", o.system}});
  std::string line;
  for (;;) {
    if (interactive) std::cerr << "> " << std::flush;
    if (!std::getline(std::cin, line)) break;
    if (line.empty()) continue;
    messages.push_back({{"role", "user"}, {"content", line}});
    const std::string text = chat_template.render(messages, Json(nullptr), true, kwargs);
    EngineRequest req;
    req.prompt = tokenizer.encode(text, /*add_special_tokens=*/false);  // the template has them
    const int64_t room = max_len - int64_t(req.prompt.size());
    if (room < 1) {
      std::cerr << "error: the conversation (" << req.prompt.size() << " tokens) fills the model's "
                << max_len << "-token context; this message is dropped\n";
      messages.erase(messages.size() - 1);
      continue;
    }
    req.max_new_tokens = int(std::min<int64_t>(o.max_tokens, room));
    req.sampling = o.sampling;
    auto queue = std::make_shared<server::EventQueue>();
    const uint64_t id = engine->submit(std::move(req), server::EventQueue::sink_for(queue));
    server::OutputText out(tokenizer, /*skip_special_tokens=*/true, o.stop, false);
    bool done = false;
    std::string error;
    while (!done) {
      for (RequestEvent& ev : queue->pop(std::chrono::milliseconds(200))) {
        if (done) break;
        std::cout << out.push(ev.tokens).text << std::flush;
        if (out.stopped() || ev.finished) {
          done = true;
          if (out.stopped()) engine->cancel(id);  // a stop string: the engine need not go on
          if (ev.finish_reason == "error") error = ev.error;
        }
      }
    }
    std::cout << out.finish().text << std::endl;
    if (!error.empty()) fail("generation failed: {}", error);
    messages.push_back({{"role", "assistant"}, {"content", out.text()}});
  }
  return 0;
}

}  // namespace dsi::cli
