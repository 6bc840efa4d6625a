// Shared test helpers; see test_util.h.
#include "test_util.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <unistd.h>

#include "dsinfer/error.h"

namespace dsi::test {

std::string source_dir() { return DSI_SOURCE_DIR; }

std::string fixture_dir(const std::string& name) { return source_dir() + "/tests/fixtures/" + name; }

nlohmann::json load_manifest(const std::string& fixture) {
  std::ifstream f(fixture_dir(fixture) + "/goldens/manifest.json");
  EXPECT_TRUE(f.good()) << "missing manifest for fixture " << fixture;
  return nlohmann::json::parse(f);
}

std::vector<std::string> fixture_names() { return {"glm_tiny", "dsv32_tiny", "glm_tiny_fp8"}; }

const DsaModel& fixture_model(const std::string& name) {
  static std::map<std::string, std::unique_ptr<DsaModel>> cache;
  auto& m = cache[name];
  if (!m) m = DsaModel::load(fixture_dir(name));
  return *m;
}

double nmse(const Tensor& a, const Tensor& ref) {
  EXPECT_EQ(a.shape(), ref.shape());
  if (a.shape() != ref.shape()) return INFINITY;
  const Tensor ac = a.contiguous(), rc = ref.contiguous();
  double num = 0, den = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double d = double(ac.f32()[i]) - double(rc.f32()[i]);
    num += d * d;
    den += double(rc.f32()[i]) * double(rc.f32()[i]);
  }
  if (std::isnan(num)) return INFINITY;
  return den == 0 ? num : num / den;
}

double max_abs_diff(const Tensor& a, const Tensor& ref) {
  EXPECT_EQ(a.shape(), ref.shape());
  if (a.shape() != ref.shape()) return INFINITY;
  const Tensor ac = a.contiguous(), rc = ref.contiguous();
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double d = std::fabs(double(ac.f32()[i]) - double(rc.f32()[i]));
    if (std::isnan(d)) return INFINITY;
    m = std::max(m, d);
  }
  return m;
}

TempDir::TempDir() {
  static std::atomic<int> counter{0};
  path_ = (std::filesystem::temp_directory_path() /
           ("dsinfer_test_" + std::to_string(getpid()) + "_" + std::to_string(counter++)))
              .string();
  std::filesystem::remove_all(path_);
  std::filesystem::create_directories(path_);
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

void expect_error(const std::function<void()>& fn, const std::vector<std::string>& needles) {
  try {
    fn();
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "multi-line message: " << msg;
    for (const auto& n : needles)
      EXPECT_NE(msg.find(n), std::string::npos) << "message '" << msg << "' lacks '" << n << "'";
    return;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected dsi::Error, got another exception: " << e.what();
    return;
  }
  ADD_FAILURE() << "expected dsi::Error, nothing was thrown";
}

std::vector<int32_t> golden_topk_by_position(const Tensor& golden) {
  const int64_t k = golden.dim(golden.ndim() - 1);
  std::vector<int32_t> out(golden.i32(), golden.i32() + golden.numel());
  for (size_t r = 0; k > 0 && r < out.size(); r += size_t(k))  // as unsigned, -1 sorts last
    std::sort(out.begin() + std::ptrdiff_t(r), out.begin() + std::ptrdiff_t(r + size_t(k)),
              [](int32_t a, int32_t b) { return uint32_t(a) < uint32_t(b); });
  return out;
}

std::vector<float> random_floats(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

}  // namespace dsi::test
