// Model configuration parsed from a checkpoint's config.json, in both layouts the DSA models ship with:
// HF v5 (rope_parameters, indexer_types, mlp_layer_types) and the released-checkpoint one (rope_theta,
// rope_scaling, index_topk_freq / index_skip_topk_offset, num_nextn_predict_layers).
// Semantics: docs dsa-reference.md section 1; HF configuration_glm_moe_dsa.py / deepseek_v32.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace dsi {

enum class ModelFamily { kGlmMoeDsa, kDeepseekV32 };
// Interleaved rotates pairs (x[2i], x[2i+1]); half-split (NeoX) rotates (x[i], x[i + d/2]).
enum class RopeStyle { kInterleaved, kHalfSplit };

struct RopeConfig {
  std::string type = "default";  // "default" or "yarn"
  double theta = 10000.0;
  // YaRN (HF _compute_yarn_parameters); unused for "default".
  double factor = 1.0;
  int64_t original_max_position_embeddings = 0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 0.0;          // 0 = absent
  double mscale_all_dim = 0.0;  // 0 = absent
  std::optional<double> attention_factor;
  bool truncate = true;
  bool is_yarn() const { return type == "yarn"; }
};

struct QuantConfig {
  bool fp8 = false;  // weights may be F8_E4M3 with <name>_scale_inv block scales
  int block_out = 128;
  int block_in = 128;
};

struct ModelConfig {
  ModelFamily family = ModelFamily::kGlmMoeDsa;
  std::string model_type;

  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;      // dense MLP
  int64_t moe_intermediate_size = 0;  // one routed expert
  int n_layers = 0;                   // num_hidden_layers (MTP layers excluded)
  int n_heads = 0;
  int q_lora_rank = 0;
  int kv_lora_rank = 0;
  int head_dim_nope = 0;  // qk_nope_head_dim
  int head_dim_rope = 0;  // qk_rope_head_dim
  int v_head_dim = 0;

  // Lightning indexer.
  int n_index_heads = 0;
  int index_head_dim = 0;
  int index_topk = 0;
  std::vector<bool> indexer_full;  // [n_layers]: true = own indexer, false = reuses the last full layer's
  RopeStyle indexer_rope_style = RopeStyle::kInterleaved;

  // FFN.
  std::vector<bool> layer_is_moe;  // [n_layers]
  int n_experts = 0;               // n_routed_experts
  int n_experts_active = 0;        // num_experts_per_tok
  int n_shared_experts = 1;
  int n_group = 1;
  int topk_group = 1;
  bool norm_topk_prob = true;
  double routed_scaling_factor = 1.0;

  double rms_norm_eps = 1e-6;
  RopeConfig rope;
  int64_t max_position_embeddings = 0;

  int n_mtp_layers = 0;  // num_nextn_predict_layers; -1 = not stated (detected from the checkpoint)
  bool index_share_for_mtp_iteration = false;
  std::vector<int64_t> eos_token_ids;
  bool tie_word_embeddings = false;
  QuantConfig quant;

  int qk_head_dim() const { return head_dim_nope + head_dim_rope; }
  int64_t shared_intermediate_size() const { return moe_intermediate_size * n_shared_experts; }
  // Softmax scale of MLA attention: qk_head_dim^-1/2, times mscale^2 under YaRN with mscale_all_dim.
  double attn_softmax_scale() const;
};

// `source` names the file in error messages. Throws dsi::Error naming the field on any defect.
ModelConfig parse_config(const nlohmann::json& j, const std::string& source);
ModelConfig load_config(const std::string& config_json_path);

}  // namespace dsi
