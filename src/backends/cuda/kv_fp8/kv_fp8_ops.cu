// The fp8 KV-cache ops of the CUDA backend (ops/kv_fp8.h): tensors to the kernels' parameters and
// launches (kv_fp8.cu, sm90_indexer_logits.cu, sm90_sparse_mla_decode.cu). Shapes, dtypes and
// devices were checked by ops/kv_fp8.cpp.
#include <algorithm>
#include <cstdint>

#include "backends/cuda/common.cuh"
#include "backends/cuda/cuda_kv_fp8.h"
#include "backends/cuda/kv_fp8/kv_fp8.h"
#include "backends/cuda/kv_fp8/sm90_indexer_logits.h"
#include "backends/cuda/kv_fp8/sm90_sparse_mla_decode.h"
#include "ops/kv_fp8.h"

namespace dsi::cuda {

namespace {

constexpr int kPage = ops::kKvPageTokens;

void check_aligned(const void* ptr, size_t align, const char* op, const char* what) {
  DSI_CHECK(reinterpret_cast<uintptr_t>(ptr) % align == 0,
            "{}: {} must be {}-byte aligned (a view at a multiple of its row size)", op, what, align);
}

void set_rope(RotateQuantParams& p, const Tensor& positions, const Tensor& inv_freq, float attention_factor,
              RopeStyle style, int heads) {
  p.positions = positions.i32();
  p.inv_freq = inv_freq.f32();
  p.rope_half = int(inv_freq.dim(0));
  p.heads = heads;
  p.interleaved = style == RopeStyle::kInterleaved;
  p.attention_factor = attention_factor;
}

}  // namespace

void indexer_keys_store_fp8(const Tensor& keys, const Tensor& slots, Tensor& pool, const ops::IndexerKeyPrep* prep) {
  const int64_t m = keys.dim(0), d = keys.dim(1);
  if (m == 0) return;
  DeviceGuard guard(keys.device());
  check_aligned(pool.raw(), 4, "indexer_keys_store_fp8", "pool");
  ErrorFlag bad("indexer_keys_store_fp8: a slot outside the pool");
  RotateQuantParams p{};
  p.x = keys.f32();
  p.x_stride = keys.stride(0);
  p.n = m;
  p.d = int(d);
  p.hadamard_scale = float(1.0 / std::sqrt(double(d)));
  p.slots = slots.i32();
  p.pool = static_cast<uint8_t*>(pool.raw());
  p.n_pages = pool.dim(0);
  p.bad = bad.ptr();
  if (prep != nullptr) {  // LayerNorm and RoPE inside the rotation (bitwise the ops first)
    p.norm_weight = prep->norm_weight.f32();
    p.norm_bias = prep->norm_bias.f32();
    p.eps = prep->eps;
    // The path ops::layer_norm(keys, w, b, eps, keys) takes (norm.cu: vectorizable()).
    const auto a16 = [](const void* q) { return reinterpret_cast<uintptr_t>(q) % 16 == 0; };
    p.norm_vec4 = d % 4 == 0 && keys.stride(0) % 4 == 0 && a16(p.x) && a16(p.norm_weight) && a16(p.norm_bias);
    set_rope(p, prep->positions, prep->inv_freq, prep->attention_factor, prep->style, 1);
  }
  launch_rotate_quant(p, stream());
  const unsigned long long first = bad.read();
  if (first != ErrorFlag::kNone)
    fail("indexer_keys_store_fp8: slot {} of key {} outside the pool's {} slots ({} pages)",
         read_device(p.slots + first), first, p.n_pages * kPage, p.n_pages);
}

void indexer_logits_fp8(const Tensor& q, const Tensor& weights, const Tensor& pool,
                        const Tensor& block_tables, const Tensor& row_seq, const Tensor& bounds,
                        float softmax_scale, Tensor& logits, const ops::IndexerQueryPrep* prep) {
  const int64_t rows = q.dim(0), heads = q.dim(1), d = q.dim(2);
  if (rows == 0) return;
  DSI_CHECK(heads <= (1 << 20), "indexer_logits_fp8: {} heads", heads);
  DeviceGuard guard(q.device());
  check_aligned(pool.raw(), 16, "indexer_logits_fp8", "pool");
  // d = 128 (the models): the tensor-core kernel, which reads the query as e4m3 bytes; other head
  // dims (and an empty pool): the CUDA-core kernel (bitwise the reference), which reads it as f32.
  const bool mma = pool.dim(0) > 0 && indexer_logits_fp8_mma_supported(int(heads), int(d));
  // The flags first (eagerly each is a memset): the rotation then runs right before the logits
  // kernel, which overlaps its start with the rotation's end (sm90_indexer_logits.h).
  ErrorFlag bad_row("indexer_logits_fp8: a row's bound outside [0, keys]");
  ErrorFlag bad_page("indexer_logits_fp8: a page outside the pool");
  Scratch q8((mma ? 1 : sizeof(float)) * size_t(rows * heads * d)), wq(sizeof(float) * size_t(rows * heads));
  RotateQuantParams rq{};
  rq.x = q.f32();
  rq.x_stride = d;
  rq.n = rows * heads;
  rq.d = int(d);
  rq.hadamard_scale = float(1.0 / std::sqrt(double(d)));
  rq.weights = weights.f32();
  rq.softmax_scale = softmax_scale;
  rq.q8 = mma ? nullptr : q8.as<float>();
  rq.q8_bytes = mma ? q8.as<uint8_t>() : nullptr;
  rq.wq = wq.as<float>();
  if (prep != nullptr) {  // RoPE and the weights' scale inside the rotation (bitwise the ops first)
    rq.weights_scale = prep->weights_scale;
    set_rope(rq, prep->positions, prep->inv_freq, prep->attention_factor, prep->style, int(heads));
  }
  launch_rotate_quant(rq, stream());
  IndexerLogitsFp8Params p{};
  p.q8 = rq.q8;
  p.q8_bytes = rq.q8_bytes;
  p.wq = wq.as<float>();
  p.pool = static_cast<const uint8_t*>(pool.raw());
  p.block_tables = block_tables.i32();
  p.row_seq = row_seq.i32();
  p.bounds = bounds.i32();
  p.logits = logits.f32();
  p.rows = rows;
  p.n_cols = logits.dim(1);
  p.n_pages = pool.dim(0);
  p.n_seqs = block_tables.dim(0);
  p.max_pages = block_tables.dim(1);
  p.heads = int(heads);
  p.d = int(d);
  p.bad_row = bad_row.ptr();
  p.bad_page = bad_page.ptr();
  if (mma)
    launch_indexer_logits_fp8_mma(p, stream());
  else
    launch_indexer_logits_fp8(p, stream());
  const unsigned long long row = bad_row.read();
  if (row != ErrorFlag::kNone) {
    const int64_t seq = read_device(p.row_seq + row), bound = read_device(p.bounds + row);
    DSI_CHECK(seq >= 0 && seq < p.n_seqs, "indexer_logits_fp8: row {} has sequence {} outside [0, {})",
              row, seq, p.n_seqs);
    fail("indexer_logits_fp8: row {} bound {} outside [0, {}]", row, bound,
         std::min<int64_t>(p.n_cols, p.max_pages * kPage));
  }
  const unsigned long long pi = bad_page.read();
  if (pi != ErrorFlag::kNone)
    fail("indexer_logits_fp8: sequence {} page {} is physical page {}, outside [0, {})",
         int64_t(pi) / p.max_pages, int64_t(pi) % p.max_pages, read_device(p.block_tables + pi),
         p.n_pages);
}

void mla_cache_store_fp8(const Tensor& rows, const Tensor& slots, Tensor& pool, const ops::MlaKeyPrep* prep) {
  const int64_t m = rows.dim(0);
  if (m == 0) return;
  DeviceGuard guard(rows.device());
  check_aligned(pool.raw(), 4, "mla_cache_store_fp8", "pool");
  ErrorFlag bad("mla_cache_store_fp8: a slot outside the pool");
  MlaStoreFp8Params p{};
  p.rows = rows.f32();
  p.slots = slots.i32();
  p.pool = static_cast<uint8_t*>(pool.raw());
  p.row_stride = rows.stride(0);
  p.m = m;
  p.n_slots = pool.dim(0);
  p.bad = bad.ptr();
  if (prep != nullptr) {
    p.norm_weight = prep->norm_weight.f32();
    p.eps = prep->eps;
    p.positions = prep->positions.i32();
    p.inv_freq = prep->inv_freq.f32();
    p.attention_factor = prep->attention_factor;
    p.interleaved = prep->style == RopeStyle::kInterleaved;
  }
  launch_mla_store_fp8(p, stream());
  const unsigned long long first = bad.read();
  if (first != ErrorFlag::kNone)
    fail("mla_cache_store_fp8: slot {} of row {} outside the pool's {} slots",
         read_device(p.slots + first), first, p.n_slots);
}

void mla_cache_load_fp8(const Tensor& pool, const Tensor& slots, Tensor& rows) {
  const int64_t m = rows.dim(0);
  if (m == 0) return;
  DeviceGuard guard(pool.device());
  check_aligned(pool.raw(), 4, "mla_cache_load_fp8", "pool");
  ErrorFlag bad("mla_cache_load_fp8: a slot outside the pool");
  MlaLoadFp8Params p{};
  p.pool = static_cast<const uint8_t*>(pool.raw());
  p.slots = slots.i32();
  p.rows = rows.f32();
  p.m = m;
  p.n_slots = pool.dim(0);
  p.bad = bad.ptr();
  launch_mla_load_fp8(p, stream());
  const unsigned long long first = bad.read();
  if (first != ErrorFlag::kNone)
    fail("mla_cache_load_fp8: slot {} of row {} outside the pool's {} slots",
         read_device(p.slots + first), first, p.n_slots);
}

void sparse_mla_fp8(const Tensor& q, const Tensor& pool, const Tensor& indices, float softmax_scale,
                    int dv, Tensor& out, Tensor& lse, bool inputs_settled) {
  const int64_t rows = q.dim(0), heads = q.dim(1);
  if (rows == 0 || heads == 0) return;
  DeviceGuard guard(q.device());
  check_aligned(pool.raw(), 16, "sparse_mla_fp8", "pool");
  ErrorFlag bad("sparse_mla_fp8: an index outside the cache slots");
  // Split-KV tensor-core decode (sm90_sparse_mla_decode.cu); the older one-block-per-head-group
  // kernel (launch_sparse_mla_fp8) stays as the benchmark's baseline.
  SparseMlaDecodeParams p{};
  p.q = q.f32();
  p.pool = static_cast<const uint8_t*>(pool.raw());
  p.indices = indices.i32();
  p.out = out.f32();
  p.lse = lse.f32();
  p.q_s0 = q.stride(0);
  p.q_s1 = q.stride(1);
  p.rows = rows;
  p.heads = heads;
  p.n_slots = pool.dim(0);
  p.topk = indices.dim(1);
  p.softmax_scale = softmax_scale;
  p.bad = bad.ptr();
  // DSI_MLA_SETTLED=0 ignores the caller's promise (for comparisons).
  static const bool honour_settled = !env_switched_off("DSI_MLA_SETTLED");
  p.settled = inputs_settled && honour_settled;
  // The workspace (split partials) is allocated per call for now; a step planner can call
  // plan_sparse_mla_decode once and pass a workspace of plan.workspace_bytes instead.
  const SparseMlaDecodePlan plan = plan_sparse_mla_decode(rows, heads, p.topk, sm_count());
  Scratch workspace(plan.workspace_bytes);
  p.workspace = workspace.as<void>();
  launch_sparse_mla_decode(p, plan, stream());
  const unsigned long long first = bad.read();
  if (first != ErrorFlag::kNone)
    fail("sparse_mla_fp8: index {} outside the {} cache slots", read_device(p.indices + first),
         p.n_slots);
}

}  // namespace dsi::cuda
