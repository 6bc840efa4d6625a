// The serving engine; see include/dsinfer/engine.h. One engine thread owns the model (its ranks,
// through a RankGroup), the page pools and every sequence; the command queue between submitters
// and that thread is the only shared state. Each step: the scheduler plans rows (decode rounds,
// prefill chunks); the MTP layer drafts for the decoding sequences (batched, chained K steps); the
// model runs every planned row in one batched forward; the engine samples or verifies per
// sequence, exactly as the single-sequence generator does (same random draws for a seed), and
// reports the new tokens to each request's sink. With ranks in several processes (mpirun), every
// process runs the same steps: the leader (rank 0's process) takes the requests, samples and
// verifies, and hands its decisions to the others (RankGroup::share) at fixed points of each step.
#include <algorithm>
#include <cmath>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <limits>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include "dsinfer/error.h"
#include "ops/sampling.h"
#include "runtime/engine_impl.h"
#include "runtime/generator.h"
#include "runtime/kv_cache.h"
#include "runtime/ranks.h"

#ifdef DSI_WITH_CUDA
#include "backends/cuda/device.h"
#endif

namespace dsi {

CommOptions comm_options(const EngineOptions& o) {
  return CommOptions{o.check_lockstep, o.comm_timeout_seconds};
}

namespace {

Device rank_device(const std::string& name, const RankGroup& ranks, int rank) {
  if (name == "cpu") return Device::cpu();
  DSI_CHECK(name == "cuda", "device '{}': expected cpu or cuda", name);
#ifdef DSI_WITH_CUDA
  return rank_cuda_device(ranks.cuda_device(rank));
#else
  (void)ranks;
  fail("--device cuda: this build has no CUDA backend (configure with the cuda preset)");
#endif
}

// Which memory a device's pages take: the host's (-1) or a GPU's (ranks sharing a GPU share it).
int memory_of(Device device) {
  if (device.is_cpu()) return -1;
#ifdef DSI_WITH_CUDA
  return cuda::physical_device(device.index);
#else
  return device.index;
#endif
}

// Bytes the page pool of one rank may take (of all the memory when it is not shared).
int64_t pool_budget(const EngineOptions& o, Device device) {
  if (o.kv_cache_memory > 0) return o.kv_cache_memory;
  DSI_CHECK(o.kv_cache_fraction > 0.0 && o.kv_cache_fraction <= 1.0,
            "kv_cache_fraction = {} must be in (0, 1]", o.kv_cache_fraction);
  double avail = 0.0;
  if (device.is_cpu()) {
    avail = double(sysconf(_SC_AVPHYS_PAGES)) * double(sysconf(_SC_PAGESIZE));
  } else {
#ifdef DSI_WITH_CUDA
    avail = double(cuda::free_memory(device.index));
#endif
  }
  return int64_t(avail * o.kv_cache_fraction);
}

}  // namespace

EngineImpl::EngineImpl(const EngineOptions& o) : EngineImpl(o, nullptr) {}

EngineImpl::EngineImpl(const EngineOptions& o, std::unique_ptr<RankGroup> ranks) : opt_(o) {
  DSI_CHECK(!o.model_dir.empty(), "no model directory given");
  cfg_ = load_config(o.model_dir + "/config.json");
  K_ = o.speculative_tokens;
  DSI_CHECK(K_ >= 0, "speculative_tokens = {} must be >= 0", K_);
  ParallelConfig pc;
  pc.tp = o.tp;
  pc.dcp = o.dcp;
  pc.dcp_interleave = o.dcp_interleave;
  pc.combine = parse_dcp_combine(o.dcp_comm);
  pc.validate(cfg_);
  const int64_t limit = o.max_model_len > 0 ? o.max_model_len : cfg_.max_position_embeddings;
  DSI_CHECK(limit <= cfg_.max_position_embeddings,
            "max_model_len = {} exceeds the model's context length {}", limit,
            cfg_.max_position_embeddings);

  DSI_CHECK(o.comm_timeout_seconds > 0.0, "comm_timeout_seconds = {} must be > 0", o.comm_timeout_seconds);
  ranks_ = ranks ? std::move(ranks)
                 : std::make_unique<RankWorkers>(pc, comm_options(o), /*cuda=*/o.device == "cuda");
  DSI_CHECK(ranks_->size() == pc.tp, "the engine's {} ranks do not match tp = {}", ranks_->size(), pc.tp);
  models_.resize(ranks_->local().size());
  ranks_->run([&](int r) {
    models_[size_t(ranks_->slot(r))] =
        load_rank_model(o.model_dir, ranks_->context(r), {}, rank_device(o.device, *ranks_, r));
  });
  DSI_CHECK(K_ == 0 || models_[0]->has_mtp(),
            "speculative decoding needs an MTP layer, and this checkpoint has none");
  // Every local rank has graphs or none does (supported() depends on the layout and the
  // communicator's kind, the same on every rank).
  if (o.cuda_graphs && StepGraphs::supported(*models_[0])) {
    graphs_.resize(models_.size());
    ranks_->run([&](int r) {
      const size_t i = size_t(ranks_->slot(r));
      graphs_[i] = std::make_unique<StepGraphs>(*models_[i]);
    });
  }
  kv_dtype_ = resolve_kv_cache_dtype(o.kv_cache_dtype, cfg_, models_[0]->device());
  if (!models_[0]->device().is_cpu()) warm_up(std::min<int64_t>(o.max_num_batched_tokens, limit));

  // The pool: what the budget buys, but no more than max_num_seqs full-length sequences need.
  const DcpLayout& dcp = ranks_->context(ranks_->local().front()).dcp;
  const KvCacheDtype kv_dtype = kv_dtype_;
  const int64_t page_bytes = KvPool::bytes_per_page(cfg_, K_ > 0, kv_dtype);
  // The graphs captured after the pool exists take their memory out of the budget's share. Every
  // rank's pool has the same pages (the leader's scheduler hands out their ids): the fewest that any
  // rank's device, of this process or another, affords (agreed over the host group, which is also
  // the barrier between every process's warm-up and the pools).
  int64_t budget = std::numeric_limits<int64_t>::max();
  for (const auto& m : models_) {
    int64_t b = pool_budget(o, m->device());
    // A fraction of free memory is split between the local ranks that draw on the same memory.
    if (o.kv_cache_memory <= 0)
      b /= std::count_if(models_.begin(), models_.end(),
                         [&](const auto& other) { return memory_of(other->device()) == memory_of(m->device()); });
    budget = std::min(budget, b);
  }
  budget -= o.kv_cache_memory > 0 ? 0 : graph_bytes_;
  const int64_t most = int64_t(o.max_num_seqs) * SequenceKvCache::pages_for(dcp, limit + 1 + K_);
  const int64_t n_pages = ranks_->min_over_processes(std::min(budget / page_bytes, most));
  DSI_CHECK(n_pages >= SequenceKvCache::pages_for(dcp, std::min<int64_t>(limit, 2 + K_)),
            "the KV cache budget of {} bytes holds {} pages of {} bytes: too few for one request",
            budget, n_pages, page_bytes);
  pools_.resize(models_.size());
  ranks_->run([&](int r) {
    const size_t i = size_t(ranks_->slot(r));
    pools_[i] = std::make_shared<KvPool>(cfg_, n_pages, K_ > 0, models_[i]->device(), kv_dtype);
  });
  SchedulerConfig sc;
  sc.max_num_seqs = o.max_num_seqs;
  sc.max_num_batched_tokens = o.max_num_batched_tokens;
  sc.speculative_tokens = K_;
  sc.n_pages = n_pages;
  sc.dcp = dcp;
  sc.prefix_caching = o.prefix_caching;
  sched_ = std::make_unique<Scheduler>(sc);
  if (!graphs_.empty()) {  // decode batches of the smallest context bucket replay from their first step
    const auto t0 = std::chrono::steady_clock::now();
    int made = 0;
    ranks_->run([&](int r) {  // every rank captures the same shapes in the same order
      const size_t i = size_t(ranks_->slot(r));
      SequenceKvCache any(pools_[i], dcp);
      const int n = graphs_[i]->capture_batches(any, o.max_num_seqs, 1 + K_);
      if (i == 0) made = n;
    });
    spdlog::info("decode graphs: {} captured for batches of up to {} sequences in {:.0f} ms", made,
                 o.max_num_seqs,
                 std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  const int64_t capacity = n_pages * kPageTokens * pc.dcp;
  spdlog::info("KV cache ({}): {} pages of {} tokens per rank ({:.1f} MiB per rank), {} tokens in "
               "all; max_model_len {}, max_num_seqs {}, max_num_batched_tokens {}",
               kv_cache_dtype_name(kv_dtype), n_pages, kPageTokens, double(n_pages * page_bytes) / 1048576.0, capacity, limit,
               o.max_num_seqs, o.max_num_batched_tokens);

  info_.model_dir = o.model_dir;
  info_.id = std::filesystem::path(o.model_dir).lexically_normal().filename().string();
  if (info_.id.empty() || info_.id == ".")
    info_.id = std::filesystem::path(o.model_dir).lexically_normal().parent_path().filename().string();
  info_.max_model_len = limit;
  info_.vocab_size = cfg_.vocab_size;
  info_.eos_token_ids.assign(cfg_.eos_token_ids.begin(), cfg_.eos_token_ids.end());
  info_.speculative_tokens = K_;
  stats_.kv_pages_total = n_pages;
  stats_.kv_capacity_tokens = capacity;
  stats_.accepted_per_pos.assign(size_t(K_), 0);
  metrics_ = stats_;
  if (ranks_->leader()) thread_ = std::thread([this] { loop(); });
}

// The largest step the scheduler makes, a prefill chunk of `rows` tokens (and its logits), runs once
// on a scratch cache before the KV pool is sized: the device's caching allocator then holds that
// step's workspace, which the free memory the budget is taken from no longer counts. Every rank
// runs it (its collectives included), so the ranks also start in step.
void EngineImpl::warm_up(int64_t rows) {
  const KvCacheDtype dtype = kv_dtype_;
#ifdef DSI_WITH_CUDA
  // Blocks cached from loading (or from an engine before this one) go back to the device first, in
  // a run of its own: cudaFree waits for the whole GPU, and a rank's collective queued on it would
  // wait for a rank still freeing.
  ranks_->run([&](int r) { cuda::empty_cache(models_[size_t(ranks_->slot(r))]->device().index); });
#endif
  ranks_->run([&](int r) {
    const DsaModel& m = *models_[size_t(ranks_->slot(r))];
    SequenceKvCache scratch = m.make_cache(rows, /*with_mtp=*/false, dtype);
    const Tensor h = m.forward(Tensor::zeros({rows}, DType::I32), scratch);
    (void)to_host(m.logits(h.slice(rows - 1, rows)));  // waits for the step
  });
#ifdef DSI_WITH_CUDA
  const cuda::MemoryStats st = cuda::memory_stats(models_[0]->device().index);
  spdlog::info("warm-up step of {} tokens: rank 0 holds {:.1f} MiB of device memory (weights, "
               "the step's workspace, the warm-up's scratch cache)",
               rows, double(st.reserved_bytes) / 1048576.0);
  if (!graphs_.empty()) {
    // The decode graphs the engine captures once the KV pool exists, captured here once on a
    // scratch cache to measure their memory (their pool is their own: the warm-up's cached blocks
    // do not serve them), which the KV budget then leaves free. Every rank captures (the graphs
    // hold collectives); rank 0's figure counts.
    ranks_->run([&](int r) {
      const size_t i = size_t(ranks_->slot(r));
      const DsaModel& m = *models_[i];
      SequenceKvCache scratch = m.make_cache(kPageTokens, K_ > 0, dtype);
      const int64_t before = cuda::memory_stats(m.device().index).reserved_bytes;
      {
        StepGraphs probe(m);
        probe.capture_batches(scratch, opt_.max_num_seqs, 1 + K_);
        if (i == 0) graph_bytes_ = cuda::memory_stats(m.device().index).reserved_bytes - before;
      }
    });
    spdlog::info("decode graphs for batches of up to {} sequences take {:.1f} MiB", opt_.max_num_seqs,
                 double(graph_bytes_) / 1048576.0);
  }
#endif
}

EngineImpl::~EngineImpl() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

// A sequence's part in the prefix cache, its chunks and its drafts: a scored prompt (EngineRequest::
// prompt_logprobs) is computed, not taken from the cache, and its chunks, whose rows all need
// logits, stay small (their logits are rows x vocabulary floats).
// A request whose constraint cannot be copied (TokenConstraint::clone; `undrafted` on every
// process) has no drafts.
void EngineImpl::plan_sequence(EngineSequence& s, bool undrafted) const {
  const bool scored = s.request.prompt_logprobs >= 0;
  s.sched.tokens = scored ? nullptr : &s.tokens;
  s.sched.max_chunk = scored ? kScoredChunkRows : 0;
  s.sched.max_drafts = undrafted ? 0 : K_;
}

uint64_t EngineImpl::submit(EngineRequest r, EventSink sink) {
  DSI_CHECK(ranks_->leader(), "only the process of rank 0 takes requests");
  validate_prompt(cfg_, r.prompt);
  const int64_t P = int64_t(r.prompt.size());
  DSI_CHECK(r.max_new_tokens >= 1, "max_new_tokens = {} must be >= 1", r.max_new_tokens);
  DSI_CHECK(P + r.max_new_tokens <= info_.max_model_len,
            "this model's maximum context length is {} tokens, but {} were requested ({} in the "
            "prompt, {} to generate)", info_.max_model_len, P + r.max_new_tokens, P, r.max_new_tokens);
  const int64_t need = sched_->pages_for(P + r.max_new_tokens + 1 + K_);
  DSI_CHECK(need <= sched_->config().n_pages,
            "the request needs {} KV pages but the whole cache has {}", need, sched_->config().n_pages);
  const SamplingParams& sp = r.sampling;
  DSI_CHECK(std::isfinite(sp.temperature) && sp.temperature >= 0.0f,
            "temperature = {} must be >= 0", sp.temperature);
  DSI_CHECK(sp.top_p > 0.0f && sp.top_p <= 1.0f, "top_p = {} must be in (0, 1]", sp.top_p);
  DSI_CHECK(sp.top_k >= 0, "top_k = {} must be >= 0 (0 keeps every token)", sp.top_k);
  DSI_CHECK(sp.min_p >= 0.0f && sp.min_p <= 1.0f, "min_p = {} must be in [0, 1]", sp.min_p);
  ops::check_penalties(sp);
  for (const auto& [id, b] : sp.logit_bias) {
    DSI_CHECK(id >= 0 && id < cfg_.vocab_size, "logit_bias token {} is outside the vocabulary [0, {})", id,
              cfg_.vocab_size);
    DSI_CHECK(std::isfinite(b), "logit_bias of token {} is not finite", id);
  }
  DSI_CHECK(r.logprobs <= 20, "logprobs = {} must be at most 20", r.logprobs);
  DSI_CHECK(r.prompt_logprobs <= 20, "prompt_logprobs = {} must be at most 20", r.prompt_logprobs);
  for (int32_t t : r.stop_token_ids)
    DSI_CHECK(t >= 0 && t < cfg_.vocab_size, "stop token id {} is outside the vocabulary [0, {})", t,
              cfg_.vocab_size);
  DSI_CHECK(bool(sink), "submit: no event sink");

  auto s = std::make_unique<EngineSequence>();
  s->tokens = r.prompt;
  s->prompt_len = P;
  s->rng.seed(r.sampling.seed);
  s->request = std::move(r);
  s->sink = std::move(sink);
  s->sched.n_tokens = P;
  plan_sequence(*s, s->request.constraint != nullptr && s->request.constraint->clone() == nullptr);
  std::lock_guard<std::mutex> lock(mu_);
  DSI_CHECK(failed_.empty(), "the engine has failed: {}", failed_);
  DSI_CHECK(!stop_, "the engine is shutting down");
  const uint64_t id = next_id_++;
  s->sched.id = id;
  incoming_.push_back(std::move(s));
  ++metrics_.waiting;  // until the engine thread publishes its own count
  cv_.notify_all();
  return id;
}

void EngineImpl::cancel(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  cancels_.push_back(id);
  cv_.notify_all();
}

std::string EngineImpl::failure() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failed_;
}

EngineMetrics EngineImpl::metrics() const {
  std::lock_guard<std::mutex> lock(mu_);
  return metrics_;
}

void EngineImpl::loop() {
  // With other processes, the leader sends a control message at least every second (and four times
  // per collective timeout), so that theirs never time out while it has nothing to do.
  const bool others = !ranks_->single_process();
  const auto beat = std::chrono::duration<double>(std::min(1.0, opt_.comm_timeout_seconds / 4));
  for (;;) {
    std::deque<std::unique_ptr<EngineSequence>> incoming;
    std::vector<uint64_t> cancels;
    bool stop = false;
    if (ranks_->leader()) {
      std::unique_lock<std::mutex> lock(mu_);
      auto ready = [&] { return stop_ || !incoming_.empty() || !cancels_.empty() || !seqs_.empty(); };
      if (others)
        cv_.wait_for(lock, beat, ready);
      else
        cv_.wait(lock, ready);
      stop = stop_;
      incoming.swap(incoming_);
      cancels.swap(cancels_);
    }
    if (others) {
      try {
        stop = share_control(stop, incoming, cancels);
      } catch (const std::exception& e) {  // another process is gone: no step can run any more
        for (auto& s : incoming) s->sink(RequestEvent{{}, true, "error", e.what(), s->prompt_len, 0, 0, {}});
        fail_all(e.what());
        ranks_->abort_job(fmt::format("engine: {}", e.what()));
        break;  // (a group whose abort_job returns: the engine takes no more work)
      }
    }
    if (stop) {
      for (auto& s : incoming) s->sink(RequestEvent{{}, true, "abort", {}, s->prompt_len, 0, 0, {}});
      break;
    }
    for (auto& s : incoming) {
      EngineSequence* p = s.get();
      seqs_[p->sched.id] = std::move(s);
      sched_->add(&p->sched);
    }
    for (uint64_t id : cancels) {
      auto it = seqs_.find(id);
      if (it != seqs_.end()) finish(*it->second, "abort");
    }
    sweep();
    if (!seqs_.empty()) {
      try {
        step();
      } catch (const std::exception& e) {
        spdlog::error("engine step failed: {}", e.what());
        fail_all(e.what());
        // Processes: the others' steps went on or wait in a collective; they cannot agree any more.
        ranks_->abort_job(fmt::format("engine step failed: {}", e.what()));
      }
      sweep();
    }
    publish_metrics();
  }
  std::vector<EngineSequence*> left;
  for (auto& [id, s] : seqs_) left.push_back(s.get());
  for (EngineSequence* s : left) finish(*s, "abort");
  seqs_.clear();
  publish_metrics();
}

void EngineImpl::follow() {
  DSI_CHECK(!ranks_->leader(), "follow() is for the processes other than rank 0's");
  loop();
}

namespace {

// The control messages' encoding: little-endian fixed-size fields and counted i32 vectors.
class Writer {
 public:
  template <typename T>
  void put(T v) {
    const size_t at = bytes.size();
    bytes.resize(at + sizeof(T));
    std::memcpy(bytes.data() + at, &v, sizeof(T));
  }
  void put_ids(const std::vector<int32_t>& v) {
    put(uint64_t(v.size()));
    for (int32_t x : v) put(x);
  }
  std::vector<uint8_t> bytes;
};

class Reader {
 public:
  explicit Reader(const std::vector<uint8_t>& b) : b_(b) {}
  template <typename T>
  T get() {
    DSI_CHECK(at_ + sizeof(T) <= b_.size(), "engine control message: truncated at byte {}", at_);
    T v;
    std::memcpy(&v, b_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return v;
  }
  std::vector<int32_t> get_ids() {
    const uint64_t n = get<uint64_t>();
    DSI_CHECK(n <= (b_.size() - at_) / 4, "engine control message: {} ids past its end", n);
    std::vector<int32_t> v(static_cast<size_t>(n));
    for (auto& x : v) x = get<int32_t>();
    return v;
  }

 private:
  const std::vector<uint8_t>& b_;
  size_t at_ = 0;
};

}  // namespace

bool EngineImpl::share_control(bool stop, std::deque<std::unique_ptr<EngineSequence>>& incoming,
                               std::vector<uint64_t>& cancels) {
  Writer w;
  if (ranks_->leader()) {
    w.put(uint8_t(stop));
    w.put(uint64_t(incoming.size()));
    for (const auto& s : incoming) {
      const EngineRequest& r = s->request;
      w.put(s->sched.id);
      w.put_ids(r.prompt);
      w.put(int32_t(r.max_new_tokens));
      w.put(uint8_t(r.ignore_eos));
      w.put(r.sampling.temperature);
      w.put(r.sampling.top_p);
      w.put(r.sampling.seed);
      w.put(int32_t(r.sampling.top_k));
      w.put(r.sampling.min_p);
      w.put(r.sampling.presence_penalty);
      w.put(r.sampling.frequency_penalty);
      w.put(r.sampling.repetition_penalty);
      w.put(uint64_t(r.sampling.logit_bias.size()));
      for (const auto& [id, b] : r.sampling.logit_bias) {
        w.put(id);
        w.put(b);
      }
      w.put_ids(r.stop_token_ids);
      w.put(int32_t(r.prompt_logprobs));
      w.put(uint8_t(s->sched.max_drafts == 0));  // the constraint itself stays with rank 0
    }
    w.put(uint64_t(cancels.size()));
    for (uint64_t id : cancels) w.put(id);
  }
  ranks_->share(w.bytes);
  if (ranks_->leader()) return stop;
  Reader rd(w.bytes);
  stop = rd.get<uint8_t>() != 0;
  const uint64_t n = rd.get<uint64_t>();
  for (uint64_t i = 0; i < n; ++i) {
    auto s = std::make_unique<EngineSequence>();
    s->sched.id = rd.get<uint64_t>();
    EngineRequest& r = s->request;
    r.prompt = rd.get_ids();
    r.max_new_tokens = rd.get<int32_t>();
    r.ignore_eos = rd.get<uint8_t>() != 0;
    r.sampling.temperature = rd.get<float>();
    r.sampling.top_p = rd.get<float>();
    r.sampling.seed = rd.get<uint64_t>();
    r.sampling.top_k = rd.get<int32_t>();
    r.sampling.min_p = rd.get<float>();
    r.sampling.presence_penalty = rd.get<float>();
    r.sampling.frequency_penalty = rd.get<float>();
    r.sampling.repetition_penalty = rd.get<float>();
    const uint64_t n_bias = rd.get<uint64_t>();
    for (uint64_t b = 0; b < n_bias; ++b) {
      const int32_t id = rd.get<int32_t>();
      r.sampling.logit_bias.emplace_back(id, rd.get<float>());
    }
    r.stop_token_ids = rd.get_ids();
    r.prompt_logprobs = rd.get<int32_t>();
    const bool undrafted = rd.get<uint8_t>() != 0;
    s->tokens = r.prompt;
    s->prompt_len = int64_t(r.prompt.size());
    s->rng.seed(r.sampling.seed);
    s->sink = [](RequestEvent&&) {};  // the leader reports to the clients
    s->sched.n_tokens = s->prompt_len;
    plan_sequence(*s, undrafted);
    incoming.push_back(std::move(s));
  }
  const uint64_t c = rd.get<uint64_t>();
  for (uint64_t i = 0; i < c; ++i) cancels.push_back(rd.get<uint64_t>());
  return stop;
}

void EngineImpl::share_tokens(std::vector<int32_t>& tokens) {
  if (ranks_->single_process()) return;
  Writer w;
  if (ranks_->leader()) w.put_ids(tokens);
  ranks_->share(w.bytes);
  if (ranks_->leader()) return;
  Reader rd(w.bytes);
  tokens = rd.get_ids();
}

std::unique_ptr<Engine> Engine::start(const EngineOptions& options) {
  return std::make_unique<EngineImpl>(options);
}

}  // namespace dsi
