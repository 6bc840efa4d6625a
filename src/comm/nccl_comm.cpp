// GPU ranks over NCCL: non-blocking NCCL communicators per group, bootstrapped and guarded through
// a host-side communicator, every collective polled against a deadline; see nccl_comm.h.
#include "comm/nccl_comm.h"

#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <utility>

#include "comm/device_tensors.h"
#include "comm/lockstep.h"
#include "comm/nccl_kernels.h"

namespace dsi {

namespace {

using Clock = std::chrono::steady_clock;

Clock::time_point deadline_after(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

// Polling back-off: spin with yields first (a collective of a decode step takes microseconds), then
// sleep so a rank waiting for a slow peer does not burn a core other ranks may need.
void back_off(int round) {
  if (round < 256)
    std::this_thread::yield();
  else
    std::this_thread::sleep_for(std::chrono::microseconds(round < 4096 ? 20 : 200));
}

std::string nccl_error(ncclResult_t r) {
  std::string s = fmt::format("{} ({})", ncclGetErrorString(r), int(r));
  const char* last = ncclGetLastError(nullptr);
  if (last != nullptr && last[0] != '\0') s += fmt::format(": {}", last);
  return s;
}

// Makes `device` current for the guard's lifetime (NCCL calls, stream 0 and allocations follow the
// current device).
class CurrentDevice {
 public:
  explicit CurrentDevice(int device) : device_(device) {
    if (cudaGetDevice(&prev_) != cudaSuccess) {
      cudaGetLastError();
      prev_ = -1;
    }
    if (prev_ != device_) {
      const cudaError_t e = cudaSetDevice(device_);
      if (e != cudaSuccess) {
        cudaGetLastError();
        fail("cannot make CUDA device {} current: {}", device_, cudaGetErrorString(e));
      }
    }
  }
  ~CurrentDevice() {
    if (prev_ >= 0 && prev_ != device_) cudaSetDevice(prev_);
  }
  CurrentDevice(const CurrentDevice&) = delete;
  CurrentDevice& operator=(const CurrentDevice&) = delete;

 private:
  int device_;
  int prev_ = -1;
};

// Member i of a group of G owns elements [start(i), start(i + 1)) of an all_reduce of n elements.
int64_t part_start(int64_t n, int G, int i) { return n * i / G; }

std::once_flag g_nvls_once;

}  // namespace

// ---- NcclProcessState ----

bool NcclProcessState::raise(int rank, const std::string& why) {
  std::lock_guard<std::mutex> lk(mu_);
  if (raised_.load(std::memory_order_relaxed)) return false;
  failure_ = why.empty() ? fmt::format("rank {} failed", rank) : why;
  raised_.store(true, std::memory_order_release);
  return true;
}

std::string NcclProcessState::failure() const {
  std::lock_guard<std::mutex> lk(mu_);
  return failure_;
}

// ---- NcclComm::State ----

struct NcclComm::State {
  Communicator* host = nullptr;
  NcclSetup setup;
  int rank = 0, size = 1, device = 0;
  cudaStream_t stream = nullptr;  // the CUDA backend's stream: the device's legacy default stream
  std::map<std::pair<int, int>, ncclComm_t> comms;  // by group (first, size); groups of 1 have none
  std::vector<ncclComm_t> owned;                    // every communicator, in creation order
  std::map<std::pair<int, int>, uint64_t> calls;    // per group: collectives issued so far
  std::string broken;     // set by a failure: every later call fails at once
  bool nccl_aborted = false;
  bool flying = false;    // counted in setup.process->in_flight
  Tensor scratch;         // U8 on the device: receive buffers of the member-order sums

  struct Call {
    CollectiveOp op;
    const Group* g;
    int me;
    CollectiveDesc desc;
    std::string ctx;  // "rank 2: all_reduce on group tp (call #7, F32[4, 128])"
    Clock::time_point deadline;
    ncclComm_t comm = nullptr;  // null for barriers and groups of one
  };

  ~State() { release(); }

  double timeout() const { return host->options().timeout_seconds; }
  std::string range(const Group& g) const {
    return fmt::format("ranks {}..{}", g.first, g.first + g.size - 1);
  }

