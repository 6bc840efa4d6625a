// Low-latency peer-to-peer collectives; see peer_collectives.h for the protocol.
#include "backends/cuda/comm/peer_collectives.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>

#include "backends/cuda/common.cuh"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/device.h"

namespace dsi::cuda {

namespace {

enum PeerOp : int { kGather = 0, kReduceScatter = 1, kAllReduce = 2, kAllToAll = 3, kBroadcast = 4 };
constexpr int kAborted = 0xff;  // the op field of the error word when a member aborted
const char* op_name(int op) {
  switch (op) {
    case kGather: return "all_gather";
    case kReduceScatter: return "reduce_scatter";
    case kAllReduce: return "all_reduce";
    case kAllToAll: return "all_to_all";
    case kBroadcast: return "broadcast";
  }
  return "a collective";
}

// The head of a member's region. flags[b][j]: the last epoch member j's block b delivered here;
// epoch[b]: the last epoch this member's block b completed; error: 0, or the first timeout any
// member of the group saw, (op + 1) << 16 | (waiting member + 1) << 8 | (missing member + 1): the
// member that times out writes it into every member's region, and from then on every call of every
// member skips the exchange and fills its output with NaN bytes (0xff). A member that aborts writes
// kAborted << 16 | (member + 1) << 8 from the host.
struct Signals {
  uint32_t flags[kPeerBlocks][kPeerMaxMembers];
  uint32_t epoch[kPeerBlocks];
  uint32_t error;
};
constexpr size_t kHeaderBytes = 512;
static_assert(sizeof(Signals) <= kHeaderBytes, "the signal area outgrew its header");
constexpr int kThreads = 512;

struct PeerParams {
  char* base[kPeerMaxMembers];  // every member's region, as this device addresses it
  uint32_t* host_error;         // this member's mapped host word: the error word once a call failed
  int members, me, op, root;    // root: the broadcasting member
  const char* in;
  char* out;
  int64_t bytes;       // payload per member and call
  int64_t in_stride;   // reduce_scatter, all_to_all: bytes from member j's input chunk to j + 1's
  int64_t out_stride;  // all_gather, all_to_all: bytes from member j's output chunk to j + 1's
  int64_t capacity;    // slot size (a multiple of 16)
  unsigned long long timeout_ns;
};

__device__ __forceinline__ void st_release_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ uint32_t ld_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ char* slot(const PeerParams& p, char* base, int bank, int member) {
  return base + kHeaderBytes + (int64_t(bank) * p.members + member) * p.capacity;
}

// dst[lo, hi) = src[lo, hi) by the block's threads (16-byte moves when both sides allow them).
// Slots are read through the L2 only (__ldcg): other GPUs write them behind this SM's L1.
__device__ __forceinline__ void copy_range(char* dst, const char* src, int64_t lo, int64_t hi) {
  if (((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) & 15) == 0) {
    const int64_t v_hi = lo + (hi - lo) / 16 * 16;
    for (int64_t i = lo + 16 * int64_t(threadIdx.x); i < v_hi; i += 16 * kThreads)
      __stcg(reinterpret_cast<uint4*>(dst + i), __ldcg(reinterpret_cast<const uint4*>(src + i)));
    lo = v_hi;
  }
  for (int64_t i = lo + threadIdx.x; i < hi; i += kThreads) dst[i] = __ldcg(src + i);
}

// One call of one member: blockIdx.x is its share of the payload (16-byte aligned ranges).
__global__ void __launch_bounds__(kThreads) peer_collective_kernel(const PeerParams p) {
  // The payload is the previous kernel's output. No early trigger: the kernel after this one would
  // sit resident while this one waits for the other members.
  pdl_wait();
  __shared__ uint32_t s_epoch;
  __shared__ int s_failed;
  const int b = blockIdx.x, G = p.members;
  Signals* own = reinterpret_cast<Signals*>(p.base[p.me]);
  if (threadIdx.x == 0) {
    s_epoch = own->epoch[b] + 1;
    s_failed = ld_acquire_sys(&own->error) != 0;  // the group failed before: no exchange
  }
  __syncthreads();
  const uint32_t e = s_epoch;
  const int bank = int(e & 1u);
  const int64_t units = (p.bytes + 15) / 16, per = (units + kPeerBlocks - 1) / kPeerBlocks;
  const int64_t lo = min(p.bytes, int64_t(b) * per * 16), hi = min(p.bytes, int64_t(b + 1) * per * 16);

  if (!s_failed) {
    // Push this block's share into slot `me` of every member (reduce_scatter, all_to_all: chunk j to
    // member j; broadcast: the root's only).
    const bool chunked = p.op == kReduceScatter || p.op == kAllToAll;
    if (p.op != kBroadcast || p.me == p.root)
      for (int j = 0; j < G; ++j)
        copy_range(slot(p, p.base[j], bank, p.me), p.in + (chunked ? j * p.in_stride : 0), lo, hi);
    __syncthreads();
    if (threadIdx.x < G) {
      __threadfence_system();  // the block's writes (ordered by the barrier) before the flag
      st_release_sys(&reinterpret_cast<Signals*>(p.base[threadIdx.x])->flags[b][p.me], e);
      // Wait for member threadIdx.x's block b (or for another member's timeout).
      const unsigned long long t0 = global_ns();
      while (int32_t(ld_acquire_sys(&own->flags[b][threadIdx.x]) - e) < 0) {
        if (ld_acquire_sys(&own->error) != 0) {
          s_failed = 1;
          break;
        }
        if (global_ns() - t0 > p.timeout_ns) {
          const uint32_t code =
              (uint32_t(p.op + 1) << 16) | (uint32_t(p.me + 1) << 8) | uint32_t(threadIdx.x + 1);
          for (int j = 0; j < G; ++j)  // every member learns it (the late one included)
            atomicCAS_system(&reinterpret_cast<Signals*>(p.base[j])->error, 0u, code);
          s_failed = 1;
          break;
        }
      }
    }
    __syncthreads();
  }
  const bool gathers = p.op == kGather || p.op == kAllToAll;
  if (s_failed) {  // no result: NaN bytes, so a caller that skips check() sees no plausible values
    for (int j = 0; j < (gathers ? G : 1); ++j)
      for (int64_t i = lo + threadIdx.x; i < hi; i += kThreads) p.out[j * p.out_stride + i] = char(0xff);
    if (threadIdx.x == 0) {  // the host learns of it without synchronising (PeerGroup::failed())
      const uint32_t code = ld_acquire_sys(&own->error);
      st_release_sys(p.host_error, code != 0 ? code : 1u);
    }
  } else {
    if (gathers) {
      for (int j = 0; j < G; ++j) copy_range(p.out + j * p.out_stride, slot(p, p.base[p.me], bank, j), lo, hi);
    } else if (p.op == kBroadcast) {
      copy_range(p.out, slot(p, p.base[p.me], bank, p.root), lo, hi);
    } else {  // member-order sums of f32
      float* out = reinterpret_cast<float*>(p.out);
      for (int64_t i = lo / 4 + threadIdx.x; i < hi / 4; i += kThreads) {
        float acc = __ldcg(reinterpret_cast<const float*>(slot(p, p.base[p.me], bank, 0)) + i);
        for (int j = 1; j < G; ++j)
          acc = __fadd_rn(acc, __ldcg(reinterpret_cast<const float*>(slot(p, p.base[p.me], bank, j)) + i));
        out[i] = acc;
      }
    }
  }
  if (threadIdx.x == 0 && !s_failed) own->epoch[b] = e;
}

// What each member tells the others about its region, and (status) whether it could map theirs.
struct Card {
  uint64_t process;  // a random token per process (pids repeat across containers and hosts)
  char host[64];     // gethostname(): IPC and peer pointers only work within one node
  int32_t device;
  uint64_t ptr;
  int32_t has_handle;
  cudaIpcMemHandle_t handle;
};
constexpr size_t kStatusBytes = 256;

uint64_t process_token() {
  static const uint64_t token = [] {
    std::random_device rd;
    return (uint64_t(rd()) << 32) ^ uint64_t(rd()) ^ uint64_t(getpid());
  }();
  return token;
}

}  // namespace

struct PeerGroup::State {
  Group group;
  int me = 0;
  int device = 0;
  size_t capacity = 0;
  double timeout_s = 0;
  char* region = nullptr;
  uint32_t* host_error = nullptr;  // mapped pinned word the kernels raise when a call failed
  cudaStream_t side = nullptr;     // clears the region and reads its error word (non-blocking)
  bool failed = false;          // check() threw: no more calls
  PeerParams params{};
  std::vector<void*> opened;  // other processes' regions, mapped through IPC

