// `dsinfer serve` (the OpenAI-compatible HTTP server over the serving engine) and `dsinfer chat`
// (an interactive conversation on stdin/stdout through the same engine and chat template).
#pragma once

#include <memory>

namespace CLI {
class App;
}

namespace dsi {
class MpiSession;
}

namespace dsi::cli {

struct ServeOptions;
struct ChatOptions;

// Adds the "serve" subcommand to `app`; after app.parse(), run() serves if parsed().
class ServeCommand {
 public:
  explicit ServeCommand(CLI::App& app);
  ~ServeCommand();
  ServeCommand(const ServeCommand&) = delete;
  ServeCommand& operator=(const ServeCommand&) = delete;
  bool parsed() const;
  // Throws dsi::Error (one line) on a bad model, option or port. Under mpirun (`mpi` with several
  // processes) rank 0 serves and the other processes run the engine's ranks.
  int run(MpiSession* mpi = nullptr) const;

 private:
  std::unique_ptr<ServeOptions> options_;
  CLI::App* sub_ = nullptr;
};

// Adds the "chat" subcommand: reads user lines from stdin, prints each reply on stdout.
class ChatCommand {
 public:
  explicit ChatCommand(CLI::App& app);
  ~ChatCommand();
  ChatCommand(const ChatCommand&) = delete;
  ChatCommand& operator=(const ChatCommand&) = delete;
  bool parsed() const;
  int run() const;

 private:
  std::unique_ptr<ChatOptions> options_;
  CLI::App* sub_ = nullptr;
};

}  // namespace dsi::cli
