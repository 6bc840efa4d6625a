// Every numerical tolerance the tests use, keyed by the kind of output, each with its reason.
#pragma once

namespace dsi::tol {

// Integer outputs (token ids, top-k sets, expert ids, cache slots): exact. Anything else would hide
// a wrong tie order or an off-by-one; the goldens only keep cases whose margins are far above noise.

// Logits against HF fp32 goldens: normalised MSE (sum (a-g)^2 / sum g^2). Both sides compute the same
// math in fp32 with different summation orders; measured ~1e-12. The bar is 1e-6.
inline constexpr double kGoldenLogitsNmse = 1e-6;
// Largest absolute logit difference against HF (logits have std ~3): measured ~2e-5.
inline constexpr double kGoldenLogitsMaxAbs = 1e-3;

// Two runs of dsinfer's own CPU path that differ only in how rows are grouped (chunked prefill,
// decode vs prefill): the per-row math is the same but GEMM blocking differs, so fp32 rounding
// differs slightly. Measured ~1e-13.
inline constexpr double kSelfConsistencyNmse = 1e-9;

// Element-wise fp32 ops against a float64 reference of the same formula.
inline constexpr double kElementwiseAbs = 1e-5;
inline constexpr double kElementwiseRel = 1.3e-6;
// Reductions (norms, dot products, softmax, GEMMs) against float64: normalised MSE.
inline constexpr double kReductionNmse = 1e-10;
// Per-element fp32 dot product / sum vs float64, relative to sum |terms| (results cancel): measured 4e-7.
inline constexpr double kDotAbsSumRel = 1e-5;

// RoPE inverse frequencies against HF's fp32 values: pow/exp implementations may differ by 1 ulp.
inline constexpr double kRopeFreqRel = 1e-6;

}  // namespace dsi::tol
