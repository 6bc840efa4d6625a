// GPU ranks over peer-to-peer one-shot kernels; see peer_comm.h.
#include "comm/peer_comm.h"

#include <algorithm>
#include <map>
#include <utility>

#include "backends/cuda/comm/peer_collectives.h"
#include "comm/device_tensors.h"
#include "comm/lockstep.h"

namespace dsi {

struct PeerComm::State {
  Communicator* host = nullptr;
  PeerSetup setup;
  int rank = 0, size = 1;
  std::map<std::pair<int, int>, std::unique_ptr<cuda::PeerGroup>> groups;  // by (first, size)
  std::map<std::pair<int, int>, uint64_t> calls;  // per group: collectives issued so far
  std::string broken;                             // set by a failure: every later call fails at once

  struct Call {
    const Group* g = nullptr;
    int me = 0;
    std::string ctx;                   // "rank 2: all_reduce on group tp (call #7, F32[4, 128])"
    cuda::PeerGroup* pg = nullptr;     // null for barriers and groups of one
  };

  Device device() const { return Device::cuda(setup.device); }

  // Runs a step of the host group; its failure breaks this communicator.
  template <typename F>
  void host_step(const std::string& ctx, const char* what, F&& step) {
    try {
      step();
    } catch (const std::exception& e) {
      if (broken.empty()) broken = fmt::format("{} failed {}: {}", ctx, what, e.what());
      throw Error(broken);
    }
  }

  // The first failure of any group this rank's collectives saw (timeouts and aborts raise a host
  // word, so this never waits for the device).
  void throw_if_failed(const std::string& ctx) {
    if (!broken.empty()) fail("{} failed: this rank's peer communicator is unusable after: {}", ctx, broken);
    for (auto& [key, pg] : groups) {
      if (!pg->failed()) continue;
      try {
        pg->check();
        broken = fmt::format("a collective of group ranks {}..{} failed", key.first, key.first + key.second - 1);
      } catch (const std::exception& e) {
        broken = e.what();
      }
      fail("{} failed: {}", ctx, broken);
    }
  }

  cuda::PeerGroup* peer_group(const Group& g, const std::string& ctx) {
    if (g.size == 1) return nullptr;
    auto it = groups.find({g.first, g.size});
    if (it != groups.end()) return it->second.get();
    std::unique_ptr<cuda::PeerGroup> pg;
    host_step(ctx, "making the peer group", [&] {
      pg = cuda::PeerGroup::create(*host, g, setup.device, setup.slot_bytes, host->options().timeout_seconds);
    });
    return (groups[{g.first, g.size}] = std::move(pg)).get();
  }

  // Checks the call and, in check mode, compares the members' descriptors over the host group
  // before anything is enqueued; then finds (or makes) the group's peer group.
  Call begin(CollectiveOp op, const Group& g, const Tensor* main, const Tensor* out, int root) {
    check_group(g, rank, size, op);
    Call c;
    c.g = &g;
    c.me = g.member(rank);
    std::string invalid;
    const Device here = device();
    for (auto [t, what] : {std::pair{main, "input"}, std::pair{out, "output"}})
      if (t != nullptr && invalid.empty() && !(t->device() == here))
        invalid = fmt::format("{} {} is on {}: this rank's peer communicator works on {}", what, t->desc(),
                              t->device().str(), here.str());
    if (invalid.empty() && main != nullptr) {
      Tensor a_main = shape_alias(*main), a_out;
      if (out != nullptr) a_out = shape_alias(*out);
      invalid = check_collective_args(op, g, &a_main, out ? &a_out : nullptr, root);
    }
    CollectiveDesc d = make_desc(op, g, rank, ++calls[{g.first, g.size}], main, root);
    d.invalid = invalid.empty() ? 0 : 1;
    c.ctx = call_context(g, d);
    throw_if_failed(c.ctx);
    if (host->options().check_lockstep) {
      compare_descriptors(g, d, c.ctx, invalid, [&](const Tensor& mine, Tensor& all) {
        host_step(c.ctx, "exchanging the lockstep descriptors", [&] { host->all_gather(g, mine, all); });
      });
    } else if (!invalid.empty()) {
      fail("{}: {}", c.ctx, invalid);
    }
    if (op != CollectiveOp::kBarrier) c.pg = peer_group(g, c.ctx);
    return c;
  }

