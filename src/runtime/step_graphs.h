// Decode steps replayed from CUDA graphs (backends/cuda/graph/step_graph.h): the main model's
// forward and logits over a batch of sequences, captured once per shape and replayed after that.
//
// Shape of a graph: the rows of each sequence (1 for plain decoding, 1 + K for MTP verification),
// padded with dummy sequences of the last sequence's rows (DsaModel::Padding) to a bucket of batch
// sizes (batch_bucket: 1, 2, 4, 8, 12, 16, 24, 32, 48, ...), and a bucket of block-table width,
// the next power of two of pages at or above the longest sequence's (at least kMinPagesBucket):
// inside a bucket the context may grow freely, since the kernels read each row's causal bound from
// the device and the padded columns of the logits and block tables are ignored. A context of 128K
// tokens is covered by 6 buckets.
// The first step of a shape runs eagerly (which also warms every kernel of the step up), then
// captures; later steps copy their inputs (one packed upload) and replay. capture_batches makes the
// batch buckets of the smallest context bucket ahead (the engine does at start-up). Results equal
// the eager forward's over the same padded batch bitwise (tests/cuda/test_step_graphs.cpp).
// The graphs share one memory pool: they replay one at a time on one stream, so each reuses the
// others' intermediate blocks and the pool holds the largest step's intermediates plus every
// graph's inputs and outputs. At most kMaxGraphs shapes are captured; steps of further shapes run
// eagerly (unpadded).
// Several ranks (TP/DCP) capture their collectives too, when their communicator can (the peer
// communicator, comm/peer_comm.h; not NCCL's blocking one): every rank has its own StepGraphs and
// makes the same decisions (shape keys, capture, replay, eager fallback) in the same order, and
// each step runs exactly one forward's collectives on every rank however it runs (eager, the
// warm-up before a capture, or a replay), so the ranks stay in step.
#pragma once

#include <map>
#include <memory>
#include <vector>

#include "model/dsa_model.h"

namespace dsi {

namespace cuda {
struct BlockPool;
}

class StepGraphs {
 public:
  static constexpr int64_t kMinPagesBucket = 32;  // 2048 tokens
  static constexpr int kMaxGraphs = 64;  // shapes captured at most; later new shapes run eagerly

  // Whether `model` can run its decode steps from graphs (a CUDA model on one rank, or on ranks
  // whose communicator is capturable and runs without the lockstep guard).
  static bool supported(const DsaModel& model);
  // min_pages_bucket: the smallest bucket (a power of two; smaller ones make more, cheaper graphs).
  explicit StepGraphs(const DsaModel& model, int64_t min_pages_bucket = kMinPagesBucket);
  ~StepGraphs();

  struct Step {
    Tensor hidden;  // [n, hidden] f32: the final-norm states (model.forward's result)
    Tensor logits;  // [n, vocab] f32
  };
  // model.forward(tokens, seqs) then model.logits of its result, with the same effect on the
  // caches. The tensors returned are the caller's (copies of the graph's outputs).
  Step forward(const std::vector<int32_t>& tokens, const std::vector<BatchSeq>& seqs);

  // Captures ahead the graphs of decode batches of every bucket up to max_seqs sequences of
  // rows_per_seq rows (1, or 1 + K when verifying K drafts) in the smallest block-table bucket, on
  // dummy sequences only (nothing is written to `cache`'s pool, any sequence of it will do, pages
  // or not). Returns the graphs made; steps of those shapes then replay from their first.
  int capture_batches(SequenceKvCache& cache, int64_t max_seqs, int64_t rows_per_seq);
  // The padded batch size of a step over `seqs` sequences.
  static int64_t batch_bucket(int64_t seqs);

  int graphs() const;   // shapes captured so far
  int64_t replays() const { return replays_; }
  int64_t eager_steps() const { return eager_steps_; }  // steps of shapes without a graph

 private:
  struct Key {
    std::vector<int64_t> rows;
    int64_t pages = 0;
    bool operator<(const Key& o) const {
      return rows != o.rows ? rows < o.rows : pages < o.pages;
    }
  };
  struct Entry;
  Step add_graph(const Key& key, const LayerContext& host, const Tensor& tokens_host,
                 SequenceKvCache& cache, int64_t keep);
  static Tensor copy_rows(const Tensor& t, int64_t rows);
  // Whether `mine` holds on any rank of the TP group (a collective: every rank calls it).
  bool any_rank(bool mine) const;

  const DsaModel& model_;
  int64_t min_pages_bucket_;
  std::shared_ptr<cuda::BlockPool> pool_;  // shared by every graph (see above)
  std::map<Key, std::unique_ptr<Entry>> entries_;
  int64_t replays_ = 0;
  int64_t eager_steps_ = 0;
};

}  // namespace dsi
