// Page-table lookups shared by the CPU ops that read paged pools (ops/paging.h).
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "ops/indexer.h"

namespace dsi::cpu {

// Row r's key s: slot s without pages, else its page's slot (-1 when the page is missing).
class PageLookup {
 public:
  PageLookup(const ops::KeyPages* pages, int64_t rows, const char* op);
  int64_t slot(int64_t row, int64_t s) const;

 private:
  const int32_t* tables_ = nullptr;  // [n_seqs, max_pages]
  const int32_t* row_seq_ = nullptr;  // [rows]
  int64_t max_pages_ = 0;
  int page_size_ = 1;
};

// Row `slot` of a pool of f32 rows, or of bf16 rows (a bf16 cache) widened exactly into `buf`
// (room for one row; unused, and may be null, for an f32 pool).
const float* key_row_f32(const Tensor& pool, int64_t slot, float* buf);

// The checks of scatter_rows and slots_from_local, shared with the CUDA backend (same messages).
void check_scatter_rows(const Tensor& src, const Tensor& slots, const Tensor& dst);
void check_slots_from_local(const Tensor& local, const Tensor& out);

}  // namespace dsi::cpu
