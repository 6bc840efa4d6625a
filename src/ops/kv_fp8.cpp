// Dispatch of the fp8 KV-cache ops (see kv_fp8.h): the shape, dtype and device checks of every op are
// made here, once, for both backends; the backends check the data (slots, pages, bounds, indices).
#include "ops/kv_fp8.h"

#include "backends/cpu/cpu_kv_fp8.h"
#include "ops/dispatch.h"
#ifdef DSI_WITH_CUDA
#include "backends/cuda/cuda_kv_fp8.h"
#endif

namespace dsi::ops {

namespace {

void same_device(const Tensor& t, Device want, const char* op, const char* what) {
  DSI_CHECK(t.device() == want, "{}: {} is on {}, expected {} (all tensors on one device)", op, what,
            t.device().str(), want.str());
}

bool is_pow2(int64_t d) { return d > 0 && (d & (d - 1)) == 0; }

void check_slots(const Tensor& slots, int64_t m, Device dev, const char* op) {
  check_dtype(slots, DType::I32, op);
  DSI_CHECK(slots.ndim() == 1 && slots.dim(0) == m && slots.is_contiguous(),
            "{}: slots {} must be [{}] contiguous", op, slots.desc(), m);
  same_device(slots, dev, op, "slots");
}

void check_mla_pool(const Tensor& pool, Device dev, const char* op) {
  DSI_CHECK(pool.dtype() == DType::U8 && pool.ndim() == 2 && pool.dim(1) == kMlaFp8Bytes &&
                pool.is_contiguous(),
            "{}: pool {} must be U8[n_slots, {}] contiguous", op, pool.desc(), kMlaFp8Bytes);
  same_device(pool, dev, op, "pool");
}

// The RoPE inputs of a prep: positions [rows] i32, inv_freq [half] f32 with 2 * half <= d.
void check_rope(const Tensor& positions, const Tensor& inv_freq, int64_t rows, int64_t d, Device dev,
                const char* op) {
  DSI_CHECK(positions.dtype() == DType::I32 && positions.ndim() == 1 && positions.dim(0) == rows,
            "{}: positions {} must be I32[{}]", op, positions.desc(), rows);
  DSI_CHECK(inv_freq.dtype() == DType::F32 && inv_freq.ndim() == 1 && 2 * inv_freq.dim(0) <= d,
            "{}: inv_freq {} must be F32[half] with 2 * half <= the head dim {}", op, inv_freq.desc(), d);
  same_device(positions, dev, op, "positions");
  same_device(inv_freq, dev, op, "inv_freq");
  DSI_CHECK(positions.is_contiguous() && inv_freq.is_contiguous(), "{}: positions and inv_freq must be contiguous",
            op);
}

}  // namespace

void indexer_keys_store_fp8(const Tensor& keys, const Tensor& slots, Tensor& pool, const IndexerKeyPrep* prep) {
  const char* op = "indexer_keys_store_fp8";
  check_dtype(keys, DType::F32, "indexer_keys_store_fp8 keys");
  DSI_CHECK(keys.ndim() == 2 && keys.stride(1) == 1, "{}: keys {} must be [m, d], rows contiguous",
            op, keys.desc());
  const int64_t m = keys.dim(0), d = keys.dim(1);
  DSI_CHECK(is_pow2(d) && d >= 16 && d <= 128, "{}: key dim d = {} is not a power of two in [16, 128]",
            op, d);
  check_slots(slots, m, keys.device(), op);
  DSI_CHECK(pool.dtype() == DType::U8 && pool.ndim() == 2 && pool.dim(1) == indexer_page_bytes(d) &&
                pool.is_contiguous(),
            "{}: pool {} must be U8[n_pages, {}] contiguous (64 x (d + 4) bytes per page, d = {})", op,
            pool.desc(), indexer_page_bytes(d), d);
  same_device(pool, keys.device(), op, "pool");
  if (prep != nullptr) {
    for (const Tensor* t : {&prep->norm_weight, &prep->norm_bias}) {
      check_dtype(*t, DType::F32, "indexer_keys_store_fp8 norm weight / bias");
      check_shape(*t, {d}, "indexer_keys_store_fp8 norm weight / bias");
    }
    check_rope(prep->positions, prep->inv_freq, m, d, keys.device(), op);
    same_device(prep->norm_weight, keys.device(), op, "norm_weight");
    same_device(prep->norm_bias, keys.device(), op, "norm_bias");
    DSI_CHECK(prep->norm_weight.is_contiguous() && prep->norm_bias.is_contiguous(),
              "{}: norm_weight and norm_bias must be contiguous", op);
  }
  DSI_DISPATCH(keys.device(), indexer_keys_store_fp8, keys, slots, pool, prep);
}

void indexer_logits_fp8(const Tensor& q, const Tensor& weights, const Tensor& pool,
                        const Tensor& block_tables, const Tensor& row_seq, const Tensor& bounds,
                        float softmax_scale, Tensor& logits, const IndexerQueryPrep* prep) {
  const char* op = "indexer_logits_fp8";
  check_dtype(q, DType::F32, "indexer_logits_fp8 q");
  DSI_CHECK(q.ndim() == 3 && q.is_contiguous(), "{}: q {} must be [rows, heads, d] contiguous", op,
            q.desc());
  const int64_t rows = q.dim(0), heads = q.dim(1), d = q.dim(2);
  const Device dev = q.device();
  DSI_CHECK(is_pow2(d) && d >= 16 && d <= 128, "{}: head dim d = {} is not a power of two in [16, 128]",
            op, d);
  DSI_CHECK(heads >= 1, "{}: q {} has no heads", op, q.desc());
  check_dtype(weights, DType::F32, "indexer_logits_fp8 weights");
  check_shape(weights, {rows, heads}, "indexer_logits_fp8 weights");
  DSI_CHECK(weights.is_contiguous(), "{}: weights must be contiguous", op);
  same_device(weights, dev, op, "weights");
  DSI_CHECK(pool.dtype() == DType::U8 && pool.ndim() == 2 && pool.dim(1) == indexer_page_bytes(d) &&
                pool.is_contiguous(),
            "{}: pool {} must be U8[n_pages, {}] contiguous (d = {})", op, pool.desc(),
            indexer_page_bytes(d), d);
  same_device(pool, dev, op, "pool");
  check_dtype(block_tables, DType::I32, "indexer_logits_fp8 block_tables");
  DSI_CHECK(block_tables.ndim() == 2 && block_tables.is_contiguous(),
            "{}: block_tables {} must be [n_seqs, max_pages] contiguous", op, block_tables.desc());
  same_device(block_tables, dev, op, "block_tables");
  check_dtype(row_seq, DType::I32, "indexer_logits_fp8 row_seq");
  check_shape(row_seq, {rows}, "indexer_logits_fp8 row_seq");
  same_device(row_seq, dev, op, "row_seq");
  check_dtype(bounds, DType::I32, "indexer_logits_fp8 bounds");
  check_shape(bounds, {rows}, "indexer_logits_fp8 bounds");
  same_device(bounds, dev, op, "bounds");
  DSI_CHECK(row_seq.is_contiguous() && bounds.is_contiguous(),
            "{}: row_seq and bounds must be contiguous", op);
  check_dtype(logits, DType::F32, "indexer_logits_fp8 logits");
  DSI_CHECK(logits.ndim() == 2 && logits.dim(0) == rows && logits.is_contiguous(),
            "{}: logits {} must be [{}, n_keys] contiguous", op, logits.desc(), rows);
  same_device(logits, dev, op, "logits");
  if (prep != nullptr) check_rope(prep->positions, prep->inv_freq, rows, d, dev, op);
  DSI_DISPATCH(dev, indexer_logits_fp8, q, weights, pool, block_tables, row_seq, bounds,
               softmax_scale, logits, prep);
}

void mla_cache_store_fp8(const Tensor& rows, const Tensor& slots, Tensor& pool, const MlaKeyPrep* prep) {
  const char* op = "mla_cache_store_fp8";
  check_dtype(rows, DType::F32, "mla_cache_store_fp8 rows");
  DSI_CHECK(rows.ndim() == 2 && rows.dim(1) == kMlaFp8Lora + kMlaFp8Rope && rows.stride(1) == 1,
            "{}: rows {} must be [m, {}], rows contiguous", op, rows.desc(),
            kMlaFp8Lora + kMlaFp8Rope);
  check_slots(slots, rows.dim(0), rows.device(), op);
  check_mla_pool(pool, rows.device(), op);
  const Device dev = rows.device();
  if (prep != nullptr) {
    check_dtype(prep->norm_weight, DType::F32, "mla_cache_store_fp8 norm_weight");
    check_shape(prep->norm_weight, {kMlaFp8Lora}, "mla_cache_store_fp8 norm_weight");
    check_dtype(prep->positions, DType::I32, "mla_cache_store_fp8 positions");
    check_shape(prep->positions, {rows.dim(0)}, "mla_cache_store_fp8 positions");
    check_dtype(prep->inv_freq, DType::F32, "mla_cache_store_fp8 inv_freq");
    check_shape(prep->inv_freq, {kMlaFp8Rope / 2}, "mla_cache_store_fp8 inv_freq");
    same_device(prep->norm_weight, dev, op, "norm_weight");
    same_device(prep->positions, dev, op, "positions");
    same_device(prep->inv_freq, dev, op, "inv_freq");
    DSI_CHECK(prep->norm_weight.is_contiguous() && prep->positions.is_contiguous() &&
                  prep->inv_freq.is_contiguous(),
              "{}: norm_weight, positions and inv_freq must be contiguous", op);
  }
  DSI_DISPATCH(dev, mla_cache_store_fp8, rows, slots, pool, prep);
}

void mla_cache_load_fp8(const Tensor& pool, const Tensor& slots, Tensor& rows) {
  const char* op = "mla_cache_load_fp8";
  check_mla_pool(pool, pool.device(), op);
  check_dtype(rows, DType::F32, "mla_cache_load_fp8 rows");
  DSI_CHECK(rows.ndim() == 2 && rows.dim(1) == kMlaFp8Lora + kMlaFp8Rope && rows.is_contiguous(),
            "{}: rows {} must be [m, {}] contiguous", op, rows.desc(), kMlaFp8Lora + kMlaFp8Rope);
  same_device(rows, pool.device(), op, "rows");
  check_slots(slots, rows.dim(0), pool.device(), op);
  DSI_DISPATCH(pool.device(), mla_cache_load_fp8, pool, slots, rows);
}

void sparse_mla_fp8(const Tensor& q, const Tensor& pool, const Tensor& indices, float softmax_scale,
                    int dv, Tensor& out, Tensor& lse, bool inputs_settled) {
  const char* op = "sparse_mla_fp8";
  check_dtype(q, DType::F32, "sparse_mla_fp8 q");
  DSI_CHECK(q.ndim() == 3 && q.dim(2) == kMlaFp8Lora + kMlaFp8Rope && q.stride(2) == 1,
            "{}: q {} must be [rows, heads, {}] (last dim contiguous)", op, q.desc(),
            kMlaFp8Lora + kMlaFp8Rope);
  const int64_t rows = q.dim(0), heads = q.dim(1);
  const Device dev = q.device();
  DSI_CHECK(dv == kMlaFp8Lora, "{}: dv = {}, the fp8 cache's value is the {}-dim latent", op, dv,
            kMlaFp8Lora);
  check_mla_pool(pool, dev, op);
  check_dtype(indices, DType::I32, "sparse_mla_fp8 indices");
  DSI_CHECK(indices.ndim() == 2 && indices.dim(0) == rows && indices.is_contiguous(),
            "{}: indices {} must be [{}, topk] contiguous", op, indices.desc(), rows);
  same_device(indices, dev, op, "indices");
  check_dtype(out, DType::F32, "sparse_mla_fp8 out");
  check_shape(out, {rows, heads, dv}, "sparse_mla_fp8 out");
  check_dtype(lse, DType::F32, "sparse_mla_fp8 lse");
  check_shape(lse, {rows, heads}, "sparse_mla_fp8 lse");
  DSI_CHECK(out.is_contiguous() && lse.is_contiguous(), "{}: out and lse must be contiguous", op);
  same_device(out, dev, op, "out");
  same_device(lse, dev, op, "lse");
  DSI_DISPATCH(dev, sparse_mla_fp8, q, pool, indices, softmax_scale, dv, out, lse, inputs_settled);
}

}  // namespace dsi::ops
