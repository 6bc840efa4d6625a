// Tensor helpers shared by the device communicators (nccl_comm.h, peer_comm.h): overlap tests,
// contiguous staging and the host-tensor aliases the shared argument checks of lockstep.h take.
#pragma once

#include "core/tensor.h"

namespace dsi {

// Whether the byte ranges two tensors' elements occupy (any strides >= 0) intersect.
bool overlaps(const Tensor& a, const Tensor& b);
// A host tensor of t's shape and dtype over t's pointer (never dereferenced): lets the shared
// argument checks of lockstep.h, written for host tensors, judge device tensors in the same words.
Tensor shape_alias(const Tensor& t);
// A contiguous tensor with t's contents on t's device (t itself when already contiguous).
Tensor device_contiguous(const Tensor& t);
// dst = src on one device, for any overlap between them.
void copy_device(Tensor& dst, const Tensor& src);

}  // namespace dsi
