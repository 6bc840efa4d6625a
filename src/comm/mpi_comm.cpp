// MPI process ranks: non-blocking MPI collectives polled against a deadline, group
// sub-communicators created lazily, the lockstep guard as an all_gather of descriptors; see mpi_comm.h.
#include "comm/mpi_comm.h"

#include <mpi.h>

#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <map>
#include <thread>
#include <vector>

#include "comm/lockstep.h"

namespace dsi {

namespace {

using Clock = std::chrono::steady_clock;

std::string mpi_error(int rc) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, buf, &len);
  return std::string(buf, size_t(len));
}

// Data only moves, so an unsigned integer type of the element's width carries every dtype.
MPI_Datatype element_type(DType t) {
  switch (dtype_size(t)) {
    case 1: return MPI_UINT8_T;
    case 2: return MPI_UINT16_T;
    case 4: return MPI_UINT32_T;
    default: return MPI_UINT64_T;
  }
}

bool overlaps(const Tensor& a, const Tensor& b) {
  if (a.nbytes() == 0 || b.nbytes() == 0) return false;
  auto* pa = static_cast<const char*>(a.raw());
  auto* pb = static_cast<const char*>(b.raw());
  return pa < pb + b.nbytes() && pb < pa + a.nbytes();
}

Tensor contiguous_of(const Tensor& t) { return t.is_contiguous() ? t : t.contiguous(); }

// The handshake before a group's creation uses one tag per group on the private world communicator.
constexpr int kHandshakeTagBase = 16;

}  // namespace

// ---- MpiSession ----

MpiSession::MpiSession(int* argc, char*** argv) {
  int initialised = 0;
  MPI_Initialized(&initialised);
  int provided = 0;
  if (!initialised) {
    const int rc = MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided);
    DSI_CHECK(rc == MPI_SUCCESS, "MPI_Init_thread failed: {}", mpi_error(rc));
    owns_ = true;
  } else {
    MPI_Query_thread(&provided);
  }
  if (provided < MPI_THREAD_SERIALIZED) {
    if (owns_) MPI_Finalize();
    fail("MPI provides thread level {}, dsinfer needs MPI_THREAD_SERIALIZED ({})", provided,
         int(MPI_THREAD_SERIALIZED));
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
}

MpiSession::~MpiSession() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (broken_) {
    std::fprintf(stderr, "dsinfer: rank %d: MPI communication failed, aborting all processes\n", rank_);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  } else if (owns_) {
    MPI_Finalize();
  }
}

// ---- MpiComm ----

struct MpiComm::State {
  MpiSession* session = nullptr;
  CommOptions options;
  int rank = 0, size = 1;
  int tag_ub = 32767;
  MPI_Comm world = MPI_COMM_NULL;  // private duplicate of MPI_COMM_WORLD
  struct GroupComm {
    MPI_Comm comm = MPI_COMM_NULL;
    uint64_t calls = 0;
  };
  std::map<std::pair<int, int>, GroupComm> groups;  // by (first, size)
  std::string broken;            // set after a timeout or MPI error: every later call fails
  std::vector<Tensor> abandoned;  // temporaries of requests left pending, kept alive

  // One collective in progress.
  struct Call {
    const Group* g;
    MPI_Comm comm;
    int me;  // member index
    CollectiveDesc desc;
    std::string ctx;  // "rank 2: all_reduce on group tp (call #7, F32[4, 128])"
    Clock::time_point deadline;
  };

