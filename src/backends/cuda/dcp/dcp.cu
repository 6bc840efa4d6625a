// The DCP exchange ops on CUDA; see ops/dcp_exchange.h. One thread per element, the CPU's
// arithmetic order (partial * factor, members summed from 0); exp/log are CUDA's, so the combine
// matches the CPU within float rounding, the candidate exchange exactly.
#include "backends/cpu/cpu_dcp.h"
#include "backends/cuda/common.cuh"
#include "backends/cuda/cuda_dcp.h"

namespace dsi::cuda {

namespace {

constexpr int kThreads = 256;

__device__ float lse_total(const float* v, int W, int64_t stride) {
  float m = -INFINITY;
  for (int w = 0; w < W; ++w) m = fmaxf(m, v[w * stride]);
  if (m == -INFINITY) return -INFINITY;
  float s = 0.0f;
  for (int w = 0; w < W; ++w) s = __fadd_rn(s, expf(__fsub_rn(v[w * stride], m)));
  return __fadd_rn(m, logf(s));
}

__device__ float lse_factor(float lse, float total) {
  return (lse == -INFINITY || total == -INFINITY) ? 0.0f : expf(__fsub_rn(lse, total));
}

__global__ void pack_kernel(const int32_t* idx, const float* val, int32_t* packed, int64_t total,
                            int W, int rank, int I) {
  pdl_enter();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int32_t l = idx[i];
    const float v = l < 0 ? -INFINITY : val[i];
    packed[2 * i] = __float_as_int(v);
    packed[2 * i + 1] = l < 0 ? -1 : int32_t((l / I) * int64_t(W) * I + int64_t(rank) * I + l % I);
  }
}

// gathered [W, n, k, 2] -> scores/positions [n, W, k]
__global__ void unpack_kernel(const int32_t* gathered, float* scores, int32_t* positions, int64_t n,
                              int64_t k, int W) {
  pdl_enter();
  const int64_t total = int64_t(W) * n * k;
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < total;
       t += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = t % k, i = (t / k) % n, m = t / (k * n);
    const int64_t dst = i * W * k + m * k + j;
    scores[dst] = __int_as_float(gathered[2 * t]);
    positions[dst] = gathered[2 * t + 1];
  }
}

__global__ void localize_kernel(const int32_t* global, int32_t* local, int64_t total, int W, int rank,
                                int I) {
  pdl_enter();
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < total;
       t += int64_t(gridDim.x) * blockDim.x) {
    const int64_t p = global[t];
    const bool mine = p >= 0 && (p / I) % W == rank;
    local[t] = mine ? int32_t((p / (int64_t(W) * I)) * I + p % I) : -1;
  }
}

// in [W, n, hl*d] -> out [n, W, hl*d]
__global__ void member_heads_kernel(const float* in, float* out, int64_t n, int64_t row, int W) {
  pdl_enter();
  const int64_t total = int64_t(W) * n * row;
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < total;
       t += int64_t(gridDim.x) * blockDim.x) {
    const int64_t c = t % row, i = (t / row) % n, m = t / (row * n);
    out[(i * W + m) * row + c] = in[t];
  }
}

// chunks[m n + i, h, c] = part[i, m hl + h, c] * factor(i, m hl + h)
__global__ void scale_kernel(const float* part, const float* lse, const float* lse_all, float* chunks,
                             int64_t n, int64_t hl, int64_t dv, int W) {
  pdl_enter();
  const int64_t H = W * hl, total = n * H * dv;
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < total;
       t += int64_t(gridDim.x) * blockDim.x) {
    const int64_t c = t % dv, h = (t / dv) % H, i = t / (dv * H);
    const float total_lse = lse_total(lse_all + i * H + h, W, n * H);
    const float f = lse_factor(lse[i * H + h], total_lse);
    chunks[(((h / hl) * n + i) * hl + h % hl) * dv + c] = __fmul_rn(part[t], f);
  }
}

__global__ void a2a_pack_kernel(const float* part, const float* lse, float* send, int64_t n,
                                int64_t hl, int64_t dv, int W) {
  pdl_enter();
  const int64_t H = W * hl, row = dv + 1, total = n * H * row;
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < total;
       t += int64_t(gridDim.x) * blockDim.x) {
    const int64_t c = t % row, h = (t / row) % H, i = t / (row * H);
    send[(((h / hl) * n + i) * hl + h % hl) * row + c] =
        c < dv ? part[(i * H + h) * dv + c] : lse[i * H + h];
  }
}

