// CPU reference: y = x W^T for f32 / bf16 / f16 / fp8-block-scaled weights. Weights stay in their
// checkpoint dtype. A few rows of x (decode, MTP verification) stream the weight once, segments of
// a row converted to fp32 and met with every row of x by OpenBLAS dot products; more rows (prefill)
// dequantise blocks of weight rows and multiply them with sgemm.
#include <cblas.h>

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "backends/cpu/cpu_ops.h"
#include "ops/linear.h"

namespace dsi::cpu {

namespace {

// Rows of x up to which a product streams the weight once, row by row (decode steps, MTP
// verification); more rows (prefill) take sgemm on OpenBLAS's threads. fp32 weights, which need
// no conversion, stream up to 4 rows: at 8, sgemm on two threads was faster (bench_cpu_linear).
constexpr int64_t kStreamedRows = 8, kStreamedRowsF32 = 4;
// Columns of a weight row converted to fp32 at a time on the streamed path: 8 KB, in L1 with the
// rows of x they meet.
constexpr int64_t kSegment = 2048;

// Columns [c0, c1) of row r of a checked weight as fp32, written to out.
void dequantize_segment(const LinearWeight& w, int64_t r, int64_t c0, int64_t c1, float* out) {
  const Tensor& wt = w.weight;
  load_span_as_f32(wt.raw(), wt.dtype(), r * wt.dim(1) + c0, c1 - c0, out);
  if (wt.dtype() != DType::F8_E4M3) return;
  // One scale per block of columns; the first block is cut short by the slice's column offset.
  const float* srow = w.scale_inv.f32() + ((w.row0 + r) / w.block_out) * w.scale_inv.dim(1);
  for (int64_t c = c0; c < c1;) {
    const int64_t b = (w.col0 + c) / w.block_in, end = std::min(c1, (b + 1) * w.block_in - w.col0);
    const float s = srow[b];
    for (; c < end; ++c) out[c - c0] *= s;
  }
}

// Rows [row_begin, row_end) of a checked weight as fp32, written to out (row-major, in_features
// apart).
void dequantize_rows_into(const LinearWeight& w, int64_t row_begin, int64_t row_end, float* out) {
  const int64_t in = w.in_features();
  for (int64_t r = row_begin; r < row_end; ++r) dequantize_segment(w, r, 0, in, out + (r - row_begin) * in);
}

// y[i, o] = x[i, :] W[o, :] for a few rows of x (n <= kStreamedRows), on the calling thread: each
// weight row is read once, kSegment columns at a time (converted to fp32 in an L1 buffer unless
// it is fp32 already), and meets every row of x there with a dot product. sgemm would first pack
// all of W, most of its time at a few rows, and sgemv splits each call over OpenBLAS's threads,
// whose hand-offs cost more than these products save and, on a host whose cores are busy, wait on
// threads that are not running. (OpenBLAS runs dot products of up to 10,000 elements on the
// calling thread.)
void streamed_product(const Tensor& x, const LinearWeight& w, Tensor& out) {
  const int64_t n = x.dim(0), rows = w.out_features(), in = w.in_features();
  const bool f32 = w.weight.dtype() == DType::F32;
  float buf[kSegment];
  float acc[kStreamedRows];
  for (int64_t r = 0; r < rows; ++r) {
    std::fill_n(acc, n, 0.0f);
    for (int64_t c0 = 0; c0 < in; c0 += kSegment) {
      const int64_t len = std::min(kSegment, in - c0);
      const float* seg = f32 ? w.weight.f32() + r * in + c0 : buf;
      if (!f32) dequantize_segment(w, r, c0, c0 + len, buf);
      for (int64_t i = 0; i < n; ++i) acc[i] += cblas_sdot(int(len), seg, 1, x.f32() + i * x.stride(0) + c0, 1);
    }
    for (int64_t i = 0; i < n; ++i) out.f32()[i * out.stride(0) + r] = acc[i];
  }
}

// y[i, :rows] = x[i, :] W^T for fp32 W [rows, in] (row-major), on OpenBLAS's threads.
void gemm(const Tensor& x, const float* w, int64_t rows, int64_t in, float* y, int y_stride) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(x.dim(0)), int(rows), int(in), 1.0f, x.f32(),
              int(x.stride(0)), w, int(in), 0.0f, y, y_stride);
}

}  // namespace

Tensor dequantize_rows(const LinearWeight& w, int64_t row_begin, int64_t row_end) {
  const Tensor& wt = w.weight;
  ops::check_linear_weight(w);
  DSI_CHECK(0 <= row_begin && row_begin <= row_end && row_end <= wt.dim(0),
            "dequantize_rows: rows [{}, {}) of {}", row_begin, row_end, wt.desc());
  Tensor out = Tensor::empty({row_end - row_begin, wt.dim(1)}, DType::F32);
  dequantize_rows_into(w, row_begin, row_end, out.f32());
  return out;
}

void linear(const Tensor& x, const LinearWeight& w, Tensor& out) {
  const int64_t out_f = w.out_features(), in_f = w.in_features();
  DSI_CHECK(x.ndim() == 2 && x.dim(1) == in_f && x.stride(1) == 1,
            "linear: input {} does not match weight {}", x.desc(), w.weight.desc());
  check_dtype(x, DType::F32, "linear input");
  DSI_CHECK(out.ndim() == 2 && out.dim(0) == x.dim(0) && out.dim(1) == out_f && out.stride(1) == 1,
            "linear: output {} for input {} and weight {}", out.desc(), x.desc(), w.weight.desc());
  const int64_t n = x.dim(0);
  if (n == 0 || out_f == 0) return;
  if (in_f == 0) {
    for (int64_t i = 0; i < n; ++i) std::fill_n(out.f32() + i * out.stride(0), out_f, 0.0f);
    return;
  }
  ops::check_linear_weight(w);  // once a product
  if (n <= (w.weight.dtype() == DType::F32 ? kStreamedRowsF32 : kStreamedRows)) {
    streamed_product(x, w, out);
    return;
  }
  if (w.weight.dtype() == DType::F32) {
    gemm(x, w.weight.f32(), out_f, in_f, out.f32(), int(out.stride(0)));
    return;
  }
  // Dequantise ~1 MB of weight rows at a time into this thread's buffer (kept from product to
  // product: a fresh megabyte each time cost page faults and clearing on every call).
  const int64_t chunk = std::max<int64_t>(1, (1 << 18) / in_f);
  thread_local std::vector<float> scratch;
  const size_t need = size_t(std::min(chunk, out_f) * in_f);
  if (scratch.size() < need) scratch.resize(need);
  for (int64_t r0 = 0; r0 < out_f; r0 += chunk) {
    const int64_t r1 = std::min(out_f, r0 + chunk);
    dequantize_rows_into(w, r0, r1, scratch.data());
    gemm(x, scratch.data(), r1 - r0, in_f, out.f32() + r0, int(out.stride(0)));
  }
}

void share_host_cores(int ranks_on_host) {
  const char* fixed = std::getenv("OPENBLAS_NUM_THREADS");
  if (fixed != nullptr && *fixed != '\0') return;
  openblas_set_num_threads(std::max(1, openblas_get_num_procs() / std::max(1, ranks_on_host)));
}

}  // namespace dsi::cpu