  Clock::time_point deadline_from_now() const {
    return Clock::now() + std::chrono::duration_cast<Clock::duration>(
                              std::chrono::duration<double>(options.timeout_seconds));
  }
  void break_with(const std::string& why) {
    if (broken.empty()) broken = why;
    session->mark_broken();
  }
  void check_rc(int rc, const std::string& ctx, const char* what) {
    if (rc == MPI_SUCCESS) return;
    break_with(fmt::format("{}: {} failed", ctx, what));
    fail("{} failed: {}: {}", ctx, what, mpi_error(rc));
  }
  // MPI_Test on every request until all completed (each becomes MPI_REQUEST_NULL) or the deadline.
  // Yields, then sleeps between rounds, so oversubscribed processes let the others progress.
  bool poll(std::vector<MPI_Request>& reqs, Clock::time_point deadline, const std::string& ctx) {
    for (int round = 0;; ++round) {
      bool all = true;
      for (MPI_Request& r : reqs) {
        if (r == MPI_REQUEST_NULL) continue;
        int done = 0;
        check_rc(MPI_Test(&r, &done, MPI_STATUS_IGNORE), ctx, "MPI_Test");
        all = all && done;
      }
      if (all) return true;
      if (Clock::now() >= deadline) return false;
      if (round < 64)
        std::this_thread::yield();
      else
        std::this_thread::sleep_for(std::chrono::microseconds(round < 2000 ? 20 : 500));
    }
  }
  // Waits for one collective's request; on timeout keeps `keep` alive and fails for good.
  void wait(MPI_Request req, const Call& c, std::vector<Tensor> keep) {
    std::vector<MPI_Request> reqs{req};
    if (poll(reqs, c.deadline, c.ctx)) return;
    for (Tensor& t : keep) abandoned.push_back(std::move(t));
    break_with(fmt::format("{} timed out", c.ctx));
    fail("{} timed out after {} s: not every member of group {} (ranks {}..{}) arrived (the MPI "
         "request is left pending: this process cannot continue; exit, or call abort())",
         c.ctx, seconds_str(options.timeout_seconds), c.g->name, c.g->first, c.g->first + c.g->size - 1);
  }

  MPI_Comm group_comm(const Group& g, GroupComm& gc, Clock::time_point deadline, const std::string& ctx);
  Call begin(CollectiveOp op, const Group& g, const Tensor* main, const Tensor* out, int root);
};

// MPI_Comm_create_group blocks, with no deadline, until every member calls it. So members first
// handshake with non-blocking point-to-point messages on the private world communicator, polled
// against the deadline; a member that never comes is then named instead of hanging everyone.
MPI_Comm MpiComm::State::group_comm(const Group& g, GroupComm& gc, Clock::time_point deadline,
                                    const std::string& ctx) {
  if (gc.comm != MPI_COMM_NULL) return gc.comm;
  const int64_t tag64 = kHandshakeTagBase + int64_t(g.first) * (size + 1) + g.size;
  DSI_CHECK(tag64 <= tag_ub, "{}: world of {} ranks too large for MPI tags (upper bound {})", ctx, size, tag_ub);
  const int tag = int(tag64);
  Tensor msg = Tensor::from_i32({g.first, g.size}, {2});
  Tensor heard = Tensor::zeros({int64_t(g.size), 2}, DType::I32);
  std::vector<MPI_Request> recvs, sends;
  std::vector<int> peers;
  for (int m = 0; m < g.size; ++m) {
    const int peer = g.first + m;
    if (peer == rank) continue;
    peers.push_back(peer);
    recvs.emplace_back();
    sends.emplace_back();
    check_rc(MPI_Irecv(heard.i32() + 2 * m, 2, MPI_INT, peer, tag, world, &recvs.back()), ctx, "MPI_Irecv");
    check_rc(MPI_Isend(msg.i32(), 2, MPI_INT, peer, tag, world, &sends.back()), ctx, "MPI_Isend");
  }
  std::vector<MPI_Request> all = recvs;
  all.insert(all.end(), sends.begin(), sends.end());
  if (!poll(all, deadline, ctx)) {
    std::vector<int> missing;
    for (size_t i = 0; i < peers.size(); ++i)
      if (all[i] != MPI_REQUEST_NULL) missing.push_back(peers[i]);
    abandoned.push_back(msg);
    abandoned.push_back(heard);
    break_with(fmt::format("{} timed out creating group {}", ctx, g.name));
    fail("{} timed out after {} s creating group {}: {} never arrived (this process cannot continue; "
         "exit, or call abort())", ctx, seconds_str(options.timeout_seconds), g.name,
         missing.empty() ? std::string("some member") : rank_list(missing));
  }
  MPI_Group world_group, sub;
  check_rc(MPI_Comm_group(world, &world_group), ctx, "MPI_Comm_group");
  int range[1][3] = {{g.first, g.first + g.size - 1, 1}};
  check_rc(MPI_Group_range_incl(world_group, 1, range, &sub), ctx, "MPI_Group_range_incl");
  const int rc = MPI_Comm_create_group(world, sub, tag, &gc.comm);
  MPI_Group_free(&sub);
  MPI_Group_free(&world_group);
  check_rc(rc, ctx, "MPI_Comm_create_group");
  check_rc(MPI_Comm_set_errhandler(gc.comm, MPI_ERRORS_RETURN), ctx, "MPI_Comm_set_errhandler");
  return gc.comm;
}