__global__ void a2a_combine_kernel(const float* recv, float* out, int64_t n, int64_t hl, int64_t dv,
                                   int W) {
  pdl_enter();
  const int64_t row = dv + 1, total = n * hl * dv;
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < total;
       t += int64_t(gridDim.x) * blockDim.x) {
    const int64_t c = t % dv, h = (t / dv) % hl, i = t / (dv * hl);
    const float* base = recv + (i * hl + h) * row;  // member m at base + m * n * hl * row
    const int64_t stride = n * hl * row;
    const float total_lse = lse_total(base + dv, W, stride);
    float o = __fmul_rn(base[c], lse_factor(base[dv], total_lse));
    for (int m = 1; m < W; ++m)
      o = __fadd_rn(o, __fmul_rn(base[m * stride + c], lse_factor(base[m * stride + dv], total_lse)));
    out[t] = o;
  }
}

template <typename... Ts>
void on(Device dev, const char* op, const Ts&... ts) {
  (check_on(ts, dev, op, "argument"), ...);
}

}  // namespace

void dcp_pack_candidates(const Tensor& idx, const Tensor& val, const ops::DcpPlace& place,
                         Tensor& packed) {
  const cpu::DcpDims s = cpu::check_pack(idx, val, packed);
  on(packed.device(), "dcp_pack_candidates", idx, val);
  DeviceGuard guard(packed.device());
  const int64_t total = s.n * s.k;
  if (total == 0) return;
  launch(pack_kernel, grid_for(total, kThreads), kThreads, 0, stream(), idx.i32(), val.f32(), packed.i32(), total, place.size, place.rank, place.interleave);
}

void dcp_unpack_candidates(const Tensor& gathered, int W, Tensor& scores, Tensor& positions) {
  const cpu::DcpDims s = cpu::check_unpack(gathered, W, scores, positions);
  on(scores.device(), "dcp_unpack_candidates", gathered, positions);
  DeviceGuard guard(scores.device());
  const int64_t total = int64_t(W) * s.n * s.k;
  if (total == 0) return;
  launch(unpack_kernel, grid_for(total, kThreads), kThreads, 0, stream(), gathered.i32(), scores.f32(), positions.i32(), s.n, s.k, W);
}

void dcp_localize(const Tensor& global, const ops::DcpPlace& place, Tensor& local) {
  DSI_CHECK(global.is_contiguous() && global.dtype() == DType::I32 && local.is_contiguous(),
            "dcp_localize: {} and {}", global.desc(), local.desc());
  check_shape(local, global.shape(), "dcp_localize local");
  on(local.device(), "dcp_localize", global);
  DeviceGuard guard(local.device());
  const int64_t total = global.numel();
  if (total == 0) return;
  launch(localize_kernel, grid_for(total, kThreads), kThreads, 0, stream(), global.i32(), local.i32(), total, place.size, place.rank, place.interleave);
}

void dcp_member_heads(const Tensor& in, int W, Tensor& out) {
  const cpu::DcpDims s = cpu::check_member_heads(in, W, out);
  on(out.device(), "dcp_member_heads", in);
  DeviceGuard guard(out.device());
  const int64_t total = in.numel();
  if (total == 0) return;
  launch(member_heads_kernel, grid_for(total, kThreads), kThreads, 0, stream(), in.f32(), out.f32(), s.n, s.hl * s.d, W);
}

void dcp_scale_partials(const Tensor& part, const Tensor& lse, const Tensor& lse_all, int W,
                        Tensor& chunks) {
  const cpu::DcpDims s = cpu::check_scale(part, lse, lse_all, W, chunks);
  on(chunks.device(), "dcp_scale_partials", part, lse, lse_all);
  DeviceGuard guard(chunks.device());
  const int64_t total = part.numel();
  if (total == 0) return;
  launch(scale_kernel, grid_for(total, kThreads), kThreads, 0, stream(), part.f32(), lse.f32(), lse_all.f32(), chunks.f32(), s.n, s.hl, s.d, W);
}

void dcp_a2a_pack(const Tensor& part, const Tensor& lse, int W, Tensor& send) {
  const cpu::DcpDims s = cpu::check_a2a_pack(part, lse, W, send);
  on(send.device(), "dcp_a2a_pack", part, lse);
  DeviceGuard guard(send.device());
  const int64_t total = send.numel();
  if (total == 0) return;
  launch(a2a_pack_kernel, grid_for(total, kThreads), kThreads, 0, stream(), part.f32(), lse.f32(), send.f32(), s.n, s.hl, s.d, W);
}

void dcp_a2a_combine(const Tensor& recv, int W, Tensor& out) {
  const cpu::DcpDims s = cpu::check_a2a_combine(recv, W, out);
  on(out.device(), "dcp_a2a_combine", recv);
  DeviceGuard guard(out.device());
  const int64_t total = out.numel();
  if (total == 0) return;
  launch(a2a_combine_kernel, grid_for(total, kThreads), kThreads, 0, stream(), recv.f32(), out.f32(),
                                                                          s.n, s.hl, s.d, W);
}

}  // namespace dsi::cuda
