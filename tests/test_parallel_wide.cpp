// Wide layouts (4, 6, 8, 12 and 16 thread ranks, DCP groups of 1..16, interleaves, both combines,
// chunked prefill, MTP speculation) on synthetic checkpoints of shapes the fixtures do not have: more
// heads and experts than the fixtures, fewer experts than ranks, shared-indexer layers in other
// patterns, grouped routing, fp8 blocks that TP shards cut through. Every layout must give one rank's teacher-forced logits (to
// the self-consistency tolerance: TP and DCP change only the order of sums) and its greedy tokens.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "model/synthetic.h"
#include "runtime/generator.h"
#include "runtime/ranks.h"
#include "test_util.h"
#include "tolerances.h"

namespace dsi {
namespace {

// Writes config.json (`base` fixture's, with `changes` merged over it) and a synthetic
// model.safetensors for it into dir.
void write_synthetic_model(const std::string& dir, const std::string& base, const nlohmann::json& changes) {
  nlohmann::json j;
  std::ifstream(test::fixture_dir(base) + "/config.json") >> j;
  j.merge_patch(changes);
  std::ofstream(dir + "/config.json") << j.dump(2);
  const ModelConfig cfg = load_config(dir + "/config.json");
  const Checkpoint ck = synthetic_checkpoint(cfg, 7);
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const std::string& name : ck.names()) tensors.emplace_back(name, ck.get(name));
  write_safetensors(dir + "/model.safetensors", tensors);
}

struct Case {
  const char* name;
  const char* base;
  nlohmann::json changes;
  std::vector<ParallelConfig> layouts;
};

std::vector<Case> cases() {
  const DcpCombine ag = DcpCombine::kAgRs, a2a = DcpCombine::kA2a;
  return {
      // GLM-5: 16 heads, 16 experts (2 of them per rank at TP 8), indexers shared in another pattern.
      {"glm_16_heads",
       "glm_tiny",
       {{"num_attention_heads", 16},
        {"num_key_value_heads", 16},
        {"index_n_heads", 8},
        {"index_topk", 6},
        {"n_routed_experts", 16},
        {"num_experts_per_tok", 4},
        {"indexer_types", {"full", "shared", "shared", "full"}}},
       {{8, 8, 1, ag}, {8, 4, 2, ag}, {8, 2, 3, a2a}, {16, 16, 1, a2a}, {16, 4, 1, ag}}},
      // DeepSeek-V3.2 with fp8 weights: TP 8 cuts the 128-row scale blocks of every sharded projection.
      {"dsv_fp8_grouped",
       "dsv32_tiny",
       {{"index_topk", 5},
        {"quantization_config",
         {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"activation_scheme", "dynamic"}, {"weight_block_size", {128, 128}}}}},
       {{8, 8, 1, ag}, {8, 2, 2, a2a}, {4, 4, 3, ag}}},
      // Rank counts that are not powers of two: 24 heads and 24 experts over 6 and 12 ranks.
      {"dsv_24_heads",
       "dsv32_tiny",
       {{"num_attention_heads", 24},
        {"num_key_value_heads", 24},
        {"n_routed_experts", 24},
        {"moe_intermediate_size", 48},
        {"index_topk", 7}},
       {{6, 3, 1, ag}, {6, 6, 2, a2a}, {12, 4, 1, ag}, {12, 12, 1, a2a}}},
      // Experts the ranks cannot share evenly: 6 over 4 ranks (1 or 2 each) and over 8 (two ranks
      // hold none and add only their share of the shared expert).
      {"glm_6_experts",
       "glm_tiny",
       {{"n_routed_experts", 6}, {"num_experts_per_tok", 3}},
       {{4, 2, 1, ag}, {8, 8, 1, a2a}, {8, 1, 1, ag}}},
  };
}

TEST(ParallelWide, WideLayoutsMatchOneRank) {
  std::vector<int32_t> prompt;
  for (int i = 0; i < 37; ++i) prompt.push_back(int32_t(3 + (i * 37 + i * i * 11) % 250));
  CommOptions opts;
  opts.check_lockstep = true;
  opts.timeout_seconds = 120;
  for (const Case& c : cases()) {
    test::TempDir dir;
    write_synthetic_model(dir.path(), c.base, c.changes);
    GenerationParams gp;
    gp.max_new_tokens = 10;
    gp.ignore_eos = true;
    const PromptLogits one = prompt_logits_on_ranks(dir.path(), prompt, 0, true, ParallelConfig{}, opts);
    const std::vector<int32_t> greedy = generate_on_ranks(dir.path(), prompt, gp, ParallelConfig{}, opts).output_ids;
    ASSERT_EQ(greedy.size(), size_t(gp.max_new_tokens));
    for (const ParallelConfig& l : c.layouts) {
      SCOPED_TRACE(std::string(c.name) + " tp " + std::to_string(l.tp) + " dcp " + std::to_string(l.dcp) +
                   " interleave " + std::to_string(l.dcp_interleave) +
                   (l.combine == DcpCombine::kA2a ? " a2a" : " ag_rs"));
      const PromptLogits pl = prompt_logits_on_ranks(dir.path(), prompt, 5, true, l, opts);  // chunks of 5
      EXPECT_LE(test::nmse(pl.logits, one.logits), tol::kSelfConsistencyNmse);
      EXPECT_LE(test::nmse(pl.mtp_logits, one.mtp_logits), tol::kSelfConsistencyNmse);
      EXPECT_EQ(generate_on_ranks(dir.path(), prompt, gp, l, opts).output_ids, greedy);
      GenerationParams spec = gp;
      spec.speculative_tokens = 3;
      EXPECT_EQ(generate_on_ranks(dir.path(), prompt, spec, l, opts).output_ids, greedy);
    }
  }
}

}  // namespace
}  // namespace dsi