  void enter_flight() {
    if (flying || !setup.process) return;
    setup.process->in_flight.fetch_add(1, std::memory_order_acq_rel);
    flying = true;
  }
  void leave_flight() {
    if (!flying) return;
    setup.process->in_flight.fetch_sub(1, std::memory_order_acq_rel);
    flying = false;
  }

  // Aborts every NCCL communicator of this rank (stops its kernels; they are unusable afterwards).
  void abort_nccl() {
    if (nccl_aborted) return;
    nccl_aborted = true;
    for (ncclComm_t c : owned) ncclCommAbort(c);
  }

  // A failure with NCCL work possibly in flight: stop it, tell the other thread ranks, throw.
  [[noreturn]] void die(const std::string& msg) {
    if (broken.empty()) broken = msg;
    abort_nccl();
    leave_flight();
    if (setup.process) setup.process->raise(rank, msg);
    throw Error(msg);
  }

  void throw_if_failed(const std::string& ctx) {
    if (!broken.empty()) fail("{} failed: this rank's NCCL communicator is unusable after: {}", ctx, broken);
    if (setup.process && setup.process->raised()) {
      broken = setup.process->failure();
      fail("{} failed: {}", ctx, broken);
    }
  }

  // Runs a host-side step of a call; its failure (timeout, abort, MPI error) breaks this comm too.
  template <typename F>
  void host_step(const std::string& ctx, const char* what, F&& step) {
    try {
      step();
    } catch (const Error& e) {
      if (broken.empty()) broken = fmt::format("{} failed {}: {}", ctx, what, e.what());
      fail("{} failed {}: {}", ctx, what, e.what());
    }
  }

  // Polls a non-blocking communicator until its pending NCCL call is enqueued (ncclSuccess).
  void wait_ready(ncclComm_t comm, Clock::time_point deadline, double seconds, const std::string& ctx,
                  const char* what) {
    for (int round = 0;; ++round) {
      ncclResult_t st = ncclSuccess;
      const ncclResult_t r = ncclCommGetAsyncError(comm, &st);
      if (r != ncclSuccess) die(fmt::format("{} failed: ncclCommGetAsyncError: {}", ctx, nccl_error(r)));
      if (st == ncclSuccess) return;
      if (st != ncclInProgress) die(fmt::format("{} failed {}: NCCL error {}", ctx, what, nccl_error(st)));
      if (setup.process && setup.process->raised())
        die(fmt::format("{} failed {}: {}", ctx, what, setup.process->failure()));
      if (Clock::now() >= deadline)
        die(fmt::format("{} timed out after {} s {} (the NCCL communicators were aborted: this rank "
                        "cannot communicate any more)", ctx, seconds_str(seconds), what));
      back_off(round);
    }
  }

  // The result of an NCCL call on `comm`: in progress (non-blocking mode) waits until enqueued.
  void nccl_step(ncclResult_t r, ncclComm_t comm, const Call& c, const char* what) {
    if (r == ncclSuccess) return;
    if (r == ncclInProgress) return wait_ready(comm, c.deadline, timeout(), c.ctx, what);
    die(fmt::format("{} failed: {}: {}", c.ctx, what, nccl_error(r)));
  }

  void cuda_step(cudaError_t e, const Call& c, const char* what) {
    if (e == cudaSuccess) return;
    cudaGetLastError();
    die(fmt::format("{} failed: {}: CUDA error {} ({})", c.ctx, what, int(e), cudaGetErrorString(e)));
  }

  // Waits until everything enqueued on the stream (the collective included) is done, NCCL reports
  // an error, another thread rank fails, or the deadline passes.
  void finish(const Call& c) {
    for (int round = 0;; ++round) {
      const cudaError_t e = cudaStreamQuery(stream);
      if (e == cudaSuccess) break;
      if (e != cudaErrorNotReady) cuda_step(e, c, "waiting for the stream");
      if (c.comm != nullptr) {
        ncclResult_t st = ncclSuccess;
        ncclCommGetAsyncError(c.comm, &st);
        if (st != ncclSuccess && st != ncclInProgress)
          die(fmt::format("{} failed: NCCL error {}", c.ctx, nccl_error(st)));
      }
      if (setup.process && setup.process->raised())
        die(fmt::format("{} failed: {}", c.ctx, setup.process->failure()));
      if (Clock::now() >= c.deadline)
        die(fmt::format("{} timed out after {} s: not every member of group {} ({}) arrived (the NCCL "
                        "communicators were aborted: this rank cannot communicate any more)",
                        c.ctx, seconds_str(timeout()), c.g->name, range(*c.g)));
      back_off(round);
    }
    leave_flight();
  }

