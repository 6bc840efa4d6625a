// The model's weights, mirroring the checkpoint's module names (model.layers.{i}.self_attn.q_a_proj,
// ...indexer.wq_b, ...mlp.experts.{e}.gate_proj, MTP's enorm/hnorm/eh_proj/shared_head).
// Linear weights stay in their checkpoint dtype (mapped, not copied); norms and biases become fp32.
// Under tensor parallelism each rank holds its shard, as the table in weights.cpp says; shapes in
// the comments below are the full (T = 1) ones, divided along the split dimension otherwise.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/config.h"
#include "model/safetensors.h"
#include "ops/linear.h"
#include "ops/moe.h"

namespace dsi {

struct IndexerWeights {
  LinearWeight wq_b;          // [n_index_heads * index_head_dim, q_lora]
  LinearWeight wk;            // [index_head_dim, hidden]; empty when stacked into in_proj
  LinearWeight weights_proj;  // [n_index_heads, hidden]
  Tensor k_norm_weight;       // [index_head_dim] f32 (LayerNorm)
  Tensor k_norm_bias;         // [index_head_dim] f32
};

struct AttentionWeights {
  // q_a_proj [q_lora, hidden], kv_a_proj_with_mqa [kv_lora + rope, hidden] and, on layers with their
  // own indexer, indexer.wk [index_head_dim, hidden] all read the layer's normed input, so the
  // loader stacks them into one weight, one product at decode (rows in that order; fp8 parts padded
  // with zero rows to whole scale blocks). A part of another dtype or scale-block size than q_a_proj
  // is not stacked: it keeps its own field (else left empty) and runs alone.
  LinearWeight in_proj;             // [q_lora (+ kv_a rows) (+ wk rows), hidden]
  int64_t in_proj_kv_row = -1;      // first row of kv_a_proj_with_mqa in in_proj (-1: not there)
  int64_t in_proj_index_k_row = -1; // first row of indexer.wk in in_proj (-1: not there)
  Tensor q_a_layernorm;             // [q_lora] f32
  LinearWeight q_b_proj;            // [n_heads * (nope + rope), q_lora]
  LinearWeight kv_a_proj_with_mqa;  // [kv_lora + rope, hidden]; empty when stacked into in_proj
  Tensor kv_a_layernorm;            // [kv_lora] f32
  LinearWeight kv_b_proj;           // [n_heads * (nope + v), kv_lora]: W_UK and W_UV (ops/mla.h)
  LinearWeight o_proj;              // [hidden, n_heads * v]
  std::optional<IndexerWeights> indexer;  // absent on "shared" layers
};

struct MoeWeights {
  LinearWeight gate;                // router [n_experts, hidden] (computed in fp32), replicated
  Tensor e_score_correction_bias;   // [n_experts] f32
  int first_expert = 0;             // experts[j] is routed expert first_expert + j (expert-parallel)
  std::vector<MlpWeights> experts;  // this rank's routed experts
  MlpWeights shared_experts;
};

struct LayerWeights {
  Tensor input_layernorm;           // [hidden] f32
  Tensor post_attention_layernorm;  // [hidden] f32
  AttentionWeights self_attn;
  bool is_moe = false;
  MlpWeights mlp;  // dense layers
  MoeWeights moe;  // MoE layers
};

// The multi-token-prediction layer (index num_hidden_layers in the checkpoint).
struct MtpWeights {
  LayerWeights layer;
  Tensor enorm;             // [hidden] f32, applied to the embedding of token i+1
  Tensor hnorm;             // [hidden] f32, applied to the main model's hidden h_i
  LinearWeight eh_proj;     // [hidden, 2 * hidden]; input = [enorm(emb) ; hnorm(h)]
  Tensor shared_head_norm;  // [hidden] f32
  Tensor embed_tokens;      // [vocab, hidden]; the layer's own copy, else model.embed_tokens
  LinearWeight head;        // [vocab, hidden]; shared_head.head, else lm_head
};

struct ModelWeights {
  Tensor embed_tokens;  // [vocab, hidden] (checkpoint dtype), replicated
  std::vector<LayerWeights> layers;
  Tensor norm;  // [hidden] f32
  LinearWeight lm_head;  // vocabulary-parallel: rows [vocab_begin, vocab_begin + out_features)
  int64_t vocab_begin = 0;
  int64_t vocab_shard = 0;  // rows per rank, ceil(vocab / T) (the last rank may hold fewer)
  std::optional<MtpWeights> mtp;
};

// This rank's share of a T-way tensor-parallel run (rank 0 of 1 = everything).
struct TpShard {
  int rank = 0;
  int size = 1;
};

// Loads every tensor the config implies for this shard, checking names, shapes and dtypes; errors
// name the tensor. Reads only what the shard needs. Sets cfg.n_mtp_layers when the config left it
// unstated (-1) from what the checkpoint holds.
ModelWeights load_weights(const Checkpoint& ck, ModelConfig& cfg, TpShard shard = {});

// Copies every tensor to `device` (a tensor shared by two fields, e.g. the MTP layer's fallback to
// the main embedding, is copied once and stays shared).
ModelWeights weights_to_device(const ModelWeights& w, Device device);

}  // namespace dsi
