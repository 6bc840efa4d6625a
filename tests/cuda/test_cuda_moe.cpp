// CUDA op tests, part 3: MoE routing (expert ids exact, including ties, groups and masked groups),
// the routed experts over a rank's slice of experts, and the dense SwiGLU MLP, against the CPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <tuple>
#include <vector>

#include "core/dtype.h"
#include "cuda/cuda_test_util.h"
#include "backends/cuda/cuda_ops.h"
#include "ops/moe.h"

namespace dsi {
namespace {

using test::dev;
using test::gpu;
using test::host;

class CudaMoe : public test::CudaTest {};

std::string sz(const char* name, int64_t v) { return std::string(" ") + name + "=" + std::to_string(v); }

TEST_F(CudaMoe, RouteGroupsTiesAndScaling) {
  // (experts, groups, keep groups, active)
  for (auto [e, g, tg, k] : std::vector<std::tuple<int, int, int, int>>{
           {8, 1, 1, 1}, {8, 4, 1, 4}, {64, 8, 4, 8}, {64, 1, 1, 6}, {256, 8, 4, 8}, {256, 1, 1, 2}}) {
    for (int64_t n : {0, 1, 5, 130}) {
      for (bool ties : {false, true}) {
        for (bool norm : {true, false}) {
          const std::string what = "moe_route" + sz("E", e) + sz("groups", g) + sz("keep", tg) +
                                   sz("k", k) + sz("n", n) + sz("ties", ties) + sz("norm", norm);
          std::vector<float> lg = test::random_floats(size_t(n * e), uint64_t(e * 1000 + n));
          // Ties: a few logit levels, so equal sigmoid scores decide by the lower expert id.
          for (float& v : lg) v = ties ? float(int(v * 2.0f)) : v * 3.0f;
          std::vector<float> bias = test::random_floats(size_t(e), uint64_t(e) + 9);
          for (float& v : bias) v = ties ? 0.0f : v * 0.1f;
          const Tensor hl = test::host_f32(lg, {n, int64_t(e)}), hb = Tensor::from_f32(bias, {e});
          RouterParams p;
          p.n_experts_active = k;
          p.n_group = g;
          p.topk_group = tg;
          p.norm_topk_prob = norm;
          p.routed_scaling_factor = 2.5f;
          Tensor ci = Tensor::empty({n, k}, DType::I32), cw = Tensor::empty({n, k}, DType::F32);
          ops::moe_route(hl, hb, p, ci, cw);
          test::Guarded gi = test::guarded({n, int64_t(k)}, DType::I32);
          test::Guarded gw = test::guarded({n, int64_t(k)}, DType::F32);
          ops::moe_route(dev(hl), dev(hb), p, gi.view, gw.view);
          test::expect_same_i32(gi.check(what), ci, what);
          test::expect_elementwise_close(gw.check(what), cw, what);
        }
      }
    }
  }
}

LinearWeight weight_of(DType dt, int64_t out, int64_t in, uint64_t seed, bool on_gpu) {
  if (dt == DType::F8_E4M3) {  // 128 x 128 scale blocks (partial ones below 128)
    const LinearWeight w = test::make_weight(dt, out, in, seed);
    return on_gpu ? test::to_gpu(w) : w;
  }
  const std::vector<float> v = test::random_floats(size_t(out * in), seed);
  LinearWeight w;
  if (dt == DType::F32) {
    w.weight = Tensor::from_f32(v, {out, in});
  } else {
    w.weight = Tensor::empty({out, in}, DType::BF16);
    for (size_t i = 0; i < v.size(); ++i) w.weight.data<uint16_t>()[i] = f32_to_bf16(v[i] * 0.3f);
  }
  if (on_gpu) w.weight = dev(w.weight);
  return w;
}

MlpWeights mlp_of(DType dt, int64_t hidden, int64_t inter, uint64_t seed, bool on_gpu) {
  return {weight_of(dt, inter, hidden, seed, on_gpu), weight_of(dt, inter, hidden, seed + 1, on_gpu),
          weight_of(dt, hidden, inter, seed + 2, on_gpu)};
}

struct RestoreGemvPlans {
  ~RestoreGemvPlans() {
    cuda::set_gemv_row_groups_per_warp(0);
    cuda::set_gemv_seg_plan(0, 0, 0, -1);
    cuda::set_moe_segment_tokens(-1);
  }
};

// Decode batches (up to kMoeDeviceRoutedPairs pairs) route on the device; n = 100 (300 pairs) and
// a hidden size that breaks 16-byte row alignment (66) take the host-routed path. The shared
// expert: none, as wide as the routed ones or narrower (both fused into the device launches), or
// wider (added after them). n = 5 repeats an expert within a token's slots.
// Also with the gate/up/SwiGLU GEMV streaming 3 row groups per warp (forced; the plan chooses it
// for products larger than these): groups whose rows end inside a block, a smaller shared expert;
// and with the down products as segment sums for every batch (forced), rows split over 8 warps with
// 4 chunks in flight through registers, or over 2 warps of 2 rows through the 3-stage ring: a token's
// slots of 8 to 32 chunks, so a lane's stretch runs from one slot into the next. Without that,
// every batch takes the grouped down products and the combine kernel.
TEST_F(CudaMoe, ExpertsOnARankSlice) {
  const int64_t inter = 32, k = 3;
  const int n_experts = 8, first = 2, held = 4;  // this rank holds experts [2, 6)
  RestoreGemvPlans restore;
  struct Forced {
    int rgw, seg_ks, seg_depth, seg_rows, seg_ring;  // rgw 0: the plans' own, grouped down products
  };
  for (const Forced f : {Forced{0, 0, 0, 0, -1}, Forced{3, 8, 4, 4, 0}, Forced{3, 2, 2, 2, 1}})
  for (int64_t hidden : {64, 66})
  for (DType dt : {DType::F32, DType::BF16, DType::F8_E4M3})
  for (int64_t shared_inter : {0, 32, 16, 48}) {
    std::vector<MlpWeights> cpu_experts, gpu_experts;
    for (int e = 0; e < held; ++e) {
      cpu_experts.push_back(mlp_of(dt, hidden, inter, uint64_t(e) * 10, false));
      gpu_experts.push_back(mlp_of(dt, hidden, inter, uint64_t(e) * 10, true));
    }
    const MlpWeights cpu_shared = mlp_of(dt, hidden, std::max<int64_t>(shared_inter, 1), 77, false);
    const MlpWeights gpu_shared = mlp_of(dt, hidden, std::max<int64_t>(shared_inter, 1), 77, true);
    const MlpWeights* cs = shared_inter ? &cpu_shared : nullptr;
    const MlpWeights* gs = shared_inter ? &gpu_shared : nullptr;
    cuda::set_gemv_row_groups_per_warp(f.rgw);
    cuda::set_gemv_seg_plan(f.seg_ks, f.seg_depth, f.seg_rows, f.seg_ring);
    cuda::set_moe_segment_tokens(f.rgw ? 1000 : 0);
    for (int64_t n : {0, 1, 5, 33, 100}) {
      const std::string what = std::string("moe_experts ") + std::string(dtype_name(dt)) +
                               sz("n", n) + sz("hidden", hidden) + sz("shared inter", shared_inter) +
                               sz("row groups per warp", f.rgw) + sz("seg k_split", f.seg_ks) +
                               sz("seg depth", f.seg_depth) + sz("seg ring", f.seg_ring);
      const Tensor x = test::rand_tensor({n, hidden}, uint64_t(n) + 1);
      std::vector<int32_t> ids(static_cast<size_t>(n * k));
      for (int64_t t = 0; t < n; ++t)
        for (int64_t j = 0; j < k; ++j)
          ids[size_t(t * k + j)] = n == 5 && j == 2 ? ids[size_t(t * k)]
                                                    : int32_t((t * 3 + j * 5 + 1) % n_experts);
      const Tensor hid = n ? Tensor::from_i32(ids, {n, k}) : Tensor::empty({0, k}, DType::I32);
      const Tensor hw = test::rand_tensor({n, k}, uint64_t(n) + 2);
      Tensor cpu = Tensor::empty({n, hidden}, DType::F32);
      ops::moe_experts(x, hid, hw, cpu_experts, first, n_experts, cpu, cs);
      test::Guarded g = test::guarded({n, hidden}, DType::F32);
      ops::moe_experts(dev(x), dev(hid), dev(hw), gpu_experts, first, n_experts, g.view, gs);
      const Tensor got = g.check(what);
      test::expect_nmse_close(got, cpu, tol::kCudaGemmNmse, what);
      ops::moe_experts(dev(x), dev(hid), dev(hw), gpu_experts, first, n_experts, g.view, gs);
      test::expect_bitwise(g.check(what), got, what + " repeat");
    }
  }
}

// Decode widths (fp8, 128 x 128 blocks): 8 of 16 experts per token and a shared expert, slots of
// 1024 columns (the segment-sum launch's rows 9 KiB long), one and two tokens (shared expert
// fused) and four (its own MLP, added by the down launch); the segment-sum down launch (forced on
// every batch) with every split and batch depth, and the grouped one with the combine.
TEST_F(CudaMoe, ExpertsAtDecodeWidths) {
  const int64_t hidden = 512, inter = 1024, k = 8;
  const int n_experts = 16;
  RestoreGemvPlans restore;
  std::vector<MlpWeights> cpu_experts, gpu_experts;
  for (int e = 0; e < n_experts; ++e) {
    cpu_experts.push_back(mlp_of(DType::F8_E4M3, hidden, inter, uint64_t(e) * 10 + 3, false));
    gpu_experts.push_back(mlp_of(DType::F8_E4M3, hidden, inter, uint64_t(e) * 10 + 3, true));
  }
  const MlpWeights cpu_shared = mlp_of(DType::F8_E4M3, hidden, inter, 99, false);
  const MlpWeights gpu_shared = mlp_of(DType::F8_E4M3, hidden, inter, 99, true);
  for (int64_t n : {1, 2, 4}) {
    const Tensor x = test::rand_tensor({n, hidden}, uint64_t(n) + 40);
    std::vector<int32_t> ids(static_cast<size_t>(n * k));
    for (int64_t t = 0; t < n; ++t)
      for (int64_t j = 0; j < k; ++j) ids[size_t(t * k + j)] = int32_t((t * 5 + j * 3 + 2) % n_experts);
    const Tensor hid = Tensor::from_i32(ids, {n, k});
    const Tensor hw = test::rand_tensor({n, k}, uint64_t(n) + 41);
    Tensor cpu = Tensor::empty({n, hidden}, DType::F32);
    ops::moe_experts(x, hid, hw, cpu_experts, 0, n_experts, cpu, &cpu_shared);
    struct SegPlan {
      int ks, depth, rows, ring;
    };
    for (const SegPlan sp : std::vector<SegPlan>{{0, 0, 0, -1}, {1, 2, 4, 0}, {2, 4, 2, 0}, {4, 2, 4, 0}, {8, 4, 4, 0},
                                                 {1, 3, 4, 1}, {2, 3, 2, 1}, {8, 3, 4, 1}, {2, 2, 4, 1}, {4, 2, 2, 1},
                                                 {-1, -1, -1, -1}}) {
      cuda::set_gemv_seg_plan(std::max(sp.ks, 0), std::max(sp.depth, 0), std::max(sp.rows, 0), sp.ring);
      cuda::set_moe_segment_tokens(sp.ks < 0 ? 0 : 64);  // the last: grouped down products, combine
      const std::string what = "moe_experts fp8" + sz("n", n) + sz("k_split", sp.ks) + sz("depth", sp.depth) +
                               sz("rows", sp.rows) + sz("ring", sp.ring);
      test::Guarded g = test::guarded({n, hidden}, DType::F32);
      ops::moe_experts(dev(x), dev(hid), dev(hw), gpu_experts, 0, n_experts, g.view, &gpu_shared);
      const Tensor got = g.check(what);
      test::expect_nmse_close(got, cpu, tol::kCudaGemmNmse, what);
      ops::moe_experts(dev(x), dev(hid), dev(hw), gpu_experts, 0, n_experts, g.view, &gpu_shared);
      test::expect_bitwise(g.check(what), got, what + " repeat");
    }
  }
}

// ops::moe from router logits: on the device path the routing kernel writes the slots itself (no
// pairs kernel). The ids it picks are the CPU's, its output the CPU's within the GEMM tolerance and
// bit for bit what routing and then moe_experts give on the GPU. Grouped routing with ties (equal
// logits decide by the lower id), this rank holding experts [4, 12) of 16, shared experts fused (as
// wide as the routed ones, narrower), added after (wider) or absent; 1, 2 and 4 tokens route on
// the device, 40 (320 pairs) on the host.
TEST_F(CudaMoe, RoutedFromLogitsAsRouteThenExperts) {
  const int64_t hidden = 256, inter = 128;
  const int n_experts = 16, first = 4, held = 8, k = 6;
  RestoreGemvPlans restore;
  std::vector<MlpWeights> cpu_experts, gpu_experts;
  for (int e = 0; e < held; ++e) {
    cpu_experts.push_back(mlp_of(DType::F8_E4M3, hidden, inter, uint64_t(e) * 10 + 5, false));
    gpu_experts.push_back(mlp_of(DType::F8_E4M3, hidden, inter, uint64_t(e) * 10 + 5, true));
  }
  RouterParams rp;
  rp.n_experts_active = k;
  rp.n_group = 4;
  rp.topk_group = 3;
  rp.routed_scaling_factor = 2.5f;
  std::vector<float> bias = test::random_floats(size_t(n_experts), 31);
  for (float& v : bias) v *= 0.1f;
  const Tensor hb = Tensor::from_f32(bias, {n_experts});
  for (int64_t shared_inter : {0, 128, 64, 256}) {
    const MlpWeights cpu_shared = mlp_of(DType::F8_E4M3, hidden, std::max<int64_t>(shared_inter, 1), 77, false);
    const MlpWeights gpu_shared = mlp_of(DType::F8_E4M3, hidden, std::max<int64_t>(shared_inter, 1), 77, true);
    const MlpWeights* cs = shared_inter ? &cpu_shared : nullptr;
    const MlpWeights* gs = shared_inter ? &gpu_shared : nullptr;
    for (int64_t n : {1, 2, 4, 40}) {
      const std::string what = "moe" + sz("n", n) + sz("shared inter", shared_inter);
      std::vector<float> lg = test::random_floats(size_t(n * n_experts), uint64_t(n) + 50);
      for (float& v : lg) v = float(int(v * 4.0f));  // a few levels: ties
      const Tensor hl = test::host_f32(lg, {n, int64_t(n_experts)});
      const Tensor x = test::rand_tensor({n, hidden}, uint64_t(n) + 60);
      Tensor ci = Tensor::empty({n, k}, DType::I32), cw = Tensor::empty({n, k}, DType::F32);
      Tensor cpu = Tensor::empty({n, hidden}, DType::F32);
      ops::moe(x, hl, hb, rp, cpu_experts, first, n_experts, ci, cw, cpu, cs);
      test::Guarded gi = test::guarded({n, int64_t(k)}, DType::I32);
      test::Guarded gw = test::guarded({n, int64_t(k)}, DType::F32);
      test::Guarded g = test::guarded({n, hidden}, DType::F32);
      ops::moe(dev(x), dev(hl), dev(hb), rp, gpu_experts, first, n_experts, gi.view, gw.view, g.view, gs);
      test::expect_same_i32(gi.check(what), ci, what + " ids");
      const Tensor weights = gw.check(what);
      test::expect_elementwise_close(weights, cw, what + " weights");
      const Tensor got = g.check(what);
      test::expect_nmse_close(got, cpu, tol::kCudaGemmNmse, what);
      // The same through the two ops.
      Tensor ids2 = Tensor::empty({n, k}, DType::I32, gpu()), w2 = Tensor::empty({n, k}, DType::F32, gpu());
      Tensor out2 = Tensor::empty({n, hidden}, DType::F32, gpu());
      ops::moe_route(dev(hl), dev(hb), rp, ids2, w2);
      ops::moe_experts(dev(x), ids2, w2, gpu_experts, first, n_experts, out2, gs);
      test::expect_bitwise(weights, host(w2), what + " weights, route then experts");
      test::expect_bitwise(got, host(out2), what + ", route then experts");
    }
  }
}

// Router logits for another number of tokens than x's rows: the op's error, on both backends.
TEST_F(CudaMoe, RoutedFromLogitsOfTheWrongShapeIsRefused) {
  std::vector<MlpWeights> ce = {mlp_of(DType::F32, 8, 4, 1, false)};
  std::vector<MlpWeights> ge = {mlp_of(DType::F32, 8, 4, 1, true)};
  RouterParams rp;
  rp.n_experts_active = 1;
  const Tensor x = test::rand_tensor({2, 8}, 1), lg = test::rand_tensor({3, 4}, 2), b = test::rand_tensor({4}, 3);
  Tensor ci = Tensor::empty({2, 1}, DType::I32), cw = Tensor::empty({2, 1}, DType::F32);
  Tensor gi = Tensor::empty({2, 1}, DType::I32, gpu()), gw = Tensor::empty({2, 1}, DType::F32, gpu());
  Tensor co = Tensor::empty({2, 8}, DType::F32), go = Tensor::empty({2, 8}, DType::F32, gpu());
  const std::string cm = test::error_of([&] { ops::moe(x, lg, b, rp, ce, 0, 4, ci, cw, co); });
  const std::string gm = test::error_of([&] { ops::moe(dev(x), dev(lg), dev(b), rp, ge, 0, 4, gi, gw, go); });
  EXPECT_NE(cm.find("router logits"), std::string::npos) << cm;
  EXPECT_EQ(gm, cm);
}

TEST_F(CudaMoe, BadExpertIdGivesTheCpuError) {
  std::vector<MlpWeights> ce = {mlp_of(DType::F32, 8, 4, 1, false)};
  std::vector<MlpWeights> ge = {mlp_of(DType::F32, 8, 4, 1, true)};
  const Tensor x = test::rand_tensor({2, 8}, 1), w = test::rand_tensor({2, 2}, 2);
  const Tensor ids = Tensor::from_i32({0, 1, 3, 4}, {2, 2});
  Tensor co = Tensor::empty({2, 8}, DType::F32), go = Tensor::empty({2, 8}, DType::F32, gpu());
  const std::string cm = test::error_of([&] { ops::moe_experts(x, ids, w, ce, 0, 4, co); });
  const std::string gm =
      test::error_of([&] { ops::moe_experts(dev(x), dev(ids), dev(w), ge, 0, 4, go); });
  EXPECT_FALSE(cm.empty());
  EXPECT_EQ(gm, cm);
}

TEST_F(CudaMoe, DenseMlp) {
  for (DType dt : {DType::F32, DType::BF16}) {
    const MlpWeights cw = mlp_of(dt, 96, 200, 5, false), gw = mlp_of(dt, 96, 200, 5, true);
    for (int64_t n : {0, 1, 7, 130}) {
      const Tensor x = test::rand_tensor({n, 96}, uint64_t(n) + 4);
      Tensor cpu = Tensor::empty({n, 96}, DType::F32);
      ops::mlp(x, cw, cpu);
      test::Guarded g = test::guarded_strided({n, 96}, DType::F32);
      ops::mlp(dev(x), gw, g.view);
      test::expect_nmse_close(g.check("mlp"), cpu, tol::kCudaGemmNmse,
                              std::string("mlp ") + std::string(dtype_name(dt)) + sz("n", n));
    }
  }
}

}  // namespace
}  // namespace dsi
