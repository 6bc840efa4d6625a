// Indexer logits of the CUDA backend; see indexer.h and ops/indexer.h.
#include <utility>
#include <vector>

#include "backends/cuda/common.cuh"
#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/indexer/indexer.h"
#include "ops/indexer.h"

namespace dsi::cuda {

namespace {

__global__ void indexer_logits_kernel(IndexerParams p) {
  pdl_enter();
  const int64_t total = p.rows * p.n_keys;
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < total; t += step) {
    const int64_t r = t / p.n_keys, s = t % p.n_keys;
    const int64_t bound = p.bounds[r];
    if (bound < 0 || bound > p.n_keys) {
      if (s == 0) atomicMin(p.bad, static_cast<unsigned long long>(r));
      continue;
    }
    if (s >= bound) {
      p.logits[t] = -INFINITY;
      continue;
    }
    const int64_t slot = p.pages.slot(r, s);
    if (slot < 0 || slot >= p.n_slots) {
      atomicMin(p.bad_key, static_cast<unsigned long long>(t));
      p.logits[t] = NAN;
      continue;
    }
    const int64_t k0 = slot * p.key_stride;
    const float* w = p.weights + r * p.heads;
    float acc = 0.0f;
    for (int64_t j = 0; j < p.heads; ++j) {
      const float* qj = p.q + (r * p.heads + j) * p.d;
      float dot = 0.0f;
      for (int64_t c = 0; c < p.d; ++c)
        dot = __fadd_rn(dot, __fmul_rn(qj[c], load_float(p.keys, p.key_kind, k0 + c)));
      const float scaled = __fmul_rn(dot, p.softmax_scale);
      const float relu = scaled < 0.0f ? 0.0f : scaled;  // std::max(scaled, 0.0f)
      acc = __fadd_rn(acc, __fmul_rn(w[j], relu));
    }
    p.logits[t] = acc;
  }
}

}  // namespace

void launch_indexer_logits(const IndexerParams& p, cudaStream_t s) {
  const int64_t total = p.rows * p.n_keys;
  if (total == 0) return;
  launch(indexer_logits_kernel, grid_for(total, 128), 128, 0, s, p);
}

void indexer_logits(const Tensor& q, const Tensor& weights, const Tensor& keys,
                    const Tensor& bounds, float softmax_scale, Tensor& logits,
                    const ops::KeyPages* pages) {
  DSI_CHECK(q.ndim() == 3 && q.is_contiguous(), "indexer_logits: q must be [rows, heads, d], got {}",
            q.desc());
  const int64_t rows = q.dim(0), heads = q.dim(1), d = q.dim(2);
  check_shape(weights, {rows, heads}, "indexer_logits weights");
  DSI_CHECK(keys.ndim() == 2 && keys.dim(1) == d && keys.stride(1) == 1,
            "indexer_logits: keys {} for q {}", keys.desc(), q.desc());
  DSI_CHECK(logits.ndim() == 2 && logits.dim(0) == rows,
            "indexer_logits: logits {} for {} rows", logits.desc(), rows);
  const int64_t n_keys = logits.dim(1);
  check_shape(bounds, {rows}, "indexer_logits bounds");
  if (!pages) check_shape(logits, {rows, keys.dim(0)}, "indexer_logits logits");
  DSI_CHECK(weights.is_contiguous() && bounds.is_contiguous() && logits.is_contiguous(),
            "indexer_logits: weights, bounds and logits must be contiguous");
  DSI_CHECK(keys.dtype() == DType::F32 || keys.dtype() == DType::BF16,
            "indexer_logits: keys must be f32 or bf16 (a bf16 cache), got {}", keys.desc());
  for (const auto& [t, what] : {std::pair<const Tensor*, const char*>{&weights, "weights"},
                                {&keys, "keys"}, {&bounds, "bounds"}, {&logits, "logits"}})
    check_on(*t, q.device(), "indexer_logits", what);
  DeviceGuard guard(q.device());
  ErrorFlag bad("indexer_logits: a row's bound outside [0, keys]");
  ErrorFlag bad_key("indexer_logits: a key on a page outside the pool");
  IndexerParams p{};
  p.pages = page_table(pages, rows, q.device(), "indexer_logits");
  p.n_slots = keys.dim(0);
  p.bad_key = bad_key.ptr();
  p.q = q.f32();
  p.weights = weights.f32();
  p.keys = keys.raw();
  p.key_kind = float_kind(keys.dtype(), "indexer_logits keys");
  p.bounds = bounds.i32();
  p.logits = logits.f32();
  p.key_stride = keys.stride(0);
  p.rows = rows;
  p.heads = heads;
  p.d = d;
  p.n_keys = n_keys;
  p.softmax_scale = softmax_scale;
  p.bad = bad.ptr();
  launch_indexer_logits(p, stream());
  // A bad bound is reported by the thread of key 0, which only exists when n_keys > 0; with no
  // keys the only valid bound is 0, checked here on the host copy of the flag's row.
  unsigned long long first = bad.read();
  if (n_keys == 0 && rows > 0) {
    std::vector<int32_t> b(static_cast<size_t>(rows));
    copy_to_host(b.data(), p.bounds, b.size() * sizeof(int32_t));
    for (int64_t r = 0; r < rows && first == ErrorFlag::kNone; ++r)
      if (b[size_t(r)] != 0) first = static_cast<unsigned long long>(r);
  }
  if (first != ErrorFlag::kNone)
    fail("indexer_logits: bound {} outside [0, {}]", read_device(p.bounds + first), n_keys);
  const unsigned long long key = bad_key.read();
  if (key != ErrorFlag::kNone)
    fail("indexer_logits: key {} of row {} has no slot among the {} keys", key % n_keys,
         key / n_keys, p.n_slots);
}

}  // namespace dsi::cuda
