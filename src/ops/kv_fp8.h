// The fp8 KV caches of the deployment numerics (dsa-reference.md section 2, "Deployment numerics"):
// the lightning indexer's key cache (Hadamard-rotated keys, e4m3 + one power-of-two scale per token,
// 132 B/token for d = 128, paged by 64 tokens) with its decode logits, and the 656-byte MLA latent
// cache (FlashMLA / vLLM "fp8_ds_mla" layout) with sparse attention over it.
//
// Paging conventions (shared with the model's paged caches):
//   pages hold kKvPageTokens = 64 tokens; a physical slot is page * 64 + offset;
//   block_tables: [n_seqs, max_pages] i32 physical page ids (-1 = unused);
//   row_seq: [rows] i32, the sequence of each query row;
//   a sequence's local key s lives in page block_tables[seq, s / 64] at offset s % 64;
//   bounds: [rows] i32, row r sees its sequence's keys [0, bounds[r]) (MTP verification rows of one
//   sequence carry their own causal bounds).
//
// Quantisation rule (both caches): per group of values, amax = max(max |x|, 1e-4) and
// scale = 2^ceil(log2(amax / 448)) (a "ue8m0" power of two, so x / scale is exact before the e4m3
// rounding); e4m3 values are rounded to nearest even (|x / scale| <= 448, no saturation happens), and
// a quantised zero is stored as +0 (0x00) whatever the sign of the input. Inputs must be finite.
// For the MLA cache FlashMLA's current quantiser also uses power-of-two tile scales; vLLM's
// concat_and_cache_ds_mla writes amax / 448 instead. Readers only multiply by the stored fp32 scale,
// so both variants decode alike; dsinfer writes the power of two (exact scaling, bitwise-equal CPU
// and GPU caches).
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "model/config.h"

