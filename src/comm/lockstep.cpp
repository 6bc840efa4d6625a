// Collective descriptors, argument checks, member-order sums and shared messages; see lockstep.h.
#include "comm/lockstep.h"

#include <algorithm>
#include <cstring>

namespace dsi {

const char* collective_name(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::kAllGather: return "all_gather";
    case CollectiveOp::kReduceScatter: return "reduce_scatter";
    case CollectiveOp::kAllReduce: return "all_reduce";
    case CollectiveOp::kAllToAll: return "all_to_all";
    case CollectiveOp::kBroadcast: return "broadcast";
    case CollectiveOp::kBarrier: return "barrier";
  }
  return "unknown collective";
}

bool CollectiveDesc::same_call(const CollectiveDesc& o) const {
  CollectiveDesc a = *this, b = o;
  a.world_rank = b.world_rank = -1;
  a.invalid = b.invalid = 0;
  return std::memcmp(&a, &b, sizeof(CollectiveDesc)) == 0;  // no padding: see the static_assert
}

CollectiveDesc make_desc(CollectiveOp op, const Group& g, int world_rank, uint64_t call,
                         const Tensor* main, int root) {
  CollectiveDesc d;
  d.call = call;
  d.world_rank = world_rank;
  d.group_first = g.first;
  d.group_size = g.size;
  d.root = op == CollectiveOp::kBroadcast ? root : -1;
  d.op = uint8_t(op);
  if (main != nullptr) {
    d.dtype = uint8_t(main->dtype());
    // A tensor with more dimensions is rejected by check_collective_args; record what fits.
    d.ndim = uint8_t(std::min(main->ndim(), kMaxCollectiveDims));
    for (int i = 0; i < int(d.ndim); ++i) d.shape[i] = main->dim(i);
  }
  return d;
}

namespace {

// [G * rows, rest...] or [rows / G, rest...] from in's shape.
Shape with_dim0(const Shape& s, int64_t dim0) {
  Shape r = s;
  r[0] = dim0;
  return r;
}

std::string check_host(const Tensor& t, const char* what) {
  if (!t.device().is_cpu()) return fmt::format("{} is on {}: host tensors only", what, t.device().str());
  if (t.numel() > 0 && !t.defined()) return fmt::format("{} {} has no data", what, t.desc());
  if (t.ndim() > kMaxCollectiveDims)
    return fmt::format("{} {} has more than {} dimensions", what, t.desc(), kMaxCollectiveDims);
  return "";
}

}  // namespace

std::string check_collective_args(CollectiveOp op, const Group& g, const Tensor* in,
                                  const Tensor* out, int root) {
  const char* name = collective_name(op);
  const int64_t G = g.size;
  for (auto [t, what] : {std::pair{in, "input"}, std::pair{out, "output"}}) {
    if (t == nullptr) continue;
    std::string e = check_host(*t, what);
    if (!e.empty()) return e;
  }
  const bool reduces = op == CollectiveOp::kReduceScatter || op == CollectiveOp::kAllReduce;
  if (reduces && in->dtype() != DType::F32)
    return fmt::format("{} sums F32 tensors only, got {}", name, in->desc());
  switch (op) {
    case CollectiveOp::kAllGather:
    case CollectiveOp::kReduceScatter:
    case CollectiveOp::kAllToAll: {
      if (in->ndim() < 1) return fmt::format("{} needs an input with a dimension 0, got {}", name, in->desc());
      Shape want = in->shape();
      if (op == CollectiveOp::kAllGather) {
        want = with_dim0(in->shape(), G * in->dim(0));
      } else if (in->dim(0) % G != 0) {
        return fmt::format("{}: input {} dimension 0 is not a multiple of the group size {}", name,
                           in->desc(), G);
      } else if (op == CollectiveOp::kReduceScatter) {
        want = with_dim0(in->shape(), in->dim(0) / G);
      }
      if (out->dtype() != in->dtype() || out->shape() != want)
        return fmt::format("{}: output is {}, expected {}{} for input {} on a group of {}", name,
                           out->desc(), dtype_name(in->dtype()), shape_str(want), in->desc(), G);
      return "";
    }
    case CollectiveOp::kBroadcast:
      if (root < 0 || root >= G)
        return fmt::format("broadcast root member {} is outside the group of {}", root, G);
      return "";
    case CollectiveOp::kAllReduce:
    case CollectiveOp::kBarrier: return "";
  }
  return "unknown collective";
}

