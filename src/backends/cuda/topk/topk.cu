// Top-k and top-k merge of the CUDA backend; see topk.h and ops/topk.h.
#include <cub/device/device_segmented_radix_sort.cuh>

#include <algorithm>

#include "backends/cuda/common.cuh"
#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/topk/topk.h"

namespace dsi::cuda {

namespace {

// Rows per sort: cub takes int item counts; keep each sort well inside them.
constexpr int64_t kMaxSortItems = int64_t(1) << 30;

__global__ void topk_keys_kernel(TopkKeysParams p) {
  pdl_enter();
  const int64_t total = p.rows * p.n;
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < total; t += step) {
    const int64_t r = t / p.n, s = t % p.n;
    const float v = p.scores[r * p.score_stride + s];
    unsigned long long key = 0;
    if (p.positions != nullptr) {
      const int32_t pos = p.positions[t];
      if (pos >= 0 && v > -INFINITY) key = topk_key(v, uint32_t(pos));
    } else if (s < int64_t(p.bounds[r]) && v > -INFINITY) {
      key = topk_key(v, uint32_t(s));
    }
    p.keys[t] = key;
  }
}

__global__ void topk_decode_kernel(TopkDecodeParams p) {
  pdl_enter();
  const int64_t total = p.rows * p.k;
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < total; t += step) {
    const int64_t r = t / p.k, j = t % p.k;
    const unsigned long long key = j < p.n ? p.sorted[r * p.n + j] : 0ull;
    const int32_t pos = key != 0 ? int32_t(topk_key_position(key)) : -1;
    p.indices[t] = pos;
    if (p.values != nullptr) p.values[t] = pos >= 0 ? p.scores[r * p.score_stride + pos] : -INFINITY;
  }
}

__global__ void check_bounds_kernel(const int32_t* bounds, int64_t rows, int64_t n,
                                    unsigned long long* bad) {
  pdl_enter();
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; r < rows; r += step)
    if (bounds[r] < 0 || int64_t(bounds[r]) > n) atomicMin(bad, static_cast<unsigned long long>(r));
}

__global__ void segment_offsets_kernel(int* offsets, int64_t rows, int64_t n) {
  pdl_enter();
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; r <= rows; r += step)
    offsets[r] = int(r * n);
}

}  // namespace

void launch_topk_keys(const TopkKeysParams& p, cudaStream_t s) {
  const int64_t total = p.rows * p.n;
  if (total == 0) return;
  launch(topk_keys_kernel, grid_for(total, 256), 256, 0, s, p);
}

void launch_topk_decode(const TopkDecodeParams& p, cudaStream_t s) {
  const int64_t total = p.rows * p.k;
  if (total == 0) return;
  launch(topk_decode_kernel, grid_for(total, 256), 256, 0, s, p);
}

void launch_topk_check_bounds(const int32_t* bounds, int64_t rows, int64_t n,
                              unsigned long long* bad, cudaStream_t s) {
  if (rows == 0) return;
  launch(check_bounds_kernel, grid_for(rows, 256), 256, 0, s, bounds, rows, n, bad);
}

namespace {

// The segment offsets r * n (r = 0..rows) of a segmented sort of rows of n items.
Scratch row_offsets(int64_t rows, int64_t n, cudaStream_t s) {
  DSI_CHECK(rows * n < kMaxSortItems * 2, "topk: sort of {} x {} items too large", rows, n);
  Scratch offsets(size_t(rows + 1) * sizeof(int));
  launch(segment_offsets_kernel, grid_for(rows + 1, 256), 256, 0, s, offsets.as<int>(), rows, n);
  return offsets;
}

}  // namespace

void sort_rows_descending(const unsigned long long* keys_in, unsigned long long* keys_out,
                          int64_t rows, int64_t n, cudaStream_t s) {
  if (rows == 0 || n == 0) return;
  const Scratch offsets = row_offsets(rows, n, s);
  const int items = int(rows * n), segments = int(rows);
  size_t temp_bytes = 0;
  DSI_CUDA_CHECK(cub::DeviceSegmentedRadixSort::SortKeysDescending(
      nullptr, temp_bytes, keys_in, keys_out, items, segments, offsets.as<int>(),
      offsets.as<int>() + 1, 0, 64, s));
  Scratch temp(std::max<size_t>(temp_bytes, 1));
  DSI_CUDA_CHECK(cub::DeviceSegmentedRadixSort::SortKeysDescending(
      temp.as<void>(), temp_bytes, keys_in, keys_out, items, segments, offsets.as<int>(),
      offsets.as<int>() + 1, 0, 64, s));
  DSI_CUDA_CHECK_LAUNCH();
}

