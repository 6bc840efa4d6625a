// Paged-pool kernels of the CUDA backend (ops/paging.h): row scatter into pool slots and the
// conversion of selected local token indices into pool slots through the block tables.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/tensor.h"
#include "ops/indexer.h"

namespace dsi::cuda {

// Row r's key s lives in slot tables[row_seq[r] * max_pages + s / page_size] * page_size
// + s % page_size; tables == nullptr means slot s (contiguous keys).
struct PageTable {
  const int32_t* tables = nullptr;   // [n_seqs, max_pages], -1 = no page
  const int32_t* row_seq = nullptr;  // [rows]
  int64_t n_seqs = 0, max_pages = 0;
  int page_size = 1;

  // -1 when the key falls outside the row's pages (or its sequence id is invalid).
  __device__ int64_t slot(int64_t row, int64_t s) const {
    if (tables == nullptr) return s;
    const int32_t seq = row_seq[row];
    const int64_t i = s / page_size;
    if (seq < 0 || seq >= n_seqs || i >= max_pages) return -1;
    const int32_t page = tables[seq * max_pages + i];
    return page < 0 ? -1 : int64_t(page) * page_size + s % page_size;
  }
};

struct ScatterRowsParams {
  const float* src;      // [n, d], row stride src_stride
  const int32_t* slots;  // [n], -1 = skip
  void* dst;             // [n_slots, d] f32, or bf16 (rounded to nearest even), row stride dst_stride
  bool dst_bf16;
  int64_t n, d, n_slots, src_stride, dst_stride;
  unsigned long long* bad;  // lowered to the first row whose slot is >= n_slots
};
void launch_scatter_rows(const ScatterRowsParams& p, cudaStream_t stream);

struct SlotsFromLocalParams {
  const int32_t* local;  // [rows, k], -1 = empty
  int32_t* out;          // [rows, k]
  PageTable pages;
  int64_t rows, k;
  unsigned long long* bad;  // lowered to the first flat index whose token has no page
};
void launch_slots_from_local(const SlotsFromLocalParams& p, cudaStream_t stream);

// The kernel view of `pages` (checked: dtypes, shapes, device); contiguous keys when null.
PageTable page_table(const ops::KeyPages* pages, int64_t rows, Device device, const char* op);

}  // namespace dsi::cuda
