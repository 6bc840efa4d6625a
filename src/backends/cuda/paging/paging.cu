// Paged-pool ops of the CUDA backend; see paging.h and ops/paging.h.
#include <vector>

#include "backends/cpu/paging.h"
#include "backends/cuda/common.cuh"
#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/paging/paging.h"
#include "ops/indexer.h"

namespace dsi::cuda {

namespace {

__global__ void scatter_rows_kernel(ScatterRowsParams p) {
  pdl_enter();
  const int64_t total = p.n * p.d;
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < total; t += step) {
    const int64_t i = t / p.d, c = t % p.d;
    const int64_t s = p.slots[i];
    if (s < 0) continue;
    if (s >= p.n_slots) {
      if (c == 0) atomicMin(p.bad, static_cast<unsigned long long>(i));
      continue;
    }
    const float v = p.src[i * p.src_stride + c];
    if (p.dst_bf16)
      static_cast<uint16_t*>(p.dst)[s * p.dst_stride + c] = f32_to_bf16_bits(v);
    else
      static_cast<float*>(p.dst)[s * p.dst_stride + c] = v;
  }
}

__global__ void slots_from_local_kernel(SlotsFromLocalParams p) {
  pdl_enter();
  const int64_t total = p.rows * p.k;
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < total; t += step) {
    const int32_t l = p.local[t];
    int64_t s = -1;
    if (l >= 0) {
      s = p.pages.slot(t / p.k, l);
      if (s < 0) atomicMin(p.bad, static_cast<unsigned long long>(t));
    }
    p.out[t] = int32_t(s);
  }
}

}  // namespace

void launch_scatter_rows(const ScatterRowsParams& p, cudaStream_t s) {
  const int64_t total = p.n * p.d;
  if (total == 0) return;
  launch(scatter_rows_kernel, grid_for(total, 256), 256, 0, s, p);
}

void launch_slots_from_local(const SlotsFromLocalParams& p, cudaStream_t s) {
  const int64_t total = p.rows * p.k;
  if (total == 0) return;
  launch(slots_from_local_kernel, grid_for(total, 256), 256, 0, s, p);
}

PageTable page_table(const ops::KeyPages* pages, int64_t rows, Device device, const char* op) {
  PageTable t;
  if (pages == nullptr) return t;
  const Tensor& bt = pages->block_tables;
  DSI_CHECK(bt.ndim() == 2 && bt.is_contiguous(), "{}: block_tables must be [n_seqs, max_pages], "
            "got {}", op, bt.desc());
  check_dtype(bt, DType::I32, "block_tables");
  check_shape(pages->row_seq, {rows}, "row_seq");
  check_dtype(pages->row_seq, DType::I32, "row_seq");
  check_on(bt, device, op, "block_tables");
  check_on(pages->row_seq, device, op, "row_seq");
  DSI_CHECK(pages->page_size > 0, "{}: page size {}", op, pages->page_size);
  t.tables = bt.i32();
  t.row_seq = pages->row_seq.i32();
  t.n_seqs = bt.dim(0);
  t.max_pages = bt.dim(1);
  t.page_size = pages->page_size;
  return t;
}

void scatter_rows(const Tensor& src, const Tensor& slots, Tensor& dst) {
  cpu::check_scatter_rows(src, slots, dst);
  check_on(src, dst.device(), "scatter_rows", "src");
  check_on(slots, dst.device(), "scatter_rows", "slots");
  DeviceGuard guard(dst.device());
  ErrorFlag bad("scatter_rows: a slot outside the pool's rows");
  ScatterRowsParams p{};
  p.src = src.f32();
  p.slots = slots.i32();
  p.dst = dst.raw();
  p.dst_bf16 = dst.dtype() == DType::BF16;
  p.n = src.dim(0);
  p.d = src.dim(1);
  p.n_slots = dst.dim(0);
  p.src_stride = src.stride(0);
  p.dst_stride = dst.stride(0);
  p.bad = bad.ptr();
  launch_scatter_rows(p, stream());
  const unsigned long long first = bad.read();
  if (first != ErrorFlag::kNone)
    fail("scatter_rows: slot {} outside the {} rows", read_device(p.slots + first), p.n_slots);
}

void slots_from_local(const Tensor& local, const Tensor& block_tables, const Tensor& row_seq,
                      int page_size, Tensor& out) {
  cpu::check_slots_from_local(local, out);
  check_on(local, out.device(), "slots_from_local", "local");
  DeviceGuard guard(out.device());
  const ops::KeyPages pages{block_tables, row_seq, page_size};
  ErrorFlag bad("slots_from_local: a local token past its sequence's pages");
  SlotsFromLocalParams p{};
  p.local = local.i32();
  p.out = out.i32();
  p.pages = page_table(&pages, local.dim(0), out.device(), "slots_from_local");
  p.rows = local.dim(0);
  p.k = local.dim(1);
  p.bad = bad.ptr();
  launch_slots_from_local(p, stream());
  const unsigned long long first = bad.read();
  if (first != ErrorFlag::kNone)
    fail("slots_from_local: row {} selects local token {} past its pages", first / p.k,
         read_device(p.local + first));
}

}  // namespace dsi::cuda
