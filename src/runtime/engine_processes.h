// The serving engine over ranks in several processes (mpirun starts one process per rank; tp = the
// process count). Built with MPI only (DSI_WITH_MPI).
#pragma once

#include <memory>

#include "dsinfer/engine.h"

namespace dsi {

class MpiSession;

// Collective over every process of `session`. On rank 0's process: the engine (its requests, events
// and metrics), whose every step all processes run. On the others: runs those steps until rank 0's
// engine is destroyed, then returns null. A process that fails ends the MPI job with a message
// naming its rank, so no process waits forever on another.
std::unique_ptr<Engine> start_engine_processes(const EngineOptions& options, MpiSession& session);

}  // namespace dsi
