// Two pieces of a step that do not depend on each other, run side by side on one device: on the GPU
// `side` goes to the device's second stream (from the point where it is called, joined back before
// whatever follows the call), so a latency-bound chain of small kernels can run while the other
// piece streams weights. The CPU backend runs side, then main.
#pragma once

#include <functional>

#include "core/tensor.h"

namespace dsi::ops {

// Runs side and main, which may overlap; both are done before the ops issued after the call. Neither
// may read what the other writes, nor run a collective (only the main piece's stream is in step with
// the other ranks'), nor call run_beside again. Tensors either piece frees are not handed to other
// work until both are done.
void run_beside(Device device, const std::function<void()>& side, const std::function<void()>& main);

}  // namespace dsi::ops
