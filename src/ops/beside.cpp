// Dispatch of run_beside; see beside.h.
#include "ops/beside.h"

#include "ops/dispatch.h"

namespace dsi::ops {

void run_beside(Device device, const std::function<void()>& side, const std::function<void()>& main) {
  DSI_DISPATCH(device, run_beside, device, side, main);
}

}  // namespace dsi::ops