  // Creates the NCCL communicator of group g (collective over its members): member 0's id goes to
  // the others through the host group's broadcast; creation is polled against the deadline.
  // Creating a communicator legitimately takes seconds (CUDA context, topology detection, proxy
  // threads), so creation gets at least a minute even when collectives have a short timeout.
  double create_seconds() const { return std::max(timeout(), 60.0); }

  ncclComm_t create_comm(const Group& g, const std::string& ctx) {
    const int me = g.member(rank);
    ncclUniqueId id{};
    Tensor idt = Tensor::zeros({int64_t(sizeof(ncclUniqueId))}, DType::U8);
    if (me == 0) {
      const ncclResult_t r = ncclGetUniqueId(&id);
      if (r != ncclSuccess) {
        // The others would wait in the broadcast below: tell them first where possible.
        if (broken.empty()) broken = fmt::format("{}: ncclGetUniqueId failed: {}", ctx, nccl_error(r));
        if (setup.process) setup.process->raise(rank, broken);
        fail("{}", broken);
      }
      std::memcpy(idt.raw(), &id, sizeof(id));
    }
    host_step(ctx, "broadcasting the NCCL id", [&] { host->broadcast(g, idt, 0); });
    std::memcpy(&id, idt.raw(), sizeof(id));

    CurrentDevice dev(device);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // creation, teardown and enqueueing return at once and are polled
    ncclComm_t comm = nullptr;
    const ncclResult_t r = ncclCommInitRankConfig(&comm, g.size, id, me, &config);
    if (comm != nullptr) owned.push_back(comm);
    if (r != ncclSuccess && r != ncclInProgress)
      die(fmt::format("{} failed: ncclCommInitRankConfig: {}", ctx, nccl_error(r)));
    if (r == ncclInProgress)
      wait_ready(comm, deadline_after(create_seconds()), create_seconds(), ctx, "creating the NCCL communicator");
    comms[{g.first, g.size}] = comm;
    return comm;
  }

  ncclComm_t group_comm(const Group& g, const std::string& ctx) {
    if (g.size == 1) return nullptr;
    auto it = comms.find({g.first, g.size});
    if (it != comms.end()) return it->second;
    return create_comm(g, ctx);
  }

  // Device checks, then the shared host-tensor argument checks on shape aliases.
  std::string check_args(CollectiveOp op, const Group& g, const Tensor* in, const Tensor* out, int root) const {
    const Device here = Device::cuda(device);
    for (auto [t, what] : {std::pair{in, "input"}, std::pair{out, "output"}}) {
      if (t == nullptr) continue;
      if (!(t->device() == here))
        return fmt::format("{} {} is on {}: this rank's NCCL communicator works on {}", what, t->desc(),
                           t->device().str(), here.str());
    }
    Tensor a_in, a_out;
    if (in) a_in = shape_alias(*in);
    if (out) a_out = shape_alias(*out);
    return check_collective_args(op, g, in ? &a_in : nullptr, out ? &a_out : nullptr, root);
  }

