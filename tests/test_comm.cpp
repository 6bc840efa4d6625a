// LocalComm (thread ranks): every collective's result on groups of 1-4 members and on sub-groups
// used concurrently, F32 and I32, zero-sized tensors, views and aliasing, argument errors, bitwise
// reproducible member-order sums, and a stress run of mixed collectives. Expected values are computed
// here from the inputs, independently of the implementation.
#include <gtest/gtest.h>

#include <random>

#include "comm/local_comm.h"
#include "test_comm_util.h"
#include "test_util.h"  // expect_error, random_floats

namespace dsi::test {
namespace {

CommOptions checked(double timeout = 10.0) { return CommOptions{true, timeout}; }

void expect_no_errors(const std::vector<std::string>& errors) {
  for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

TEST(LocalComm, EveryCollectiveOnGroupsOfOneToFour) {
  for (int W = 1; W <= 4; ++W) {
    for (bool check : {false, true}) {
      LocalWorld world(W, CommOptions{check, 10.0});
      const Group g{"tp", 0, W};
      expect_no_errors(run_ranks(world, [&](LocalComm& c) {
        uint64_t seed = 1;
        for (CollectiveOp op : kAllOps)
          for (DType dt : {DType::F32, DType::I32}) {
            if (sums(op) && dt != DType::F32) continue;
            for (int64_t rows : {0, 1, 3})
              for (int root = 0; root < (op == CollectiveOp::kBroadcast ? W : 1); ++root)
                EXPECT_EQ(check_collective(c, g, op, dt, rows, 5, seed++, root), "");
          }
      }));
    }
  }
}

TEST(LocalComm, SubGroupsUsedConcurrently) {
  // World 4: halves dcp0 = {0, 1} and dcp1 = {2, 3} run different collectives at the same time,
  // interleaved with the whole group, a group of three that leaves rank 0 out, and singletons.
  LocalWorld world(4, checked());
  const Group tp{"tp", 0, 4}, trio{"trio", 1, 3};
  expect_no_errors(run_ranks(world, [&](LocalComm& c) {
    const int r = c.rank();
    const Group half{r < 2 ? "dcp0" : "dcp1", r < 2 ? 0 : 2, 2};
    const Group self{"self", r, 1};
    for (int rep = 0; rep < 20; ++rep) {
      const uint64_t seed = 100 + uint64_t(rep);
      // The halves issue different operations in the same step.
      const CollectiveOp mine = kAllOps[size_t((rep + (r < 2 ? 0 : 3)) % 6)];
      const DType dt = sums(mine) ? DType::F32 : (rep % 2 ? DType::I32 : DType::F32);
      EXPECT_EQ(check_collective(c, half, mine, dt, rep % 4, 3, seed, rep % 2), "");
      EXPECT_EQ(check_collective(c, tp, CollectiveOp::kAllReduce, DType::F32, 2, 7, seed + 1000), "");
      if (r >= 1) {
        EXPECT_EQ(check_collective(c, trio, kAllOps[size_t(rep % 6)], DType::F32, 2, 3, seed, 2), "");
      }
      EXPECT_EQ(check_collective(c, self, kAllOps[size_t((rep + 1) % 6)], DType::F32, 1, 4, seed), "");
    }
  }));
}

TEST(LocalComm, AnyDtypeMovesUnchanged) {
  // all_gather / all_to_all / broadcast carry raw elements: BF16 and U8 included.
  LocalWorld world(3, checked());
  const Group g{"tp", 0, 3};
  expect_no_errors(run_ranks(world, [&](LocalComm& c) {
    for (DType dt : {DType::BF16, DType::U8, DType::I64}) {
      Tensor in = Tensor::empty({2, 3}, dt);
      for (size_t b = 0; b < in.nbytes(); ++b) static_cast<uint8_t*>(in.raw())[b] = uint8_t(c.rank() * 50 + int(b));
      Tensor out = Tensor::empty({6, 3}, dt);
      c.all_gather(g, in, out);
      for (int i = 0; i < 3; ++i)
        for (size_t b = 0; b < in.nbytes(); ++b)
          EXPECT_EQ(static_cast<uint8_t*>(out.raw())[size_t(i) * in.nbytes() + b], uint8_t(i * 50 + int(b)));
      Tensor root_val = in.contiguous();
      c.broadcast(g, root_val, 1);
      for (size_t b = 0; b < in.nbytes(); ++b) EXPECT_EQ(static_cast<uint8_t*>(root_val.raw())[b], uint8_t(50 + int(b)));
    }
  }));
}

TEST(LocalComm, SumsInMemberOrderAreBitwiseReproducible) {
  // Member values 1e8, 1, -1e8, 1: in member order ((1e8 + 1) - 1e8) + 1 = 1 in fp32 (1e8 + 1
  // rounds to 1e8); another order would give 0 or 2.
  const float vals[4] = {1e8f, 1.0f, -1e8f, 1.0f};
  LocalWorld world(4, checked());
  const Group g{"tp", 0, 4};
  expect_no_errors(run_ranks(world, [&](LocalComm& c) {
    Tensor x = Tensor::from_f32({vals[c.rank()], vals[c.rank()]}, {2});
    c.all_reduce(g, x);
    EXPECT_EQ(x.f32()[0], 1.0f);
    Tensor in = Tensor::from_f32(std::vector<float>(8, vals[c.rank()]), {8});
    Tensor out = Tensor::zeros({2}, DType::F32);
    c.reduce_scatter(g, in, out);
    EXPECT_EQ(out.f32()[1], 1.0f);
  }));
  // Random data, fresh worlds: every run and every rank gets the same bits.
  std::vector<Tensor> results;
  for (int run = 0; run < 3; ++run) {
    LocalWorld w(4, checked());
    std::vector<Tensor> per_rank(4);
    expect_no_errors(run_ranks(w, [&](LocalComm& c) {
      Tensor t = Tensor::from_f32(random_floats(4096, 7 + uint64_t(c.rank())), {64, 64});
      for (int i = 0; i < 3; ++i) c.all_reduce(g, t);
      per_rank[size_t(c.rank())] = t;
    }));
    for (const Tensor& t : per_rank) results.push_back(t);
  }
  for (const Tensor& t : results) EXPECT_TRUE(bitwise_equal(t, results[0]));
}

TEST(LocalComm, ViewsAndAliasing) {
  LocalWorld world(2, checked());
  const Group g{"tp", 0, 2};
  expect_no_errors(run_ranks(world, [&](LocalComm& c) {
    const int r = c.rank();
    // Non-contiguous input and output: column slices of wider tensors.
    Tensor wide = make_input(DType::F32, {3, 8}, r, 1);
    Tensor in = wide.narrow(1, 2, 4);
    Tensor out_wide = Tensor::zeros({6, 10}, DType::F32);
    Tensor out = out_wide.narrow(1, 3, 4);
    c.all_gather(g, in, out);
    for (int i = 0; i < 2; ++i) {
      Tensor src = make_input(DType::F32, {3, 8}, i, 1);
      for (int row = 0; row < 3; ++row)
        for (int col = 0; col < 4; ++col)
          EXPECT_EQ(out_wide.f32()[(i * 3 + row) * 10 + 3 + col], src.f32()[row * 8 + 2 + col]);
    }
    for (int row = 0; row < 6; ++row) EXPECT_EQ(out_wide.f32()[row * 10], 0.0f);  // untouched
    // In-place all_reduce on a strided view: only the viewed elements change.
    Tensor base = Tensor::from_f32(std::vector<float>(12, float(r + 1)), {3, 4});
    Tensor view = base.narrow(1, 1, 2);
    c.all_reduce(g, view);
    for (int row = 0; row < 3; ++row)
      for (int col = 0; col < 4; ++col)
        EXPECT_EQ(base.f32()[row * 4 + col], (col == 1 || col == 2) ? 3.0f : float(r + 1));
    // reduce_scatter whose output is this member's own chunk of the input (others still read it).
    Tensor buf = make_input(DType::F32, {4, 3}, r, 9);
    Tensor own = buf.slice(r * 2, r * 2 + 2);
    c.reduce_scatter(g, buf, own);
    const std::vector<float> want = member_sum(g, {4, 3}, 9, r * 6, 6);
    for (int e = 0; e < 6; ++e) EXPECT_EQ(own.f32()[e], want[size_t(e)]);
    // Broadcast into a strided view.
    Tensor bbase = Tensor::from_f32(std::vector<float>(8, float(10 * r)), {2, 4});
    Tensor bview = bbase.narrow(1, 0, 2);
    c.broadcast(g, bview, 1);
    EXPECT_EQ(bbase.f32()[0], 10.0f);
    EXPECT_EQ(bbase.f32()[3], float(10 * r));
  }));
}

TEST(LocalComm, ArgumentErrorsFailEveryMember) {
  LocalWorld world(4, CommOptions{false, 5.0});
  // Rank 3 names a group it is not in: only it fails, at once; the others complete.
  auto errors = run_ranks(world, [&](LocalComm& c) {
    Tensor x = Tensor::from_f32({1.0f}, {1});
    c.all_reduce(Group{"trio", 0, 3}, x);
    EXPECT_EQ(x.f32()[0], 3.0f);
  });
  EXPECT_NE(errors[3].find("rank 3: all_reduce on group trio (ranks 0..2): rank 3 is not a member"), std::string::npos)
      << errors[3];
  for (int r = 0; r < 3; ++r) EXPECT_EQ(errors[size_t(r)], "");
  expect_error([&] {
    Tensor x = Tensor::from_f32({1.0f}, {1});
    world.comm(1).all_reduce(Group{"bad", 2, 3}, x);
  }, {"group bad", "not a group of the world of 4 ranks"});

  // One member's output has the wrong shape: every member fails, none hangs.
  const Group g{"tp", 0, 4};
  errors = run_ranks(world, [&](LocalComm& c) {
    Tensor in = Tensor::zeros({2, 4}, DType::F32);
    Tensor out = Tensor::zeros({c.rank() == 2 ? 6 : 8, 4}, DType::F32);
    c.all_gather(g, in, out);
  });
  for (int r = 0; r < 4; ++r)
    EXPECT_NE(errors[size_t(r)].find(fmt::format("rank {}: all_gather on group tp (call #1, F32[2, 4]) failed: rank 2 "
                                                 "passed invalid arguments: all_gather: output is F32[6, 4], "
                                                 "expected F32[8, 4]", r)),
              std::string::npos)
        << errors[size_t(r)];
  // Sums need F32; the split dimension must divide by the group size; the root must exist.
  errors = run_ranks(world, [&](LocalComm& c) {
    Tensor x = Tensor::from_i32({1, 2}, {2});
    c.all_reduce(g, x);
  });
  for (const auto& e : errors) EXPECT_NE(e.find("all_reduce sums F32 tensors only, got I32[2]"), std::string::npos) << e;
  errors = run_ranks(world, [&](LocalComm& c) {
    Tensor in = Tensor::zeros({6, 2}, DType::F32), out = Tensor::zeros({1, 2}, DType::F32);
    c.reduce_scatter(g, in, out);
  });
  for (const auto& e : errors) EXPECT_NE(e.find("dimension 0 is not a multiple of the group size 4"), std::string::npos) << e;
  errors = run_ranks(world, [&](LocalComm& c) {
    Tensor x = Tensor::zeros({2}, DType::F32);
    c.broadcast(g, x, 4);
  });
  for (const auto& e : errors) EXPECT_NE(e.find("broadcast root member 4 is outside the group of 4"), std::string::npos) << e;
  // The group is still in step afterwards.
  expect_no_errors(run_ranks(world, [&](LocalComm& c) {
    EXPECT_EQ(check_collective(c, g, CollectiveOp::kAllReduce, DType::F32, 3, 3, 5), "");
  }));
}

TEST(LocalComm, StressMixedCollectives) {
  // A few thousand collectives on 4 ranks: each step picks (from a seed every rank shares) a layout
  // (whole group, halves, a trio, singletons), an operation per group, a dtype and random sizes.
  constexpr int kSteps = 3000;
  LocalWorld world(4, checked());
  std::vector<int> checked_calls(4, 0);
  expect_no_errors(run_ranks(world, [&](LocalComm& c) {
    const int r = c.rank();
    int bad = 0;
    for (int step = 0; step < kSteps; ++step) {
      std::mt19937_64 rng(uint64_t(step) * 7919 + 17);
      const int layout = int(rng() % 4);
      Group g;
      if (layout == 0) g = Group{"tp", 0, 4};
      if (layout == 1) g = r < 2 ? Group{"dcp0", 0, 2} : Group{"dcp1", 2, 2};
      if (layout == 2) {
        if (r == 0) continue;
        g = Group{"trio", 1, 3};
      }
      if (layout == 3) g = Group{"self", r, 1};
      // Draw per-group choices from a stream seeded by the group, so members agree.
      std::mt19937_64 grng(uint64_t(step) * 131 + uint64_t(g.first) * 7 + uint64_t(g.size));
      const CollectiveOp op = kAllOps[grng() % 6];
      const DType dt = sums(op) || grng() % 2 ? DType::F32 : DType::I32;
      const int64_t rows = int64_t(grng() % 6), cols = 1 + int64_t(grng() % 17);
      const int root = int(grng() % uint64_t(g.size));
      const std::string e = check_collective(c, g, op, dt, rows, cols, uint64_t(step), root);
      if (!e.empty() && bad++ < 5) ADD_FAILURE() << "step " << step << ": " << e;
      ++checked_calls[size_t(r)];
    }
    EXPECT_EQ(bad, 0);
  }));
  for (int n : checked_calls) EXPECT_GT(n, kSteps / 2);
}

}  // namespace
}  // namespace dsi::test
