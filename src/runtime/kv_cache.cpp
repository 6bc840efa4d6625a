// Paged KV caches; see kv_cache.h.
#include "runtime/kv_cache.h"

#include <numeric>
#include <string>

#include <fmt/format.h>

#include "ops/kv_fp8.h"

namespace dsi {

namespace {
// Why the model cannot use the fp8 caches, or "" when it can.
std::string fp8_geometry_problem(const ModelConfig& cfg) {
  if (cfg.kv_lora_rank != ops::kMlaFp8Lora || cfg.head_dim_rope != ops::kMlaFp8Rope)
    return fmt::format(
        "the fp8 KV cache holds {} + {} latent values per token (the 656-byte layout), but this "
        "model has kv_lora_rank {} and qk_rope_head_dim {}: use the f32 cache",
        ops::kMlaFp8Lora, ops::kMlaFp8Rope, cfg.kv_lora_rank, cfg.head_dim_rope);
  const int64_t d = cfg.index_head_dim;
  if (d < 16 || d > 128 || (d & (d - 1)) != 0)
    return fmt::format(
        "the fp8 indexer-key cache needs index_head_dim a power of two in [16, 128], got {}", d);
  return "";
}

void check_fp8_geometry(const ModelConfig& cfg) {
  const std::string problem = fp8_geometry_problem(cfg);
  DSI_CHECK(problem.empty(), "{}", problem);
}

LayerKvCache make_layer(const ModelConfig& cfg, int64_t n_pages, bool indexer, Device device,
                        KvCacheDtype dtype) {
  const int64_t slots = n_pages * kPageTokens;
  LayerKvCache c;
  if (dtype == KvCacheDtype::kFp8) {
    c.latent = Tensor::zeros({slots, ops::kMlaFp8Bytes}, DType::U8, device);
    if (indexer)
      c.index_keys = Tensor::zeros({n_pages, ops::indexer_page_bytes(cfg.index_head_dim)}, DType::U8,
                                   device);
    return c;
  }
  const DType t = dtype == KvCacheDtype::kBf16 ? DType::BF16 : DType::F32;
  c.latent = Tensor::zeros({slots, cfg.kv_lora_rank + cfg.head_dim_rope}, t, device);
  if (indexer) c.index_keys = Tensor::zeros({slots, cfg.index_head_dim}, t, device);
  return c;
}

// Rank 0 of a DCP group owns the most tokens of any prefix, so its counts bound every rank's.
DcpLayout first_rank(const DcpLayout& dcp) { return DcpLayout{dcp.size, 0, dcp.interleave}; }
}  // namespace

KvCacheDtype parse_kv_cache_dtype(const std::string& name) {
  if (name == "f32") return KvCacheDtype::kF32;
  if (name == "fp8") return KvCacheDtype::kFp8;
  if (name == "bf16") return KvCacheDtype::kBf16;
  fail("KV cache dtype '{}': expected f32, bf16, fp8 or auto", name);
}

KvCacheDtype resolve_kv_cache_dtype(const std::string& name, const ModelConfig& cfg, Device device) {
  if (name != "auto") return parse_kv_cache_dtype(name);
  if (device.is_cpu()) return KvCacheDtype::kF32;
  return fp8_geometry_problem(cfg).empty() ? KvCacheDtype::kFp8 : KvCacheDtype::kBf16;
}

const char* kv_cache_dtype_name(KvCacheDtype dtype) {
  switch (dtype) {
    case KvCacheDtype::kF32: return "f32";
    case KvCacheDtype::kBf16: return "bf16";
    default: return "fp8";
  }
}

KvPool::KvPool(const ModelConfig& cfg, int64_t n_pages_, bool with_mtp, Device device_,
               KvCacheDtype dtype_)
    : n_pages(n_pages_), dtype(dtype_), device(device_) {
  DSI_CHECK(n_pages >= 0, "kv pool: {} pages", n_pages);
  if (dtype == KvCacheDtype::kFp8) check_fp8_geometry(cfg);
  for (int i = 0; i < cfg.n_layers; ++i)
    layers.push_back(make_layer(cfg, n_pages, cfg.indexer_full[size_t(i)], device, dtype));
  if (with_mtp) mtp = make_layer(cfg, n_pages, /*indexer=*/true, device, dtype);
}

int64_t KvPool::bytes_per_page(const ModelConfig& cfg, bool with_mtp, KvCacheDtype dtype) {
  const bool fp8 = dtype == KvCacheDtype::kFp8;
  const int64_t elem = dtype == KvCacheDtype::kBf16 ? 2 : 4;
  const int64_t latent = fp8 ? ops::kMlaFp8Bytes : elem * (cfg.kv_lora_rank + cfg.head_dim_rope);
  const int64_t keys = fp8 ? cfg.index_head_dim + 4 : elem * cfg.index_head_dim;
  int64_t per_token = 0;
  for (int i = 0; i < cfg.n_layers; ++i)
    per_token += latent + (cfg.indexer_full[size_t(i)] ? keys : 0);
  if (with_mtp) per_token += latent + keys;
  return per_token * kPageTokens;
}

SequenceKvCache::SequenceKvCache(const ModelConfig& cfg, int64_t capacity, bool with_mtp,
                                 const DcpLayout& dcp, Device device, KvCacheDtype dtype)
    : dcp_(dcp) {
  DSI_CHECK(capacity > 0, "kv cache: capacity {} must be positive", capacity);
  const int64_t n_pages = pages_for(dcp, capacity);
  pool_ = std::make_shared<KvPool>(cfg, n_pages, with_mtp, device, dtype);
  std::vector<int32_t> pages(static_cast<size_t>(n_pages));
  std::iota(pages.begin(), pages.end(), 0);
  set_pages(std::move(pages));
}

SequenceKvCache::SequenceKvCache(std::shared_ptr<KvPool> pool, const DcpLayout& dcp)
    : pool_(std::move(pool)), dcp_(dcp) {
  DSI_CHECK(pool_ != nullptr, "kv cache: no pool");
}

int64_t SequenceKvCache::pages_for(const DcpLayout& dcp, int64_t tokens) {
  return (first_rank(dcp).local_len(tokens) + kPageTokens - 1) / kPageTokens;
}

void SequenceKvCache::set_pages(std::vector<int32_t> pages) {
  for (int32_t p : pages)
    DSI_CHECK(p >= 0 && p < pool_->n_pages, "kv cache: page {} outside the pool's {} pages", p,
              pool_->n_pages);
  pages_ = std::move(pages);
  // The first position rank 0 could not store: every rank holds its share of [0, capacity).
  capacity_ = first_rank(dcp_).global(int64_t(pages_.size()) * kPageTokens);
  DSI_CHECK(length_ <= capacity_ && mtp_length_ <= capacity_,
            "kv cache: {} pages hold {} tokens, fewer than the {} cached", pages_.size(), capacity_,
            std::max(length_, mtp_length_));
}

int64_t SequenceKvCache::slot_of(int64_t p) const {
  DSI_CHECK(p >= 0 && p < capacity_ && dcp_.owns(p),
            "kv cache: position {} is not a slot of this rank (capacity {})", p, capacity_);
  const int64_t l = dcp_.local(p);
  return int64_t(pages_[size_t(l / kPageTokens)]) * kPageTokens + l % kPageTokens;
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