  ~State() {
    const int prev = [] {
      int d = 0;
      cudaGetDevice(&d);
      return d;
    }();
    try {
      cudaSetDevice(physical_device(device));
    } catch (const std::exception&) {
    }
    for (void* p : opened) cudaIpcCloseMemHandle(p);
    if (region != nullptr) cudaFree(region);
    if (host_error != nullptr) cudaFreeHost(host_error);
    if (side != nullptr) cudaStreamDestroy(side);
    cudaSetDevice(prev);
  }
};

std::unique_ptr<PeerGroup> PeerGroup::create(Communicator& host, const Group& g, int device,
                                             size_t capacity, double timeout_seconds) {
  DSI_CHECK(g.size >= 1 && g.size <= kPeerMaxMembers, "peer collectives: group {} has {} members (1..{})",
            g.name, g.size, kPeerMaxMembers);
  DSI_CHECK(g.contains(host.rank()), "peer collectives: rank {} is not in group {}", host.rank(), g.name);
  DSI_CHECK(capacity > 0 && timeout_seconds > 0, "peer collectives: capacity {} B, timeout {} s", capacity,
            timeout_seconds);
  DeviceGuard guard(Device::cuda(device));
  auto s = std::make_unique<State>();
  s->group = g;
  s->me = g.member(host.rank());
  s->device = device;
  s->capacity = (capacity + 15) / 16 * 16;
  s->timeout_s = timeout_seconds;
  const size_t region_bytes = kHeaderBytes + 2 * size_t(g.size) * s->capacity;
  DSI_CUDA_CHECK(cudaStreamCreateWithFlags(&s->side, cudaStreamNonBlocking));
  DSI_CUDA_CHECK(cudaMalloc(&s->region, region_bytes));
  // On a stream of its own: other members' kernels may already run on this device.
  DSI_CUDA_CHECK(cudaMemsetAsync(s->region, 0, region_bytes, s->side));
  DSI_CUDA_CHECK(cudaStreamSynchronize(s->side));
  DSI_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&s->host_error), sizeof(uint32_t), cudaHostAllocMapped));
  *s->host_error = 0;

  Card mine{};
  mine.process = process_token();
  gethostname(mine.host, sizeof mine.host - 1);
  mine.device = physical_device(device);  // the GPU: logical devices of one GPU need no peer access
  mine.ptr = reinterpret_cast<uint64_t>(s->region);
  mine.has_handle = cudaIpcGetMemHandle(&mine.handle, s->region) == cudaSuccess ? 1 : 0;
  cudaGetLastError();  // a failed handle only matters to members in other processes
  Tensor card = Tensor::empty({int64_t(sizeof(Card))}, DType::U8);
  std::memcpy(card.raw(), &mine, sizeof(Card));
  Tensor cards = Tensor::empty({int64_t(g.size * sizeof(Card))}, DType::U8);
  host.all_gather(g, card, cards);

  PeerParams& p = s->params;
  p.members = g.size;
  p.me = s->me;
  DSI_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&p.host_error), s->host_error, 0));
  p.capacity = int64_t(s->capacity);
  p.timeout_ns = static_cast<unsigned long long>(timeout_seconds * 1e9);
  std::string status;  // why this member cannot map a peer ("" when it can)
  for (int j = 0; j < g.size && status.empty(); ++j) {
    Card c{};
    std::memcpy(&c, static_cast<const char*>(cards.raw()) + j * sizeof(Card), sizeof(Card));
    c.host[sizeof c.host - 1] = '\0';
    try {
      if (j == s->me) {
        p.base[j] = s->region;
      } else if (std::strcmp(c.host, mine.host) != 0) {
        fail("member {} runs on host '{}', member {} on '{}' (peer collectives need one node)", j, c.host,
             s->me, mine.host);
      } else if (c.process == mine.process) {  // a thread rank of this process: its pointer, peer access
        p.base[j] = reinterpret_cast<char*>(c.ptr);
        if (c.device != mine.device) {
          int ok = 0;
          DSI_CUDA_CHECK(cudaDeviceCanAccessPeer(&ok, mine.device, c.device));
          DSI_CHECK(ok, "GPU {} cannot access GPU {} (no peer-to-peer path)", mine.device, c.device);
          const cudaError_t enable = cudaDeviceEnablePeerAccess(c.device, 0);
          cudaGetLastError();  // clears "already enabled" (another group of these GPUs)
          if (enable != cudaErrorPeerAccessAlreadyEnabled) DSI_CUDA_CHECK(enable);
        }
      } else {  // another process: its region through CUDA IPC
        DSI_CHECK(c.has_handle, "member {} could not export its region", j);
        void* q = nullptr;
        DSI_CUDA_CHECK(cudaIpcOpenMemHandle(&q, c.handle, cudaIpcMemLazyEnablePeerAccess));
        s->opened.push_back(q);
        p.base[j] = static_cast<char*>(q);
      }
    } catch (const std::exception& e) {
      status = e.what();
    }
  }
  // Every member learns every member's status, so all of them fail alike (and none waits for one
  // that gave up).
  Tensor st = Tensor::zeros({int64_t(kStatusBytes)}, DType::U8);
  std::memcpy(st.raw(), status.data(), std::min(status.size(), kStatusBytes - 1));
  Tensor sts = Tensor::empty({int64_t(g.size * kStatusBytes)}, DType::U8);
  host.all_gather(g, st, sts);
  for (int j = 0; j < g.size; ++j) {
    const char* why = static_cast<const char*>(sts.raw()) + j * kStatusBytes;
    if (why[0] != '\0')
      fail("peer collectives: group {}: member {} cannot map the others' memory: {}", g.name, j,
           std::string(why, strnlen(why, kStatusBytes)));
  }
  host.barrier(g);  // every region is cleared and mapped before anyone writes into it
  return std::unique_ptr<PeerGroup>(new PeerGroup(std::move(s)));
}

