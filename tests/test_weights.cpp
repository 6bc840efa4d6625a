// Loading checkpoints: a broken checkpoint (missing, mis-shaped or mistyped tensors, fp8 without
// scales, truncated files, config and weights that disagree) ends in one error naming the tensor.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "model/dsa_model.h"
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

TEST(Weights, ShardedFixtureLoadsFromIndex) {
  auto m = DsaModel::load(test::fixture_dir("dsv32_tiny"));
  EXPECT_EQ(m->config().family, ModelFamily::kDeepseekV32);
  EXPECT_TRUE(m->has_mtp());
}

}  // namespace
}  // namespace dsi
