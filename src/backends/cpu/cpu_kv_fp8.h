// CPU reference of the fp8 KV-cache ops (ops/kv_fp8.h), and the scalar numerics they share with the
// tests: the Hadamard butterfly, the power-of-two scale, the e4m3 encoding. Shapes, dtypes and devices
// are checked by ops/kv_fp8.cpp before these run; these check the data (slots, pages, bounds).
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "ops/kv_fp8.h"

namespace dsi::cpu {

// In place x <- H_d x / sqrt(d) (Sylvester order), d a power of two: butterflies (a + b, a - b) in
// stage order h = 1, 2, 4, ..., d / 2, then each value times fp32(1 / sqrt(d)).
void hadamard_rotate(float* x, int64_t d);
// fp32(1 / sqrt(d)), the constant the rotation multiplies by (the GPU uses the same value).
float hadamard_scale(int64_t d);
// The power-of-two scale of a group: 2^ceil(log2(max(amax, 1e-4) / 448)), the quotient in fp32.
float ue8m0_scale(float amax);
// e4m3 byte of x (|x| <= 448): round to nearest even, a zero result stored as +0.
uint8_t quantize_e4m3(float x);
// Rotates and quantises one d-vector: out[d] e4m3 bytes, returns the scale (x is not modified).
float rotate_quantize(const float* x, int64_t d, uint8_t* out);

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

}  // namespace dsi::cpu