  // Checks the call and, in check mode, compares the members' descriptors over the host group
  // before anything is enqueued: a divergence fails every member with the same message and leaves
  // the group in step. Then finds (or creates) the group's NCCL communicator.
  Call begin(CollectiveOp op, const Group& g, const Tensor* main, const Tensor* out, int root) {
    check_group(g, rank, size, op);
    Call c;
    c.op = op;
    c.g = &g;
    c.me = g.member(rank);
    c.deadline = deadline_after(timeout());
    const bool writes_main = op == CollectiveOp::kAllReduce || op == CollectiveOp::kBroadcast;
    const std::string invalid = main ? check_args(op, g, main, writes_main ? nullptr : out, root) : "";
    c.desc = make_desc(op, g, rank, ++calls[{g.first, g.size}], main, root);
    c.desc.invalid = invalid.empty() ? 0 : 1;
    c.ctx = call_context(g, c.desc);
    throw_if_failed(c.ctx);
    if (host->options().check_lockstep) {
      compare_descriptors(g, c.desc, c.ctx, invalid, [&](const Tensor& mine, Tensor& all) {
        host_step(c.ctx, "exchanging the lockstep descriptors", [&] { host->all_gather(g, mine, all); });
      });
    } else if (!invalid.empty()) {
      fail("{}: {}", c.ctx, invalid);
    }
    if (op != CollectiveOp::kBarrier && c.g->size > 1 && !comms.count({g.first, g.size})) {
      c.comm = group_comm(g, c.ctx);
      c.deadline = deadline_after(timeout());  // the collective's own time starts after the creation
    } else if (op != CollectiveOp::kBarrier) {
      c.comm = group_comm(g, c.ctx);
    }
    return c;
  }

  // A device buffer of at least `bytes` bytes (grown, never shrunk; no work in flight when it grows).
  void* scratch_bytes(size_t bytes) {
    if (size_t(scratch.numel()) < bytes) {
      scratch = Tensor();  // free first: the old and new buffer need not coexist
      scratch = Tensor::empty({int64_t(std::max<size_t>(bytes, 1 << 16))}, DType::U8, Device::cuda(device));
    }
    return scratch.raw();
  }

  // Grouped point-to-point transfers of one call: `ops` issues ncclSend/ncclRecv on c.comm.
  template <typename F>
  void grouped(const Call& c, F&& ops, const char* what) {
    nccl_step(ncclGroupStart(), c.comm, c, "ncclGroupStart");
    ops();
    nccl_step(ncclGroupEnd(), c.comm, c, what);
  }
  void send(const Call& c, const void* buf, size_t count, ncclDataType_t t, int peer_member) {
    nccl_step(ncclSend(buf, count, t, peer_member, c.comm, stream), c.comm, c, "ncclSend");
  }
  void recv(const Call& c, void* buf, size_t count, ncclDataType_t t, int peer_member) {
    nccl_step(ncclRecv(buf, count, t, peer_member, c.comm, stream), c.comm, c, "ncclRecv");
  }

  bool native_sum(int G) const {
    switch (setup.sums) {
      case NcclSumOrder::kNative: return true;
      case NcclSumOrder::kOrderedAlways: return false;
      case NcclSumOrder::kMemberOrder: return G <= 2;  // a + b == b + a: any order is member order
    }
    return false;
  }

