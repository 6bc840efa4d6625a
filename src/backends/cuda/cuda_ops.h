// The CUDA backend: every op of src/ops with the signature and semantics of the CPU reference
// (backends/cpu/cpu_ops.h). All tensor arguments live on one CUDA device (checked); ops run on that
// device's legacy default stream, in call order. This header has no CUDA includes: ops/dispatch.h
// includes it into plain C++ translation units.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <vector>

#include "core/tensor.h"
#include "dsinfer/sampling.h"
#include "model/config.h"

namespace dsi {
struct LinearWeight;
struct MlpWeights;
struct RouterParams;
namespace ops {
struct KeyPages;
}  // namespace ops
}  // namespace dsi

namespace dsi::cuda {

// Registers the CUDA device backend (allocation and copies of CUDA tensors); idempotent. Called
// implicitly by the first CUDA tensor allocation.
void init();

void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out);
void add_rms_norm(Tensor& h, const Tensor& delta, const Tensor& weight, float eps, Tensor& out);
void layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps, Tensor& out);

void rope(Tensor& x, const Tensor& positions, const Tensor& inv_freq, float attention_factor,
          RopeStyle style, int offset, Tensor* out);

void linear(const Tensor& x, const LinearWeight& w, Tensor& out);
// Returns a host tensor, as the CPU op (linear.h); dequantize_rows_to is the on-device form.
Tensor dequantize_rows(const LinearWeight& w, int64_t row_begin, int64_t row_end);
// out: [row_end - row_begin, in] f32 contiguous, on the weight's device.
void dequantize_rows_to(const LinearWeight& w, int64_t row_begin, int64_t row_end, Tensor& out);

void copy(const Tensor& src, Tensor& dst);
void scale_inplace(Tensor& a, float scale);
void add_inplace(Tensor& a, const Tensor& b);
void axpy_inplace(Tensor& a, const Tensor& b, float scale);
void silu_mul(const Tensor& gate, const Tensor& up, Tensor& out);
void embedding(const Tensor& table, const Tensor& ids, Tensor& out);

void indexer_logits(const Tensor& q, const Tensor& weights, const Tensor& keys,
                    const Tensor& bounds, float softmax_scale, Tensor& logits,
                    const ops::KeyPages* pages);

void scatter_rows(const Tensor& src, const Tensor& slots, Tensor& dst);
void slots_from_local(const Tensor& local, const Tensor& block_tables, const Tensor& row_seq,
                      int page_size, Tensor& out);

void topk(const Tensor& scores, const Tensor& bounds, int k, Tensor& indices, Tensor* values);
void topk_merge(const Tensor& scores, const Tensor& positions, int k, Tensor& winners);

void mla_absorb_q(const Tensor& q_nope, const LinearWeight& kv_b, Tensor& out);
void mla_absorbed_queries(const Tensor& q, int64_t nope, const LinearWeight& kv_b, const Tensor& positions,
                          const Tensor& inv_freq, float attention_factor, RopeStyle style, Tensor& out);
void mla_up_v(const Tensor& o_lat, const LinearWeight& kv_b, Tensor& out);
void sparse_mla(const Tensor& q, const Tensor& kv, const Tensor& indices, float softmax_scale,
                int dv, Tensor& out, Tensor& lse);

void moe_route(const Tensor& router_logits, const Tensor& bias, const RouterParams& p,
               Tensor& expert_ids, Tensor& weights);
void moe_experts(const Tensor& x, const Tensor& expert_ids, const Tensor& weights,
                 const std::vector<MlpWeights>& experts, int first_expert, int n_experts,
                 Tensor& out, const MlpWeights* shared);
void moe(const Tensor& x, const Tensor& router_logits, const Tensor& bias, const RouterParams& rp,
         const std::vector<MlpWeights>& experts, int first_expert, int n_experts, Tensor& expert_ids,
         Tensor& weights, Tensor& out, const MlpWeights* shared);
void mlp(const Tensor& x, const MlpWeights& w, Tensor& out);

// ops::run_beside (ops/beside.h).
void run_beside(Device device, const std::function<void()>& side, const std::function<void()>& main);

void argmax(const Tensor& logits, Tensor& out);

