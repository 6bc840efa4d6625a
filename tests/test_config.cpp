// config.json parsing: both layouts (HF v5 and released checkpoints), the indexer schedule, YaRN
// fields, and a clear error for every broken field.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "model/config.h"
#include "test_util.h"

namespace dsi {
namespace {

using json = nlohmann::json;

// A minimal valid GLM config in the HF v5 layout.
json glm_v5() {
  return json::parse(R"({
    "model_type": "glm_moe_dsa", "vocab_size": 100, "hidden_size": 64, "intermediate_size": 96,
    "moe_intermediate_size": 32, "num_hidden_layers": 4, "num_attention_heads": 4,
    "q_lora_rank": 32, "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
    "v_head_dim": 16, "index_n_heads": 2, "index_head_dim": 16, "index_topk": 4,
    "n_routed_experts": 8, "num_experts_per_tok": 2, "first_k_dense_replace": 1,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
    "indexer_types": ["full", "shared", "full", "shared"], "eos_token_id": [1, 2]
  })");
}

TEST(Config, ParsesHfV5Layout) {
  const ModelConfig c = parse_config(glm_v5(), "cfg");
  EXPECT_EQ(c.family, ModelFamily::kGlmMoeDsa);
  EXPECT_EQ(c.indexer_full, (std::vector<bool>{true, false, true, false}));
  EXPECT_EQ(c.layer_is_moe, (std::vector<bool>{false, true, true, true}));
  EXPECT_EQ(c.rope.type, "default");
  EXPECT_EQ(c.rope.theta, 1e6);
  EXPECT_EQ(c.indexer_rope_style, RopeStyle::kInterleaved);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{1, 2}));
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);  // GLM default
  EXPECT_EQ(c.n_mtp_layers, -1);           // unstated: detected from the checkpoint
  EXPECT_DOUBLE_EQ(c.attn_softmax_scale(), 1.0 / std::sqrt(24.0));
}

TEST(Config, ReleasedLayoutEqualsV5Layout) {
  json r = glm_v5();
  r.erase("rope_parameters");
  r.erase("indexer_types");
  r["rope_theta"] = 1000000.0;
  r["index_topk_freq"] = 2;
  r["index_skip_topk_offset"] = 1;  // full iff max(i - 1 + 1, 0) % 2 == 0
  r["num_nextn_predict_layers"] = 1;
  const ModelConfig a = parse_config(glm_v5(), "v5"), b = parse_config(r, "released");
  EXPECT_EQ(a.indexer_full, b.indexer_full);
  EXPECT_EQ(a.rope.theta, b.rope.theta);
  EXPECT_EQ(a.rope.type, b.rope.type);
  EXPECT_EQ(b.n_mtp_layers, 1);
}

// GLM-5.2's released schedule: 21 full layers 0, 1, 2, 6, 10, ..., 74 of 78 (dsa-reference.md).
TEST(Config, Glm52IndexerSchedule) {
  json j = glm_v5();
  j.erase("indexer_types");
  j["num_hidden_layers"] = 78;
  j["index_topk_freq"] = 4;
  j["index_skip_topk_offset"] = 3;
  const ModelConfig c = parse_config(j, "glm52");
  std::vector<int> full;
  for (int i = 0; i < 78; ++i)
    if (c.indexer_full[size_t(i)]) full.push_back(i);
  std::vector<int> want = {0, 1, 2};
  for (int i = 6; i <= 74; i += 4) want.push_back(i);
  EXPECT_EQ(full, want);
  EXPECT_EQ(full.size(), 21u);
}

TEST(Config, IndexerPatternString) {
  json j = glm_v5();
  j.erase("indexer_types");
  j["index_topk_pattern"] = "FSFF";
  EXPECT_EQ(parse_config(j, "p").indexer_full, (std::vector<bool>{true, false, true, true}));
}

TEST(Config, NoScheduleMeansEveryLayerFull) {
  json j = glm_v5();
  j.erase("indexer_types");
  EXPECT_EQ(parse_config(j, "p").indexer_full, (std::vector<bool>(4, true)));
}

TEST(Config, DeepseekYarnReleasedLayout) {
  json j = glm_v5();
  j["model_type"] = "deepseek_v32";
  j.erase("rope_parameters");
  j.erase("indexer_types");
  j["rope_theta"] = 10000.0;
  j["rope_scaling"] = {{"type", "yarn"},          {"factor", 40},      {"beta_fast", 32},
                       {"beta_slow", 1},          {"mscale", 1.0},     {"mscale_all_dim", 1.0},
                       {"original_max_position_embeddings", 4096}};
  const ModelConfig c = parse_config(j, "ds");
  EXPECT_EQ(c.family, ModelFamily::kDeepseekV32);
  EXPECT_EQ(c.indexer_rope_style, RopeStyle::kHalfSplit);
  EXPECT_TRUE(c.rope.is_yarn());
  EXPECT_EQ(c.rope.factor, 40);
  EXPECT_EQ(c.rope.original_max_position_embeddings, 4096);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);  // DeepSeek default
  const double m = 0.1 * std::log(40.0) + 1.0;
  EXPECT_DOUBLE_EQ(c.attn_softmax_scale(), m * m / std::sqrt(24.0));
  // The same in the v5 layout.
  json v5 = j;
  v5.erase("rope_theta");
  v5.erase("rope_scaling");
  v5["rope_parameters"] = j["rope_scaling"];
  v5["rope_parameters"].erase("type");
  v5["rope_parameters"]["rope_type"] = "yarn";
  v5["rope_parameters"]["rope_theta"] = 10000.0;
  const ModelConfig d = parse_config(v5, "ds5");
  EXPECT_EQ(d.rope.factor, c.rope.factor);
  EXPECT_EQ(d.rope.theta, c.rope.theta);
  EXPECT_DOUBLE_EQ(d.attn_softmax_scale(), c.attn_softmax_scale());
}

