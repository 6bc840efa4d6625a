// Tolerances of the CUDA op tests (GPU result against the CPU reference run on the same inputs),
// keyed by the kind of output, each with its reason. The float64-reference tolerances of the CPU op
// tests live in tests/tolerances.h; the element-wise bound is shared with them.
#pragma once

#include "tolerances.h"

namespace dsi::tol {

// Integer outputs (top-k sets, argmax, expert ids): exact. The GPU encodes the same total order.

// Element-wise fp32 ops: the kernels round every product and sum as the CPU does (no FMA), and take
// exp/cos/sin in double rounded once (glibc's fp32 functions are within ~0.5 ulp): GPU vs CPU is
// bitwise in practice; the bound is the element-wise one of the CPU tests.
inline constexpr double kCudaElementwiseAbs = kElementwiseAbs;
inline constexpr double kCudaElementwiseRel = kElementwiseRel;

// Our own fp32 reductions (norms, indexer, sparse attention scores and softmax sums): same math in
// fp32, a tree instead of a sequential sum. Normalised MSE; measured far below (~1e-14).
inline constexpr double kCudaReductionNmse = 1e-10;

// cuBLAS GEMMs (linear, mla_absorb_q, mla_up_v, MoE experts): fp32 with its own blocking and
// summation order (and possibly split-k); normalised MSE.
inline constexpr double kCudaGemmNmse = 1e-9;

}  // namespace dsi::tol
