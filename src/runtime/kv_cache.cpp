// Per-sequence caches; see kv_cache.h.
#include "runtime/kv_cache.h"

namespace dsi {

namespace {
LayerKvCache make_layer(const ModelConfig& cfg, int64_t capacity, bool indexer, Device device) {
  LayerKvCache c;
  c.latent = Tensor::zeros({capacity, cfg.kv_lora_rank + cfg.head_dim_rope}, DType::F32, device);
  if (indexer) c.index_keys = Tensor::zeros({capacity, cfg.index_head_dim}, DType::F32, device);
  return c;
}
}  // namespace

SequenceKvCache::SequenceKvCache(const ModelConfig& cfg, int64_t capacity, bool with_mtp,
                                 const DcpLayout& dcp, Device device)
    : capacity_(capacity) {
  DSI_CHECK(capacity > 0, "kv cache: capacity {} must be positive", capacity);
  const int64_t slots = dcp.local_len(capacity);
  for (int i = 0; i < cfg.n_layers; ++i)
    layers_.push_back(make_layer(cfg, slots, cfg.indexer_full[size_t(i)], device));
  if (with_mtp) mtp_ = make_layer(cfg, slots, /*indexer=*/true, device);
}

void SequenceKvCache::set_length(int64_t n) {
  DSI_CHECK(n >= 0 && n <= capacity_, "kv cache: length {} outside [0, {}]", n, capacity_);
  length_ = n;
}

void SequenceKvCache::set_mtp_length(int64_t n) {
  DSI_CHECK(has_mtp(), "kv cache: no MTP caches");
  DSI_CHECK(n >= 0 && n <= capacity_, "kv cache: MTP length {} outside [0, {}]", n, capacity_);
  mtp_length_ = n;
}

}  // namespace dsi
