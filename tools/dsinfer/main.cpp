// dsinfer command-line interface: `generate` (prefill + decode) and `logits` (teacher-forced
// logits to .npy). Errors go to stderr as one line with a non-zero exit code; with --json the last
// line of stdout is one JSON object.
#include <CLI/CLI.hpp>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <fmt/ranges.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/npy.h"
#include "dsinfer/error.h"
#include "model/dsa_model.h"
#include "runtime/generator.h"
#include "runtime/perplexity.h"
#include "runtime/ranks.h"
#include "text/tokenizer.h"
#include "sampling_flags.h"
#ifdef DSI_WITH_SERVER
#include "bench.h"
#include "serve.h"
#endif
#ifdef DSI_WITH_MPI
#include "comm/mpi_comm.h"
#include "runtime/mpi_ranks.h"
#endif
#ifdef DSI_WITH_CUDA
#include "backends/cuda/device.h"
#endif

namespace dsi {
// The MPI session of a process started by mpirun (none otherwise).
#ifdef DSI_WITH_MPI
using MpiSessionPtr = std::unique_ptr<MpiSession>;
#else
struct NoMpi {
  int rank() const { return 0; }
  int size() const { return 1; }
};
using MpiSessionPtr = std::unique_ptr<NoMpi>;
#endif
}  // namespace dsi

namespace {

using dsi::fail;

// True when this process was started by mpirun / srun as one of several ranks.
bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"})
    if (const char* s = std::getenv(v); s && std::atoi(s) > 1) return true;
  return false;
}

std::vector<int32_t> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i <= text.size()) {
    size_t j = text.find(',', i);
    if (j == std::string::npos) j = text.size();
    std::string tok = text.substr(i, j - i);
    tok.erase(0, tok.find_first_not_of(" \t"));
    tok.erase(tok.find_last_not_of(" \t") + 1);
    if (!tok.empty() || j < text.size()) {
      char* end = nullptr;
      errno = 0;
      const long long v = std::strtoll(tok.c_str(), &end, 10);
      if (tok.empty() || *end != '\0' || errno != 0 || v < INT32_MIN || v > INT32_MAX)
        fail("--prompt-ids: '{}' is not a token id (expected comma-separated integers)", tok);
      ids.push_back(int32_t(v));
    }
    i = j + 1;
  }
  if (ids.empty()) fail("--prompt-ids: the prompt is empty");
  return ids;
}

struct CommonOptions {
  std::string model_dir;
  std::string prompt_ids;
  std::string prompt_text;
  std::string device = "cpu";
  int prefill_chunk = 0;
  bool text_given = false;  // --prompt was passed (even empty)
  bool dense_attention = false;
  dsi::ParallelConfig parallel;
  std::string dcp_comm = "ag_rs";
  dsi::CommOptions comm;
};

void add_common(CLI::App* cmd, CommonOptions& o) {
  o.model_dir = DSI_DEFAULT_MODEL_DIR;
  cmd->add_option("--model", o.model_dir,
                  "checkpoint directory (config.json + safetensors); default: the bundled model");
  cmd->add_option("--prefill-chunk", o.prefill_chunk, "prompt tokens per prefill step (0 = all)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--device", o.device, "compute device: cpu (default) or cuda")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_flag("--dense-attention", o.dense_attention,
                "attend to every causal key (index_topk raised to the context length)");
  cmd->add_option("--tp", o.parallel.tp, "tensor-parallel ranks (threads, or the mpirun processes)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--dcp", o.parallel.dcp, "decode-context-parallel group size (divides --tp)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--dcp-interleave", o.parallel.dcp_interleave,
                  "consecutive tokens per DCP rank (default 1)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--dcp-comm", o.dcp_comm, "DCP attention combine: ag_rs (default) or a2a")
      ->check(CLI::IsMember({"ag_rs", "a2a"}));
  cmd->add_flag("--check-lockstep", o.comm.check_lockstep,
                "verify that every rank issues the same collectives (debugging)");
  cmd->add_option("--comm-timeout", o.comm.timeout_seconds,
                  "seconds a collective may wait before failing (default 60)")
      ->check(CLI::PositiveNumber);
}

