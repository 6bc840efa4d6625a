// Times the CPU backend's linear products (ops::linear, src/backends/cpu/linear.cpp) at decode
// shapes: one row (a decode step) and a few (MTP verification), weights in f32, bf16 and fp8 with
// 128x128 block scales, enough copies of each weight (1 GB) that it streams from memory.
// Prints microseconds per product and the weight bytes' rate next to this host's copy rate.
//
//   bench_cpu_linear [--reps N] [--rows 1,4] [--threads T] [--only TEXT]
// T: OpenBLAS threads (default: its own); --only: the rows whose product and dtype contain TEXT.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "../bench_options.h"
#include "core/dtype.h"
#include "dsinfer/error.h"
#include "ops/linear.h"

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// A weight of `out` x `in` in `dtype` from a xorshift generator (the values do not matter, the
// setup's time does): uniform in [-0.1, 0.1) for f32 and bf16; fp8: any code but NaN's, with
// scales of 2^-8.
dsi::LinearWeight make_weight(int64_t out, int64_t in, dsi::DType dtype, uint32_t seed) {
  uint64_t state = 0x9E3779B97F4A7C15ull * (seed + 1);
  auto next = [&] {
    state ^= state << 13, state ^= state >> 7, state ^= state << 17;
    return state;
  };
  auto uniform = [&] { return float(int32_t(next() >> 40) - (1 << 23)) * (0.1f / float(1 << 23)); };
  dsi::LinearWeight w;
  w.weight = dsi::Tensor::empty({out, in}, dtype);
  const int64_t n = out * in;
  switch (dtype) {
    case dsi::DType::F32:
      for (int64_t i = 0; i < n; ++i) w.weight.f32()[i] = uniform();
      break;
    case dsi::DType::BF16: {
      auto* p = static_cast<uint16_t*>(w.weight.raw());
      for (int64_t i = 0; i < n; ++i) p[i] = dsi::f32_to_bf16(uniform());
      break;
    }
    case dsi::DType::F8_E4M3: {
      auto* p = static_cast<uint8_t*>(w.weight.raw());
      for (int64_t i = 0; i < n; ++i) {
        const uint8_t b = uint8_t(next() >> 56);
        p[i] = (b & 0x7f) == 0x7f ? uint8_t(b ^ 1) : b;
      }
      const int64_t so = (out + 127) / 128, si = (in + 127) / 128;
      w.scale_inv = dsi::Tensor::from_f32(std::vector<float>(size_t(so * si), 0x1p-8f), {so, si});
      break;
    }
    default: dsi::fail("make_weight: {}", dsi::dtype_name(dtype));
  }
  return w;
}

// This host's copy rate over a buffer far larger than its caches (bytes read + written a second).
double copy_gbs() {
  const size_t bytes = size_t(1) << 30;
  std::vector<char> a(bytes, 1), b(bytes, 0);
  std::vector<double> t;
  for (int r = 0; r < 5; ++r) {
    const auto t0 = Clock::now();
    std::memcpy(b.data(), a.data(), bytes);
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return 2.0 * double(bytes) / median(t) / 1e9;
}

}  // namespace

int main(int argc, char** argv) try {
  int reps = 20, threads = 0;
  std::string only;
  std::vector<int> rows = {1, 4};
  parse_options(argc, argv, [&](const std::string& k, auto value) {
    if (k == "--reps") reps = std::max(1, std::stoi(value()));
    else if (k == "--rows") rows = int_list(value());
    else if (k == "--threads") threads = std::stoi(value());
    else if (k == "--only") only = value();
    else return false;
    return true;
  });
  if (threads > 0) openblas_set_num_threads(threads);
  std::printf("host copy rate: %.1f GB/s (memcpy of 1 GB, read + write)\n", copy_gbs());
  struct Shape {
    const char* name;
    int64_t out, in;
  };
  // Decode products of the geometries in configs/ (GLM-5.2: hidden 6144, experts of 2048;
  // DeepSeek-V3.2: hidden 7168), and a wide one of the bundled model's kind.
  const Shape shapes[] = {{"expert gate/up [2048, 6144]", 2048, 6144},
                          {"expert down [6144, 2048]", 6144, 2048},
                          {"q_b [16384, 2048]", 16384, 2048},
                          {"DSV3.2 expert gate/up [2048, 7168]", 2048, 7168}};
  std::printf("%-36s %-7s %4s %10s %10s\n", "product", "dtype", "rows", "us", "GB/s");
  for (const Shape& s : shapes) {
    for (const dsi::DType dt : {dsi::DType::F32, dsi::DType::BF16, dsi::DType::F8_E4M3}) {
      if ((std::string(s.name) + " " + std::string(dsi::dtype_name(dt))).find(only) == std::string::npos) continue;
      // Enough copies of the weight that one pass over them is larger than any cache here.
      const int64_t bytes = s.out * s.in * int64_t(dsi::dtype_size(dt));
      const int copies = int(std::max<int64_t>(2, (int64_t(1) << 30) / bytes));
      std::vector<dsi::LinearWeight> ws;
      for (int c = 0; c < copies; ++c) ws.push_back(make_weight(s.out, s.in, dt, uint32_t(c + 1)));
      for (const int n : rows) {
        std::vector<float> xv(size_t(n * s.in));
        std::mt19937 rng(7);
        std::normal_distribution<float> d(0.0f, 1.0f);
        for (float& v : xv) v = d(rng);
        const dsi::Tensor x = dsi::Tensor::from_f32(xv, {n, s.in});
        dsi::Tensor y = dsi::Tensor::empty({n, s.out}, dsi::DType::F32);
        std::vector<double> t;
        for (int r = 0; r < reps + 1; ++r) {
          const auto t0 = Clock::now();
          dsi::ops::linear(x, ws[size_t(r % copies)], y);
          if (r > 0) t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
        }
        const double us = median(t) * 1e6;
        std::printf("%-36s %-7s %4d %10.1f %10.2f\n", s.name, std::string(dsi::dtype_name(dt)).c_str(), n, us,
                    double(bytes) / (us * 1e-6) / 1e9);
      }
    }
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_cpu_linear: %s\n", e.what());
  return 1;
}
