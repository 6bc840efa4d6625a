// Thread-rank collectives: a per-group rendezvous under one mutex and condition variable; see
// local_comm.h for the protocol and its guarantees.
#include "comm/local_comm.h"

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "comm/lockstep.h"

namespace dsi {

namespace {

using Clock = std::chrono::steady_clock;

// One member's call in its group's open round. The pointers stay valid until every member of the
// round has finished reading (the member does not leave before that).
struct Posted {
  CollectiveDesc desc;
  const std::string* invalid = nullptr;  // the member's own argument problem, or null
  const void* in = nullptr;              // contiguous input bytes (all_reduce/broadcast: the inout)
};

struct GroupState {
  explicit GroupState(int n) : calls(size_t(n), 0), posted(size_t(n)), present(size_t(n), 0) {}

  std::vector<uint64_t> calls;  // per member: calls issued on this group so far
  uint64_t round = 1;           // call number of the open round
  int arrived = 0, finished = 0, departed = 0;
  std::vector<Posted> posted;   // per member, for the open round
  std::vector<char> present;    // per member: posted in the open round
  // Set by the last to arrive when the round fails for everyone before data moves. A lockstep
  // violation is the whole message; otherwise each member prefixes its own call context.
  std::string failure;
  bool failure_is_whole = false;
  // Set when a member gave up waiting (timeout or abort) while others may hold its stale
  // pointers or wait for it: every later call on the group fails at once.
  std::string broken;
  uint64_t timeout_round = 0;   // the round a timeout broke (0: not broken by a timeout)
  std::vector<int> timeout_missing;
};

// What one call asks for. main: the tensor the descriptor describes (in, or inout).
struct Call {
  CollectiveOp op;
  const Group* g;
  const Tensor* main = nullptr;
  Tensor* out = nullptr;  // written tensor: out, or inout (null for barrier)
  int root = -1;
};

bool overlaps(const Tensor& a, const Tensor& b) {
  if (a.nbytes() == 0 || b.nbytes() == 0) return false;
  auto* pa = static_cast<const char*>(a.raw());
  auto* pb = static_cast<const char*>(b.raw());
  return pa < pb + b.nbytes() && pb < pa + a.nbytes();
}

void copy_bytes(void* dst, const void* src, size_t n) {
  if (n > 0) std::memcpy(dst, src, n);  // memcpy(nullptr, nullptr, 0) is undefined
}

}  // namespace

struct LocalWorld::Impl {
  int n = 0;
  CommOptions options;
  std::mutex mu;
  std::condition_variable cv;  // every state change notifies all; waiters re-check their predicate
  std::map<std::pair<int, int>, std::unique_ptr<GroupState>> groups;  // by (first, size)
  std::vector<uint64_t> abort_order;  // per rank: 0, or the order in which it called abort()
  std::vector<std::string> abort_why;
  uint64_t n_aborts = 0;
  std::vector<std::unique_ptr<LocalComm>> comms;

  GroupState& group(const Group& g) {
    auto& p = groups[{g.first, g.size}];
    if (!p) p = std::make_unique<GroupState>(g.size);
    return *p;
  }
  // The member of g that aborted first, or -1.
  int first_aborted(const Group& g) const {
    int who = -1;
    for (int r = g.first; r < g.first + g.size; ++r)
      if (abort_order[size_t(r)] != 0 && (who < 0 || abort_order[size_t(r)] < abort_order[size_t(who)])) who = r;
    return who;
  }
  void run(int rank, const Call& c);
};

LocalWorld::LocalWorld(int n_ranks, CommOptions options) : impl_(std::make_unique<Impl>()) {
  DSI_CHECK(n_ranks >= 1, "LocalWorld: {} ranks (need at least 1)", n_ranks);
  DSI_CHECK(options.timeout_seconds > 0, "LocalWorld: timeout_seconds is {} (must be positive)",
            options.timeout_seconds);
  impl_->n = n_ranks;
  impl_->options = options;
  impl_->abort_order.assign(size_t(n_ranks), 0);
  impl_->abort_why.assign(size_t(n_ranks), "");
  for (int r = 0; r < n_ranks; ++r) impl_->comms.emplace_back(new LocalComm(this, r));
}

LocalWorld::~LocalWorld() = default;
int LocalWorld::size() const { return impl_->n; }
const CommOptions& LocalWorld::options() const { return impl_->options; }

LocalComm& LocalWorld::comm(int rank) {
  DSI_CHECK(rank >= 0 && rank < impl_->n, "LocalWorld::comm: rank {} outside the world of {}", rank,
            impl_->n);
  return *impl_->comms[size_t(rank)];
}

void LocalWorld::Impl::run(int rank, const Call& c) {
  const Group& g = *c.g;
  check_group(g, rank, n, c.op);
  const int G = g.size, me = g.member(rank);
  const bool writes_inout = c.op == CollectiveOp::kAllReduce || c.op == CollectiveOp::kBroadcast;
  const std::string invalid =
      c.main ? check_collective_args(c.op, g, c.main, writes_inout ? nullptr : c.out, c.root) : "";

  // Contiguous input this member exposes to the others, and where its output is computed: straight
  // into `out` when that is contiguous and no member reads it, else into a temporary written back
  // once every member has finished reading (in-place all_reduce, an output aliasing the input).
  Tensor in_c, out_c;
  bool write_back = false;
  if (c.main && invalid.empty()) {
    in_c = c.main->is_contiguous() ? *c.main : c.main->contiguous();
    const bool direct = c.op == CollectiveOp::kBroadcast
                            ? c.out->is_contiguous()  // only the root's inout is read, never written
                            : c.op != CollectiveOp::kAllReduce && c.out->is_contiguous() &&
                                  !overlaps(*c.out, in_c);
    out_c = direct ? *c.out : Tensor::empty(c.out->shape(), c.out->dtype());
    write_back = !direct;
  }

  std::unique_lock<std::mutex> lk(mu);
  GroupState& gs = group(g);
  CollectiveDesc desc = make_desc(c.op, g, rank, ++gs.calls[size_t(me)], c.main, c.root);
  desc.invalid = invalid.empty() ? 0 : 1;
  const uint64_t call = desc.call;
  const std::string ctx = call_context(g, desc);
  const double secs = options.timeout_seconds;
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(secs));