namespace {

// Lists each row's winners by ascending position: a segmented radix sort of the k positions as
// unsigned keys (-1 becomes the largest, so the padding stays last), carrying the values along.
void sort_rows_by_position(const int32_t* idx_in, const float* val_in, int32_t* idx_out, float* val_out,
                           int64_t rows, int64_t k, cudaStream_t s) {
  if (rows == 0 || k == 0) return;
  const Scratch offsets = row_offsets(rows, k, s);
  const int items = int(rows * k), segments = int(rows);
  const int* begin = offsets.as<int>();
  const int* end = begin + 1;
  const auto* kin = reinterpret_cast<const uint32_t*>(idx_in);
  auto* kout = reinterpret_cast<uint32_t*>(idx_out);
  size_t temp_bytes = 0;
  if (val_in != nullptr) {
    DSI_CUDA_CHECK(cub::DeviceSegmentedRadixSort::SortPairs(nullptr, temp_bytes, kin, kout, val_in, val_out,
                                                            items, segments, begin, end, 0, 32, s));
    Scratch temp(std::max<size_t>(temp_bytes, 1));
    DSI_CUDA_CHECK(cub::DeviceSegmentedRadixSort::SortPairs(temp.as<void>(), temp_bytes, kin, kout, val_in,
                                                            val_out, items, segments, begin, end, 0, 32, s));
  } else {
    DSI_CUDA_CHECK(cub::DeviceSegmentedRadixSort::SortKeys(nullptr, temp_bytes, kin, kout, items, segments,
                                                           begin, end, 0, 32, s));
    Scratch temp(std::max<size_t>(temp_bytes, 1));
    DSI_CUDA_CHECK(cub::DeviceSegmentedRadixSort::SortKeys(temp.as<void>(), temp_bytes, kin, kout, items,
                                                           segments, begin, end, 0, 32, s));
  }
  DSI_CUDA_CHECK_LAUNCH();
}

// Keys, sort and decode for rows [0, rows) in chunks that keep each sort inside cub's int sizes;
// the decoded winners (best first) are then listed by position.
void select_rows(const TopkKeysParams& base, const TopkDecodeParams& dbase) {
  const int64_t rows = base.rows, n = std::max<int64_t>(base.n, 1);
  const int64_t chunk = std::max<int64_t>(1, std::min(rows, kMaxSortItems / n));
  DSI_CHECK(base.n <= kMaxSortItems, "topk: rows of {} scores are too long", base.n);
  Scratch keys(size_t(chunk * base.n) * sizeof(unsigned long long));
  Scratch sorted(size_t(chunk * base.n) * sizeof(unsigned long long));
  Scratch best_idx(size_t(chunk * dbase.k) * sizeof(int32_t));
  Scratch best_val(dbase.values != nullptr ? size_t(chunk * dbase.k) * sizeof(float) : 0);
  for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
    const int64_t rc = std::min(chunk, rows - r0);
    TopkKeysParams kp = base;
    kp.scores = base.scores + r0 * base.score_stride;
    if (kp.bounds != nullptr) kp.bounds += r0;
    if (kp.positions != nullptr) kp.positions += r0 * base.n;
    kp.keys = keys.as<unsigned long long>();
    kp.rows = rc;
    launch_topk_keys(kp, stream());
    sort_rows_descending(keys.as<unsigned long long>(), sorted.as<unsigned long long>(), rc, base.n,
                         stream());
    TopkDecodeParams dp = dbase;
    dp.sorted = sorted.as<unsigned long long>();
    dp.scores = dbase.scores + r0 * dbase.score_stride;
    dp.indices = best_idx.as<int32_t>();
    dp.values = dbase.values != nullptr ? best_val.as<float>() : nullptr;
    dp.rows = rc;
    launch_topk_decode(dp, stream());
    sort_rows_by_position(dp.indices, dp.values, dbase.indices + r0 * dbase.k,
                          dbase.values != nullptr ? dbase.values + r0 * dbase.k : nullptr, rc, dbase.k,
                          stream());
  }
}

}  // namespace

