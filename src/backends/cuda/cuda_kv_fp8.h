// The fp8 KV-cache ops of the CUDA backend (ops/kv_fp8.h), same signatures and semantics as the CPU
// reference (backends/cpu/cpu_kv_fp8.h). Shapes, dtypes and devices are checked by ops/kv_fp8.cpp;
// these check the data (slots, pages, bounds, indices) on the device and throw the CPU's message.
// No CUDA includes: ops/kv_fp8.cpp includes it into a plain C++ translation unit.
#pragma once

#include "core/tensor.h"
#include "ops/kv_fp8.h"

namespace dsi::cuda {

void indexer_keys_store_fp8(const Tensor& keys, const Tensor& slots, Tensor& pool,
                            const ops::IndexerKeyPrep* prep);
void indexer_logits_fp8(const Tensor& q, const Tensor& weights, const Tensor& pool,
                        const Tensor& block_tables, const Tensor& row_seq, const Tensor& bounds,
                        float softmax_scale, Tensor& logits, const ops::IndexerQueryPrep* prep);
void mla_cache_store_fp8(const Tensor& rows, const Tensor& slots, Tensor& pool,
                         const ops::MlaKeyPrep* prep);
void mla_cache_load_fp8(const Tensor& pool, const Tensor& slots, Tensor& rows);
void sparse_mla_fp8(const Tensor& q, const Tensor& pool, const Tensor& indices, float softmax_scale,
                    int dv, Tensor& out, Tensor& lse, bool inputs_settled);

}  // namespace dsi::cuda
