// Dispatch of the normalisation ops; see norm.h.
#include "ops/norm.h"

#include "ops/dispatch.h"

namespace dsi::ops {

void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) {
  DSI_DISPATCH(x.device(), rms_norm, x, weight, eps, out);
}

void add_rms_norm(Tensor& h, const Tensor& delta, const Tensor& weight, float eps, Tensor& out) {
  DSI_CHECK(delta.shape() == h.shape(), "add_rms_norm: delta {} for h {}", delta.desc(), h.desc());
  DSI_CHECK(delta.device() == h.device(), "add_rms_norm: delta on {}, h on {}", delta.device().str(),
            h.device().str());
  DSI_DISPATCH(h.device(), add_rms_norm, h, delta, weight, eps, out);
}

void layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps, Tensor& out) {
  DSI_DISPATCH(x.device(), layer_norm, x, weight, bias, eps, out);
}

}  // namespace dsi::ops