PeerGroup::PeerGroup(std::unique_ptr<State> s) : s_(std::move(s)) {}
PeerGroup::~PeerGroup() = default;

int PeerGroup::members() const { return s_->group.size; }
int PeerGroup::member() const { return s_->me; }
size_t PeerGroup::capacity() const { return s_->capacity; }

void PeerGroup::launch_op(int op, const void* in, void* out, size_t bytes, size_t in_stride, size_t out_stride,
                          int root, cudaStream_t stream) {
  DSI_CHECK(!s_->failed, "peer collectives: group {} failed earlier (see check())", s_->group.name);
  DSI_CHECK(bytes <= s_->capacity, "peer collectives: {} of {} B per member over the capacity of {} B",
            op_name(op), bytes, s_->capacity);
  if (bytes == 0) return;  // every member skips alike
  DeviceGuard guard(Device::cuda(s_->device));
  PeerParams p = s_->params;
  p.op = op;
  p.root = root;
  p.in = static_cast<const char*>(in);
  p.out = static_cast<char*>(out);
  p.bytes = int64_t(bytes);
  p.in_stride = int64_t(in_stride != 0 ? in_stride : bytes);
  p.out_stride = int64_t(out_stride != 0 ? out_stride : bytes);
  launch(peer_collective_kernel, dim3(kPeerBlocks), dim3(kThreads), 0, stream != nullptr ? stream : cuda::stream(), p);
}

