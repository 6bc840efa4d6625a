// Shared helpers for the tests: fixture paths and manifests, comparisons, temp dirs, error checks.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/dsa_model.h"

namespace dsi::test {

std::string source_dir();
std::string fixture_dir(const std::string& name);  // tests/fixtures/<name>
nlohmann::json load_manifest(const std::string& fixture);
std::vector<std::string> fixture_names();  // every fixture with goldens
// The fixture's model, loaded once per test binary (loading dominates under sanitizers).
const DsaModel& fixture_model(const std::string& name);

// sum((a - b)^2) / sum(b^2) over all elements of two f32 tensors of the same shape.
double nmse(const Tensor& a, const Tensor& ref);
double max_abs_diff(const Tensor& a, const Tensor& ref);

// A fresh empty directory, removed when the object dies.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Runs fn, expects a dsi::Error whose one-line message contains every string in `needles`.
void expect_error(const std::function<void()>& fn, const std::vector<std::string>& needles);

// Deterministic pseudo-random floats in [-1, 1).
std::vector<float> random_floats(size_t n, uint64_t seed);

// Golden top-k selections ([..., k] rows, each best first with -1 padding, as the fixtures store
// them) listed as the engine lists a selection: positions ascending, then -1.
std::vector<int32_t> golden_topk_by_position(const Tensor& golden);

}  // namespace dsi::test
