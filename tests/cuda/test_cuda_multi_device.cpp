// CUDA op tests, part 4: more than one GPU (skipped with fewer than two). Copies between devices
// (peer, contiguous and strided) and ops run concurrently from one host thread per device, as the
// tensor-parallel thread ranks do: each device's results match the CPU and each other bitwise.
#include <gtest/gtest.h>

#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "backends/cuda/device.h"
#include "core/dtype.h"
#include "cuda/cuda_test_util.h"
#include "ops/linear.h"
#include "ops/mla.h"
#include "ops/norm.h"
#include "ops/topk.h"

namespace dsi {
namespace {

using test::host;

class CudaMultiDevice : public test::CudaTest {
 protected:
  void SetUp() override {
    test::CudaTest::SetUp();
    if (IsSkipped()) return;
    if (cuda::device_count() < 2) GTEST_SKIP() << "needs two CUDA devices";
  }
};

TEST_F(CudaMultiDevice, CopiesBetweenDevices) {
  const Tensor h = test::rand_tensor({5, 7, 9}, 1);
  const Tensor d0 = to_device(h, Device::cuda(0));
  const Tensor d1 = to_device(d0, Device::cuda(1));  // peer copy
  EXPECT_EQ(d1.device(), Device::cuda(1));
  test::expect_bitwise(host(d1), h, "peer copy");
  // strided on device 0 -> strided on device 1
  Tensor dst = Tensor::empty({5, 9, 12}, DType::F32, Device::cuda(1)).narrow(1, 1, 7).narrow(2, 2, 9);
  dst.copy_from(d0);
  test::expect_bitwise(host(dst), h, "strided peer copy");
  Tensor dst2 = Tensor::empty({5, 3, 9}, DType::F32, Device::cuda(1));
  dst2.copy_from(to_device(h, Device::cuda(0)).narrow(1, 2, 3));
  test::expect_bitwise(host(dst2), h.narrow(1, 2, 3).contiguous(), "strided source peer copy");
}

struct Results {
  Tensor lin, norm, idx, out, lse;
};

TEST_F(CudaMultiDevice, OpsOnEachDeviceFromTheirOwnThreads) {
  const int64_t n = 9, in = 300, out_f = 257, rows = 3, heads = 16, dk = 576, topk = 300;
  const Tensor x = test::rand_tensor({n, in}, 2);
  LinearWeight w;
  w.weight = Tensor::empty({out_f, in}, DType::BF16);
  const std::vector<float> wv = test::random_floats(size_t(out_f * in), 3);
  for (size_t i = 0; i < wv.size(); ++i) w.weight.data<uint16_t>()[i] = f32_to_bf16(wv[i]);
  const Tensor nw = test::rand_tensor({in}, 4);
  const Tensor scores = test::rand_tensor({rows, 2049}, 5);
  const Tensor bounds = Tensor::from_i32({2049, 1000, 7}, {rows});
  const Tensor q = test::rand_tensor({rows, heads, dk}, 6), kv = test::rand_tensor({2049, dk}, 7);

  auto run = [&](Device d) {
    Results r;
    LinearWeight dw = w;
    dw.weight = to_device(w.weight, d);
    Tensor lin = Tensor::empty({n, out_f}, DType::F32, d), norm = Tensor::empty({n, in}, DType::F32, d);
    const Tensor dx = to_device(x, d);
    ops::linear(dx, dw, lin);
    ops::rms_norm(dx, to_device(nw, d), 1e-6f, norm);
    Tensor idx = Tensor::empty({rows, topk}, DType::I32, d);
    ops::topk(to_device(scores, d), to_device(bounds, d), int(topk), idx, nullptr);
    Tensor o = Tensor::empty({rows, heads, 512}, DType::F32, d), lse = Tensor::empty({rows, heads}, DType::F32, d);
    ops::sparse_mla(to_device(q, d), to_device(kv, d), idx, 0.07f, 512, o, lse);
    return Results{host(lin), host(norm), host(idx), host(o), host(lse)};
  };
  Results cpu = run(Device::cpu());
  std::vector<Results> got(2);
  std::vector<std::exception_ptr> err(2);
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] {
      try {
        for (int rep = 0; rep < 3; ++rep) got[size_t(i)] = run(Device::cuda(i));
      } catch (...) {
        err[size_t(i)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < 2; ++i) {
    if (err[size_t(i)]) std::rethrow_exception(err[size_t(i)]);
    const std::string what = "cuda:" + std::to_string(i);
    test::expect_nmse_close(got[size_t(i)].lin, cpu.lin, tol::kCudaGemmNmse, what + " linear");
    test::expect_nmse_close(got[size_t(i)].norm, cpu.norm, tol::kCudaReductionNmse, what + " rms_norm");
    test::expect_same_i32(got[size_t(i)].idx, cpu.idx, what + " topk");
    test::expect_nmse_close(got[size_t(i)].out, cpu.out, tol::kCudaReductionNmse, what + " sparse_mla");
    test::expect_nmse_close(got[size_t(i)].lse, cpu.lse, tol::kCudaReductionNmse, what + " lse");
  }
  test::expect_bitwise(got[1].lin, got[0].lin, "linear on both devices");
  test::expect_bitwise(got[1].out, got[0].out, "sparse_mla on both devices");
}

}  // namespace
}  // namespace dsi