void topk(const Tensor& scores, const Tensor& bounds, int k, Tensor& indices, Tensor* values) {
  DSI_CHECK(scores.ndim() == 2 && scores.stride(1) == 1, "topk: scores must be [rows, n], got {}",
            scores.desc());
  check_dtype(scores, DType::F32, "topk scores");
  const int64_t rows = scores.dim(0), n = scores.dim(1);
  DSI_CHECK(k >= 0, "topk: k = {} must be >= 0", k);
  check_shape(bounds, {rows}, "topk bounds");
  check_shape(indices, {rows, k}, "topk indices");
  DSI_CHECK(indices.is_contiguous(), "topk: indices must be contiguous");
  const bool want_values = values != nullptr && values->defined();
  if (want_values) {
    check_shape(*values, {rows, k}, "topk values");
    DSI_CHECK(values->is_contiguous(), "topk: values must be contiguous");
    check_on(*values, scores.device(), "topk", "values");
  }
  check_on(bounds, scores.device(), "topk", "bounds");
  check_on(indices, scores.device(), "topk", "indices");
  DSI_CHECK(bounds.is_contiguous(), "topk: bounds must be contiguous");
  DSI_CHECK(n < (int64_t(1) << 31), "topk: {} positions do not fit int32 indices", n);
  DeviceGuard guard(scores.device());
  ErrorFlag bad("topk: a row's bound outside [0, keys]");
  auto fail_on_bad_bound = [&] {
    const unsigned long long first = bad.read();
    if (first != ErrorFlag::kNone)
      fail("topk: bound {} outside [0, {}]", read_device(bounds.i32() + first), n);
  };
  if (rows > 0 && k > 0 && topk_select_supported(n, k)) {  // the select checks the bounds itself
    TopkSelectParams sp{};
    sp.scores = scores.f32();
    sp.bounds = bounds.i32();
    sp.indices = indices.i32();
    sp.values = want_values ? values->f32() : nullptr;
    sp.score_stride = scores.stride(0);
    sp.rows = rows;
    sp.n = n;
    sp.k = k;
    sp.bad = bad.ptr();
    launch_topk_select(sp, stream());
    fail_on_bad_bound();
    return;
  }
  launch_topk_check_bounds(bounds.i32(), rows, n, bad.ptr(), stream());
  fail_on_bad_bound();
  if (rows == 0 || k == 0) return;
  TopkKeysParams kp{};
  kp.scores = scores.f32();
  kp.bounds = bounds.i32();
  kp.score_stride = scores.stride(0);
  kp.rows = rows;
  kp.n = n;
  TopkDecodeParams dp{};
  dp.scores = scores.f32();
  dp.indices = indices.i32();
  dp.values = want_values ? values->f32() : nullptr;
  dp.score_stride = scores.stride(0);
  dp.rows = rows;
  dp.n = n;
  dp.k = k;
  select_rows(kp, dp);
}

void topk_merge(const Tensor& scores, const Tensor& positions, int k, Tensor& winners) {
  DSI_CHECK(scores.ndim() == 2 && scores.is_contiguous(), "topk_merge: scores {}", scores.desc());
  check_dtype(scores, DType::F32, "topk_merge scores");
  check_shape(positions, scores.shape(), "topk_merge positions");
  check_dtype(positions, DType::I32, "topk_merge positions");
  const int64_t rows = scores.dim(0), m = scores.dim(1);
  check_shape(winners, {rows, k}, "topk_merge winners");
  DSI_CHECK(positions.is_contiguous() && winners.is_contiguous(), "topk_merge: contiguous tensors");
  DSI_CHECK(k >= 0, "topk_merge: k = {} must be >= 0", k);
  check_on(positions, scores.device(), "topk_merge", "positions");
  check_on(winners, scores.device(), "topk_merge", "winners");
  if (rows == 0 || k == 0) return;
  DeviceGuard guard(scores.device());
  TopkKeysParams kp{};
  kp.scores = scores.f32();
  kp.positions = positions.i32();
  kp.score_stride = m;
  kp.rows = rows;
  kp.n = m;
  TopkDecodeParams dp{};
  dp.scores = scores.f32();
  dp.indices = winners.i32();
  dp.score_stride = m;
  dp.rows = rows;
  dp.n = m;
  dp.k = k;
  select_rows(kp, dp);
}

}  // namespace dsi::cuda