// Whether ops::linear runs 2..8 rows of fp8 weights (128-column blocks) on the GEMV's tensor-core
// kernel (linear/gemv.cu) instead of its FMA kernels: on unless DSI_GEMV_MMA=0 or switched here.
bool gemv_tensor_cores();
void set_gemv_tensor_cores(bool on);
// Whether it also takes one row of x (products of >= 4096 rows): off unless DSI_GEMV_MMA1=1 or
// switched here.
bool gemv_mma_one_row();
void set_gemv_mma_one_row(bool on);
// Launches of that kernel so far in this process (tests check that it ran).
uint64_t gemv_tensor_core_launches();
// Whether ops::linear runs one row of fp8 weights on the GEMV's tensor-map kernel
// (linear/gemv_tma.cu) where its plan balances: on unless DSI_GEMV_TMA=0 or switched here; and its
// launches so far in this process (tests check that it ran).
bool gemv_tma();
void set_gemv_tma(bool on);
uint64_t gemv_tma_launches();
// How even the tensor-map kernel's plan must spread a product over the SMs before gemv_plan takes
// it: the average SM's tiles at least this percent of the busiest SM's (gemv_tma_plan; default
// kGemvTmaBalance in linear/gemv.h, DSI_GEMV_TMA_BALANCE=P or this call for comparisons).
int gemv_tma_balance();
void set_gemv_tma_balance(int percent);
// Whether ops::linear runs more than the GEMV's rows (prefill) of fp8 block-scaled weights in
// DeepSeek's recipe, on the fp8 tensor cores (ops::linear_fp8_act: activations quantised per
// 128 columns, no dequantised copy of the weight), instead of fp32 GEMMs over dequantised rows (the
// CPU reference's numerics, which the GPU's model tests hold it to): off unless DSI_FP8_PREFILL=1
// or switched here.
// y = rms_norm(x, norm_w, eps) W^T as one kernel where the one-row tensor-map GEMV takes the
// product (gemv.h: one row, fp8 weights, a plan that balances); false (nothing launched) elsewhere.
// Arguments as ops::rms_norm_linear's, already checked.
bool rms_norm_linear_fused(const Tensor& x, const Tensor& norm_w, float eps, const LinearWeight& w, Tensor& out);
// Whether rms_norm_linear_fused would take these operands (an output of w's rows, contiguous).
bool rms_norm_linear_fuses(const Tensor& x, const Tensor& norm_w, const LinearWeight& w);
// Whether rms_norm_linear_fused may fuse: on unless DSI_GEMV_NORM=0 or switched here (tests).
bool norm_in_gemv();
void set_norm_in_gemv(bool on);
bool fp8_prefill();
void set_fp8_prefill(bool on);
// That kernel's plan for one row of an fp8 [out, in] weight with 128x128 blocks on a GPU of num_sms
// SMs: {tile groups per block, warps per tile, tiles per warp, bytes per piece}, all 0 where the
// plan leaves the product to the FMA kernels (linear/gemv.h's GemvTmaPlan; for tests).
std::array<int, 4> gemv_tma_plan_for(int64_t out, int64_t in, int num_sms);
// Row groups per warp forced on every vector-kernel GEMV plan, for tests and comparisons: 0 (the
// default) lets the plan choose, 1 never streams row groups, n > 1 always streams n. Also read
// from DSI_GEMV_ROW_GROUPS.
int gemv_row_groups_per_warp();
void set_gemv_row_groups_per_warp(int n);
// The plan of the segment-sum GEMV (the MoE's down products and their weighted sum) forced for
// tests and comparisons: warps per row group (1, 2, 4 or 8), 16-byte chunks per lane and row in
// flight (through registers 2 or 4, through the shared-memory ring 2 or 3), output rows per warp (2
// or 4), and the kernel (0 registers, 1 the ring); 0 (-1 for the kernel), the default, lets the
// plan choose each.
void set_gemv_seg_plan(int k_split, int depth, int rows = 0, int ring = -1);
// Decode batches of up to this many tokens run the MoE's down products as one segment-sum GEMV
// (moe/moe.h); larger ones as grouped products and a combine. For tests and comparisons; a
// negative n restores the default, kMoeSegmentTokens.
int moe_segment_tokens();
void set_moe_segment_tokens(int n);
// Sampling is host logic: the logits row is copied to the host and the CPU code runs on it, so the
// result is bitwise the CPU's.
std::vector<double> token_distribution(const Tensor& logits, const SamplingParams& sp);

}  // namespace dsi::cuda