  // Giving up (timeout, abort) while others may wait for this member or hold its pointers: the
  // group can never be used again.
  auto give_up = [&](const std::string& why) {
    if (gs.broken.empty()) gs.broken = why;
    cv.notify_all();
  };
  // posted: this member waits in round `call`, so another member's timeout there is its timeout too.
  auto throw_if_unusable = [&](bool posted) {
    if (int who = first_aborted(g); who >= 0) {
      give_up(fmt::format("rank {} aborted: {}", who, abort_why[size_t(who)]));
      fail("{} failed: rank {} aborted: {}", ctx, who, abort_why[size_t(who)]);
    }
    if (posted && gs.timeout_round == call)
      fail("{} timed out after {} s: {} never arrived", ctx, seconds_str(secs), rank_list(gs.timeout_missing));
    if (!gs.broken.empty()) fail("{} failed: group {} is unusable: {}", ctx, g.name, gs.broken);
  };
  auto unusable = [&]() { return first_aborted(g) >= 0 || !gs.broken.empty(); };
  throw_if_unusable(false);

  // 1. Wait until round `call` is open (every member has left the previous one).
  if (!cv.wait_until(lk, deadline, [&] { return gs.round == call || unusable(); })) {
    std::vector<int> busy;
    for (int m = 0; m < G; ++m)
      if (gs.present[size_t(m)]) busy.push_back(g.first + m);
    give_up(fmt::format("rank {} timed out at call #{} waiting for {} to finish call #{}", rank, call,
                        rank_list(busy), call - 1));
    fail("{} timed out after {} s: {} still in call #{}", ctx, seconds_str(secs), rank_list(busy), call - 1);
  }
  throw_if_unusable(false);

  // 2. Post; the last to arrive judges the round for everyone.
  gs.posted[size_t(me)] = Posted{desc, invalid.empty() ? nullptr : &invalid, in_c.raw()};
  gs.present[size_t(me)] = 1;
  if (++gs.arrived == G) {
    std::vector<CollectiveDesc> descs;
    for (const Posted& p : gs.posted) descs.push_back(p.desc);
    const std::string div = find_divergence(descs);
    if (!div.empty() && options.check_lockstep) {
      gs.failure = lockstep_violation(g, div);
      gs.failure_is_whole = true;
    } else if (!div.empty()) {
      gs.failure = "members disagree " + div;
    } else {
      for (const Posted& p : gs.posted)
        if (p.invalid) {
          gs.failure = fmt::format("rank {} passed invalid arguments: {}", p.desc.world_rank, *p.invalid);
          break;
        }
    }
    cv.notify_all();
  } else if (!cv.wait_until(lk, deadline, [&] { return gs.arrived == G || unusable(); })) {
    std::vector<int> missing;
    for (int m = 0; m < G; ++m)
      if (!gs.present[size_t(m)]) missing.push_back(g.first + m);
    gs.timeout_round = call;
    gs.timeout_missing = missing;
    give_up(fmt::format("rank {} timed out at call #{} waiting for {}", rank, call, rank_list(missing)));
    fail("{} timed out after {} s: {} never arrived", ctx, seconds_str(secs), rank_list(missing));
  } else if (gs.arrived != G) {
    throw_if_unusable(true);  // woken by an abort or another member's timeout
  }