void PeerGroup::all_gather(const void* in, size_t bytes, void* out, cudaStream_t stream, size_t out_stride) {
  launch_op(kGather, in, out, bytes, 0, out_stride, 0, stream);
}

void PeerGroup::reduce_scatter(const float* in, int64_t m, float* out, cudaStream_t stream, int64_t in_stride) {
  DSI_CHECK(m >= 0 && in_stride >= 0, "peer collectives: reduce_scatter of {} elements (stride {})", m, in_stride);
  launch_op(kReduceScatter, in, out, size_t(m) * sizeof(float), size_t(in_stride) * sizeof(float), 0, 0, stream);
}

void PeerGroup::all_reduce(float* inout, int64_t n, cudaStream_t stream) {
  DSI_CHECK(n >= 0, "peer collectives: all_reduce of {} elements", n);
  launch_op(kAllReduce, inout, inout, size_t(n) * sizeof(float), 0, 0, 0, stream);
}

void PeerGroup::all_to_all(const void* in, size_t bytes, void* out, cudaStream_t stream, size_t in_stride,
                           size_t out_stride) {
  launch_op(kAllToAll, in, out, bytes, in_stride, out_stride, 0, stream);
}

void PeerGroup::broadcast(const void* in, size_t bytes, void* out, int root, cudaStream_t stream) {
  DSI_CHECK(root >= 0 && root < s_->group.size, "peer collectives: broadcast from member {} of {}", root,
            s_->group.size);
  launch_op(kBroadcast, in, out, bytes, 0, 0, root, stream);
}