// The checkpoint's tokenizer (<model>/tokenizer.json), for --prompt.
std::optional<dsi::Tokenizer> tokenizer_of(const CommonOptions& o) {
  if (!o.text_given) return std::nullopt;
  const auto t0 = std::chrono::steady_clock::now();
  dsi::Tokenizer tok = dsi::Tokenizer::load(o.model_dir + "/tokenizer.json");
  spdlog::info("loaded {}/tokenizer.json ({} tokens) in {:.3f} s", o.model_dir, tok.vocab_size(),
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return tok;
}

// --prompt text is encoded as HF does by default (add_special_tokens: the tokenizer's
// post-processor may add a BOS); --prompt-ids are taken as they are.
std::vector<int32_t> prompt_of(const CommonOptions& o, const std::optional<dsi::Tokenizer>& tok) {
  if (!tok) return parse_ids(o.prompt_ids);
  std::vector<int32_t> ids = tok->encode(o.prompt_text, /*add_special_tokens=*/true);
  if (ids.empty()) fail("--prompt: the prompt is empty (it encodes to no tokens)");
  return ids;
}

// The device a rank computes on: the CPU, or CUDA device `rank` with --device cuda (ranks.h).
dsi::Device device_for(const CommonOptions& o, int rank) {
  if (o.device == "cpu") return dsi::Device::cpu();
#ifdef DSI_WITH_CUDA
  return dsi::rank_cuda_device(rank);
#else
  (void)rank;
  fail("--device {}: this build has no CUDA backend (build the `cuda` preset)", o.device);
#endif
}

std::unique_ptr<dsi::DsaModel> load_model(const CommonOptions& o, const dsi::RankContext& rank) {
  const auto t0 = std::chrono::steady_clock::now();
  // A process rank's GPU is its device communicator's (its node-local rank), not its world rank.
  const int comm_device = rank.comm != nullptr ? rank.comm->device() : -1;
  const dsi::Device device = comm_device >= 0 ? dsi::Device::cuda(comm_device) : device_for(o, rank.tp_rank);
  auto model = dsi::load_rank_model(o.model_dir, rank, dsi::ModelOverrides{o.dense_attention}, device);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const auto& c = model->config();
  if (rank.is_root())
    spdlog::info("loaded {} ({}, {} layers, hidden {}, vocab {}{}) on {} rank{} (tp {}, dcp {}) "
                 "on {} in {:.2f} s",
                 o.model_dir, c.model_type, c.n_layers, c.hidden_size, c.vocab_size,
                 model->has_mtp() ? ", MTP layer" : "", o.parallel.tp,
                 o.parallel.tp == 1 ? "" : "s", o.parallel.tp, o.parallel.dcp, device.str(), s);
  return model;
}

// Runs `work(model)` on every rank of the layout: this process's rank under mpirun (one process
// per rank), else thread ranks in this process. Only the root rank should print.
void on_ranks(const CommonOptions& o, dsi::MpiSessionPtr& mpi,
              const std::function<void(const dsi::DsaModel&)>& work) {
  device_for(o, 0);  // a missing GPU fails here, before any rank starts
  dsi::ParallelConfig cfg = o.parallel;
  cfg.combine = dsi::parse_dcp_combine(o.dcp_comm);
#ifdef DSI_WITH_MPI
  if (mpi && mpi->size() > 1) {
    const dsi::MpiRanks ranks(*mpi, cfg, o.comm, /*cuda=*/o.device == "cuda");
    work(*load_model(o, ranks.context(mpi->rank())));
    return;
  }
#endif
  dsi::run_on_thread_ranks(
      cfg, o.comm, [&](const dsi::RankContext& rank) { work(*load_model(o, rank)); },
      /*cuda=*/o.device == "cuda");
}

int run_generate(const CommonOptions& o, const dsi::GenerationParams& params, bool json,
                 dsi::MpiSessionPtr& mpi) {
  const std::optional<dsi::Tokenizer> tok = tokenizer_of(o);
  const std::vector<int32_t> prompt = prompt_of(o, tok);
  on_ranks(o, mpi, [&](const dsi::DsaModel& model) {
    const dsi::GenerationResult r = dsi::generate(model, prompt, params);
    if (!model.rank().is_root()) return;
    const auto& st = r.stats;
    spdlog::info("prompt {} tokens, prefill {:.3f} s; generated {} tokens, decode {:.2f} tok/s ({})",
                 st.prompt_tokens, st.prefill_seconds, st.generated_tokens,
                 st.decode_tokens_per_second, r.finish_reason);
    const dsi::SpeculativeStats& sp = r.speculative;
    if (params.speculative_tokens > 0)
      spdlog::info("speculative: {} rounds, {} drafted, {} accepted (rate {:.3f}, mean acceptance "
                   "length {:.3f}), per position [{:.3f}]",
                   sp.rounds, sp.drafted, sp.accepted, sp.acceptance_rate(),
                   sp.mean_acceptance_length(), fmt::join(sp.per_position_rates(), ", "));
    if (json) {
      nlohmann::json j;
      j["prompt_ids"] = prompt;
      j["output_ids"] = r.output_ids;
      j["finish_reason"] = r.finish_reason;
      // The generated text; special tokens (an eos that stopped generation) are left out.
      if (tok) j["output_text"] = tok->decode(r.output_ids, /*skip_special_tokens=*/true);
      j["stats"] = {{"prompt_tokens", st.prompt_tokens},
                    {"generated_tokens", st.generated_tokens},
                    {"prefill_seconds", st.prefill_seconds},
                    {"decode_seconds", st.decode_seconds},
                    {"decode_tokens_per_second", st.decode_tokens_per_second}};
      if (params.speculative_tokens > 0)
        j["stats"]["speculative"] = {{"rounds", sp.rounds},
                                     {"drafted", sp.drafted},
                                     {"accepted", sp.accepted},
                                     {"acceptance_rate", sp.acceptance_rate()},
                                     {"mean_acceptance_length", sp.mean_acceptance_length()},
                                     {"per_position_acceptance", sp.per_position_rates()}};
      std::cout << j.dump() << std::endl;
    } else if (tok) {
      std::cout << tok->decode(r.output_ids, /*skip_special_tokens=*/true) << std::endl;
    } else {
      std::string line;
      for (size_t i = 0; i < r.output_ids.size(); ++i) {
        if (i) line += ',';
        line += std::to_string(r.output_ids[i]);
      }
      std::cout << line << std::endl;
    }
  });
  return 0;
}

int run_logits(const CommonOptions& o, const std::string& out, const std::string& mtp_out,
               dsi::MpiSessionPtr& mpi) {
  const std::vector<int32_t> prompt = prompt_of(o, std::nullopt);
  on_ranks(o, mpi, [&](const dsi::DsaModel& model) {
    const dsi::PromptLogits r =
        dsi::prompt_logits(model, prompt, o.prefill_chunk, !mtp_out.empty());
    if (!model.rank().is_root()) return;
    dsi::write_npy(out, r.logits);
    spdlog::info("wrote {} logits {}", out, dsi::shape_str(r.logits.shape()));
    if (!mtp_out.empty()) {
      dsi::write_npy(mtp_out, r.mtp_logits);
      spdlog::info("wrote {} MTP logits {}", mtp_out, dsi::shape_str(r.mtp_logits.shape()));
    }
  });
  return 0;
}

// Held-out evaluation of a text file (encoded with the checkpoint's tokenizer) or of token ids.
int run_perplexity(const CommonOptions& o, const std::string& text_file, int window, bool json,
                   dsi::MpiSessionPtr& mpi) {
  std::vector<int32_t> tokens;
  if (!text_file.empty()) {
    std::ifstream f(text_file, std::ios::binary);
    if (!f.good()) fail("{}: cannot open", text_file);
    std::stringstream ss;
    ss << f.rdbuf();
    tokens = dsi::Tokenizer::load(o.model_dir + "/tokenizer.json").encode(ss.str(), false);
  } else {
    tokens = parse_ids(o.prompt_ids);
  }
  if (tokens.size() < 2) fail("perplexity needs at least 2 tokens, got {}", tokens.size());
  on_ranks(o, mpi, [&](const dsi::DsaModel& model) {
    const dsi::PerplexityResult r = dsi::perplexity(model, tokens, window, model.has_mtp());
    if (!model.rank().is_root()) return;
    spdlog::info("{} tokens in {} windows of {}: cross-entropy {:.6f}, perplexity {:.4f}, top-1 "
                 "accuracy {:.4f}{}",
                 r.tokens_scored, r.windows, window, r.ce, r.ppl, r.top1_acc,
                 model.has_mtp() ? fmt::format("; MTP (t+2) cross-entropy {:.6f}", r.mtp_ce) : "");
    if (json) {
      nlohmann::json j = {{"windows", r.windows},   {"tokens_scored", r.tokens_scored},
                          {"ce", r.ce},             {"ppl", r.ppl},
                          {"top1_acc", r.top1_acc}, {"dense_attention", o.dense_attention}};
      if (model.has_mtp()) {
        j["mtp_tokens_scored"] = r.mtp_tokens_scored;
        j["mtp_ce"] = r.mtp_ce;
        j["mtp_top1_acc"] = r.mtp_top1_acc;
      }
      std::cout << j.dump() << std::endl;
    } else {
      std::cout << fmt::format("perplexity {:.4f} (cross-entropy {:.6f} over {} tokens)", r.ppl, r.ce,
                               r.tokens_scored)
                << std::endl;
    }
  });
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  spdlog::set_default_logger(spdlog::stderr_color_mt("dsinfer"));
  spdlog::set_pattern("[%H:%M:%S.%e] %v");

  CLI::App app{"dsinfer: inference for DeepSeek-Sparse-Attention models (GLM-5.x, DeepSeek-V3.2)"};
  app.require_subcommand(1);

  CommonOptions gen_opts;
  dsi::GenerationParams params;
  bool json = false;
  CLI::App* gen = app.add_subcommand("generate", "generate tokens after a prompt");
  add_common(gen, gen_opts);
  auto* ids_opt = gen->add_option("--prompt-ids", gen_opts.prompt_ids, "prompt token ids: 1,2,3");
  auto* text_opt = gen->add_option("--prompt", gen_opts.prompt_text,
                                   "prompt text, encoded with <model>/tokenizer.json; the output "
                                   "is then printed as text");
  ids_opt->excludes(text_opt);
  gen->add_option("--max-new-tokens", params.max_new_tokens, "tokens to generate (default 16)")
      ->check(CLI::NonNegativeNumber);
  dsi::cli::add_sampling_flags(gen, params.sampling);
  gen->add_flag("--ignore-eos", params.ignore_eos, "do not stop at the config's eos_token_id");
  gen->add_option("--speculative-tokens", params.speculative_tokens,
                  "MTP speculative decoding: draft K tokens per round (0 = off, the default)")
      ->check(CLI::NonNegativeNumber);
  gen->add_flag("--json", json, "print one JSON object (ids and stats) as the last stdout line");
  gen->add_option("--kv-cache-dtype", params.kv_cache_dtype,
                  "auto (default: f32 on the CPU; on a GPU fp8 when the model allows, else bf16), "
                  "f32, bf16 or fp8")
      ->check(CLI::IsMember({"auto", "f32", "bf16", "fp8"}));
  bool no_graphs = false;
  gen->add_flag("--no-cuda-graphs", no_graphs,
                "--device cuda: run every decode step eagerly instead of replaying CUDA graphs");

  CommonOptions log_opts;
  std::string out, mtp_out;
  CLI::App* lg = app.add_subcommand("logits", "teacher-forced logits of a prompt to .npy");
  add_common(lg, log_opts);
  lg->add_option("--prompt-ids", log_opts.prompt_ids, "prompt token ids: 1,2,3")->required();
  lg->add_option("--out", out, "output .npy: float32 [n, vocab]")->required();
  lg->add_option("--mtp-out", mtp_out, "MTP logits .npy: float32 [n - 1, vocab]");

  CommonOptions ppl_opts;
  std::string text_file;
  int window = 512;
  bool ppl_json = false;
  CLI::App* pp = app.add_subcommand("perplexity", "held-out cross-entropy and perplexity");
  add_common(pp, ppl_opts);
  auto* file_opt = pp->add_option("--text-file", text_file, "text, encoded with <model>/tokenizer.json");
  auto* tids_opt = pp->add_option("--token-ids", ppl_opts.prompt_ids, "token ids: 1,2,3");
  file_opt->excludes(tids_opt);
  pp->add_option("--window", window, "tokens per window, each evaluated from scratch (default 512)")
      ->check(CLI::Range(2, 1 << 24));
  pp->add_flag("--json", ppl_json, "print one JSON object as the last stdout line");

#ifdef DSI_WITH_SERVER
  dsi::bench::BenchCommand bench(app);  // dsinfer bench: load a running server
  dsi::cli::ServeCommand serve(app);    // dsinfer serve: the OpenAI-compatible server
  dsi::cli::ChatCommand chat(app);      // dsinfer chat: a conversation on stdin/stdout
#endif

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
#ifdef DSI_WITH_CUDA
  // Before CUDA starts: ranks' collectives may be kernels that wait for each other (device.h).
  dsi::cuda::prepare_for_spinning_kernels();
#endif
  dsi::MpiSessionPtr mpi;
  try {
#ifdef DSI_WITH_MPI
    if (launched_by_mpi()) mpi = std::make_unique<dsi::MpiSession>(&argc, &argv);
#else
    if (launched_by_mpi()) fail("started by mpirun, but this build has no MPI support");
#endif
#ifdef DSI_WITH_SERVER
#ifdef DSI_WITH_MPI
    if (serve.parsed()) return serve.run(mpi.get());
#else
    if (serve.parsed()) return serve.run();
#endif
    if ((chat.parsed() || bench.parsed()) && mpi && mpi->size() > 1)
      fail("chat and bench run as one process (under mpirun, run `serve`)");
    if (chat.parsed()) return chat.run();
    if (bench.parsed()) return bench.run();
#endif
    if (gen->parsed()) {
      if (ids_opt->count() == 0 && text_opt->count() == 0)
        fail("generate needs --prompt-ids or --prompt");
      params.prefill_chunk = gen_opts.prefill_chunk;
      params.cuda_graphs = !no_graphs;
      gen_opts.text_given = text_opt->count() > 0;
      return run_generate(gen_opts, params, json, mpi);
    }
    if (pp->parsed()) {
      if (file_opt->count() == 0 && tids_opt->count() == 0)
        fail("perplexity needs --text-file or --token-ids");
      return run_perplexity(ppl_opts, text_file, window, ppl_json, mpi);
    }
    return run_logits(log_opts, out, mtp_out, mpi);
  } catch (const std::exception& e) {
    if (mpi && mpi->size() > 1)
      std::fprintf(stderr, "error: rank %d: %s\n", mpi->rank(), e.what());
    else
      std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
