// CPU reference of the paging ops; see ops/paging.h.
#include "backends/cpu/paging.h"

#include <cstring>
#include <vector>

#include "backends/cpu/cpu_ops.h"

namespace dsi::cpu {

PageLookup::PageLookup(const ops::KeyPages* pages, int64_t rows, const char* op) {
  if (pages == nullptr) return;
  const Tensor& bt = pages->block_tables;
  DSI_CHECK(bt.ndim() == 2 && bt.is_contiguous(), "{}: block_tables must be [n_seqs, max_pages], "
            "got {}", op, bt.desc());
  check_dtype(bt, DType::I32, "block_tables");
  check_shape(pages->row_seq, {rows}, "row_seq");
  check_dtype(pages->row_seq, DType::I32, "row_seq");
  DSI_CHECK(pages->page_size > 0, "{}: page size {}", op, pages->page_size);
  tables_ = bt.i32();
  row_seq_ = pages->row_seq.i32();
  max_pages_ = bt.dim(1);
  page_size_ = pages->page_size;
  for (int64_t r = 0; r < rows; ++r)
    DSI_CHECK(row_seq_[r] >= 0 && row_seq_[r] < bt.dim(0), "{}: row {} belongs to sequence {} of {}",
              op, r, row_seq_[r], bt.dim(0));
}

int64_t PageLookup::slot(int64_t row, int64_t s) const {
  if (tables_ == nullptr) return s;
  const int64_t i = s / page_size_;
  if (i >= max_pages_) return -1;
  const int32_t page = tables_[row_seq_[row] * max_pages_ + i];
  return page < 0 ? -1 : int64_t(page) * page_size_ + s % page_size_;
}

void check_scatter_rows(const Tensor& src, const Tensor& slots, const Tensor& dst) {
  DSI_CHECK(src.ndim() == 2 && dst.ndim() == 2 && src.dim(1) == dst.dim(1) && src.stride(1) == 1 &&
                dst.stride(1) == 1,
            "scatter_rows: src {} and dst {} must be [n, d] and [n_slots, d]", src.desc(), dst.desc());
  check_dtype(src, DType::F32, "scatter_rows src");
  DSI_CHECK(dst.dtype() == DType::F32 || dst.dtype() == DType::BF16,
            "scatter_rows: dst must be f32 or bf16 (a bf16 cache), got {}", dst.desc());
  check_shape(slots, {src.dim(0)}, "scatter_rows slots");
  check_dtype(slots, DType::I32, "scatter_rows slots");
}

void check_slots_from_local(const Tensor& local, const Tensor& out) {
  DSI_CHECK(local.ndim() == 2 && local.is_contiguous(), "slots_from_local: local must be [rows, k], "
            "got {}", local.desc());
  check_dtype(local, DType::I32, "slots_from_local local");
  check_shape(out, local.shape(), "slots_from_local out");
  check_dtype(out, DType::I32, "slots_from_local out");
  DSI_CHECK(out.is_contiguous(), "slots_from_local: out must be contiguous");
}

const float* key_row_f32(const Tensor& pool, int64_t slot, float* buf) {
  if (pool.dtype() == DType::F32) return pool.f32() + slot * pool.stride(0);
  const uint16_t* row = static_cast<const uint16_t*>(pool.raw()) + slot * pool.stride(0);
  for (int64_t c = 0; c < pool.dim(1); ++c) buf[c] = bf16_to_f32(row[c]);
  return buf;
}

void scatter_rows(const Tensor& src, const Tensor& slots, Tensor& dst) {
  check_scatter_rows(src, slots, dst);
  const int64_t d = src.dim(1);
  std::vector<bool> seen(size_t(dst.dim(0)), false);
  for (int64_t i = 0; i < src.dim(0); ++i) {
    const int64_t s = slots.i32()[i];
    if (s < 0) continue;
    DSI_CHECK(s < dst.dim(0), "scatter_rows: slot {} outside the {} rows", s, dst.dim(0));
    DSI_CHECK(!seen[size_t(s)], "scatter_rows: slot {} written twice", s);
    seen[size_t(s)] = true;
    const float* row = src.f32() + i * src.stride(0);
    if (dst.dtype() == DType::BF16) {  // rounded to nearest even, as the GPU stores it
      uint16_t* out = static_cast<uint16_t*>(dst.raw()) + s * dst.stride(0);
      for (int64_t c = 0; c < d; ++c) out[c] = f32_to_bf16(row[c]);
    } else {
      std::memcpy(dst.f32() + s * dst.stride(0), row, sizeof(float) * size_t(d));
    }
  }
}

void slots_from_local(const Tensor& local, const Tensor& block_tables, const Tensor& row_seq,
                      int page_size, Tensor& out) {
  check_slots_from_local(local, out);
  const ops::KeyPages pages{block_tables, row_seq, page_size};
  const PageLookup lookup(&pages, local.dim(0), "slots_from_local");
  const int64_t k = local.dim(1);
  for (int64_t r = 0; r < local.dim(0); ++r)
    for (int64_t j = 0; j < k; ++j) {
      const int32_t l = local.i32()[r * k + j];
      int64_t s = -1;
      if (l >= 0) {
        s = lookup.slot(r, l);
        DSI_CHECK(s >= 0, "slots_from_local: row {} selects local token {} past its pages", r, l);
      }
      out.i32()[r * k + j] = int32_t(s);
    }
}

}  // namespace dsi::cpu
