// The serving engine's command-line flags, shared by `dsinfer serve` and `dsinfer chat`.
#pragma once

#include <memory>
#include <string>

#include "dsinfer/engine.h"

namespace CLI {
class App;
}

namespace dsi {
class MpiSession;
}

namespace dsi::cli {

struct EngineFlags {
  EngineOptions engine;
  std::string kv_cache_memory;  // "2G", ... (parsed after the command line)
  bool no_cuda_graphs = false;
  bool no_prefix_caching = false;
};

void add_engine_flags(CLI::App* cmd, EngineFlags& flags);
// Engine::start with the flags; throws dsi::Error on a bad model, option or device. Under mpirun
// (`mpi` with several processes: one rank each) the engine's ranks are the processes: rank 0's
// process gets the engine, the others run its steps until it stops and get null.
std::unique_ptr<Engine> start_engine(const EngineFlags& flags, MpiSession* mpi = nullptr);
// "512M" -> bytes; throws dsi::Error naming the flag.
int64_t parse_bytes(const std::string& text);

}  // namespace dsi::cli