namespace dsi::ops {

inline constexpr int kKvPageTokens = 64;
inline constexpr float kFp8AmaxFloor = 1e-4f;
// MLA fp8 cache entry: [512 e4m3 | 4 x f32 tile scales | 64 x bf16 RoPE] = 656 bytes.
inline constexpr int kMlaFp8Lora = 512;
inline constexpr int kMlaFp8Rope = 64;
inline constexpr int kMlaFp8Tile = 128;
inline constexpr int kMlaFp8Tiles = kMlaFp8Lora / kMlaFp8Tile;
inline constexpr int kMlaFp8ScaleOffset = kMlaFp8Lora;                       // bytes
inline constexpr int kMlaFp8RopeOffset = kMlaFp8Lora + 4 * kMlaFp8Tiles;     // bytes
inline constexpr int kMlaFp8Bytes = kMlaFp8RopeOffset + 2 * kMlaFp8Rope;     // 656
// Indexer key cache page: [64 x d e4m3 | 64 x f32 scales].
inline constexpr int64_t indexer_page_bytes(int64_t d) { return kKvPageTokens * (d + 4); }

// What the indexer does to wk's output before it caches it: LayerNorm (k <- (k - mean) / sqrt(var +
// eps) * norm_weight + norm_bias), then RoPE of its first 2 * inv_freq.size() dims at the row's
// position ("rope first").
struct IndexerKeyPrep {
  Tensor norm_weight, norm_bias;  // [d] f32
  float eps = 1e-6f;
  Tensor positions;  // [m] i32
  Tensor inv_freq;   // [rot_dim / 2] f32, rot_dim <= d
  float attention_factor = 1.0f;
  RopeStyle style = RopeStyle::kInterleaved;
};

// What the indexer does to its query and head weights before the logits: RoPE of each head's first
// 2 * inv_freq.size() dims at the row's position ("rope first"), and the head weights times
// H^-1/2 (weights_scale).
struct IndexerQueryPrep {
  Tensor positions;  // [rows] i32
  Tensor inv_freq;   // [rot_dim / 2] f32, rot_dim <= d
  float attention_factor = 1.0f;
  RopeStyle style = RopeStyle::kInterleaved;
  float weights_scale = 1.0f;
};

// Quantises and stores indexer keys. keys: [m, d] f32 (row-strided ok), d a power of two in
// [16, 128]; slots: [m] i32 physical slots, -1 = skip (distinct otherwise); pool: [n_pages,
// 64 * (d + 4)] U8 contiguous. Each key is rotated by the Sylvester Hadamard matrix H_d / sqrt(d)
// (butterflies in stage order 1, 2, 4, ..., then one multiply by fp32(1/sqrt(d))), quantised with
// one scale, and written to page slot / 64 at offset slot % 64.
// With `prep`, keys are wk's raw output: what is stored is ops::layer_norm, then ops::rope, of the
// keys (the same bits as running those ops first on the same device; the GPU does all in one
// kernel), and keys are left as they are.
void indexer_keys_store_fp8(const Tensor& keys, const Tensor& slots, Tensor& pool,
                            const IndexerKeyPrep* prep = nullptr);

// Indexer logits over the paged fp8 key cache. q: [rows, H, d] f32 contiguous (rotated and quantised
// per head inside, same rule as the keys); weights: [rows, H] f32, already carrying H^-1/2 (or see prep);
// pool as above; block_tables, row_seq, bounds as in the header comment; logits: [rows, n_keys] f32
// contiguous, n_keys >= every bound; entries at or past a row's bound are -inf. For s < bound:
//   logit[r, s] = k_scale_s * sum_j w'[r, j] * relu(q8[r, j] . k8[s]),
//   w'[r, j] = (w[r, j] * q_scale[r, j]) * softmax_scale,
// the dot product over the e4m3 values in fp32 (c ascending), heads summed in j order, every product
// and sum rounded (no fused multiply-add) in the CPU reference; the CUDA tensor-core kernel (d = 128)
// sums the exact e4m3 products in another order and, per 32 products, in the fp8 MMA's narrower
// accumulator (measured within 1e-4 of the sum of |terms|; tested at 2^-10). Equal in exact
// math to ops::indexer_logits on the unquantised keys when nothing is lost to fp8.
// With `prep`, q and weights are the raw projections (wq_b's and weights_proj's outputs): the logits
// are those of ops::rope(q) and weights * prep->weights_scale (the same bits as running those ops
// first; the GPU does both inside the query's rotation), and q and weights are left as they are.
void indexer_logits_fp8(const Tensor& q, const Tensor& weights, const Tensor& pool,
                        const Tensor& block_tables, const Tensor& row_seq, const Tensor& bounds,
                        float softmax_scale, Tensor& logits, const IndexerQueryPrep* prep = nullptr);

// What MLA does to kv_a_proj's output before it caches it: c_kv <- RMSNorm(c_kv) * norm_weight,
// k_pe <- RoPE(k_pe) at each row's position.
struct MlaKeyPrep {
  Tensor norm_weight;  // [512] f32
  float eps = 0.0f;
  Tensor positions;    // [m] i32
  Tensor inv_freq;     // [32] f32
  float attention_factor = 1.0f;
  RopeStyle style = RopeStyle::kInterleaved;
};

// Quantises and stores MLA cache rows. rows: [m, 576] f32 (row-strided ok, [c_kv (512) | k_pe (64)]);
// slots: [m] i32, -1 = skip (distinct otherwise); pool: [n_slots, 656] U8 contiguous. The latent is
// quantised in 4 tiles of 128 (one scale each), k_pe is stored as bf16 (round to nearest even).
// With `prep`, rows are kv_a_proj's raw output: what is stored is ops::rms_norm of the latent and
// ops::rope of k_pe (the same bits as running those ops first; the GPU does all in one kernel), and
// rows are left as they are.
void mla_cache_store_fp8(const Tensor& rows, const Tensor& slots, Tensor& pool,
                         const MlaKeyPrep* prep = nullptr);

// Dequantises cache rows: rows[i] = decode(pool[slots[i]]) (a -1 slot gives a row of zeros).
// pool: [n_slots, 656] U8; slots: [m] i32; rows: [m, 576] f32 contiguous.
void mla_cache_load_fp8(const Tensor& pool, const Tensor& slots, Tensor& rows);

// ops::sparse_mla (ops/mla.h) with keys and values decoded from the fp8 MLA cache. The CPU reference
// keeps q and the softmax weights in f32; the CUDA decode kernel (bf16 tensor cores) rounds q and the
// softmax weights P to bf16 (the e4m3 cache values are used exactly), within ~1e-6 normalised MSE.
// q: [rows, H, 576] f32 (last dim contiguous); pool: [n_slots, 656] U8; indices: [rows, topk] i32
// physical slots, -1 = empty; dv must be 512 (the value is the decoded latent); out: [rows, H, 512]
// f32 contiguous; lse: [rows, H] f32, natural log. A row with no key gets out = 0 and lse = -inf.
// inputs_settled: the caller's promise that the op issued right before this one on the device writes
// neither `pool` nor `indices`. A scheduling hint (the CUDA kernel then reads them, and starts the
// gather, while that op still runs); the results are the same either way.
void sparse_mla_fp8(const Tensor& q, const Tensor& pool, const Tensor& indices, float softmax_scale,
                    int dv, Tensor& out, Tensor& lse, bool inputs_settled = false);

}  // namespace dsi::ops
