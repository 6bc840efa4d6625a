// MLA ops of the CUDA backend; see mla.h and ops/mla.h.
#include <algorithm>
#include <climits>

#include "backends/cuda/common.cuh"
#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/linear/cublas.h"
#include "backends/cuda/linear/gemv.h"
#include "backends/cuda/linear/linear.h"
#include "backends/cuda/memory/memory.h"
#include "backends/cuda/mla/mla.h"
#include "ops/linear.h"
#include "ops/mla.h"

namespace dsi::cuda {

namespace {

constexpr int kMlaThreads = 256;

// One block per (row, head). Shared memory: sel[topk] (key row or -1), p[topk] (scores, then
// unnormalised probabilities), red[33] for the reductions.
__global__ void __launch_bounds__(kMlaThreads) sparse_mla_kernel(SparseMlaParams p) {
  pdl_enter();
  extern __shared__ float smem[];
  int32_t* sel = reinterpret_cast<int32_t*>(smem);
  float* prob = smem + p.topk;
  float* red = prob + p.topk;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  for (int64_t bh = blockIdx.x; bh < p.rows * p.heads; bh += gridDim.x) {
    const int64_t r = bh / p.heads, h = bh % p.heads;
    const int32_t* idx = p.indices + r * p.topk;
    for (int64_t j = threadIdx.x; j < p.topk; j += blockDim.x) {
      const int32_t s = idx[j];
      if (s >= p.n_keys && h == 0) atomicMin(p.bad, static_cast<unsigned long long>(r * p.topk + j));
      sel[j] = (s >= 0 && s < p.n_keys) ? s : -1;
    }
    __syncthreads();
    // Scores: one warp per selected key, lanes split the dk dims.
    const float* q = p.q + r * p.q_s0 + h * p.q_s1;
    for (int64_t j = warp; j < p.topk; j += nwarps) {
      const int32_t s = sel[j];
      if (s < 0) {
        if (lane == 0) prob[j] = -INFINITY;
        continue;
      }
      const int64_t k0 = int64_t(s) * p.kv_stride;
      float dot = 0.0f;
      for (int64_t c = lane; c < p.dk; c += 32)
        dot = __fadd_rn(dot, __fmul_rn(q[c], load_float(p.kv, p.kv_kind, k0 + c)));
      dot = warp_sum(dot);
      if (lane == 0) prob[j] = __fmul_rn(dot, p.softmax_scale);
    }
    __syncthreads();
    float m = -INFINITY, cnt = 0.0f;
    for (int64_t j = threadIdx.x; j < p.topk; j += blockDim.x) {
      if (sel[j] < 0) continue;
      m = fmaxf(m, prob[j]);
      cnt += 1.0f;
    }
    m = block_max(m, red);
    cnt = block_sum(cnt, red);  // exact: counts stay far below 2^24
    float* o = p.out + bh * p.dv;
    if (cnt == 0.0f) {  // no key: out = 0, lse = -inf (block-uniform branch)
      for (int c = threadIdx.x; c < p.dv; c += blockDim.x) o[c] = 0.0f;
      if (threadIdx.x == 0) p.lse[bh] = -INFINITY;
      __syncthreads();  // sel/prob are rewritten by the next (row, head)
      continue;
    }
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < p.topk; j += blockDim.x) {
      float e = 0.0f;
      if (sel[j] >= 0) e = exp_f(__fsub_rn(prob[j], m));
      prob[j] = e;
      sum = __fadd_rn(sum, e);
    }
    sum = block_sum(sum, red);  // its barriers also publish prob[]
    // out[c] = sum_j p_j v_j[c] / sum, accumulated in key order like the CPU reference.
    for (int c = threadIdx.x; c < p.dv; c += blockDim.x) {
      float acc = 0.0f;
      for (int64_t j = 0; j < p.topk; ++j) {
        const int32_t s = sel[j];
        if (s >= 0)
          acc = __fadd_rn(acc, __fmul_rn(prob[j], load_float(p.kv, p.kv_kind, int64_t(s) * p.kv_stride + c)));
      }
      o[c] = __fdiv_rn(acc, sum);
    }
    if (threadIdx.x == 0) p.lse[bh] = __fadd_rn(m, log_f(sum));
    __syncthreads();  // sel/prob are rewritten by the next (row, head)
  }
}

// Column-major strided-batched sgemm over heads, fp32 in and out.
void batched_sgemm(cublasOperation_t ta, int64_t m, int64_t n, int64_t k, const float* a,
                   int64_t lda, int64_t stride_a, const float* b, int64_t ldb, int64_t stride_b,
                   float* c, int64_t ldc, int64_t stride_c, int64_t batch) {
  DSI_CHECK(m <= INT_MAX && n <= INT_MAX && k <= INT_MAX && lda <= INT_MAX && ldb <= INT_MAX &&
                ldc <= INT_MAX && batch <= INT_MAX,
            "mla: batched GEMM {} x {} x {} (batch {}) beyond cuBLAS's 32-bit sizes", m, n, k, batch);
  const float alpha = 1.0f, beta = 0.0f;
  DSI_CUBLAS_CHECK(cublasSgemmStridedBatched(cublas_handle(), ta, CUBLAS_OP_N, int(m), int(n), int(k),
                                             &alpha, a, int(lda), stride_a, b, int(ldb), stride_b,
                                             &beta, c, int(ldc), stride_c, int(batch)));
}

}  // namespace

