// Indexer decode logits on the tensor cores (sm_90a: wgmma with e4m3 operands, f32 accumulators),
// the fast path of ops::indexer_logits_fp8 for d = 128 and up to 128 heads. Same Params as the
// CUDA-core kernel (kv_fp8.h). Design and numerics: docs in sm90_indexer_logits.cu's header.
#pragma once

#include <cuda_runtime.h>

#include "backends/cuda/kv_fp8/kv_fp8.h"

namespace dsi::cuda {

// True when the tensor-core kernel handles this shape (d = 128, 1..128 heads) on the current device.
bool indexer_logits_fp8_mma_supported(int heads, int d);

// Same contract as launch_indexer_logits_fp8, except that the head sums are not in the CPU's order:
// logits agree with the reference to a stated tolerance (see the .cu), not bitwise. It reads the
// rows' sequences and bounds, the block tables and the key pages before its programmatic wait
// (common.cuh), so the kernel launched right before it on the stream must not write those
// (ops::indexer_logits_fp8 launches the query rotation there).
void launch_indexer_logits_fp8_mma(const IndexerLogitsFp8Params& p, cudaStream_t stream);

// The blocks that share each row group's pages, forced on every call for tests and comparisons
// (few blocks: each walks many pages through its ring); 0 (the default) lets the launch choose.
void set_indexer_logits_blocks(int blocks);

}  // namespace dsi::cuda
