// Running one model over several ranks: thread ranks inside this process (the default for CPU runs
// and tests), each loading its shard and running the same calls; the communicator keeps them in
// lockstep. Multi-process runs (mpirun) call the same per-rank code with an MPI communicator.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "dsinfer/sampling.h"
#include "model/dsa_model.h"
#include "runtime/generator.h"
#include "runtime/parallel.h"

namespace dsi {

// Runs fn(rank) on each of cfg.tp thread ranks and waits for all of them. A rank that throws
// aborts the others (they fail instead of waiting), and its error, the root cause, is rethrown.
// With `cuda`, rank r computes on CUDA device r (rank_cuda_device) and the ranks move device
// tensors through make_thread_rank_device_comm's communicator.
void run_on_thread_ranks(const ParallelConfig& cfg, const CommOptions& options,
                         const std::function<void(const RankContext&)>& fn, bool cuda = false);

#ifdef DSI_WITH_CUDA
// Rank r's CUDA device: the logical device r (backends/cuda/device.h), GPU r, or with GPU sharing
// GPU r mod the GPUs. Throws when there is no such device, naming DSI_SHARE_GPUS.
Device rank_cuda_device(int r);

// Whether CUDA ranks move device tensors through the peer communicator (peer_comm.h) rather than
// NCCL: when the build has no NCCL, when ranks share GPUs (NCCL refuses that), when they are
// threads of one process whose GPUs all have peer access (`peer_access`: its small collectives take
// a few microseconds where NCCL's take 16-18, and they run inside CUDA graphs), or with
// DSI_DEVICE_COMM=peer; DSI_DEVICE_COMM=nccl insists on NCCL (an error where it cannot be had).
// Thread ranks (make_thread_rank_device_comm) and processes (MpiRanks: peer_access false, as they
// may be on other nodes) both ask it.
bool use_peer_comm(bool ranks_share_gpus, bool peer_access);

// Shared by the device communicators of the thread ranks of one process (NCCL's failure state).
struct ThreadRankComms;
std::shared_ptr<ThreadRankComms> make_thread_rank_comms();
// Thread rank r's communicator for device tensors on rank_cuda_device(r), over its host-side
// thread communicator `host`, with the TP and DCP groups of `cfg` made at start: NCCL (nccl_comm.h)
// when the build has it and every rank has a GPU of its own; otherwise, or with
// DSI_DEVICE_COMM=peer, the peer-to-peer communicator (peer_comm.h), which also serves ranks that
// share GPUs. DSI_DEVICE_COMM=nccl insists on NCCL. Collective: every rank calls it at once, from
// its own thread, with the same `shared`.
std::unique_ptr<Communicator> make_thread_rank_device_comm(Communicator& host, const ParallelConfig& cfg, int r,
                                                           const std::shared_ptr<ThreadRankComms>& shared);
#endif

// Changes to a checkpoint's config made at load time.
struct ModelOverrides {
  // Every causal key selected (index_topk raised to the context length): dense attention, for
  // evaluating what the sparse selection costs.
  bool dense_attention = false;
};

// Loads this rank's shard of the checkpoint in `dir` (config.json + safetensors).
std::unique_ptr<DsaModel> load_rank_model(const std::string& dir, const RankContext& rank,
                                          const ModelOverrides& overrides = {},
                                          Device device = Device::cpu());

// generate / prompt_logits over the ranks of `cfg` on threads; returns rank 0's result (every rank
// computes the same one).
GenerationResult generate_on_ranks(const std::string& dir, const std::vector<int32_t>& prompt,
                                   const GenerationParams& params, const ParallelConfig& cfg,
                                   const CommOptions& options = {});
PromptLogits prompt_logits_on_ranks(const std::string& dir, const std::vector<int32_t>& prompt,
                                    int prefill_chunk, bool with_mtp, const ParallelConfig& cfg,
                                    const CommOptions& options = {});

}  // namespace dsi
