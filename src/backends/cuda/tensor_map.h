// Tensor maps for the copy engine (cp.async.bulk.tensor; ptx.cuh's tma_load_3d): byte tensors of
// 1..5 dimensions described through cuTensorMapEncodeTiled, reached through the runtime's driver
// entry point (no link against the driver library).
#pragma once

#include <cuda.h>

#include <cstdint>

namespace dsi::cuda {

// The map of a uint8 tensor at `base` with `rank` dimensions (dims[0] innermost, in bytes),
// strides[i] the byte distance between consecutive indices of dimension i + 1 (multiples of 16),
// one copy a box of box[i] elements per dimension, written to shared memory in `swizzle`. Throws
// (naming `what`) when the driver has no encoder or rejects the description.
CUtensorMap byte_tensor_map(const void* base, int rank, const uint64_t* dims, const uint64_t* strides,
                            const uint32_t* box, CUtensorMapSwizzle swizzle, const char* what);

}  // namespace dsi::cuda
