// Paged KV caches for incremental decode. A rank's KvPool holds, for every layer, the MLA latent
// pool (c_kv after kv_a_layernorm, then k_pe after RoPE: kv_lora + rope values per token) and, on
// layers with their own indexer, the indexer-key pool (LayerNorm + RoPE'd keys); the MTP layer has
// its own pair. Pools are cut into pages of kPageTokens slots: slot page * 64 + i holds the i-th
// token of that page. A sequence owns a list of pages (its block table); its local token l (in
// this rank's DCP order, runtime/parallel.h) lives in slot pages[l / 64] * 64 + l % 64. Under DCP
// one logical page spans W x 64 tokens of the sequence: each rank keeps its 64 in its own pool,
// under the same page id (all ranks allocate alike). Rows are fp32 or fp8 (KvCacheDtype).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/config.h"
#include "runtime/parallel.h"

namespace dsi {

constexpr int64_t kPageTokens = 64;

// How cached keys are stored: fp32 rows (the reference), bf16 rows (half the bytes; values rounded
// to nearest even when stored), or the deployment's fp8 formats (ops/kv_fp8.h): the 656-byte MLA
// entry (512 e4m3 + 4 fp32 scales + 64 bf16 RoPE values; needs kv_lora_rank 512 and
// qk_rope_head_dim 64) and Hadamard-rotated e4m3 indexer keys with one scale.
enum class KvCacheDtype { kF32, kBf16, kFp8 };
KvCacheDtype parse_kv_cache_dtype(const std::string& name);  // "f32", "bf16" or "fp8"
// As parse_kv_cache_dtype, and "auto": the CPU reference keeps f32; a GPU takes fp8 when the model
// has the 656-byte entry's geometry (kv_lora_rank 512, qk_rope_head_dim 64, a power-of-two
// index_head_dim up to 128), else bf16.
KvCacheDtype resolve_kv_cache_dtype(const std::string& name, const ModelConfig& cfg, Device device);
const char* kv_cache_dtype_name(KvCacheDtype dtype);

struct LayerKvCache {
  Tensor latent;      // f32 / bf16: [n_pages * 64, kv_lora + rope]; fp8: U8 [n_pages * 64, 656]
  Tensor index_keys;  // f32 / bf16: [n_pages * 64, index_head_dim]; fp8: U8 [n_pages, 64 * (d + 4)];
                      // undefined on "shared" layers
};

// One rank's pages for every layer (and the MTP layer when asked).
struct KvPool {
  KvPool(const ModelConfig& cfg, int64_t n_pages, bool with_mtp, Device device = Device::cpu(),
         KvCacheDtype dtype = KvCacheDtype::kF32);
  // Bytes one page takes in every layer's pools on one rank.
  static int64_t bytes_per_page(const ModelConfig& cfg, bool with_mtp,
                                KvCacheDtype dtype = KvCacheDtype::kF32);

  int64_t n_pages = 0;
  KvCacheDtype dtype = KvCacheDtype::kF32;
  std::vector<LayerKvCache> layers;
  LayerKvCache mtp;  // undefined without the MTP layer
  Device device;
};

class SequenceKvCache {
 public:
  // A sequence with a private pool just large enough for `capacity` tokens (pages 0, 1, ... in
  // order, so local token l sits in slot l); for single-sequence generation.
  SequenceKvCache(const ModelConfig& cfg, int64_t capacity, bool with_mtp,
                  const DcpLayout& dcp = {}, Device device = Device::cpu(),
                  KvCacheDtype dtype = KvCacheDtype::kF32);
  // A sequence in a shared pool; it starts without pages (set_pages gives them).
  SequenceKvCache(std::shared_ptr<KvPool> pool, const DcpLayout& dcp);

  // Tokens of the sequence its pages can hold (the same on every rank of the DCP group).
  int64_t capacity() const { return capacity_; }
  int64_t length() const { return length_; }          // main-model tokens cached
  int64_t mtp_length() const { return mtp_length_; }  // MTP-layer positions cached
  void set_length(int64_t n);
  void set_mtp_length(int64_t n);

  const std::vector<int32_t>& pages() const { return pages_; }
  void set_pages(std::vector<int32_t> pages);
  // The pool slot of the sequence's token at global position p (which this rank must own).
  int64_t slot_of(int64_t p) const;
  // Pages needed on every rank to hold `tokens` tokens of a sequence under `dcp`.
  static int64_t pages_for(const DcpLayout& dcp, int64_t tokens);

  const KvPool& pool() const { return *pool_; }
  const std::shared_ptr<KvPool>& shared_pool() const { return pool_; }
  const DcpLayout& dcp() const { return dcp_; }
  LayerKvCache& layer(int i) { return pool_->layers.at(size_t(i)); }
  const LayerKvCache& layer(int i) const { return pool_->layers.at(size_t(i)); }
  LayerKvCache& mtp() { return pool_->mtp; }
  const LayerKvCache& mtp() const { return pool_->mtp; }
  bool has_mtp() const { return pool_->mtp.latent.defined(); }

 private:
  std::shared_ptr<KvPool> pool_;
  DcpLayout dcp_;
  std::vector<int32_t> pages_;
  int64_t capacity_ = 0;
  int64_t length_ = 0;
  int64_t mtp_length_ = 0;
};

}  // namespace dsi
