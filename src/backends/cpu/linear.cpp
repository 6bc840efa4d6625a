// CPU reference: y = x W^T for f32 / bf16 / f16 / fp8-block-scaled weights. Weights stay in their
// checkpoint dtype; blocks of rows are dequantised to fp32 and multiplied with OpenBLAS (sgemm, or
// at one row a dot product per weight row).
#include <cblas.h>

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "backends/cpu/cpu_ops.h"
#include "ops/linear.h"

namespace dsi::cpu {

namespace {

// OpenBLAS computes a dot product of at most 10,000 elements on the calling thread; longer ones
// are split over its threads.
constexpr int64_t kDotSegment = 8192;

float dot(const float* a, const float* b, int64_t n) {
  if (n <= kDotSegment) return cblas_sdot(int(n), a, 1, b, 1);
  float s = 0.0f;
  for (int64_t i = 0; i < n; i += kDotSegment)
    s += cblas_sdot(int(std::min(kDotSegment, n - i)), a + i, 1, b + i, 1);
  return s;
}

// y[i, :rows] = x[i, :] W^T for fp32 W [rows, in] (row-major). One row of x (a decode step) takes a
// dot product per weight row, on the calling thread: sgemm would first pack all of W, which is most
// of its time at one row (4-7x slower), and sgemv splits each call over OpenBLAS's threads, whose
// hand-offs cost more than these products save (a megabyte of weights, in cache) and, on a host
// whose cores are busy, wait on threads that are not running.
void product(const Tensor& x, const float* w, int64_t rows, int64_t in, float* y, int y_stride) {
  const int64_t n = x.dim(0);
  if (n == 1) {
    for (int64_t r = 0; r < rows; ++r) y[r] = dot(w + r * in, x.f32(), in);
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(n), int(rows), int(in), 1.0f, x.f32(),
              int(x.stride(0)), w, int(in), 0.0f, y, y_stride);
}

// Rows [row_begin, row_end) of a checked weight as fp32, written to out (row-major, in_features
// apart).
void dequantize_rows_into(const LinearWeight& w, int64_t row_begin, int64_t row_end, float* out) {
  const Tensor& wt = w.weight;
  const int64_t in = wt.dim(1);
  const bool fp8 = wt.dtype() == DType::F8_E4M3;
  for (int64_t r = row_begin; r < row_end; ++r) {
    float* orow = out + (r - row_begin) * in;
    load_span_as_f32(wt.raw(), wt.dtype(), r * in, in, orow);
    if (!fp8) continue;
    // One scale per block of columns; the first block is cut short by the slice's column offset.
    const float* srow = w.scale_inv.f32() + ((w.row0 + r) / w.block_out) * w.scale_inv.dim(1);
    for (int64_t c0 = 0, b = 0; c0 < in; ++b) {
      const int64_t c1 = std::min(in, (b + 1) * w.block_in - w.col0);
      const float s = srow[b];
      for (int64_t c = c0; c < c1; ++c) orow[c] *= s;
      c0 = c1;
    }
  }
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
  if (w.weight.dtype() == DType::F32 && w.weight.is_contiguous()) {
    product(x, w.weight.f32(), out_f, in_f, out.f32(), int(out.stride(0)));
    return;
  }
  // Dequantise ~1 MB of weight rows at a time into this thread's buffer (kept from product to
  // product: a fresh megabyte each time cost page faults and clearing on every call).
  ops::check_linear_weight(w);  // once a product, not a chunk
  const int64_t chunk = std::max<int64_t>(1, (1 << 18) / in_f);
  thread_local std::vector<float> scratch;
  const size_t need = size_t(std::min(chunk, out_f) * in_f);
  if (scratch.size() < need) scratch.resize(need);
  for (int64_t r0 = 0; r0 < out_f; r0 += chunk) {
    const int64_t r1 = std::min(out_f, r0 + chunk);
    dequantize_rows_into(w, r0, r1, scratch.data());
    product(x, scratch.data(), r1 - r0, in_f, out.f32() + r0, int(out.stride(0)));
  }
}

void share_host_cores(int ranks_on_host) {
  const char* fixed = std::getenv("OPENBLAS_NUM_THREADS");
  if (fixed != nullptr && *fixed != '\0') return;
  openblas_set_num_threads(std::max(1, openblas_get_num_procs() / std::max(1, ranks_on_host)));
}

}  // namespace dsi::cpu
