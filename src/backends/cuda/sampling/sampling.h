// Greedy argmax on the GPU (one block per row; lowest id wins ties, exactly the CPU's sequential scan
// including its NaN behaviour). Temperature / top-p sampling is host logic: the logits row is copied
// to the host and the CPU reference runs on it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dsi::cuda {

struct ArgmaxParams {
  const float* logits;  // [rows, vocab], row stride logit_stride
  int32_t* out;         // [rows], stride out_stride
  int64_t logit_stride, out_stride;
  int64_t rows, vocab;
};
void launch_argmax(const ArgmaxParams& p, cudaStream_t stream);

}  // namespace dsi::cuda
