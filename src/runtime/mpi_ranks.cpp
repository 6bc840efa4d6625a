// Ranks as MPI processes; see mpi_ranks.h.
#include "runtime/mpi_ranks.h"

#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "model/config.h"
#include "ops/linear.h"
#include "runtime/engine_impl.h"
#include "runtime/engine_processes.h"
#include "runtime/ranks.h"

#ifdef DSI_WITH_CUDA
#include "backends/cuda/device.h"
#include "comm/peer_comm.h"
#endif
#ifdef DSI_WITH_NCCL
#include "comm/nccl_comm.h"
#endif

namespace dsi {

namespace {

// Prints why this rank cannot go on and ends the whole job (the others would wait for it).
[[noreturn]] void abort_mpi_job(int rank, const std::string& why) {
  std::fprintf(stderr, "dsinfer: rank %d aborted: %s\n", rank, why.c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);  // MPI_Abort does not return in practice; the standard does not promise it
}

int world_rank(MpiSession& session, const ParallelConfig& cfg) {
  DSI_CHECK(cfg.tp == session.size(), "--tp {} does not match the {} processes mpirun started", cfg.tp,
            session.size());
  return session.rank();
}

// A 64-bit value as the two i32 words the host collectives move, and back.
Tensor words_of(uint64_t v) { return Tensor::from_i32({int32_t(v & 0xffffffffu), int32_t(v >> 32)}, {2}); }
uint64_t value_of(const int32_t* w) { return uint64_t(uint32_t(w[0])) | (uint64_t(uint32_t(w[1])) << 32); }

}  // namespace

MpiRanks::MpiRanks(MpiSession& session, const ParallelConfig& cfg, const CommOptions& options, bool cuda)
    : RankGroup(cfg.tp, {world_rank(session, cfg)}) {
  host_ = std::make_unique<MpiComm>(session, options);
  Communicator* data = host_.get();
  if (cuda) {
#ifdef DSI_WITH_CUDA
    const RankContext layout = RankContext::make(cfg, host_->rank(), host_.get());
    const int n_gpus = cuda::device_count();
    DSI_CHECK(n_gpus > 0, "rank {}: --device cuda, and this process sees no CUDA device", host_->rank());
    int local = local_rank_from_env();
    if (local < 0) local = host_->rank();
    device_index_ = local % n_gpus;
    if (use_peer_comm(/*ranks_share_gpus=*/false, /*peer_access=*/false)) {  // one node's GPUs, by CUDA IPC
      device_ = PeerComm::create(*host_, PeerSetup{device_index_, {layout.tp_group, layout.dcp_group}});
    } else {
#ifdef DSI_WITH_NCCL
      device_ = NcclComm::create(*host_, NcclSetup{device_index_, {layout.tp_group, layout.dcp_group},
                                                   NcclSumOrder::kMemberOrder, nullptr});
#endif
    }
    data = device_.get();
#else
    ::dsi::fail("ranks on CUDA devices need a CUDA build");
#endif
  }
  context_ = RankContext::make(cfg, host_->rank(), data);
  const int on_node = local_size_from_env();
  if (on_node > 0) ops::share_host_cores(on_node);
}

MpiRanks::~MpiRanks() = default;

void MpiRanks::abort_job(const std::string& why) { abort_mpi_job(context_.tp_rank, why); }

int MpiRanks::cuda_device(int rank) const {
  DSI_CHECK(rank == context_.tp_rank, "rank {} is not run by this process (rank {})", rank, context_.tp_rank);
  return device_index_;
}

const RankContext& MpiRanks::context(int rank) const {
  DSI_CHECK(rank == context_.tp_rank, "rank {} is not run by this process (rank {})", rank,
            context_.tp_rank);
  return context_;
}

void MpiRanks::run(const std::function<void(int)>& fn) {
  DSI_CHECK(!failed_, "this rank failed before; it cannot run another step");
  try {
    fn(context_.tp_rank);
  } catch (...) {
    failed_ = true;
    throw;
  }
}

void MpiRanks::share(std::vector<uint8_t>& bytes) {
  const Group world{"world", 0, size()};
  // The size first (two i32 words), then the bytes padded to whole words.
  Tensor head = words_of(bytes.size());
  host_->broadcast(world, head, 0);
  const uint64_t m = value_of(head.i32());
  Tensor body = Tensor::zeros({int64_t((m + 3) / 4)}, DType::I32);
  if (leader() && m > 0) std::memcpy(body.raw(), bytes.data(), m);
  host_->broadcast(world, body, 0);
  bytes.resize(size_t(m));
  if (m > 0) std::memcpy(bytes.data(), body.raw(), m);
}

int64_t MpiRanks::min_over_processes(int64_t v) {
  const Group world{"world", 0, size()};
  Tensor all = Tensor::empty({2 * int64_t(size())}, DType::I32);
  host_->all_gather(world, words_of(uint64_t(v)), all);
  int64_t least = v;
  for (int r = 0; r < size(); ++r) least = std::min(least, int64_t(value_of(all.i32() + 2 * r)));
  return least;
}

std::unique_ptr<Engine> start_engine_processes(const EngineOptions& o, MpiSession& session) {
  ParallelConfig pc;
  pc.tp = o.tp;
  pc.dcp = o.dcp;
  pc.dcp_interleave = o.dcp_interleave;
  pc.combine = parse_dcp_combine(o.dcp_comm);
  try {
    auto engine = std::make_unique<EngineImpl>(
        o, std::make_unique<MpiRanks>(session, pc, comm_options(o), o.device == "cuda"));
    if (session.rank() == 0) return engine;
    engine->follow();
  } catch (const std::exception& e) {
    if (session.rank() == 0) throw;  // the leader's caller reports it; the others time out
    abort_mpi_job(session.rank(), e.what());  // the leader's steps need this rank
  }
  return nullptr;
}

}  // namespace dsi
