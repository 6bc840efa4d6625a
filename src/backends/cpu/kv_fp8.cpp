// CPU reference of the fp8 KV caches (ops/kv_fp8.h): quantises at exactly the points the CUDA kernels
// do (Hadamard butterflies, power-of-two scales, e4m3 round to nearest even), so the two backends
// write bitwise-equal caches. sparse_mla_fp8 decodes the selected entries and runs the fp32
// sparse_mla reference on them: by construction it equals ops::sparse_mla on mla_cache_load_fp8 rows.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backends/cpu/cpu_kv_fp8.h"
#include "backends/cpu/cpu_ops.h"
#include "ops/kv_fp8.h"

namespace dsi::cpu {

namespace {

constexpr int64_t kPage = ops::kKvPageTokens;
constexpr int64_t kDk = ops::kMlaFp8Lora + ops::kMlaFp8Rope;

// ceil(log2(max(amax, 1e-4) / 448)) from the bits of the fp32 quotient (a normal number: >= 2.2e-7).
int ue8m0_exponent(float amax) {
  const float ratio = std::max(amax, ops::kFp8AmaxFloor) / kE4M3Max;
  const uint32_t bits = f32_to_bits(ratio);
  const int e = int((bits >> 23) & 0xffu) - 127;
  return (bits & 0x7fffffu) != 0 ? e + 1 : e;
}

// Quantises n values with one power-of-two scale; returns the scale.
float quantize_group(const float* x, int64_t n, uint8_t* out) {
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  const int e = ue8m0_exponent(amax);
  const float inv = std::ldexp(1.0f, -e);  // exact: x * inv is x / scale
  for (int64_t i = 0; i < n; ++i) out[i] = quantize_e4m3(x[i] * inv);
  return std::ldexp(1.0f, e);
}

void decode_mla_entry(const uint8_t* e, float* row) {
  float scales[ops::kMlaFp8Tiles];
  std::memcpy(scales, e + ops::kMlaFp8ScaleOffset, sizeof(scales));
  for (int c = 0; c < ops::kMlaFp8Lora; ++c) row[c] = e4m3_to_f32(e[c]) * scales[c / ops::kMlaFp8Tile];
  for (int c = 0; c < ops::kMlaFp8Rope; ++c) {
    uint16_t h;
    std::memcpy(&h, e + ops::kMlaFp8RopeOffset + 2 * c, 2);
    row[ops::kMlaFp8Lora + c] = bf16_to_f32(h);
  }
}

}  // namespace

void hadamard_rotate(float* x, int64_t d) {
  for (int64_t h = 1; h < d; h *= 2) {
    for (int64_t i = 0; i < d; i += 2 * h) {
      for (int64_t j = i; j < i + h; ++j) {
        const float a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
    }
  }
  const float s = hadamard_scale(d);
  for (int64_t i = 0; i < d; ++i) x[i] *= s;
}

float hadamard_scale(int64_t d) { return float(1.0 / std::sqrt(double(d))); }

float ue8m0_scale(float amax) { return std::ldexp(1.0f, ue8m0_exponent(amax)); }

uint8_t quantize_e4m3(float x) {
  const uint8_t b = f32_to_e4m3(x);
  return (b & 0x7f) == 0 ? uint8_t(0) : b;  // -0 stored as +0: one encoding of zero on CPU and GPU
}

float rotate_quantize(const float* x, int64_t d, uint8_t* out) {
  std::vector<float> y(x, x + d);
  hadamard_rotate(y.data(), d);
  return quantize_group(y.data(), d, out);
}

void indexer_keys_store_fp8(const Tensor& keys, const Tensor& slots, Tensor& pool, const ops::IndexerKeyPrep* prep) {
  if (prep != nullptr) {  // the reference: the two ops on a copy, then the plain store
    Tensor k = Tensor::empty({keys.dim(0), keys.dim(1)}, DType::F32);
    copy(keys, k);
    layer_norm(k, prep->norm_weight, prep->norm_bias, prep->eps, k);
    Tensor k3 = k.view({keys.dim(0), 1, keys.dim(1)});
    rope(k3, prep->positions, prep->inv_freq, prep->attention_factor, prep->style, 0, nullptr);
    indexer_keys_store_fp8(k, slots, pool, nullptr);
    return;
  }
  const int64_t m = keys.dim(0), d = keys.dim(1), n_pages = pool.dim(0);
  const int64_t page_bytes = ops::indexer_page_bytes(d);
  const int32_t* sl = slots.i32();
  for (int64_t i = 0; i < m; ++i)
    DSI_CHECK(sl[i] >= -1 && int64_t(sl[i]) < n_pages * kPage,
              "indexer_keys_store_fp8: slot {} of key {} outside the pool's {} slots ({} pages)",
              sl[i], i, n_pages * kPage, n_pages);
  auto* base = static_cast<uint8_t*>(pool.raw());
  std::vector<uint8_t> q(static_cast<size_t>(d));
  for (int64_t i = 0; i < m; ++i) {
    if (sl[i] < 0) continue;
    const float scale = rotate_quantize(keys.f32() + i * keys.stride(0), d, q.data());
    uint8_t* page = base + (sl[i] / kPage) * page_bytes;
    const int64_t off = sl[i] % kPage;
    std::memcpy(page + off * d, q.data(), size_t(d));
    std::memcpy(page + kPage * d + off * 4, &scale, 4);
  }
}

void indexer_logits_fp8(const Tensor& q, const Tensor& weights, const Tensor& pool,
                        const Tensor& block_tables, const Tensor& row_seq, const Tensor& bounds,
                        float softmax_scale, Tensor& logits, const ops::IndexerQueryPrep* prep) {
  if (prep != nullptr) {  // the reference: the two ops on copies, then the plain logits
    Tensor qr = Tensor::empty(q.shape(), DType::F32), wr = Tensor::empty(weights.shape(), DType::F32);
    copy(q, qr);
    copy(weights, wr);
    rope(qr, prep->positions, prep->inv_freq, prep->attention_factor, prep->style, 0, nullptr);
    scale_inplace(wr, prep->weights_scale);
    indexer_logits_fp8(qr, wr, pool, block_tables, row_seq, bounds, softmax_scale, logits, nullptr);
    return;
  }
  const int64_t rows = q.dim(0), heads = q.dim(1), d = q.dim(2);
  const int64_t n_cols = logits.dim(1), n_pages = pool.dim(0);
  const int64_t n_seqs = block_tables.dim(0), max_pages = block_tables.dim(1);
  const int64_t page_bytes = ops::indexer_page_bytes(d);
  const int64_t max_bound = std::min(n_cols, max_pages * kPage);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t seq = row_seq.i32()[r], bound = bounds.i32()[r];
    DSI_CHECK(seq >= 0 && seq < n_seqs, "indexer_logits_fp8: row {} has sequence {} outside [0, {})",
              r, seq, n_seqs);
    DSI_CHECK(bound >= 0 && bound <= max_bound, "indexer_logits_fp8: row {} bound {} outside [0, {}]",
              r, bound, max_bound);
    for (int64_t p = 0; p * kPage < bound; ++p) {
      const int32_t page = block_tables.i32()[seq * max_pages + p];
      DSI_CHECK(page >= 0 && page < n_pages,
                "indexer_logits_fp8: sequence {} page {} is physical page {}, outside [0, {})", seq,
                p, page, n_pages);
    }
  }
  const auto* base = static_cast<const uint8_t*>(pool.raw());
  std::vector<float> q8(size_t(heads * d)), wq(static_cast<size_t>(heads)), k8(static_cast<size_t>(d));
  std::vector<uint8_t> qb(static_cast<size_t>(d));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < heads; ++j) {
      const float qs = rotate_quantize(q.f32() + (r * heads + j) * d, d, qb.data());
      for (int64_t c = 0; c < d; ++c) q8[size_t(j * d + c)] = e4m3_to_f32(qb[size_t(c)]);
      wq[size_t(j)] = (weights.f32()[r * heads + j] * qs) * softmax_scale;
    }
    const int64_t seq = row_seq.i32()[r], bound = bounds.i32()[r];
    float* out = logits.f32() + r * n_cols;
    for (int64_t s = 0; s < n_cols; ++s) {
      if (s >= bound) {
        out[s] = -std::numeric_limits<float>::infinity();
        continue;
      }
      const uint8_t* page = base + int64_t(block_tables.i32()[seq * max_pages + s / kPage]) * page_bytes;
      const int64_t off = s % kPage;
      for (int64_t c = 0; c < d; ++c) k8[size_t(c)] = e4m3_to_f32(page[off * d + c]);
      float k_scale;
      std::memcpy(&k_scale, page + kPage * d + off * 4, 4);
      float acc = 0.0f;
      for (int64_t j = 0; j < heads; ++j) {
        float dot = 0.0f;  // products of e4m3 values are exact in fp32
        for (int64_t c = 0; c < d; ++c) dot += q8[size_t(j * d + c)] * k8[size_t(c)];
        acc += wq[size_t(j)] * std::max(dot, 0.0f);
      }
      out[s] = k_scale * acc;
    }
  }
}

