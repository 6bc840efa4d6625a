// The sampling flags of `dsinfer generate` and `dsinfer chat`.
#pragma once

#include "dsinfer/sampling.h"

namespace CLI {
class App;
}

namespace dsi::cli {

// --temperature, --top-p, --top-k, --min-p, --presence-penalty, --frequency-penalty,
// --repetition-penalty and --seed into sp.
void add_sampling_flags(CLI::App* cmd, SamplingParams& sp);

}  // namespace dsi::cli
