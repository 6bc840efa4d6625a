// ops::run_beside on the GPU (ops/beside.h): the pieces give what running them one after the other
// gives, eagerly and replayed from a step graph; a block one piece frees is not handed to the other
// before both are done; an error in a piece reaches the caller with the streams joined.
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "backends/cuda/graph/step_graph.h"
#include "cuda/cuda_test_util.h"
#include "dsinfer/error.h"
#include "ops/beside.h"
#include "ops/elementwise.h"
#include "test_util.h"

namespace dsi {
namespace {

using test::dev;
using test::gpu;
using test::host;

class CudaBeside : public test::CudaTest {};

// Chains of element-wise kernels long enough to overlap: a += 0.5 x, twenty times; b = silu(b) * y,
// twenty times.
void side_piece(Tensor& a, const Tensor& x) {
  for (int i = 0; i < 20; ++i) ops::axpy_inplace(a, x, 0.5f);
}
void main_piece(Tensor& b, const Tensor& y) {
  for (int i = 0; i < 20; ++i) ops::silu_mul(b, y, b);
}

TEST_F(CudaBeside, PiecesGiveTheirSequentialResults) {
  const Tensor x = test::rand_tensor({512, 1024}, 1), y = test::rand_tensor({512, 1024}, 2);
  Tensor ca = Tensor::empty(x.shape(), DType::F32), cb = Tensor::empty(y.shape(), DType::F32);
  ca.copy_from(x);
  cb.copy_from(y);
  // The CPU backend runs them in turn.
  ops::run_beside(Device::cpu(), [&] { side_piece(ca, x); }, [&] { main_piece(cb, y); });
  const Tensor gx = dev(x), gy = dev(y);
  Tensor a = dev(x), b = dev(y), sa = dev(x), sb = dev(y);
  side_piece(sa, gx);
  main_piece(sb, gy);
  for (int round = 0; round < 3; ++round) {
    const std::string what = "round " + std::to_string(round);
    a.copy_from(gx);
    b.copy_from(gy);
    ops::run_beside(gpu(), [&] { side_piece(a, gx); }, [&] { main_piece(b, gy); });
    // Read after the call: the main stream has joined the side one.
    test::expect_bitwise(host(a), host(sa), what + " side");
    test::expect_bitwise(host(b), host(sb), what + " main");
  }
  test::expect_elementwise_close(host(a), ca, "side against the CPU");
  test::expect_elementwise_close(host(b), cb, "main against the CPU");
}

TEST_F(CudaBeside, FreedBlocksWaitUntilBothPiecesAreDone) {
  const int64_t n = int64_t(1) << 18;  // 1 MiB blocks
  const Tensor x = dev(test::rand_tensor({1, n}, 3));
  void* first = nullptr;
  {
    Tensor t = Tensor::empty({1, n}, DType::F32, gpu());
    first = t.raw();
  }
  {
    Tensor t = Tensor::empty({1, n}, DType::F32, gpu());
    ASSERT_EQ(t.raw(), first) << "outside run_beside a freed block is taken again at once";
  }
  void *side_block = nullptr, *main_block = nullptr;
  ops::run_beside(
      gpu(),
      [&] {
        Tensor t = Tensor::empty({1, n}, DType::F32, gpu());
        t.copy_from(x);
        ops::axpy_inplace(t, x, 2.0f);  // still queued on the side stream when t is freed
        side_block = t.raw();
      },
      [&] {
        Tensor t = Tensor::empty({1, n}, DType::F32, gpu());
        main_block = t.raw();
        t.copy_from(x);
      });
  EXPECT_NE(main_block, side_block);
  // Both are back after the call.
  Tensor u = Tensor::empty({1, n}, DType::F32, gpu()), v = Tensor::empty({1, n}, DType::F32, gpu());
  EXPECT_TRUE((u.raw() == side_block && v.raw() == main_block) || (u.raw() == main_block && v.raw() == side_block))
      << "the held blocks went back to the pool";
}

TEST_F(CudaBeside, ReplayedFromAStepGraph) {
  const Tensor gx = dev(test::rand_tensor({256, 512}, 4)), gy = dev(test::rand_tensor({256, 512}, 5));
  Tensor sa = dev(host(gx)), sb = dev(host(gy));
  side_piece(sa, gx);
  main_piece(sb, gy);
  Tensor a = Tensor::empty(gx.shape(), DType::F32, gpu()), b = Tensor::empty(gy.shape(), DType::F32, gpu());
  auto step = [&] {
    a.copy_from(gx);
    b.copy_from(gy);
    ops::run_beside(gpu(), [&] { side_piece(a, gx); }, [&] { main_piece(b, gy); });
  };
  cuda::StepGraph graph(gpu());
  graph.warm_up(step);
  graph.capture(step);
  EXPECT_GE(graph.kernel_nodes(), 40);
  for (int r = 0; r < 3; ++r) {
    a.copy_from(gy);  // overwritten by the replay
    graph.replay();
    test::expect_bitwise(host(a), host(sa), "replay " + std::to_string(r) + " side");
    test::expect_bitwise(host(b), host(sb), "replay " + std::to_string(r) + " main");
  }
}

TEST_F(CudaBeside, AnErrorInAPieceReachesTheCaller) {
  const Tensor gx = dev(test::rand_tensor({1, 64}, 6));
  for (int which = 0; which < 2; ++which) {
    Tensor a = dev(host(gx));
    const std::string err = test::error_of([&] {
      ops::run_beside(
          gpu(),
          [&] {
            ops::axpy_inplace(a, gx, 1.0f);
            if (which == 0) fail("the side piece failed");
          },
          [&] { fail("the main piece failed"); });
    });
    EXPECT_NE(err.find(which == 0 ? "the side piece failed" : "the main piece failed"), std::string::npos) << err;
  }
  // A run_beside inside either piece is refused.
  for (int which = 0; which < 2; ++which) {
    const std::function<void()> nested = [] { ops::run_beside(gpu(), [] {}, [] {}); };
    const std::string err = test::error_of([&] {
      ops::run_beside(gpu(), which == 0 ? nested : [] {}, which == 1 ? nested : [] {});
    });
    EXPECT_NE(err.find("inside a run_beside"), std::string::npos) << err;
  }
  // The device goes on: both streams again, then one.
  Tensor a = dev(host(gx)), b = dev(host(gx));
  ops::run_beside(gpu(), [&] { ops::axpy_inplace(a, gx, 1.0f); }, [&] { ops::axpy_inplace(b, gx, 1.0f); });
  ops::add_inplace(a, b);
  Tensor want = dev(host(gx));
  ops::scale_inplace(want, 4.0f);
  test::expect_elementwise_close(host(a), host(want), "after the errors");
}

}  // namespace
}  // namespace dsi