// Checks the call, finds its communicator and, in check mode, compares descriptors across the group
// before any data moves: on a divergence every member throws the same message and the group stays
// in step (every member has made exactly one exchange for this call).
MpiComm::State::Call MpiComm::State::begin(CollectiveOp op, const Group& g, const Tensor* main,
                                           const Tensor* out, int root) {
  check_group(g, rank, size, op);
  Call c;
  c.g = &g;
  c.me = g.member(rank);
  c.deadline = deadline_from_now();
  GroupComm& gc = groups[{g.first, g.size}];
  const std::string invalid = main ? check_collective_args(op, g, main, out, root) : "";
  c.desc = make_desc(op, g, rank, ++gc.calls, main, root);
  c.desc.invalid = invalid.empty() ? 0 : 1;
  c.ctx = call_context(g, c.desc);
  if (!broken.empty()) fail("{} failed: the MPI communicator is unusable after: {}", c.ctx, broken);
  c.comm = group_comm(g, gc, c.deadline, c.ctx);
  if (!options.check_lockstep) {
    if (!invalid.empty()) fail("{}: {}", c.ctx, invalid);
    return c;
  }
  compare_descriptors(g, c.desc, c.ctx, invalid, [&](const Tensor& mine, Tensor& all) {
    MPI_Request req;
    check_rc(MPI_Iallgather(mine.raw(), int(sizeof(CollectiveDesc)), MPI_BYTE, all.raw(),
                            int(sizeof(CollectiveDesc)), MPI_BYTE, c.comm, &req),
             c.ctx, "MPI_Iallgather");
    wait(req, c, {mine, all});
  });
  return c;
}

MpiComm::MpiComm(MpiSession& session, CommOptions options) : s_(std::make_unique<State>()) {
  int initialised = 0;
  MPI_Initialized(&initialised);
  DSI_CHECK(initialised, "MpiComm: MPI is not initialised (create an MpiSession first)");
  DSI_CHECK(options.timeout_seconds > 0, "MpiComm: timeout_seconds is {} (must be positive)",
            options.timeout_seconds);
  State& s = *s_;
  s.session = &session;
  s.options = options;
  MPI_Comm_rank(MPI_COMM_WORLD, &s.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &s.size);
  int* ub = nullptr;
  int found = 0;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &found);
  if (found && ub) s.tag_ub = *ub;
  const std::string ctx = fmt::format("rank {}: creating the MPI communicator", s.rank);
  std::vector<MPI_Request> reqs(1);
  s.check_rc(MPI_Comm_idup(MPI_COMM_WORLD, &s.world, &reqs[0]), ctx, "MPI_Comm_idup");
  if (!s.poll(reqs, s.deadline_from_now(), ctx)) {
    s.break_with(ctx + " timed out");
    (void)s_.release();  // the pending MPI_Comm_idup still writes into the state: leak it
    fail("{} timed out after {} s: not every process arrived", ctx, seconds_str(options.timeout_seconds));
  }
  s.check_rc(MPI_Comm_set_errhandler(s.world, MPI_ERRORS_RETURN), ctx, "MPI_Comm_set_errhandler");
}

