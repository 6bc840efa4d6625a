// Element-wise ops of the CUDA backend; see elementwise.h and ops/elementwise.h.
#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/elementwise/elementwise.h"

namespace dsi::cuda {

namespace {

__global__ void rowwise_kernel(RowwiseParams p) {
  pdl_enter();
  const int64_t total = p.rows * p.cols;
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += step) {
    const int64_t r = i / p.cols, c = i % p.cols;
    float* a = p.a + r * p.a_stride + c;
    switch (p.op) {
      case RowOp::kScale: *a = __fmul_rn(*a, p.scale); break;
      case RowOp::kAdd: *a = __fadd_rn(*a, p.b[r * p.b_stride + c]); break;
      case RowOp::kAxpy: *a = __fadd_rn(*a, __fmul_rn(p.b[r * p.b_stride + c], p.scale)); break;
      default: p.out[r * p.out_stride + c] = silu_mul_f(*a, p.b[r * p.b_stride + c]);
    }
  }
}

// One block per row (grid-stride): the row's id is checked once, threads copy its columns.
__global__ void embedding_kernel(EmbeddingParams p) {
  pdl_enter();
  for (int64_t i = blockIdx.x; i < p.n; i += gridDim.x) {
    const int64_t id = p.ids[i];
    if (id < 0 || id >= p.vocab) {
      if (threadIdx.x == 0) atomicMin(p.bad, static_cast<unsigned long long>(i));
      continue;
    }
    for (int64_t j = threadIdx.x; j < p.d; j += blockDim.x)
      p.out[i * p.out_s0 + j * p.out_s1] = load_float(p.table, p.table_kind, id * p.d + j);
  }
}

void check_same_2d(const Tensor& a, const Tensor& b, const char* op) {
  DSI_CHECK(a.shape() == b.shape() && a.ndim() == 2, "{}: shapes {} and {}", op, a.desc(), b.desc());
  check_dtype(a, DType::F32, op);
  check_dtype(b, DType::F32, op);
  DSI_CHECK(a.stride(1) == 1 && b.stride(1) == 1, "{}: rows must be contiguous", op);
}

void run_rowwise(RowwiseParams p, Device device) {
  DeviceGuard guard(device);
  launch_rowwise(p, stream());
}

}  // namespace

void launch_rowwise(const RowwiseParams& p, cudaStream_t s) {
  if (p.rows == 0 || p.cols == 0) return;
  launch(rowwise_kernel, grid_for(p.rows * p.cols, 256), 256, 0, s, p);
}

void launch_embedding(const EmbeddingParams& p, cudaStream_t s) {
  if (p.n == 0) return;
  launch(embedding_kernel, grid_items(p.n), 128, 0, s, p);
}

void copy(const Tensor& src, Tensor& dst) { dst.copy_from(src); }

void scale_inplace(Tensor& a, float scale) {
  DSI_CHECK(a.ndim() == 2 && a.stride(1) == 1, "scale_inplace: {}", a.desc());
  check_dtype(a, DType::F32, "scale_inplace");
  RowwiseParams p{};
  p.a = a.f32();
  p.a_stride = a.stride(0);
  p.rows = a.dim(0);
  p.cols = a.dim(1);
  p.scale = scale;
  p.op = RowOp::kScale;
  run_rowwise(p, a.device());
}

void add_inplace(Tensor& a, const Tensor& b) {
  check_same_2d(a, b, "add_inplace");
  check_on(b, a.device(), "add_inplace", "b");
  RowwiseParams p{};
  p.a = a.f32();
  p.b = b.f32();
  p.a_stride = a.stride(0);
  p.b_stride = b.stride(0);
  p.rows = a.dim(0);
  p.cols = a.dim(1);
  p.op = RowOp::kAdd;
  run_rowwise(p, a.device());
}

void axpy_inplace(Tensor& a, const Tensor& b, float scale) {
  check_same_2d(a, b, "axpy_inplace");
  check_on(b, a.device(), "axpy_inplace", "b");
  RowwiseParams p{};
  p.a = a.f32();
  p.b = b.f32();
  p.a_stride = a.stride(0);
  p.b_stride = b.stride(0);
  p.rows = a.dim(0);
  p.cols = a.dim(1);
  p.scale = scale;
  p.op = RowOp::kAxpy;
  run_rowwise(p, a.device());
}

void silu_mul(const Tensor& gate, const Tensor& up, Tensor& out) {
  check_same_2d(gate, up, "silu_mul");
  check_same_2d(gate, out, "silu_mul out");
  check_on(up, gate.device(), "silu_mul", "up");
  check_on(out, gate.device(), "silu_mul", "out");
  RowwiseParams p{};
  p.a = gate.f32();
  p.b = up.f32();
  p.out = out.f32();
  p.a_stride = gate.stride(0);
  p.b_stride = up.stride(0);
  p.out_stride = out.stride(0);
  p.rows = gate.dim(0);
  p.cols = gate.dim(1);
  p.op = RowOp::kSiluMul;
  run_rowwise(p, gate.device());
}

void embedding(const Tensor& table, const Tensor& ids, Tensor& out) {
  DSI_CHECK(table.ndim() == 2 && table.is_contiguous(), "embedding: table must be [vocab, d], got {}",
            table.desc());
  DSI_CHECK(ids.ndim() == 1, "embedding: ids must be [n], got {}", ids.desc());
  check_shape(out, {ids.dim(0), table.dim(1)}, "embedding out");
  check_dtype(out, DType::F32, "embedding out");
  check_on(table, out.device(), "embedding", "table");
  check_on(ids, out.device(), "embedding", "ids");
  DSI_CHECK(ids.is_contiguous(), "embedding: ids must be contiguous");
  DeviceGuard guard(out.device());
  ErrorFlag bad("embedding: a token id outside the table");
  EmbeddingParams p{};
  p.table = table.raw();
  p.table_kind = float_kind(table.dtype(), "embedding table");
  p.ids = ids.i32();
  p.out = out.f32();
  p.out_s0 = out.stride(0);
  p.out_s1 = out.stride(1);
  p.n = ids.dim(0);
  p.d = table.dim(1);
  p.vocab = table.dim(0);
  p.bad = bad.ptr();
  launch_embedding(p, stream());
  const unsigned long long first = bad.read();
  if (first != ErrorFlag::kNone) {
    const int64_t id = read_device(ids.i32() + first);
    fail("token id {} is outside the vocabulary [0, {})", id, p.vocab);
  }
}

}  // namespace dsi::cuda
