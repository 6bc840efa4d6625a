// The block-scaled fp8 GEMM through cuBLASLt (see fp8_gemm.h).
//
// cuBLASLt is column-major: D[m, n] = op(A)[m, k] op(B)[k, n]. With m = out, k = in and n = rows of
// x, the row-major weight [out, in] is A stored [k, m] (transposed: fp8 wants "TN"), the row-major
// quantised x [n, in] is B stored [k, n], and the row-major y [n, out] (row stride ldy) is D [m, n]
// with leading dimension ldy. Scales: A's are 128x128 blocks, [ceil(m / 128)] runs of
// ceil(k / 128) (padded to a multiple of 4) — the checkpoint's row-major weight_scale_inv when
// groups % 4 == 0; B's are one per 128 columns per row of x, group-major [groups, n].
#include <cublasLt.h>

#include <climits>
#include <map>
#include <tuple>

#include "backends/cuda/common.cuh"
#include "backends/cuda/linear/cublas.h"
#include "backends/cuda/linear/fp8_gemm.h"

namespace dsi::cuda {

namespace {

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// One shape's matmul description and algorithm (or the finding that there is none).
struct Plan {
  bool ok = false;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

using Key = std::tuple<int, int64_t, int64_t, int64_t, int64_t>;  // device, n, in, out, ldy

// The plans and the handle of one host thread (cuBLASLt descriptors carry the scale pointers, set
// per call, so threads do not share them). Destroyed with the thread, best effort.
struct ThreadState {
  std::map<int, cublasLtHandle_t> handles;
  std::map<Key, Plan> plans;
  ~ThreadState() {
    for (auto& [key, p] : plans) {
      if (p.desc) cublasLtMatmulDescDestroy(p.desc);
      for (cublasLtMatrixLayout_t l : {p.a, p.b, p.d})
        if (l) cublasLtMatrixLayoutDestroy(l);
    }
    for (auto& [dev, h] : handles) cublasLtDestroy(h);
  }
};

ThreadState& state() {
  thread_local ThreadState s;
  return s;
}

cublasLtHandle_t handle(int dev) {
  cublasLtHandle_t& h = state().handles[dev];
  if (h == nullptr) DSI_CUBLAS_CHECK(cublasLtCreate(&h));
  return h;
}

template <typename T>
void set_attr(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const T& v) {
  DSI_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, attr, &v, sizeof v));
}

const Plan& plan_for(const Fp8GemmParams& p) {
  int dev = 0;
  DSI_CUDA_CHECK(cudaGetDevice(&dev));
  const Key key{dev, p.n, p.in, p.out, p.ldy};
  auto [it, fresh] = state().plans.try_emplace(key);
  Plan& pl = it->second;
  if (!fresh) return pl;
  // Hopper only: the 1x128 / 128x128 scale modes are sm_90's (other GPUs use other block formats).
  int major = 0;
  DSI_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  if (major != 9 || cublasLtGetVersion() < 120900) return pl;
  DSI_CUBLAS_CHECK(cublasLtMatmulDescCreate(&pl.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  set_attr(pl.desc, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T);
  set_attr(pl.desc, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N);
  set_attr(pl.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE,
           int32_t(CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F));
  set_attr(pl.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, int32_t(CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F));
  // The heuristic refuses block scale modes without scale pointers; each call sets its own.
  set_attr(pl.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(p.scale_inv));
  set_attr(pl.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(p.sx));
  DSI_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&pl.a, CUDA_R_8F_E4M3, uint64_t(p.in), uint64_t(p.out), int64_t(p.in)));
  DSI_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&pl.b, CUDA_R_8F_E4M3, uint64_t(p.in), uint64_t(p.n), int64_t(p.in)));
  cublasLtMatmulPreference_t pref = nullptr;
  DSI_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = kFp8GemmLtWorkspace;
  DSI_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
  DSI_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&pl.d, CUDA_R_32F, uint64_t(p.out), uint64_t(p.n), int64_t(p.ldy)));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(handle(dev), pl.desc, pl.a, pl.b, pl.d,
                                                           pl.d, pref, 1, &result, &found);
  if (st == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS) {
    pl.algo = result.algo;
    pl.ok = true;
  }
  cublasLtMatmulPreferenceDestroy(pref);
  return pl;
}

}  // namespace

bool fp8_gemm_lt_supported(const Fp8GemmParams& p) {
  return p.block_in == 128 && p.block_out == 128 && p.row0 == 0 && p.col0 == 0 && p.n > 0 &&
         p.out > 0 && p.in > 0 && p.in % 16 == 0 && p.groups % 4 == 0 && p.ldy % 4 == 0 &&
         p.ldy >= p.out && p.sx_row == 1 && p.sx_group == p.n && p.n <= INT_MAX &&
         p.in <= INT_MAX && p.out <= INT_MAX && p.ldy <= INT_MAX && aligned16(p.xq) &&
         aligned16(p.w) && aligned16(p.y) && aligned16(p.sx) && aligned16(p.scale_inv);
}

bool fp8_gemm_lt_available(const Fp8GemmParams& p) { return plan_for(p).ok; }

void prepare_fp8_gemm_lt() {
  int dev = 0;
  DSI_CUDA_CHECK(cudaGetDevice(&dev));
  (void)handle(dev);
}

bool launch_fp8_gemm_lt(const Fp8GemmParams& p, void* workspace, cudaStream_t stream) {
  if (!fp8_gemm_lt_supported(p)) return false;
  const Plan& pl = plan_for(p);
  if (!pl.ok) return false;
  int dev = 0;
  DSI_CUDA_CHECK(cudaGetDevice(&dev));
  set_attr(pl.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(p.scale_inv));
  set_attr(pl.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(p.sx));
  const float alpha = 1.0f, beta = 0.0f;
  DSI_CUBLAS_CHECK(cublasLtMatmul(handle(dev), pl.desc, &alpha, p.w, pl.a, p.xq, pl.b, &beta, p.y,
                                  pl.d, p.y, pl.d, &pl.algo, workspace, kFp8GemmLtWorkspace, stream));
  return true;
}

}  // namespace dsi::cuda