MpiComm::~MpiComm() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized || !s_->broken.empty()) return;  // pending requests: the session aborts instead
  for (auto& [key, gc] : s_->groups)
    if (gc.comm != MPI_COMM_NULL) MPI_Comm_free(&gc.comm);
  if (s_->world != MPI_COMM_NULL) MPI_Comm_free(&s_->world);
}

int MpiComm::rank() const { return s_->rank; }
int MpiComm::world_size() const { return s_->size; }
const CommOptions& MpiComm::options() const { return s_->options; }

namespace {
int count_of(int64_t n, const std::string& ctx) {
  DSI_CHECK(n <= INT_MAX, "{}: {} elements in one MPI message exceed MPI's int count", ctx, n);
  return int(n);
}
}  // namespace

void MpiComm::all_gather(const Group& g, const Tensor& in, Tensor& out) {
  State::Call c = s_->begin(CollectiveOp::kAllGather, g, &in, &out, -1);
  Tensor in_c = contiguous_of(in);
  const bool direct = out.is_contiguous() && !overlaps(out, in_c);
  Tensor out_c = direct ? out : Tensor::empty(out.shape(), out.dtype());
  const MPI_Datatype t = element_type(in.dtype());
  const int n = count_of(in.numel(), c.ctx);
  MPI_Request req;
  s_->check_rc(MPI_Iallgather(in_c.raw(), n, t, out_c.raw(), n, t, c.comm, &req), c.ctx, "MPI_Iallgather");
  s_->wait(req, c, {in_c, out_c});
  if (!direct) out.copy_from(out_c);
}

void MpiComm::reduce_scatter(const Group& g, const Tensor& in, Tensor& out) {
  State::Call c = s_->begin(CollectiveOp::kReduceScatter, g, &in, &out, -1);
  const int G = g.size;
  const int64_t chunk = in.numel() / G;
  Tensor in_c = contiguous_of(in);
  Tensor recv = Tensor::empty({G * chunk}, DType::F32);  // [G, chunk]: row i came from member i
  const int n = count_of(chunk, c.ctx);
  MPI_Request req;
  s_->check_rc(MPI_Ialltoall(in_c.raw(), n, MPI_UINT32_T, recv.raw(), n, MPI_UINT32_T, c.comm, &req),
               c.ctx, "MPI_Ialltoall");
  s_->wait(req, c, {in_c, recv});
  std::vector<const float*> parts;
  for (int i = 0; i < G; ++i) parts.push_back(recv.f32() + i * chunk);
  const bool direct = out.is_contiguous();
  Tensor out_c = direct ? out : Tensor::empty(out.shape(), DType::F32);
  sum_in_member_order(out_c.f32(), parts.data(), G, chunk);
  if (!direct) out.copy_from(out_c);
}

