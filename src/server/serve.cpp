// serve(): transport + routes + a signal thread.
#include "server/serve.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <thread>

#include "dsinfer/error.h"

namespace dsi::server {

namespace {
// The self-pipe of the stop signals: a handler may run on any thread (libraries start threads of
// their own before main), so it only writes the signal number here, for the signal thread to read.
// Process-wide by nature (signal dispositions are), hence the one static.
int g_signal_pipe[2] = {-1, -1};

extern "C" void on_stop_signal(int sig) {
  const char c = char(sig);
  [[maybe_unused]] const ssize_t n = write(g_signal_pipe[1], &c, 1);
}
}  // namespace

std::optional<ChatTemplate> load_chat_template(const std::string& model_dir) {
  namespace fs = std::filesystem;
  const bool has = fs::exists(fs::path(model_dir) / "chat_template.jinja") ||
                   fs::exists(fs::path(model_dir) / "chat_template.json") ||
                   fs::exists(fs::path(model_dir) / "tokenizer_config.json");
  if (!has) {
    spdlog::warn("{} has no chat template: /v1/chat/completions will refuse requests", model_dir);
    return std::nullopt;
  }
  try {
    return ChatTemplate::load(model_dir);
  } catch (const dsi::Error& e) {
    spdlog::warn("no chat template ({}): /v1/chat/completions will refuse requests", e.what());
    return std::nullopt;
  }
}

int serve(Engine& engine, Tokenizer tokenizer, std::optional<ChatTemplate> chat_template,
          const HttpServerOptions& http, const ServiceOptions& service) {
  OpenAiService api(engine, std::move(tokenizer), std::move(chat_template), service);
  HttpServer server(api.router(), http);
  const int port = server.bind();
  spdlog::info("serving {} on http://{}:{} (max_model_len {}; pid {} stops on SIGINT / SIGTERM)",
               api.limits().id, http.host, port, api.limits().max_model_len, int(getpid()));

  // The signal thread: waits for SIGINT / SIGTERM (or the wake-up byte 0 when serving ends alone).
  if (pipe2(g_signal_pipe, O_CLOEXEC) != 0) fail("cannot create the signal pipe");
  struct sigaction sa {}, old_int{}, old_term{};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  std::atomic<bool> served{false};
  std::thread signals([&] {
    char c = 0;
    while (read(g_signal_pipe[0], &c, 1) < 0 && errno == EINTR) {
    }
    if (c == 0) return;
    spdlog::info("signal {}: stopping", int(c));
    api.shutdown();
    // stop() acts only on a running listener: repeat until serve() has returned, in case the
    // signal came before the listener started.
    while (!served.load()) {
      server.stop();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  server.serve();
  served.store(true);
  api.shutdown();
  const char wake = 0;
  [[maybe_unused]] const ssize_t n = write(g_signal_pipe[1], &wake, 1);
  signals.join();
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  close(g_signal_pipe[0]);
  close(g_signal_pipe[1]);
  g_signal_pipe[0] = g_signal_pipe[1] = -1;
  spdlog::info("server stopped");
  return 0;
}

}  // namespace dsi::server