void mla_cache_store_fp8(const Tensor& rows, const Tensor& slots, Tensor& pool, const ops::MlaKeyPrep* prep) {
  if (prep != nullptr) {  // the reference: the two ops on a copy, then the plain store
    Tensor r = Tensor::empty({rows.dim(0), ops::kMlaFp8Lora + ops::kMlaFp8Rope}, DType::F32);
    copy(rows, r);
    Tensor lat = r.narrow(1, 0, ops::kMlaFp8Lora);
    rms_norm(lat, prep->norm_weight, prep->eps, lat);
    Tensor r3 = r.view({rows.dim(0), 1, ops::kMlaFp8Lora + ops::kMlaFp8Rope});
    rope(r3, prep->positions, prep->inv_freq, prep->attention_factor, prep->style, ops::kMlaFp8Lora, nullptr);
    mla_cache_store_fp8(r, slots, pool, nullptr);
    return;
  }
  const int64_t m = rows.dim(0), n_slots = pool.dim(0);
  const int32_t* sl = slots.i32();
  for (int64_t i = 0; i < m; ++i)
    DSI_CHECK(sl[i] >= -1 && sl[i] < n_slots,
              "mla_cache_store_fp8: slot {} of row {} outside the pool's {} slots", sl[i], i, n_slots);
  auto* base = static_cast<uint8_t*>(pool.raw());
  for (int64_t i = 0; i < m; ++i) {
    if (sl[i] < 0) continue;
    const float* x = rows.f32() + i * rows.stride(0);
    uint8_t* e = base + int64_t(sl[i]) * ops::kMlaFp8Bytes;
    for (int t = 0; t < ops::kMlaFp8Tiles; ++t) {
      const float scale = quantize_group(x + t * ops::kMlaFp8Tile, ops::kMlaFp8Tile,
                                         e + t * ops::kMlaFp8Tile);
      std::memcpy(e + ops::kMlaFp8ScaleOffset + 4 * t, &scale, 4);
    }
    for (int c = 0; c < ops::kMlaFp8Rope; ++c) {
      const uint16_t h = f32_to_bf16(x[ops::kMlaFp8Lora + c]);
      std::memcpy(e + ops::kMlaFp8RopeOffset + 2 * c, &h, 2);
    }
  }
}