TEST(Config, IndexerRopeInterleaveOverridesFamilyDefault) {
  json j = glm_v5();
  j["indexer_rope_interleave"] = false;
  EXPECT_EQ(parse_config(j, "c").indexer_rope_style, RopeStyle::kHalfSplit);
}

TEST(Config, Fp8QuantizationConfig) {
  json j = glm_v5();
  j["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", "e4m3"},
                              {"weight_block_size", {128, 64}}};
  const ModelConfig c = parse_config(j, "q");
  EXPECT_TRUE(c.quant.fp8);
  EXPECT_EQ(c.quant.block_out, 128);
  EXPECT_EQ(c.quant.block_in, 64);
}

// Every broken field ends in one error that names the field (and the file).
TEST(Config, BrokenFieldsNameTheField) {
  struct Case {
    std::function<void(json&)> edit;
    std::vector<std::string> needles;
  };
  const std::vector<Case> cases = {
      {[](json& j) { j["model_type"] = "llama"; }, {"cfg.json", "unsupported model_type 'llama'"}},
      {[](json& j) { j.erase("model_type"); }, {"unsupported model_type ''"}},
      // Control characters in a value are escaped: the message stays one line.
      {[](json& j) { j["model_type"] = "gl\nm\t"; }, {"unsupported model_type 'gl\\nm\\t'"}},
      {[](json& j) { j["hidden_act"] = "ge\nlu"; }, {"hidden_act 'ge\\nlu'"}},
      {[](json& j) { j.erase("hidden_size"); }, {"missing required field 'hidden_size'"}},
      {[](json& j) { j["hidden_size"] = "64"; }, {"'hidden_size' must be an integer"}},
      {[](json& j) { j["hidden_size"] = 0; }, {"'hidden_size' = 0 must be >= 1"}},
      {[](json& j) { j["num_attention_heads"] = 2.5; }, {"num_attention_heads"}},
      {[](json& j) { j["qk_rope_head_dim"] = 7; }, {"qk_rope_head_dim = 7 must be even"}},
      {[](json& j) { j["index_head_dim"] = 4; }, {"index_head_dim = 4"}},
      {[](json& j) { j["indexer_types"] = {"full", "shared"}; }, {"'indexer_types'", "4 entries"}},
      {[](json& j) { j["indexer_types"][1] = "half"; }, {"indexer_types[1]"}},
      {[](json& j) { j["indexer_types"][0] = "shared"; }, {"layer 0 must have its own indexer"}},
      {[](json& j) { j["mlp_layer_types"] = {"dense"}; }, {"'mlp_layer_types'"}},
      {[](json& j) { j["rope_parameters"]["rope_type"] = "llama3"; },
       {"unsupported rope type 'llama3'"}},
      {[](json& j) { j["rope_parameters"] = 5; }, {"'rope_parameters' must be an object"}},
      {[](json& j) { j["n_group"] = 3; }, {"n_routed_experts = 8 must be divisible by n_group = 3"}},
      {[](json& j) { j["num_experts_per_tok"] = 9; }, {"num_experts_per_tok = 9"}},
      {[](json& j) { j["hidden_act"] = "gelu"; }, {"hidden_act 'gelu'"}},
      {[](json& j) { j["eos_token_id"] = "x"; }, {"eos_token_id"}},
      {[](json& j) { j["quantization_config"] = {{"quant_method", "awq"}}; },
       {"quantization method 'awq'"}},
      {[](json& j) { j["quantization_config"] = {{"quant_method", "fp8"}, {"weight_block_size", {128}}}; },
       {"weight_block_size"}},
      {[](json& j) { j["norm_topk_prob"] = 1; }, {"'norm_topk_prob' must be true or false"}},
      // Sizes past int32 are refused before any conversion (no wrap to 0 or to a small value).
      {[](json& j) { j["vocab_size"] = 1e300; }, {"'vocab_size'", "too large"}},
      {[](json& j) { j["n_group"] = 4294967296LL; }, {"'n_group' = 4294967296 is too large"}},
      {[](json& j) { j["num_hidden_layers"] = 4294967298LL; }, {"'num_hidden_layers'", "too large"}},
      {[](json& j) { j["hidden_size"] = 18446744073709551615ULL; }, {"'hidden_size'", "too large"}},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE("case " + std::to_string(i));
    json j = glm_v5();
    cases[i].edit(j);
    test::expect_error([&] { parse_config(j, "cfg.json"); }, cases[i].needles);
  }
}

TEST(Config, LoadConfigFileErrors) {
  test::TempDir tmp;
  const std::string missing = tmp.path() + "/nope.json";
  test::expect_error([&] { load_config(missing); }, {missing, "cannot open"});
  const std::string bad = tmp.path() + "/bad.json";
  std::ofstream(bad) << "{\"model_type\": ";
  test::expect_error([&] { load_config(bad); }, {bad, "not valid JSON"});
  const std::string arr = tmp.path() + "/arr.json";
  std::ofstream(arr) << "[1, 2]";
  test::expect_error([&] { load_config(arr); }, {arr, "must be a JSON object"});
}

}  // namespace
}  // namespace dsi
