// The CPU backend: the reference implementation of every op in src/ops (same signatures and
// semantics; see the op headers). Plain loops with fp32 accumulation; OpenBLAS for GEMMs.
#pragma once

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

namespace dsi::cpu {

void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out);
void add_rms_norm(Tensor& h, const Tensor& delta, const Tensor& weight, float eps, Tensor& out);
void layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps, Tensor& out);

void rope(Tensor& x, const Tensor& positions, const Tensor& inv_freq, float attention_factor,
          RopeStyle style, int offset, Tensor* out);

void linear(const Tensor& x, const LinearWeight& w, Tensor& out);
Tensor dequantize_rows(const LinearWeight& w, int64_t row_begin, int64_t row_end);
void share_host_cores(int ranks_on_host);  // ops/linear.h

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
std::vector<double> token_distribution(const Tensor& logits, const SamplingParams& sp);
int32_t draw_token(const std::vector<double>& p, double u);

}  // namespace dsi::cpu
