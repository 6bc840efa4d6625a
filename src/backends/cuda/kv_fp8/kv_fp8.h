// Kernels of the fp8 KV caches (ops/kv_fp8.h): Hadamard rotation + power-of-two e4m3 quantisation
// into the paged indexer-key cache and the 656-byte MLA cache, indexer decode logits over paged keys
// (d = 128: fp8 tensor cores, sm90_indexer_logits.cu, equal to the reference up to summation order;
// other d: one thread per key in the CPU's operation order, bitwise equal), and sparse MLA over the
// fp8 cache (decode: split-KV on tensor cores, sm90_sparse_mla_decode.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dsi::cuda {

// Rotate + quantise d-vectors, one block per vector. Store mode (pool != null): into the paged
// indexer-key cache. Query mode (q8 or q8_bytes != null): the e4m3 values (as f32, as bytes or
// both) and the folded head weights.
struct RotateQuantParams {
  const float* x;          // [n, d], row stride x_stride (keys [m, d] or q [rows * heads, d])
  int64_t x_stride, n;
  int d;                   // power of two, 16..128
  float hadamard_scale;    // fp32(1 / sqrt(d))
  // store mode
  const int32_t* slots;    // [n] physical slots, -1 = skip
  uint8_t* pool;           // [n_pages, 64 * (d + 4)]: 64 x d e4m3, then 64 x f32 scales
  int64_t n_pages;
  unsigned long long* bad;  // lowered to the first vector whose slot is outside the pool
  // store mode, optional (norm_weight != null): LayerNorm of each vector first, layer_norm_kernel's
  // arithmetic for the same input (norm_vec4: its float4 path, one float4 per thread; else one value
  // per thread), then the RoPE below
  const float* norm_weight;  // [d]
  const float* norm_bias;    // [d]
  float eps;
  bool norm_vec4;
  // query mode
  const float* weights;    // [n] head weights (carrying H^-1/2, or times weights_scale below)
  float softmax_scale;
  float* q8;               // [n, d] e4m3 values as f32 (exact), or null
  uint8_t* q8_bytes;       // [n, d] the same values as e4m3 bytes, or null
  float* wq;               // [n] ((weights * weights_scale) * q_scale) * softmax_scale
  float weights_scale = 1.0f;  // 1: the weights as given
  // optional (positions != null): RoPE of each vector's dims [0, 2 * rope_half) at its row's
  // position before the rotation, rope_kernel's arithmetic (vector i: head i % heads of row
  // i / heads; keys: heads = 1)
  const int32_t* positions;  // [n / heads]
  const float* inv_freq;     // [rope_half]
  int rope_half, heads;
  bool interleaved;
  float attention_factor;
};
void launch_rotate_quant(const RotateQuantParams& p, cudaStream_t stream);
// Whether d = 128 without LayerNorm (the models' query rotation and plain key stores) runs one warp
// per vector instead of one block (the same bits): on unless DSI_ROTATE_WARP=0 or switched here.
bool rotate_quant_warp();
void set_rotate_quant_warp(bool on);

struct IndexerLogitsFp8Params {
  const float* q8;             // [rows, heads, d] e4m3 values as f32 (rotate_quant query mode):
                               // the CUDA-core kernel's query
  const uint8_t* q8_bytes;     // [rows, heads, d] the same as e4m3 bytes, 16-byte aligned: the
                               // tensor-core kernel's query
  const float* wq;             // [rows, heads] folded weights
  const uint8_t* pool;         // [n_pages, 64 * (d + 4)], 16-byte aligned
  const int32_t* block_tables; // [n_seqs, max_pages] physical page ids, -1 = unused
  const int32_t* row_seq;      // [rows] sequence of each row
  const int32_t* bounds;       // [rows] row r sees keys [0, bounds[r])
  float* logits;               // [rows, n_cols] contiguous, -inf at or past the bound
  int64_t rows, n_cols, n_pages, n_seqs, max_pages;
  int heads, d;
  unsigned long long* bad_row;   // lowered to the first row with a bad sequence or bound
  unsigned long long* bad_page;  // lowered to the first seq * max_pages + p with a bad page id
};
// Shared memory of the logits kernel (bytes): the row's quantised query and weights.
size_t indexer_logits_fp8_smem_bytes(int heads, int d);
void launch_indexer_logits_fp8(const IndexerLogitsFp8Params& p, cudaStream_t stream);

struct MlaStoreFp8Params {
  const float* rows;        // [m, 576], row stride row_stride
  const int32_t* slots;     // [m], -1 = skip
  uint8_t* pool;            // [n_slots, 656], 4-byte aligned
  int64_t row_stride, m, n_slots;
  unsigned long long* bad;  // lowered to the first row whose slot is outside the pool
  // Key preparation (ops::MlaKeyPrep), when norm_weight is set: RMSNorm of the latent, RoPE of k_pe.
  const float* norm_weight = nullptr;  // [512]
  float eps = 0.0f;
  const int32_t* positions = nullptr;  // [m]
  const float* inv_freq = nullptr;     // [32]
  float attention_factor = 1.0f;
  bool interleaved = true;
};
void launch_mla_store_fp8(const MlaStoreFp8Params& p, cudaStream_t stream);

struct MlaLoadFp8Params {
  const uint8_t* pool;      // [n_slots, 656]
  const int32_t* slots;     // [m], -1 = a row of zeros
  float* rows;              // [m, 576] contiguous
  int64_t m, n_slots;
  unsigned long long* bad;  // lowered to the first row whose slot is outside the pool
};
void launch_mla_load_fp8(const MlaLoadFp8Params& p, cudaStream_t stream);

struct SparseMlaFp8Params {
  const float* q;           // [rows, heads, 576], strides q_s0, q_s1 (last dim contiguous)
  const uint8_t* pool;      // [n_slots, 656], 16-byte aligned
  const int32_t* indices;   // [rows, topk] contiguous physical slots, any negative = empty
  float* out;               // [rows, heads, 512] contiguous
  float* lse;               // [rows, heads] contiguous, natural log; -inf for a row with no key
  int64_t q_s0, q_s1, rows, heads, n_slots, topk;
  float softmax_scale;
  unsigned long long* bad;  // lowered to the first flat index r * topk + j with indices >= n_slots
};
void launch_sparse_mla_fp8(const SparseMlaFp8Params& p, cudaStream_t stream);

}  // namespace dsi::cuda