size_t sparse_mla_smem_bytes(int64_t topk) { return size_t(topk) * 8 + 33 * sizeof(float); }

void launch_sparse_mla(const SparseMlaParams& p, cudaStream_t s) {
  const int64_t blocks = p.rows * p.heads;
  if (blocks == 0) return;
  const size_t smem = sparse_mla_smem_bytes(p.topk);
  if (smem > 48 * 1024) {
    int dev = 0, max_smem = 0;
    DSI_CUDA_CHECK(cudaGetDevice(&dev));
    DSI_CUDA_CHECK(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    DSI_CHECK(smem <= size_t(max_smem), "sparse_mla: top-k of {} needs {} bytes of shared memory, the "
              "device has {}", p.topk, smem, max_smem);
    DSI_CUDA_CHECK(cudaFuncSetAttribute(sparse_mla_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        int(smem)));
  }
  launch(sparse_mla_kernel, grid_items(blocks), kMlaThreads, smem, s, p);
}

namespace {

// kv_b dequantised to fp32 [heads * per, lora] in scratch (the many-row fallback: prefill).
Tensor dequantized_kv_b(const LinearWeight& kv_b, Scratch& buf) {
  const int64_t rows = kv_b.out_features(), lora = kv_b.in_features();
  buf = Scratch(size_t(rows * lora) * sizeof(float));
  Tensor t = Tensor::wrap(buf.as<float>(), {rows, lora}, DType::F32, kv_b.weight.device());
  dequantize_rows_to(kv_b, 0, rows, t);
  return t;
}

// The checks both ops share: a [rows, heads, *] f32 input and output on kv_b's device.
void check_head_tensors(const Tensor& in, const Tensor& out, const LinearWeight& kv_b, const char* op) {
  check_dtype(in, DType::F32, op);
  check_dtype(out, DType::F32, op);
  check_on(in, kv_b.weight.device(), op, "input");
  check_on(out, kv_b.weight.device(), op, "out");
  validate_weight(kv_b, 0, kv_b.out_features());
}

// The per-head products as one strided batch over kv_b: head h reads kv_b's rows from
// h * per + first on (scale rows follow), x[:, h, :] and writes y[:, h, :]; in, out and n are the
// caller's.
GemvParams head_batch(const LinearWeight& kv_b, int64_t first, int64_t per, int64_t heads,
                      const Tensor& x, Tensor& y) {
  GemvParams g = gemv_weight_params(kv_b);
  g.w = static_cast<const char*>(g.w) + first * kv_b.in_features() * int64_t(dtype_size(kv_b.weight.dtype()));
  g.row0 += first;
  g.n_groups = int(heads);
  g.batch_rows = per;
  g.x = x.f32();
  g.y = y.f32();
  g.batch_x = x.stride(1);
  g.batch_y = y.stride(1);
  g.ldx = x.stride(0);
  g.ldy = y.stride(0);
  return g;
}

// mla_absorb_q's call, checked: its sizes, and at decode sizes (rows, nope and lora > 0, up to 4
// kGemvTRows rows, shapes the kernel takes) the transposed GEMV's params: W_UK[h] ([nope, lora],
// rows h * per.. of kv_b) read in place.
struct AbsorbPlan {
  int64_t rows, heads, nope, lora, per;
  bool transposed;
  GemvParams g;
};
AbsorbPlan absorb_plan(const Tensor& q_nope, const LinearWeight& kv_b, Tensor& out) {
  DSI_CHECK(q_nope.ndim() == 3 && q_nope.stride(2) == 1, "mla_absorb_q: q_nope {}", q_nope.desc());
  AbsorbPlan a{};
  a.rows = q_nope.dim(0), a.heads = q_nope.dim(1), a.nope = q_nope.dim(2);
  DSI_CHECK(out.ndim() == 3 && out.dim(0) == a.rows && out.dim(1) == a.heads && out.stride(2) == 1,
            "mla_absorb_q: out {} for q_nope {}", out.desc(), q_nope.desc());
  a.lora = out.dim(2);
  a.per = ops::mla_rows_per_head(kv_b, a.heads, a.lora, a.nope, "mla_absorb_q");
  check_head_tensors(q_nope, out, kv_b, "mla_absorb_q");
  if (a.rows == 0 || a.lora == 0 || a.nope == 0 || a.rows > 4 * kGemvTRows || a.heads > 65535) return a;
  a.g = head_batch(kv_b, 0, a.per, a.heads, q_nope, out);
  a.g.in = a.nope;
  a.g.out = a.lora;
  a.g.n = int(std::min<int64_t>(a.rows, kGemvTRows));
  a.transposed = gemv_t_ok(a.g);
  return a;
}

// The transposed launches of a plan, kGemvTRows rows each; with `rope` the first also rotates
// every row's rope dims (launch_gemv_t).
void launch_absorb_t(AbsorbPlan a, const Tensor& q_nope, Tensor& out, const RopeParams* rope) {
  for (int64_t r = 0; r < a.rows; r += kGemvTRows) {
    a.g.x = q_nope.f32() + r * q_nope.stride(0);
    a.g.y = out.f32() + r * out.stride(0);
    a.g.n = int(std::min<int64_t>(a.rows - r, kGemvTRows));
    launch_gemv_t(a.g, stream(), r == 0 ? rope : nullptr);
  }
}

// The product of a checked plan: zeros (no nope dims), the transposed launches, or per head
// through cuBLAS.
void absorb(const AbsorbPlan& a, const Tensor& q_nope, const LinearWeight& kv_b, Tensor& out) {
  if (a.rows == 0 || a.lora == 0) return;
  DeviceGuard guard(q_nope.device());
  if (a.nope == 0) {
    fill_f32(out, 0.0f);
    return;
  }
  if (a.transposed) {
    launch_absorb_t(a, q_nope, out, nullptr);
    return;
  }
  // Per head, row-major out[:, h, :] (rows x lora) = q_nope[:, h, :] (rows x nope) W_UK[h] (nope x
  // lora); column-major: out^T (lora x rows) = W_UK[h]^T-as-stored (lora x nope) q^T (nope x rows).
  Scratch buf;
  const Tensor w = dequantized_kv_b(kv_b, buf);
  const int64_t ldq = a.rows == 1 ? std::max(q_nope.stride(0), a.nope) : q_nope.stride(0);
  const int64_t ldo = a.rows == 1 ? std::max(out.stride(0), a.lora) : out.stride(0);
  batched_sgemm(CUBLAS_OP_N, a.lora, a.rows, a.nope, w.f32(), a.lora, a.per * a.lora, q_nope.f32(), ldq,
                q_nope.stride(1), out.f32(), ldo, out.stride(1), a.heads);
}

}  // namespace

void mla_absorb_q(const Tensor& q_nope, const LinearWeight& kv_b, Tensor& out) {
  absorb(absorb_plan(q_nope, kv_b, out), q_nope, kv_b, out);
}

void mla_absorbed_queries(const Tensor& q, int64_t nope, const LinearWeight& kv_b, const Tensor& positions,
                          const Tensor& inv_freq, float attention_factor, RopeStyle style, Tensor& out) {
  const ops::MlaQueryParts parts = ops::mla_query_parts(q, nope, inv_freq, out);
  const Tensor q_nope = q.narrow(2, 0, nope);
  Tensor lat = out.narrow(2, 0, parts.lora), pe = out.narrow(2, parts.lora, parts.rot);
  const AbsorbPlan a = absorb_plan(q_nope, kv_b, lat);
  const RopeParams r = rope_params(q, positions, inv_freq, attention_factor, style, int(nope), &pe);
  if (a.transposed) {  // one launch: the product and the rotation
    DeviceGuard guard(q.device());
    launch_absorb_t(a, q_nope, lat, &r);
    return;
  }
  absorb(a, q_nope, kv_b, lat);  // checked once, above
  Tensor qv = q;
  rope(qv, positions, inv_freq, attention_factor, style, int(nope), &pe);
}

void mla_up_v(const Tensor& o_lat, const LinearWeight& kv_b, Tensor& out) {
  DSI_CHECK(o_lat.ndim() == 3 && o_lat.stride(2) == 1, "mla_up_v: o_lat {}", o_lat.desc());
  const int64_t rows = o_lat.dim(0), heads = o_lat.dim(1), lora = o_lat.dim(2);
  DSI_CHECK(out.ndim() == 3 && out.dim(0) == rows && out.dim(1) == heads && out.stride(2) == 1,
            "mla_up_v: out {} for o_lat {}", out.desc(), o_lat.desc());
  const int64_t dv = out.dim(2);
  const int64_t per = ops::mla_rows_per_head(kv_b, heads, lora, dv, "mla_up_v");
  check_head_tensors(o_lat, out, kv_b, "mla_up_v");
  if (rows == 0 || dv == 0) return;
  DeviceGuard guard(o_lat.device());
  if (lora == 0) {
    fill_f32(out, 0.0f);
    return;
  }
  // Decode: W_UV[h] ([dv, lora], the last dv rows of head h) read in place, one strided batch.
  if (rows <= kGemvMaxRows && heads <= 65535) {
    GemvParams g = head_batch(kv_b, per - dv, per, heads, o_lat, out);  // past W_UK's rows
    g.out = dv;
    g.n = int(rows);
    launch_gemv(g, gemv_plan(g, sm_count()), stream());
    return;
  }
  // Per head, row-major out[:, h, :] (rows x dv) = o_lat[:, h, :] (rows x lora) W_UV[h]^T (lora x
  // dv); column-major: out^T (dv x rows) = op_T(W_UV[h] stored lora x dv) o_lat^T (lora x rows).
  Scratch buf;
  const Tensor w = dequantized_kv_b(kv_b, buf);
  const int64_t ldo_lat = rows == 1 ? std::max(o_lat.stride(0), lora) : o_lat.stride(0);
  const int64_t ldo = rows == 1 ? std::max(out.stride(0), dv) : out.stride(0);
  batched_sgemm(CUBLAS_OP_T, dv, rows, lora, w.f32() + (per - dv) * lora, lora, per * lora,
                o_lat.f32(), ldo_lat, o_lat.stride(1), out.f32(), ldo, out.stride(1), heads);
}

void sparse_mla(const Tensor& q, const Tensor& kv, const Tensor& indices, float softmax_scale,
                int dv, Tensor& out, Tensor& lse) {
  DSI_CHECK(q.ndim() == 3 && q.stride(2) == 1, "sparse_mla: q must be [rows, heads, dk], got {}",
            q.desc());
  const int64_t rows = q.dim(0), heads = q.dim(1), dk = q.dim(2);
  DSI_CHECK(kv.ndim() == 2 && kv.dim(1) == dk && kv.stride(1) == 1, "sparse_mla: kv {} for q {}",
            kv.desc(), q.desc());
  DSI_CHECK(dv > 0 && dv <= dk, "sparse_mla: dv = {} outside (0, {}]", dv, dk);
  DSI_CHECK(indices.ndim() == 2 && indices.dim(0) == rows, "sparse_mla: indices {}", indices.desc());
  check_shape(out, {rows, heads, dv}, "sparse_mla out");
  check_shape(lse, {rows, heads}, "sparse_mla lse");
  DSI_CHECK(indices.is_contiguous() && out.is_contiguous() && lse.is_contiguous(),
            "sparse_mla: indices, out and lse must be contiguous");
  check_dtype(q, DType::F32, "sparse_mla q");
  DSI_CHECK(kv.dtype() == DType::F32 || kv.dtype() == DType::BF16,
            "sparse_mla: kv must be f32 or bf16 (a bf16 cache), got {}", kv.desc());
  check_on(kv, q.device(), "sparse_mla", "kv");
  check_on(indices, q.device(), "sparse_mla", "indices");
  check_on(out, q.device(), "sparse_mla", "out");
  check_on(lse, q.device(), "sparse_mla", "lse");
  if (rows == 0) return;
  DeviceGuard guard(q.device());
  ErrorFlag bad("sparse_mla: an index outside the cached keys");
  SparseMlaParams p{};
  p.q = q.f32();
  p.kv = kv.raw();
  p.kv_kind = float_kind(kv.dtype(), "sparse_mla kv");
  p.indices = indices.i32();
  p.out = out.f32();
  p.lse = lse.f32();
  p.q_s0 = q.stride(0);
  p.q_s1 = q.stride(1);
  p.kv_stride = kv.stride(0);
  p.rows = rows;
  p.heads = heads;
  p.dk = dk;
  p.n_keys = kv.dim(0);
  p.topk = indices.dim(1);
  p.dv = dv;
  p.softmax_scale = softmax_scale;
  p.bad = bad.ptr();
  launch_sparse_mla(p, stream());
  const unsigned long long first = bad.read();
  if (first != ErrorFlag::kNone)
    fail("sparse_mla: index {} outside the {} cached keys", read_device(p.indices + first), p.n_keys);
}

}  // namespace dsi::cuda