  // Every member has arrived: the round completes for all of them, aborts notwithstanding.
  auto depart = [&]() {
    if (++gs.departed < G) return;
    gs.arrived = gs.finished = gs.departed = 0;
    std::fill(gs.present.begin(), gs.present.end(), 0);
    gs.failure.clear();
    gs.failure_is_whole = false;
    ++gs.round;
    cv.notify_all();
  };
  if (!gs.failure.empty()) {  // nobody reads anybody's buffers: leave at once
    const std::string msg = gs.failure_is_whole ? gs.failure : ctx + " failed: " + gs.failure;
    depart();
    throw Error(msg);
  }

  // 3. Read the others' inputs (no lock: nobody changes them before every member finished).
  std::vector<const char*> ins;
  for (const Posted& p : gs.posted) ins.push_back(static_cast<const char*>(p.in));
  lk.unlock();
  std::exception_ptr err;
  try {
    char* out = static_cast<char*>(out_c.raw());
    switch (c.op) {
      case CollectiveOp::kAllGather: {
        const size_t n_bytes = in_c.nbytes();
        for (int i = 0; i < G; ++i) copy_bytes(out + size_t(i) * n_bytes, ins[size_t(i)], n_bytes);
        break;
      }
      case CollectiveOp::kReduceScatter:
      case CollectiveOp::kAllReduce: {
        const int64_t chunk = c.op == CollectiveOp::kAllReduce ? in_c.numel() : in_c.numel() / G;
        const int64_t offset = c.op == CollectiveOp::kAllReduce ? 0 : me * chunk;
        std::vector<const float*> parts;
        for (const char* p : ins) parts.push_back(reinterpret_cast<const float*>(p) + offset);
        sum_in_member_order(reinterpret_cast<float*>(out), parts.data(), G, chunk);
        break;
      }
      case CollectiveOp::kAllToAll: {
        const size_t chunk = in_c.nbytes() / size_t(G);
        for (int i = 0; i < G; ++i)
          copy_bytes(out + size_t(i) * chunk, ins[size_t(i)] + size_t(me) * chunk, chunk);
        break;
      }
      case CollectiveOp::kBroadcast:
        if (me != c.root) copy_bytes(out, ins[size_t(c.root)], in_c.nbytes());
        else write_back = false;  // the root's inout is unchanged
        break;
      case CollectiveOp::kBarrier: break;
    }
  } catch (...) {
    err = std::current_exception();
  }
  lk.lock();
  if (++gs.finished == G) cv.notify_all();
  // No deadline here: every member has arrived and only has a bounded copy left, and leaving
  // early would free buffers that others may still be reading.
  cv.wait(lk, [&] { return gs.finished == G; });
  lk.unlock();
  if (write_back && !err) {
    try {
      c.out->copy_from(out_c);
    } catch (...) {
      err = std::current_exception();
    }
  }
  lk.lock();
  depart();
  lk.unlock();
  if (err) std::rethrow_exception(err);
}

int LocalComm::world_size() const { return world_->size(); }
const CommOptions& LocalComm::options() const { return world_->options(); }

void LocalComm::all_gather(const Group& g, const Tensor& in, Tensor& out) {
  world_->impl_->run(rank_, {CollectiveOp::kAllGather, &g, &in, &out});
}
void LocalComm::reduce_scatter(const Group& g, const Tensor& in, Tensor& out) {
  world_->impl_->run(rank_, {CollectiveOp::kReduceScatter, &g, &in, &out});
}
void LocalComm::all_reduce(const Group& g, Tensor& inout) {
  world_->impl_->run(rank_, {CollectiveOp::kAllReduce, &g, &inout, &inout});
}
void LocalComm::all_to_all(const Group& g, const Tensor& in, Tensor& out) {
  world_->impl_->run(rank_, {CollectiveOp::kAllToAll, &g, &in, &out});
}
void LocalComm::broadcast(const Group& g, Tensor& inout, int root_member) {
  world_->impl_->run(rank_, {CollectiveOp::kBroadcast, &g, &inout, &inout, root_member});
}
void LocalComm::barrier(const Group& g) { world_->impl_->run(rank_, {CollectiveOp::kBarrier, &g}); }

void LocalComm::abort(const std::string& why) {
  LocalWorld::Impl& w = *world_->impl_;
  std::lock_guard<std::mutex> lk(w.mu);
  if (w.abort_order[size_t(rank_)] == 0) {
    w.abort_order[size_t(rank_)] = ++w.n_aborts;
    w.abort_why[size_t(rank_)] = why;
  }
  w.cv.notify_all();
}

}  // namespace dsi