void mla_cache_load_fp8(const Tensor& pool, const Tensor& slots, Tensor& rows) {
  const int64_t m = rows.dim(0), n_slots = pool.dim(0);
  const int32_t* sl = slots.i32();
  for (int64_t i = 0; i < m; ++i)
    DSI_CHECK(sl[i] >= -1 && sl[i] < n_slots,
              "mla_cache_load_fp8: slot {} of row {} outside the pool's {} slots", sl[i], i, n_slots);
  const auto* base = static_cast<const uint8_t*>(pool.raw());
  for (int64_t i = 0; i < m; ++i) {
    float* row = rows.f32() + i * kDk;
    if (sl[i] < 0)
      std::fill_n(row, kDk, 0.0f);
    else
      decode_mla_entry(base + int64_t(sl[i]) * ops::kMlaFp8Bytes, row);
  }
}

void sparse_mla_fp8(const Tensor& q, const Tensor& pool, const Tensor& indices, float softmax_scale,
                    int dv, Tensor& out, Tensor& lse, bool /*inputs_settled: ops run in order here*/) {
  const int64_t rows = q.dim(0), heads = q.dim(1), topk = indices.dim(1), n_slots = pool.dim(0);
  const int32_t* idx = indices.i32();
  for (int64_t i = 0; i < rows * topk; ++i)
    DSI_CHECK(idx[i] < n_slots, "sparse_mla_fp8: index {} outside the {} cache slots", idx[i], n_slots);
  const auto* base = static_cast<const uint8_t*>(pool.raw());
  for (int64_t r = 0; r < rows; ++r) {
    // Decode the row's selected entries (in index order, duplicates kept) into a small fp32 cache.
    std::vector<int32_t> local;
    std::vector<float> kv;
    for (int64_t j = 0; j < topk; ++j) {
      const int32_t s = idx[r * topk + j];
      if (s < 0) continue;
      local.push_back(int32_t(local.size()));
      kv.resize(kv.size() + kDk);
      decode_mla_entry(base + int64_t(s) * ops::kMlaFp8Bytes, kv.data() + kv.size() - kDk);
    }
    Tensor o = out.slice(r, r + 1), l = lse.slice(r, r + 1);
    if (local.empty()) {  // as sparse_mla: out = 0, lse = -inf
      std::fill_n(o.f32(), heads * dv, 0.0f);
      std::fill_n(l.f32(), heads, -std::numeric_limits<float>::infinity());
      continue;
    }
    const int64_t n = int64_t(local.size());
    const Tensor kv_t = Tensor::wrap(kv.data(), {n, kDk}, DType::F32);
    const Tensor idx_t = Tensor::wrap(local.data(), {1, n}, DType::I32);
    sparse_mla(q.slice(r, r + 1), kv_t, idx_t, softmax_scale, dv, o, l);
  }
}

}  // namespace dsi::cpu