  // Teardown: abort after a failure; otherwise finalise every communicator within the timeout (an
  // abort if that fails), then destroy. Thread ranks first wait until no rank of the process has
  // NCCL work in flight, so no kernel of theirs still reads this rank's buffers.
  void release() noexcept {
    leave_flight();
    if (owned.empty()) return;
    int prev = -1;
    if (cudaGetDevice(&prev) != cudaSuccess) prev = -1;
    cudaSetDevice(device);
    // Another rank's collective ends within its own timeout (done, failed or timed out), so twice
    // the timeout is enough unless it keeps starting new ones.
    const double t = host->options().timeout_seconds;
    if (setup.process) {
      const auto quiet_by = deadline_after(2 * t + 1);
      for (int round = 0; setup.process->in_flight.load(std::memory_order_acquire) > 0 &&
                          Clock::now() < quiet_by; ++round)
        back_off(round);
    }
    const auto deadline = deadline_after(t);
    bool failed = !broken.empty() || nccl_aborted || (setup.process && setup.process->raised());
    if (!failed) {
      for (ncclComm_t c : owned) {
        const ncclResult_t r = ncclCommFinalize(c);
        if (r != ncclSuccess && r != ncclInProgress) failed = true;
      }
      for (size_t i = 0; i < owned.size() && !failed; ++i) {
        for (int round = 0;; ++round) {
          ncclResult_t st = ncclSuccess;
          if (ncclCommGetAsyncError(owned[i], &st) != ncclSuccess || (st != ncclSuccess && st != ncclInProgress)) {
            failed = true;
            break;
          }
          if (st == ncclSuccess) break;
          if (Clock::now() >= deadline) {
            failed = true;
            break;
          }
          back_off(round);
        }
      }
    }
    if (failed) {
      if (!nccl_aborted)
        for (ncclComm_t c : owned) ncclCommAbort(c);
    } else {
      for (ncclComm_t c : owned) ncclCommDestroy(c);
    }
    owned.clear();
    comms.clear();
    scratch = Tensor();
    cudaGetLastError();
    if (prev >= 0) cudaSetDevice(prev);
  }
};

// ---- NcclComm ----

NcclComm::NcclComm(std::unique_ptr<State> s) : s_(std::move(s)) {}
NcclComm::~NcclComm() = default;

std::unique_ptr<NcclComm> NcclComm::create(Communicator& host, NcclSetup setup) {
  // NVLink SHARP stays off (multicast objects are allocated outside our allocator and are not
  // available on every system); set before the first communicator, unless the user chose.
  std::call_once(g_nvls_once, [] { setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0); });
  const int rank = host.rank(), size = host.world_size();
  int n_devices = 0;
  if (cudaGetDeviceCount(&n_devices) != cudaSuccess) {
    cudaGetLastError();
    n_devices = 0;
  }
  DSI_CHECK(setup.device >= 0 && setup.device < n_devices,
            "rank {}: NCCL communicator on CUDA device {}, but this process sees {} CUDA device(s)", rank,
            setup.device, n_devices);
  auto s = std::make_unique<State>();
  s->host = &host;
  s->rank = rank;
  s->size = size;
  s->device = setup.device;
  s->setup = std::move(setup);
  std::vector<Group> groups{Group{"world", 0, size}};
  groups.insert(groups.end(), s->setup.groups.begin(), s->setup.groups.end());
  for (const Group& g : groups) {
    DSI_CHECK(g.size >= 1 && g.first >= 0 && int64_t(g.first) + g.size <= size && g.contains(rank),
              "rank {}: NCCL communicator for group {} (ranks {}..{}): not a group of the world of {} "
              "ranks containing rank {}", rank, g.name, g.first, int64_t(g.first) + g.size - 1, size, rank);
    const std::string ctx = fmt::format("rank {}: creating the NCCL communicator of group {} ({}) on {}",
                                        rank, g.name, s->range(g), Device::cuda(s->device).str());
    s->throw_if_failed(ctx);
    s->group_comm(g, ctx);
  }
  return std::unique_ptr<NcclComm>(new NcclComm(std::move(s)));
}

int NcclComm::rank() const { return s_->rank; }
int NcclComm::world_size() const { return s_->size; }
const CommOptions& NcclComm::options() const { return s_->host->options(); }
int NcclComm::device() const { return s_->device; }
cudaStream_t NcclComm::stream() const { return s_->stream; }
Communicator& NcclComm::host() const { return *s_->host; }

void NcclComm::all_gather(const Group& g, const Tensor& in, Tensor& out) {
  State& s = *s_;
  State::Call c = s.begin(CollectiveOp::kAllGather, g, &in, &out, -1);
  if (in.numel() == 0) return;
  CurrentDevice dev(s.device);
  const Tensor in_c = device_contiguous(in);
  if (g.size == 1) return copy_device(out, in_c);
  const size_t n = in_c.nbytes();
  // NCCL's in-place form: the input is this member's slot of the output.
  const bool in_place = out.is_contiguous() && in_c.raw() == static_cast<char*>(out.raw()) + c.me * n;
  const bool direct = out.is_contiguous() && (in_place || !overlaps(out, in_c));
  Tensor out_c = direct ? out : Tensor::empty(out.shape(), out.dtype(), out.device());
  s.enter_flight();
  s.nccl_step(ncclAllGather(in_c.raw(), out_c.raw(), n, ncclUint8, c.comm, s.stream), c.comm, c, "ncclAllGather");
  s.finish(c);
  if (!direct) out.copy_from(out_c);
}

void NcclComm::reduce_scatter(const Group& g, const Tensor& in, Tensor& out) {
  State& s = *s_;
  State::Call c = s.begin(CollectiveOp::kReduceScatter, g, &in, &out, -1);
  const int G = g.size;
  const int64_t m = out.numel();  // elements per member
  if (m == 0) return;
  CurrentDevice dev(s.device);
  const Tensor in_c = device_contiguous(in);
  if (G == 1) return copy_device(out, in_c);
  const float* src = static_cast<const float*>(in_c.raw());
  if (s.native_sum(G)) {
    const bool in_place = out.is_contiguous() && out.raw() == src + c.me * m;
    const bool direct = out.is_contiguous() && (in_place || !overlaps(out, in_c));
    Tensor out_c = direct ? out : Tensor::empty(out.shape(), DType::F32, out.device());
    s.enter_flight();
    s.nccl_step(ncclReduceScatter(src, out_c.raw(), size_t(m), ncclFloat32, ncclSum, c.comm, s.stream),
                c.comm, c, "ncclReduceScatter");
    s.finish(c);
    if (!direct) out.copy_from(out_c);
    return;
  }
  // Member order: every member's chunk for this member lands in row i of `parts`, then one kernel
  // sums the rows in order. The input is only read by the transfers, which complete (in stream
  // order) before the kernel writes the output, so any overlap of out with in is harmless.
  float* parts = static_cast<float*>(s.scratch_bytes(size_t(G) * size_t(m) * sizeof(float)));
  const bool direct = out.is_contiguous();
  Tensor out_c = direct ? out : Tensor::empty(out.shape(), DType::F32, out.device());
  s.enter_flight();
  s.grouped(c, [&] {
    for (int j = 0; j < G; ++j) {
      if (j == c.me) continue;
      s.send(c, src + j * m, size_t(m), ncclFloat32, j);
      s.recv(c, parts + j * m, size_t(m), ncclFloat32, j);
    }
  }, "exchanging the chunks");
  s.cuda_step(cudaMemcpyAsync(parts + c.me * m, src + c.me * m, size_t(m) * sizeof(float),
                              cudaMemcpyDeviceToDevice, s.stream), c, "copying the own chunk");
  s.cuda_step(nccl_detail::launch_member_order_sum(static_cast<float*>(out_c.raw()), parts, G, m, s.stream),
              c, "the member-order sum");
  s.finish(c);
  if (!direct) out.copy_from(out_c);
}

void NcclComm::all_reduce(const Group& g, Tensor& inout) {
  State& s = *s_;
  State::Call c = s.begin(CollectiveOp::kAllReduce, g, &inout, nullptr, -1);
  const int G = g.size;
  const int64_t n = inout.numel();
  if (n == 0 || G == 1) return;  // the sum over one member is its own tensor
  CurrentDevice dev(s.device);
  const bool direct = inout.is_contiguous();
  Tensor buf = direct ? inout : device_contiguous(inout);
  float* data = static_cast<float*>(buf.raw());
  if (s.native_sum(G)) {
    s.enter_flight();
    s.nccl_step(ncclAllReduce(data, data, size_t(n), ncclFloat32, ncclSum, c.comm, s.stream), c.comm, c,
                "ncclAllReduce");
    s.finish(c);
  } else {
    // Member order, as a reduce-scatter then an all-gather of uneven parts: member i sums elements
    // [start(i), start(i + 1)) of everyone's tensor in order and sends its sum to all the others.
    const int64_t lo = part_start(n, G, c.me), len = part_start(n, G, c.me + 1) - lo;
    float* parts = static_cast<float*>(s.scratch_bytes(size_t(G) * size_t(std::max<int64_t>(len, 1)) * sizeof(float)));
    s.enter_flight();
    s.grouped(c, [&] {
      for (int j = 0; j < G; ++j) {
        if (j == c.me) continue;
        const int64_t jlo = part_start(n, G, j), jlen = part_start(n, G, j + 1) - jlo;
        if (jlen > 0) s.send(c, data + jlo, size_t(jlen), ncclFloat32, j);
        if (len > 0) s.recv(c, parts + j * len, size_t(len), ncclFloat32, j);
      }
    }, "exchanging the parts to sum");
    if (len > 0) {
      s.cuda_step(cudaMemcpyAsync(parts + c.me * len, data + lo, size_t(len) * sizeof(float),
                                  cudaMemcpyDeviceToDevice, s.stream), c, "copying the own part");
      s.cuda_step(nccl_detail::launch_member_order_sum(data + lo, parts, G, len, s.stream), c,
                  "the member-order sum");
    }
    s.grouped(c, [&] {
      for (int j = 0; j < G; ++j) {
        if (j == c.me) continue;
        const int64_t jlo = part_start(n, G, j), jlen = part_start(n, G, j + 1) - jlo;
        if (len > 0) s.send(c, data + lo, size_t(len), ncclFloat32, j);
        if (jlen > 0) s.recv(c, data + jlo, size_t(jlen), ncclFloat32, j);
      }
    }, "gathering the sums");
    s.finish(c);
  }
  if (!direct) inout.copy_from(buf);
}

void NcclComm::all_to_all(const Group& g, const Tensor& in, Tensor& out) {
  State& s = *s_;
  State::Call c = s.begin(CollectiveOp::kAllToAll, g, &in, &out, -1);
  const int G = g.size;
  if (in.numel() == 0) return;
  CurrentDevice dev(s.device);
  const Tensor in_c = device_contiguous(in);
  if (G == 1) return copy_device(out, in_c);
  const size_t chunk = in_c.nbytes() / size_t(G);
  const bool direct = out.is_contiguous() && !overlaps(out, in_c);
  Tensor out_c = direct ? out : Tensor::empty(out.shape(), out.dtype(), out.device());
  const char* src = static_cast<const char*>(in_c.raw());
  char* dst = static_cast<char*>(out_c.raw());
  s.enter_flight();
  s.grouped(c, [&] {
    for (int j = 0; j < G; ++j) {
      if (j == c.me) continue;
      s.send(c, src + size_t(j) * chunk, chunk, ncclUint8, j);
      s.recv(c, dst + size_t(j) * chunk, chunk, ncclUint8, j);
    }
  }, "exchanging the chunks");
  s.cuda_step(cudaMemcpyAsync(dst + size_t(c.me) * chunk, src + size_t(c.me) * chunk, chunk,
                              cudaMemcpyDeviceToDevice, s.stream), c, "copying the own chunk");
  s.finish(c);
  if (!direct) out.copy_from(out_c);
}

void NcclComm::broadcast(const Group& g, Tensor& inout, int root_member) {
  State& s = *s_;
  State::Call c = s.begin(CollectiveOp::kBroadcast, g, &inout, nullptr, root_member);
  if (inout.numel() == 0 || g.size == 1) return;
  CurrentDevice dev(s.device);
  const bool direct = inout.is_contiguous();
  Tensor buf = direct ? inout : device_contiguous(inout);
  s.enter_flight();
  s.nccl_step(ncclBroadcast(buf.raw(), buf.raw(), buf.nbytes(), ncclUint8, root_member, c.comm, s.stream),
              c.comm, c, "ncclBroadcast");
  s.finish(c);
  if (!direct && c.me != root_member) inout.copy_from(buf);
}

void NcclComm::barrier(const Group& g) {
  State& s = *s_;
  State::Call c = s.begin(CollectiveOp::kBarrier, g, nullptr, nullptr, -1);
  s.host_step(c.ctx, "in the host barrier", [&] { s.host->barrier(g); });
}

void NcclComm::abort(const std::string& why) {
  State& s = *s_;
  if (s.broken.empty()) s.broken = fmt::format("rank {} aborted: {}", s.rank, why);
  if (s.setup.process) s.setup.process->raise(s.rank, fmt::format("rank {} aborted: {}", s.rank, why));
  // The NCCL communicators are released by the destructor, once no other thread rank has work in
  // flight; the host group wakes its own waiters (MpiComm ends the job).
  s.host->abort(why);
}

std::string nccl_version() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "unknown";
  if (v >= 10000) return fmt::format("{}.{}.{}", v / 10000, (v % 10000) / 100, v % 100);
  return fmt::format("{}.{}.{}", v / 1000, (v % 1000) / 100, v % 100);
}

}  // namespace dsi
