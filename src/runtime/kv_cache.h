// Per-sequence caches for incremental decode: for every layer the MLA latent cache (c_kv after
// kv_a_layernorm, then k_pe after RoPE: kv_lora + rope values per token) and, on layers with their
// own indexer, the indexer-key cache (LayerNorm + RoPE'd keys); the MTP layer has its own pair.
// Under DCP a rank holds only the tokens it owns, in local slot order (runtime/parallel.h).
// Contiguous fp32 rows on the CPU; the paged, fp8 form comes with the serving and CUDA work.
#pragma once

#include <vector>

#include "core/tensor.h"
#include "model/config.h"
#include "runtime/parallel.h"

namespace dsi {

struct LayerKvCache {
  Tensor latent;      // [local capacity, kv_lora + rope] f32
  Tensor index_keys;  // [local capacity, index_head_dim] f32; undefined on "shared" layers
};

class SequenceKvCache {
 public:
  // `capacity` tokens of the sequence; this rank allocates slots for the ones `dcp` gives it.
  // `with_mtp` adds the MTP layer's caches (same capacity).
  SequenceKvCache(const ModelConfig& cfg, int64_t capacity, bool with_mtp,
                  const DcpLayout& dcp = {}, Device device = Device::cpu());

  int64_t capacity() const { return capacity_; }  // in tokens of the sequence (global)
  int64_t length() const { return length_; }          // main-model tokens cached
  int64_t mtp_length() const { return mtp_length_; }  // MTP-layer positions cached
  void set_length(int64_t n);
  void set_mtp_length(int64_t n);

  LayerKvCache& layer(int i) { return layers_.at(size_t(i)); }
  const LayerKvCache& layer(int i) const { return layers_.at(size_t(i)); }
  LayerKvCache& mtp() { return mtp_; }
  const LayerKvCache& mtp() const { return mtp_; }
  bool has_mtp() const { return mtp_.latent.defined(); }

 private:
  int64_t capacity_ = 0;
  int64_t length_ = 0;
  int64_t mtp_length_ = 0;
  std::vector<LayerKvCache> layers_;
  LayerKvCache mtp_;
};

}  // namespace dsi