void check_group(const Group& g, int world_rank, int world_size, CollectiveOp op) {
  DSI_CHECK(g.size >= 1 && g.first >= 0 && int64_t(g.first) + g.size <= world_size,
            "rank {}: {} on group {} (ranks {}..{}): not a group of the world of {} ranks", world_rank,
            collective_name(op), g.name, g.first, int64_t(g.first) + g.size - 1, world_size);
  DSI_CHECK(g.contains(world_rank), "rank {}: {} on group {} (ranks {}..{}): rank {} is not a member",
            world_rank, collective_name(op), g.name, g.first, g.first + g.size - 1, world_rank);
}

std::string describe(const CollectiveDesc& d) {
  const auto op = CollectiveOp(d.op);
  std::string s = collective_name(op);
  if (op == CollectiveOp::kBarrier) return s;
  Shape shape(d.shape, d.shape + d.ndim);
  s += fmt::format(" {}{}", dtype_name(DType(d.dtype)), shape_str(shape));
  if (op == CollectiveOp::kBroadcast) s += fmt::format(" from member {}", d.root);
  return s;
}

std::string call_context(const Group& g, const CollectiveDesc& d) {
  const auto op = CollectiveOp(d.op);
  std::string what = fmt::format("call #{}", d.call);
  if (op != CollectiveOp::kBarrier) {
    Shape shape(d.shape, d.shape + d.ndim);
    what += fmt::format(", {}{}", dtype_name(DType(d.dtype)), shape_str(shape));
  }
  return fmt::format("rank {}: {} on group {} ({})", d.world_rank, collective_name(op), g.name, what);
}

std::string find_divergence(const std::vector<CollectiveDesc>& members) {
  if (members.empty()) return "";
  const CollectiveDesc& a = members[0];
  for (size_t i = 1; i < members.size(); ++i) {
    const CollectiveDesc& b = members[i];
    if (a.same_call(b)) continue;
    if (a.call != b.call)
      return fmt::format("at call #{}: rank {} issued {} (call #{}), rank {} issued {} (call #{})",
                         a.call, a.world_rank, describe(a), a.call, b.world_rank, describe(b), b.call);
    return fmt::format("at call #{}: rank {} issued {}, rank {} issued {}", a.call, a.world_rank,
                       describe(a), b.world_rank, describe(b));
  }
  return "";
}

std::string lockstep_violation(const Group& g, const std::string& divergence) {
  return fmt::format("lockstep violation on group {} {}", g.name, divergence);
}

std::string rank_list(const std::vector<int>& world_ranks) {
  std::string s = world_ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < world_ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(world_ranks[i]);
  return s;
}

std::string seconds_str(double s) { return fmt::format("{:g}", s); }

void sum_in_member_order(float* out, const float* const* parts, int n_parts, int64_t n) {
  if (n == 0) return;
  std::memcpy(out, parts[0], size_t(n) * sizeof(float));
  for (int p = 1; p < n_parts; ++p) {
    const float* src = parts[p];
    for (int64_t e = 0; e < n; ++e) out[e] += src[e];
  }
}

void compare_descriptors(const Group& g, const CollectiveDesc& mine, const std::string& ctx,
                         const std::string& invalid, const std::function<void(const Tensor&, Tensor&)>& gather) {
  Tensor me = Tensor::empty({1, int64_t(sizeof(CollectiveDesc))}, DType::U8);
  std::memcpy(me.raw(), &mine, sizeof(CollectiveDesc));
  Tensor all = Tensor::empty({int64_t(g.size), int64_t(sizeof(CollectiveDesc))}, DType::U8);
  gather(me, all);
  std::vector<CollectiveDesc> descs(size_t(g.size));
  std::memcpy(descs.data(), all.raw(), all.nbytes());
  if (std::string div = find_divergence(descs); !div.empty()) throw Error(lockstep_violation(g, div));
  for (const CollectiveDesc& d : descs) {
    if (!d.invalid) continue;
    if (d.world_rank == mine.world_rank) fail("{}: {}", ctx, invalid);
    fail("{} failed: rank {} passed invalid arguments for {}", ctx, d.world_rank, describe(d));
  }
}

}  // namespace dsi