void MpiComm::all_reduce(const Group& g, Tensor& inout) {
  State::Call c = s_->begin(CollectiveOp::kAllReduce, g, &inout, nullptr, -1);
  const int G = g.size;
  const int64_t N = inout.numel();
  const int64_t chunk = (N + G - 1) / G;  // member i sums elements [i * chunk, (i + 1) * chunk)
  Tensor send = Tensor::zeros({G * chunk}, DType::F32);  // inout flattened, zero-padded
  if (N > 0) send.slice(0, N).view(inout.shape()).copy_from(inout);
  Tensor recv = Tensor::empty({G * chunk}, DType::F32);
  const int n = count_of(chunk, c.ctx);
  MPI_Request req;
  s_->check_rc(MPI_Ialltoall(send.raw(), n, MPI_UINT32_T, recv.raw(), n, MPI_UINT32_T, c.comm, &req),
               c.ctx, "MPI_Ialltoall");
  s_->wait(req, c, {send, recv});
  std::vector<const float*> parts;
  for (int i = 0; i < G; ++i) parts.push_back(recv.f32() + i * chunk);
  Tensor mine = Tensor::empty({chunk}, DType::F32);
  sum_in_member_order(mine.f32(), parts.data(), G, chunk);
  Tensor sum = Tensor::empty({G * chunk}, DType::F32);
  s_->check_rc(MPI_Iallgather(mine.raw(), n, MPI_UINT32_T, sum.raw(), n, MPI_UINT32_T, c.comm, &req),
               c.ctx, "MPI_Iallgather");
  s_->wait(req, c, {mine, sum});
  if (N > 0) inout.copy_from(sum.slice(0, N).view(inout.shape()));
}

void MpiComm::all_to_all(const Group& g, const Tensor& in, Tensor& out) {
  State::Call c = s_->begin(CollectiveOp::kAllToAll, g, &in, &out, -1);
  Tensor in_c = contiguous_of(in);
  const bool direct = out.is_contiguous() && !overlaps(out, in_c);
  Tensor out_c = direct ? out : Tensor::empty(out.shape(), out.dtype());
  const MPI_Datatype t = element_type(in.dtype());
  const int n = count_of(in.numel() / g.size, c.ctx);
  MPI_Request req;
  s_->check_rc(MPI_Ialltoall(in_c.raw(), n, t, out_c.raw(), n, t, c.comm, &req), c.ctx, "MPI_Ialltoall");
  s_->wait(req, c, {in_c, out_c});
  if (!direct) out.copy_from(out_c);
}

void MpiComm::broadcast(const Group& g, Tensor& inout, int root_member) {
  State::Call c = s_->begin(CollectiveOp::kBroadcast, g, &inout, nullptr, root_member);
  const bool direct = inout.is_contiguous();
  Tensor buf = direct ? inout : inout.contiguous();
  const int n = count_of(inout.numel(), c.ctx);
  MPI_Request req;
  s_->check_rc(MPI_Ibcast(buf.raw(), n, element_type(inout.dtype()), root_member, c.comm, &req), c.ctx,
               "MPI_Ibcast");
  s_->wait(req, c, {buf});
  if (!direct && c.me != root_member) inout.copy_from(buf);
}

void MpiComm::barrier(const Group& g) {
  State::Call c = s_->begin(CollectiveOp::kBarrier, g, nullptr, nullptr, -1);
  MPI_Request req;
  s_->check_rc(MPI_Ibarrier(c.comm, &req), c.ctx, "MPI_Ibarrier");
  s_->wait(req, c, {});
}

void MpiComm::abort(const std::string& why) {
  std::fprintf(stderr, "dsinfer: rank %d aborted: %s\n", s_->rank, why.c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);  // MPI_Abort does not return in practice; the standard does not promise it
}

namespace {

// The first of the launcher's variables `names` that is set, as an integer >= lo, or -1 when none is.
int launcher_int(std::initializer_list<const char*> names, long lo, const char* what) {
  for (const char* name : names) {
    const char* v = std::getenv(name);
    if (v == nullptr || *v == '\0') continue;
    char* end = nullptr;
    const long r = std::strtol(v, &end, 10);
    DSI_CHECK(end != v && *end == '\0' && r >= lo && r < (1 << 20), "{}={} is not {}", name, v, what);
    return int(r);
  }
  return -1;
}

}  // namespace

int local_rank_from_env() {
  return launcher_int({"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID", "LOCAL_RANK"}, 0,
                      "a local rank");
}

int local_size_from_env() {
  return launcher_int({"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"}, 1, "a count of local ranks");
}

}  // namespace dsi