  // Splits `bytes` into slot-sized pieces: fn(offset, length) for each (every member alike).
  template <typename F>
  void pieces(size_t bytes, size_t align, F&& fn) {
    const size_t step = std::max<size_t>(align, setup.slot_bytes / align * align);
    for (size_t off = 0; off < bytes; off += step) fn(off, std::min(step, bytes - off));
  }
};

namespace {

// Runs move(dst) with dst the output's bytes: out's own when contiguous and clear of `in`, else a
// staging tensor copied into out afterwards.
template <typename F>
void into_output(Tensor& out, const Tensor& in, F&& move) {
  const bool direct = out.is_contiguous() && !overlaps(out, in);
  Tensor out_c = direct ? out : Tensor::empty(out.shape(), out.dtype(), out.device());
  move(static_cast<char*>(out_c.raw()));
  if (!direct) out.copy_from(out_c);
}

// Runs work(data) on a contiguous copy of inout (inout itself when contiguous), then copies the
// result back when `changed` says inout was written.
template <typename F>
void in_place(Tensor& inout, bool changed, F&& work) {
  const bool direct = inout.is_contiguous();
  Tensor buf = direct ? inout : device_contiguous(inout);
  work(static_cast<char*>(buf.raw()), buf.nbytes());
  if (!direct && changed) inout.copy_from(buf);
}

}  // namespace

PeerComm::PeerComm(std::unique_ptr<State> s) : s_(std::move(s)) {}
PeerComm::~PeerComm() = default;

std::unique_ptr<PeerComm> PeerComm::create(Communicator& host, PeerSetup setup) {
  auto s = std::make_unique<State>();
  s->host = &host;
  s->rank = host.rank();
  s->size = host.world_size();
  s->setup = std::move(setup);
  DSI_CHECK(s->setup.slot_bytes >= 16, "peer communicator: slots of {} bytes", s->setup.slot_bytes);
  std::vector<Group> groups{Group{"world", 0, s->size}};
  groups.insert(groups.end(), s->setup.groups.begin(), s->setup.groups.end());
  for (const Group& g : groups) {
    DSI_CHECK(g.size >= 1 && g.first >= 0 && int64_t(g.first) + g.size <= s->size && g.contains(s->rank),
              "rank {}: peer group {} (ranks {}..{}): not a group of the world of {} ranks containing rank {}",
              s->rank, g.name, g.first, int64_t(g.first) + g.size - 1, s->size, s->rank);
    s->peer_group(g, fmt::format("rank {}: making the peer group of group {} on {}", s->rank, g.name,
                                 s->device().str()));
  }
  return std::unique_ptr<PeerComm>(new PeerComm(std::move(s)));
}

int PeerComm::rank() const { return s_->rank; }
int PeerComm::world_size() const { return s_->size; }
const CommOptions& PeerComm::options() const { return s_->host->options(); }
int PeerComm::device() const { return s_->setup.device; }
Communicator& PeerComm::host() const { return *s_->host; }

void PeerComm::check_async() { s_->throw_if_failed(fmt::format("rank {}: an earlier collective", s_->rank)); }

void PeerComm::all_gather(const Group& g, const Tensor& in, Tensor& out) {
  State& s = *s_;
  const State::Call c = s.begin(CollectiveOp::kAllGather, g, &in, &out, -1);
  if (in.numel() == 0) return;
  const Tensor in_c = device_contiguous(in);
  if (g.size == 1) return copy_device(out, in_c);
  const size_t n = in_c.nbytes();
  const char* src = static_cast<const char*>(in_c.raw());
  into_output(out, in_c, [&](char* dst) {
    s.pieces(n, 16, [&](size_t off, size_t len) { c.pg->all_gather(src + off, len, dst + off, nullptr, n); });
  });
}

void PeerComm::reduce_scatter(const Group& g, const Tensor& in, Tensor& out) {
  State& s = *s_;
  const State::Call c = s.begin(CollectiveOp::kReduceScatter, g, &in, &out, -1);
  if (out.numel() == 0) return;
  const Tensor in_c = device_contiguous(in);
  const int64_t m = out.numel();
  if (g.size == 1) return copy_device(out, in_c);
  const float* src = static_cast<const float*>(in_c.raw());
  into_output(out, in_c, [&](char* bytes) {
    float* dst = reinterpret_cast<float*>(bytes);
    s.pieces(size_t(m) * 4, 16, [&](size_t off, size_t len) {
      c.pg->reduce_scatter(src + off / 4, int64_t(len / 4), dst + off / 4, nullptr, m);
    });
  });
}

void PeerComm::all_reduce(const Group& g, Tensor& inout) {
  State& s = *s_;
  const State::Call c = s.begin(CollectiveOp::kAllReduce, g, &inout, nullptr, -1);
  if (inout.numel() == 0 || g.size == 1) return;
  in_place(inout, /*changed=*/true, [&](char* bytes, size_t n) {
    float* data = reinterpret_cast<float*>(bytes);
    s.pieces(n, 16, [&](size_t off, size_t len) { c.pg->all_reduce(data + off / 4, int64_t(len / 4), nullptr); });
  });
}

void PeerComm::all_to_all(const Group& g, const Tensor& in, Tensor& out) {
  State& s = *s_;
  const State::Call c = s.begin(CollectiveOp::kAllToAll, g, &in, &out, -1);
  if (in.numel() == 0) return;
  const Tensor in_c = device_contiguous(in);
  if (g.size == 1) return copy_device(out, in_c);
  const size_t chunk = in_c.nbytes() / size_t(g.size);
  const char* src = static_cast<const char*>(in_c.raw());
  into_output(out, in_c, [&](char* dst) {
    s.pieces(chunk, 16, [&](size_t off, size_t len) { c.pg->all_to_all(src + off, len, dst + off, nullptr, chunk, chunk); });
  });
}

void PeerComm::broadcast(const Group& g, Tensor& inout, int root_member) {
  State& s = *s_;
  const State::Call c = s.begin(CollectiveOp::kBroadcast, g, &inout, nullptr, root_member);
  if (inout.numel() == 0 || g.size == 1) return;
  in_place(inout, /*changed=*/c.me != root_member, [&](char* data, size_t n) {
    s.pieces(n, 16, [&](size_t off, size_t len) { c.pg->broadcast(data + off, len, data + off, root_member, nullptr); });
  });
}

void PeerComm::barrier(const Group& g) {
  State& s = *s_;
  const State::Call c = s.begin(CollectiveOp::kBarrier, g, nullptr, nullptr, -1);
  s.host_step(c.ctx, "in the host barrier", [&] { s.host->barrier(g); });
}

void PeerComm::abort(const std::string& why) {
  State& s = *s_;
  if (s.broken.empty()) s.broken = fmt::format("rank {} aborted: {}", s.rank, why);
  for (auto& [key, pg] : s.groups) pg->abort();  // the others' waiting kernels stop now
  s.host->abort(why);
}

}  // namespace dsi
