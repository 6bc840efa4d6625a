// Helpers for the communicator tests (thread ranks and MPI): run a function on N thread ranks and
// collect each rank's error; deterministic inputs per rank; each collective's expected result
// computed directly from the inputs (independently of the implementations).
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "comm/local_comm.h"

namespace dsi::test {

// Runs fn(comm) for every rank of `world` on its own thread and joins them. Returns each rank's
// error message ("" when fn returned normally); a non-dsi exception is reported as such.
inline std::vector<std::string> run_ranks(LocalWorld& world, const std::function<void(LocalComm&)>& fn) {
  std::vector<std::string> errors(size_t(world.size()));
  std::vector<std::thread> threads;
  for (int r = 0; r < world.size(); ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(world.comm(r));
      } catch (const Error& e) {
        errors[size_t(r)] = e.what();
      } catch (const std::exception& e) {
        errors[size_t(r)] = std::string("non-dsi exception: ") + e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

// Seconds since `t0`.
inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

inline bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         (a.nbytes() == 0 || std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0);
}

// Deterministic floats in [-1, 1) (splitmix64), so the MPI test needs nothing else from the suite.
inline std::vector<float> comm_test_floats(size_t n, uint64_t seed) {
  std::vector<float> v(n);
  uint64_t x = seed;
  for (auto& f : v) {
    uint64_t z = (x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    f = float(int64_t(z >> 40) - (int64_t(1) << 23)) / float(int64_t(1) << 23);
  }
  return v;
}

// Rank r's input for a call: deterministic in (rank, seed); F32 random, I32 distinct per rank.
inline Tensor make_input(DType dt, const Shape& shape, int rank, uint64_t seed) {
  const int64_t n = shape_numel(shape);
  if (dt == DType::F32) return Tensor::from_f32(comm_test_floats(size_t(n), seed * 131 + uint64_t(rank)), shape);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = int32_t(rank * 1000003 + i * 7 + int64_t(seed % 1000));
  return Tensor::from_i32(v, shape);
}

// The address of element `elem` of a contiguous tensor.
inline const char* bytes_at(const Tensor& t, int64_t elem) {
  return static_cast<const char*>(t.raw()) + elem * int64_t(dtype_size(t.dtype()));
}

// sum over members i, in member order, of input_i's flattened elements [begin, begin + len).
inline std::vector<float> member_sum(const Group& g, const Shape& shape, uint64_t seed, int64_t begin, int64_t len) {
  std::vector<float> acc(size_t(len), 0.0f);
  for (int i = 0; i < g.size; ++i) {
    Tensor in = make_input(DType::F32, shape, g.first + i, seed);
    for (int64_t e = 0; e < len; ++e)
      acc[size_t(e)] = i == 0 ? in.f32()[begin + e] : acc[size_t(e)] + in.f32()[begin + e];
  }
  return acc;
}

// Runs `op` as member g.member(c.rank()) with `rows` rows per member (F32 or I32 data of `cols`
// columns) and checks the result bitwise against the expectation. Returns "" or what differed.
inline std::string check_collective(Communicator& c, const Group& g, CollectiveOp op, DType dt, int64_t rows,
                             int64_t cols, uint64_t seed, int root = 0) {
  const int G = g.size, me = g.member(c.rank());
  const int64_t es = int64_t(dtype_size(dt));
  Tensor expect, got;
  switch (op) {
    case CollectiveOp::kAllGather: {
      const Shape s{rows, cols};
      Tensor in = make_input(dt, s, c.rank(), seed);
      got = Tensor::zeros({G * rows, cols}, dt);
      c.all_gather(g, in, got);
      expect = Tensor::zeros({G * rows, cols}, dt);
      for (int i = 0; i < G; ++i) {
        Tensor in_i = make_input(dt, s, g.first + i, seed);
        if (in_i.nbytes()) std::memcpy(static_cast<char*>(expect.raw()) + i * in_i.nbytes(), in_i.raw(), in_i.nbytes());
      }
      break;
    }
    case CollectiveOp::kReduceScatter: {
      const Shape s{G * rows, cols};
      Tensor in = make_input(DType::F32, s, c.rank(), seed);
      got = Tensor::zeros({rows, cols}, DType::F32);
      c.reduce_scatter(g, in, got);
      expect = Tensor::from_f32(member_sum(g, s, seed, me * rows * cols, rows * cols), {rows, cols});
      break;
    }
    case CollectiveOp::kAllReduce: {
      const Shape s{rows, cols};
      got = make_input(DType::F32, s, c.rank(), seed);
      c.all_reduce(g, got);
      expect = Tensor::from_f32(member_sum(g, s, seed, 0, rows * cols), s);
      break;
    }
    case CollectiveOp::kAllToAll: {
      const Shape s{G * rows, cols};
      Tensor in = make_input(dt, s, c.rank(), seed);
      got = Tensor::zeros(s, dt);
      c.all_to_all(g, in, got);
      expect = Tensor::zeros(s, dt);
      const int64_t chunk = rows * cols;
      for (int i = 0; i < G; ++i) {
        Tensor in_i = make_input(dt, s, g.first + i, seed);
        if (chunk) std::memcpy(static_cast<char*>(expect.raw()) + i * chunk * es, bytes_at(in_i, me * chunk), size_t(chunk * es));
      }
      break;
    }
    case CollectiveOp::kBroadcast: {
      const Shape s{rows, cols};
      got = make_input(dt, s, c.rank(), seed);
      c.broadcast(g, got, root);
      expect = make_input(dt, s, g.first + root, seed);
      break;
    }
    case CollectiveOp::kBarrier:
      c.barrier(g);
      return "";
  }
  if (bitwise_equal(got, expect)) return "";
  return fmt::format("rank {}: {} on group {} ({} rows of {} {}) differs from the expected result",
                     c.rank(), collective_name(op), g.name, rows, cols, dtype_name(dt));
}

inline constexpr CollectiveOp kAllOps[] = {CollectiveOp::kAllGather, CollectiveOp::kReduceScatter,
                                    CollectiveOp::kAllReduce, CollectiveOp::kAllToAll,
                                    CollectiveOp::kBroadcast, CollectiveOp::kBarrier};

inline bool sums(CollectiveOp op) { return op == CollectiveOp::kReduceScatter || op == CollectiveOp::kAllReduce; }

}  // namespace dsi::test