bool PeerGroup::failed() const {
  return s_->failed || reinterpret_cast<volatile const uint32_t*>(s_->host_error)[0] != 0;
}

void PeerGroup::abort() noexcept {
  try {
    DeviceGuard guard(Device::cuda(s_->device));
    const uint32_t code = (uint32_t(kAborted) << 16) | (uint32_t(s_->me + 1) << 8);
    // Into every member's error word (their waiting kernels stop), on the side stream: the member
    // streams may be busy with exactly those kernels.
    for (int j = 0; j < s_->group.size; ++j)
      cudaMemcpyAsync(s_->params.base[j] + offsetof(Signals, error), &code, sizeof code, cudaMemcpyHostToDevice,
                      s_->side);
    cudaStreamSynchronize(s_->side);
    cudaGetLastError();
  } catch (const std::exception&) {
  }
}

void PeerGroup::check() const {
  DeviceGuard guard(Device::cuda(s_->device));
  uint32_t code = 0;
  // On the side stream: a blocking copy would wait for other members' kernels sharing this GPU.
  DSI_CUDA_CHECK(cudaMemcpyAsync(&code, s_->region + offsetof(Signals, error), sizeof code,
                                 cudaMemcpyDeviceToHost, s_->side));
  DSI_CUDA_CHECK(cudaStreamSynchronize(s_->side));
  if (code == 0) return;
  s_->failed = true;
  const int op = int(code >> 16) - 1, waiter = int((code >> 8) & 0xffu) - 1, missing = int(code & 0xffu) - 1;
  if (int(code >> 16) == kAborted)
    fail("peer collectives: group {}: member {} (world rank {}) aborted", s_->group.name, waiter,
         s_->group.first + waiter);
  fail("peer collectives: group {}: member {} (world rank {}) waited {} s in {} for member {} (world rank {}), "
       "which never arrived",
       s_->group.name, waiter, s_->group.first + waiter, s_->timeout_s, op_name(op), missing,
       s_->group.first + missing);
}

}  // namespace dsi::cuda
