// Loading checkpoints: a broken checkpoint (missing, mis-shaped or mistyped tensors, fp8 without
// scales, truncated files, config and weights that disagree) ends in one error naming the tensor.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <cstring>
#include <functional>

#include "model/dsa_model.h"
#include "model/weights.h"
#include "ops/linear.h"
#include "model/safetensors.h"
#include "test_util.h"

namespace dsi {
namespace {

namespace fs = std::filesystem;
using Tensors = std::vector<std::pair<std::string, Tensor>>;

Tensors read_all(const std::string& file) {
  auto f = SafetensorsFile::open(file);
  Tensors out;
  for (const auto& [name, info] : f->tensors()) out.push_back({name, f->get(name).contiguous()});
  return out;
}

// Copies a single-file fixture into `dir`, letting `edit` change its tensors and config first.
void write_variant(const std::string& fixture, const std::string& dir,
                   const std::function<void(Tensors&)>& edit,
                   const std::function<void(nlohmann::json&)>& edit_config = nullptr) {
  const std::string src = test::fixture_dir(fixture);
  Tensors t = read_all(src + "/model.safetensors");
  if (edit) edit(t);
  write_safetensors(dir + "/model.safetensors", t);
  std::ifstream cf(src + "/config.json");
  nlohmann::json cfg = nlohmann::json::parse(cf);
  if (edit_config) edit_config(cfg);
  std::ofstream(dir + "/config.json") << cfg.dump(2);
}

void erase(Tensors& t, const std::string& name) {
  auto it = std::find_if(t.begin(), t.end(), [&](auto& p) { return p.first == name; });
  ASSERT_NE(it, t.end()) << name;
  t.erase(it);
}

Tensor& find(Tensors& t, const std::string& name) {
  for (auto& p : t)
    if (p.first == name) return p.second;
  throw std::runtime_error("fixture lacks " + name);
}

TEST(Weights, UnchangedCopyLoads) {
  test::TempDir d;
  write_variant("glm_tiny", d.path(), nullptr);
  auto m = DsaModel::load(d.path());
  EXPECT_TRUE(m->has_mtp());
  EXPECT_EQ(m->config().n_mtp_layers, 1);
}

TEST(Weights, MissingTensorIsNamed) {
  test::TempDir d;
  const std::string name = "model.layers.2.mlp.experts.3.up_proj.weight";
  write_variant("glm_tiny", d.path(), [&](Tensors& t) { erase(t, name); });
  test::expect_error([&] { DsaModel::load(d.path()); }, {"missing tensor '" + name + "'"});
}

TEST(Weights, MisshapedTensorIsNamed) {
  test::TempDir d;
  const std::string name = "model.layers.1.self_attn.q_a_proj.weight";
  write_variant("glm_tiny", d.path(), [&](Tensors& t) {
    Tensor& w = find(t, name);
    w = w.slice(0, w.dim(0) - 1).contiguous();
  });
  test::expect_error([&] { DsaModel::load(d.path()); }, {name, "has shape [63, 128], expected [64, 128]"});
}

TEST(Weights, NonFloatTensorIsNamed) {
  test::TempDir d;
  const std::string name = "model.norm.weight";
  write_variant("glm_tiny", d.path(), [&](Tensors& t) {
    find(t, name) = Tensor::zeros({128}, DType::I32);
  });
  test::expect_error([&] { DsaModel::load(d.path()); }, {name, "I32"});
}

TEST(Weights, Fp8WithoutScaleIsNamed) {
  test::TempDir d;
  const std::string name = "model.layers.0.self_attn.o_proj.weight_scale_inv";
  write_variant("glm_tiny_fp8", d.path(), [&](Tensors& t) { erase(t, name); });
  test::expect_error([&] { DsaModel::load(d.path()); },
                     {"model.layers.0.self_attn.o_proj.weight", name});
}

TEST(Weights, Fp8ScaleWithWrongShapeIsNamed) {
  test::TempDir d;
  const std::string name = "model.layers.1.self_attn.q_b_proj.weight_scale_inv";
  write_variant("glm_tiny_fp8", d.path(), [&](Tensors& t) {
    find(t, name) = Tensor::zeros({1, 1}, DType::F32);
  });
  test::expect_error([&] { DsaModel::load(d.path()); }, {name, "expected [3, 2]"});
}

TEST(Weights, ScaleOnNonFp8WeightIsRejected) {
  test::TempDir d;
  write_variant("glm_tiny", d.path(), [&](Tensors& t) {
    t.push_back({"model.layers.0.self_attn.o_proj.weight_scale_inv", Tensor::zeros({1, 1}, DType::F32)});
  });
  test::expect_error([&] { DsaModel::load(d.path()); },
                     {"model.layers.0.self_attn.o_proj.weight_scale_inv", "not F8_E4M3"});
}

TEST(Weights, ConfigAndCheckpointDisagreeOnSharedIndexer) {
  test::TempDir d;
  // Layer 2 has its own indexer in the checkpoint; a config calling it "shared" is a mismatch.
  write_variant("glm_tiny", d.path(), nullptr, [](nlohmann::json& c) {
    c["indexer_types"] = {"full", "shared", "shared", "shared"};
  });
  test::expect_error([&] { DsaModel::load(d.path()); },
                     {"model.layers.2.self_attn.indexer.wk.weight", "\"shared\""});
}

TEST(Weights, DeclaredMtpLayerMustExist) {
  test::TempDir d;
  write_variant("glm_tiny", d.path(), [](Tensors& t) {
    t.erase(std::remove_if(t.begin(), t.end(),
                           [](auto& p) { return p.first.rfind("model.layers.4.", 0) == 0; }),
            t.end());
  }, [](nlohmann::json& c) { c["num_nextn_predict_layers"] = 1; });
  test::expect_error([&] { DsaModel::load(d.path()); }, {"missing tensor 'model.layers.4."});
}

TEST(Weights, UnstatedMtpLayerIsDetected) {
  test::TempDir d;
  write_variant("glm_tiny", d.path(), [](Tensors& t) {
    t.erase(std::remove_if(t.begin(), t.end(),
                           [](auto& p) { return p.first.rfind("model.layers.4.", 0) == 0; }),
            t.end());
  }, [](nlohmann::json& c) { c.erase("num_nextn_predict_layers"); });
  auto m = DsaModel::load(d.path());
  EXPECT_FALSE(m->has_mtp());
  EXPECT_EQ(m->config().n_mtp_layers, 0);
}

TEST(Weights, TruncatedShardIsNamed) {
  test::TempDir d;
  write_variant("glm_tiny", d.path(), nullptr);
  const std::string file = d.path() + "/model.safetensors";
  fs::resize_file(file, fs::file_size(file) - 1000);
  test::expect_error([&] { DsaModel::load(d.path()); }, {file, "truncated"});
}

TEST(Weights, MissingConfigOrUnknownModelType) {
  test::TempDir d;
  test::expect_error([&] { DsaModel::load(d.path()); }, {d.path() + "/config.json", "cannot open"});
  write_variant("glm_tiny", d.path(), nullptr, [](nlohmann::json& c) { c["model_type"] = "qwen3"; });
  test::expect_error([&] { DsaModel::load(d.path()); }, {"unsupported model_type 'qwen3'"});
}

// The checkpoint's own weight `name` (fp8: with its block scales), for comparisons.
LinearWeight checkpoint_linear(const Checkpoint& ck, const ModelConfig& c, const std::string& name) {
  LinearWeight w;
  w.weight = ck.get(name + ".weight");
  if (w.weight.dtype() == DType::F8_E4M3) {
    w.block_out = c.quant.block_out;
    w.block_in = c.quant.block_in;
    w.scale_inv = ck.get(name + ".weight_scale_inv").contiguous();
  }
  return w;
}

// q_a_proj, kv_a_proj_with_mqa and (own-indexer layers) indexer.wk are stacked into one weight:
// each part's rows are the checkpoint's (dequantised, bitwise), fp8 parts are padded with zero rows
// to whole scale blocks (glm_tiny_fp8: 160, 160 and 32 rows in 128-row blocks), and the stacked
// parts' own fields are empty.
TEST(Weights, InputProjectionsAreStacked) {
  for (const char* fixture : {"glm_tiny", "glm_tiny_fp8", "dsv32_tiny"}) {
    const Checkpoint ck = Checkpoint::open(test::fixture_dir(fixture));
    ModelConfig c = load_config(test::fixture_dir(fixture) + "/config.json");
    const ModelWeights w = load_weights(ck, c);
    for (int i = 0; i < c.n_layers; ++i) {
      const AttentionWeights& a = w.layers[size_t(i)].self_attn;
      const std::string p = "model.layers." + std::to_string(i) + ".self_attn.";
      const bool fp8 = a.in_proj.weight.dtype() == DType::F8_E4M3;
      const int64_t pad = fp8 ? c.quant.block_out : 1;
      auto up = [&](int64_t rows) { return (rows + pad - 1) / pad * pad; };
      struct Part {
        std::string name;
        int64_t row, rows;
      };
      std::vector<Part> parts = {{p + "q_a_proj", 0, c.q_lora_rank},
                                 {p + "kv_a_proj_with_mqa", up(c.q_lora_rank), c.kv_lora_rank + c.head_dim_rope}};
      EXPECT_EQ(a.in_proj_kv_row, parts[1].row) << fixture << " layer " << i;
      EXPECT_FALSE(a.kv_a_proj_with_mqa.defined());
      if (a.indexer) {
        parts.push_back({p + "indexer.wk", parts[1].row + up(parts[1].rows), c.index_head_dim});
        EXPECT_EQ(a.in_proj_index_k_row, parts[2].row) << fixture << " layer " << i;
        EXPECT_FALSE(a.indexer->wk.defined());
      } else {
        EXPECT_EQ(a.in_proj_index_k_row, -1);
      }
      const Part& last = parts.back();
      ASSERT_EQ(a.in_proj.out_features(), last.row + up(last.rows)) << fixture << " layer " << i;
      for (size_t j = 0; j < parts.size(); ++j) {
        const Part& pt = parts[j];
        const Tensor want = ops::dequantize_rows(checkpoint_linear(ck, c, pt.name), 0, pt.rows);
        const Tensor got = ops::dequantize_rows(a.in_proj, pt.row, pt.row + pt.rows);
        ASSERT_EQ(got.shape(), want.shape()) << fixture << " " << pt.name;
        EXPECT_EQ(std::memcmp(got.raw(), want.raw(), got.nbytes()), 0) << fixture << " " << pt.name;
        const int64_t end = j + 1 < parts.size() ? parts[j + 1].row : a.in_proj.out_features();
        const Tensor padding = ops::dequantize_rows(a.in_proj, pt.row + pt.rows, end);
        for (int64_t e = 0; e < padding.numel(); ++e)
          ASSERT_EQ(padding.f32()[e], 0.0f) << fixture << " " << pt.name << " padding";
      }
    }
  }
}

// A part of another dtype than q_a_proj is not stacked and runs alone: indexer.wk of glm_tiny_fp8
// stored as its dequantised f32 values gives the same logits.
TEST(Weights, InputProjectionOfAnotherDtypeRunsAlone) {
  const std::string src = test::fixture_dir("glm_tiny_fp8");
  const Checkpoint ck = Checkpoint::open(src);
  const ModelConfig c = load_config(src + "/config.json");
  test::TempDir d;
  write_variant("glm_tiny_fp8", d.path(), [&](Tensors& t) {
    for (int i = 0; i < c.n_layers + c.n_mtp_layers; ++i) {
      const std::string name = "model.layers." + std::to_string(i) + ".self_attn.indexer.wk";
      if (!ck.has(name + ".weight")) continue;
      find(t, name + ".weight") = ops::dequantize_rows(checkpoint_linear(ck, c, name), 0, c.index_head_dim);
      erase(t, name + ".weight_scale_inv");
    }
  });
  const Checkpoint ck2 = Checkpoint::open(d.path());
  ModelConfig c2 = load_config(d.path() + "/config.json");
  const ModelWeights w = load_weights(ck2, c2);
  int alone = 0;
  for (const LayerWeights& l : w.layers)
    if (l.self_attn.indexer) {
      EXPECT_EQ(l.self_attn.in_proj_index_k_row, -1);
      EXPECT_TRUE(l.self_attn.indexer->wk.defined());
      EXPECT_EQ(l.self_attn.indexer->wk.weight.dtype(), DType::F32);
      ++alone;
    }
  ASSERT_GT(alone, 0);
  const auto a = DsaModel::load(src), b = DsaModel::load(d.path());
  const std::vector<int32_t> ids = {1, 5, 9, 13, 17, 21, 25, 29};
  auto logits = [&](const DsaModel& m) {
    SequenceKvCache cache(m.config(), int64_t(ids.size()), false);
    return m.logits(m.forward(Tensor::from_i32(ids, {int64_t(ids.size())}), cache));
  };
  EXPECT_LE(test::nmse(logits(*b), logits(*a)), 1e-12);
}

TEST(Weights, ShardedFixtureLoadsFromIndex) {
  auto m = DsaModel::load(test::fixture_dir("dsv32_tiny"));
  EXPECT_EQ(m->config().family, ModelFamily::kDeepseekV32);
  EXPECT_TRUE(m->has_mtp());
}

}  // namespace
}  // namespace dsi
