// Rotary position embedding: frequency tables (default and YaRN, as HF modeling_rope_utils) and
// the rotation itself in both layouts (interleaved pairs and half-split / NeoX).
#pragma once

#include <vector>

#include "core/tensor.h"
#include "model/config.h"

namespace dsi::ops {

struct RopeFreqs {
  std::vector<float> inv_freq;    // [rot_dim / 2], computed in fp32 like the reference
  float attention_factor = 1.0f;  // multiplies cos and sin (1 for the DSA models' configs)
};

// HF `_compute_default_rope_parameters` / `_compute_yarn_parameters` for a rotary dim `rot_dim`.
RopeFreqs compute_rope_freqs(const RopeConfig& rope, int rot_dim);

// Rotates x[r, h, offset : offset + 2*inv_freq.size()] in place by angle pos[r] * inv_freq[i].
// x: [n, heads, d] f32, last dim contiguous, other dims may be strided; positions: [n] i32;
// inv_freq: [rot_dim / 2] f32. Interleaved rotates (x[2i], x[2i+1]); half-split (x[i], x[i+rot/2]).
// With `out` ([n, heads, rot_dim] f32, last dim contiguous; on x's device, not overlapping x unless
// it is exactly those dims of x) the rotated dims are written there instead and x is left as it is.
void rope(Tensor& x, const Tensor& positions, const Tensor& inv_freq, float attention_factor,
          RopeStyle style, int offset, Tensor* out = nullptr);

}  // namespace dsi::ops
