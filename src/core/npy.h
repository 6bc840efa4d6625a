// NumPy .npy files (format version 1.0): write float32 / int32 tensors, read them back.
// Used by `dsinfer logits --out` and by the tests that compare against golden outputs.
#pragma once

#include <string>

#include "core/tensor.h"

namespace dsi {

// Writes a contiguous host F32 or I32 tensor as little-endian C-order .npy.
void write_npy(const std::string& path, const Tensor& t);
// Reads a little-endian C-order .npy of dtype <f4 or <i4 into a host tensor; errors name the file.
Tensor read_npy(const std::string& path);

}  // namespace dsi
