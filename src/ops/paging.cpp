// Dispatch of the paging ops; see paging.h.
#include "ops/paging.h"

#include "ops/dispatch.h"

namespace dsi::ops {

void scatter_rows(const Tensor& src, const Tensor& slots, Tensor& dst) {
  DSI_DISPATCH(dst.device(), scatter_rows, src, slots, dst);
}

void slots_from_local(const Tensor& local, const Tensor& block_tables, const Tensor& row_seq,
                      int page_size, Tensor& out) {
  DSI_DISPATCH(out.device(), slots_from_local, local, block_tables, row_seq, page_size, out);
}

}  // namespace dsi::ops
