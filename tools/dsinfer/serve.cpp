// `dsinfer serve`: EngineOptions from the command line, Engine::start, then the server of
// src/server/ until SIGINT / SIGTERM. Also the engine flags `dsinfer chat` shares.
#include "serve.h"

#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include <cctype>
#include <csignal>

#include "dsinfer/engine.h"
#include "dsinfer/error.h"
#include "engine_flags.h"
#include "server/serve.h"

#ifdef DSI_WITH_MPI
#include "comm/mpi_comm.h"
#include "runtime/engine_processes.h"
#endif

namespace dsi::cli {

int64_t parse_bytes(const std::string& text) {
  // "1073741824", "512M", "2G", "2GiB", "0.5G"
  size_t end = 0;
  double v = 0;
  try {
    v = std::stod(text, &end);
  } catch (const std::exception&) {
    fail("--kv-cache-memory: '{}' is not a size (bytes, or a number with K, M, G or T)", text);
  }
  std::string unit = text.substr(end);
  for (auto& c : unit) c = char(std::toupper(static_cast<unsigned char>(c)));
  if (unit.size() > 1 && unit.back() == 'B') unit.pop_back();
  if (unit.size() > 1 && unit.back() == 'I') unit.pop_back();
  double scale = 1;
  if (unit == "K") scale = 1024.0;
  else if (unit == "M") scale = 1024.0 * 1024;
  else if (unit == "G") scale = 1024.0 * 1024 * 1024;
  else if (unit == "T") scale = 1024.0 * 1024 * 1024 * 1024;
  else if (!unit.empty() && unit != "B")
    fail("--kv-cache-memory: '{}' has an unknown unit (use K, M, G or T)", text);
  if (!(v >= 0) || v * scale > 9e18) fail("--kv-cache-memory: '{}' is out of range", text);
  return int64_t(v * scale);
}

void add_engine_flags(CLI::App* cmd, EngineFlags& f) {
  f.engine.model_dir = DSI_DEFAULT_MODEL_DIR;
  cmd->add_option("--model", f.engine.model_dir,
                  "checkpoint directory (config.json, safetensors, tokenizer.json, chat template); "
                  "default: the bundled model");
  cmd->add_option("--device", f.engine.device, "compute device: cpu (default) or cuda")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_option("--tp", f.engine.tp, "tensor-parallel ranks (threads, or the mpirun processes)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--dcp", f.engine.dcp, "decode-context-parallel group size (divides --tp)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--dcp-interleave", f.engine.dcp_interleave, "consecutive tokens per DCP rank")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--dcp-comm", f.engine.dcp_comm, "DCP attention combine: ag_rs (default) or a2a")
      ->check(CLI::IsMember({"ag_rs", "a2a"}));
  cmd->add_flag("--check-lockstep", f.engine.check_lockstep,
                "verify that every rank issues the same collectives (debugging)");
  cmd->add_option("--comm-timeout", f.engine.comm_timeout_seconds,
                  "seconds a collective may wait before failing (default 60)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--speculative-tokens", f.engine.speculative_tokens,
                  "MTP speculative decoding: drafts per round (0 = off)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--max-num-seqs", f.engine.max_num_seqs, "requests decoded together (default 16)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--max-num-batched-tokens", f.engine.max_num_batched_tokens,
                  "tokens per engine step (default 2048)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--max-model-len", f.engine.max_model_len,
                  "prompt + output tokens per request (default: the model's limit)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--kv-cache-memory", f.kv_cache_memory,
                  "bytes for the KV pages per rank, e.g. 2G (default: a fraction of free memory)");
  cmd->add_option("--kv-cache-dtype", f.engine.kv_cache_dtype,
                  "auto (default: f32 on the CPU; on a GPU fp8 when the model allows, else bf16), "
                  "f32, bf16 (half the bytes) or fp8 (656-byte MLA entries, e4m3 indexer keys; "
                  "needs kv_lora_rank 512 and qk_rope_head_dim 64)")
      ->check(CLI::IsMember({"auto", "f32", "bf16", "fp8"}));
  cmd->add_flag("--no-cuda-graphs", f.no_cuda_graphs,
                "--device cuda: run decode steps eagerly instead of replaying CUDA graphs");
  cmd->add_flag("--no-prefix-caching", f.no_prefix_caching,
                "compute every prompt in full instead of taking cached blocks of earlier requests");
}

std::unique_ptr<Engine> start_engine(const EngineFlags& f, MpiSession* mpi) {
  EngineOptions o = f.engine;
  if (!f.kv_cache_memory.empty()) o.kv_cache_memory = parse_bytes(f.kv_cache_memory);
  o.cuda_graphs = !f.no_cuda_graphs;
  o.prefix_caching = !f.no_prefix_caching;
#ifdef DSI_WITH_MPI
  if (mpi != nullptr && mpi->size() > 1) {
    // mpirun passes a SIGINT / SIGTERM on to every process: rank 0's server stops on it and stops
    // the engine, which ends the other processes' step loops. They must not die of it first.
    if (mpi->rank() != 0) {
      signal(SIGINT, SIG_IGN);
      signal(SIGTERM, SIG_IGN);
    }
    return start_engine_processes(o, *mpi);
  }
#else
  (void)mpi;
#endif
  return Engine::start(o);
}

struct ServeOptions {
  EngineFlags flags;
  server::HttpServerOptions http;
  server::ServiceOptions service;
};

ServeCommand::ServeCommand(CLI::App& app) : options_(std::make_unique<ServeOptions>()) {
  sub_ = app.add_subcommand("serve", "serve the model over an OpenAI-compatible HTTP API");
  add_engine_flags(sub_, options_->flags);
  options_->http.port = 8000;
  sub_->add_option("--host", options_->http.host, "address to listen on (default 127.0.0.1)");
  sub_->add_option("--port", options_->http.port, "port (default 8000; 0 = any free port)")
      ->check(CLI::Range(0, 65535));
  sub_->add_option("--served-model-name", options_->service.served_model_name,
                   "the model's name in the API (default: the model directory's name)");
  sub_->add_option("--reasoning-parser", options_->service.reasoning_parser,
                   "chat answers' <think> blocks as reasoning_content: think, none, or auto (default: "
                   "think when the chat template writes </think>)")
      ->check(CLI::IsMember({"auto", "think", "none"}));
  sub_->add_option("--tool-call-parser", options_->service.tool_call_parser,
                   "chat answers' tool calls as tool_calls: glm (GLM-4.5 .. GLM-5), dsml (DeepSeek-V3.2), "
                   "deepseek_v3 (DeepSeek-V3.1, V3.2-Exp), none, or auto (default: the format the chat "
                   "template writes)")
      ->check(CLI::IsMember({"auto", "glm", "dsml", "deepseek_v3", "none"}));
  sub_->add_option("--http-threads", options_->http.threads,
                   "connections served at once (default 64; each streaming client holds one)")
      ->check(CLI::Range(2, 4096));
}

ServeCommand::~ServeCommand() = default;
bool ServeCommand::parsed() const { return sub_->parsed(); }

int ServeCommand::run(MpiSession* mpi) const {
  const ServeOptions& o = *options_;
  Tokenizer tokenizer = Tokenizer::load(o.flags.engine.model_dir + "/tokenizer.json");
  std::optional<ChatTemplate> chat_template = server::load_chat_template(o.flags.engine.model_dir);
  std::unique_ptr<Engine> engine = start_engine(o.flags, mpi);
  if (!engine) return 0;  // a process of rank > 0: it ran rank 0's engine steps until they stopped
  const int rc = server::serve(*engine, std::move(tokenizer), std::move(chat_template), o.http, o.service);
  engine.reset();  // finishes what is left with "abort", joins the engine thread
  return rc;
}

}  // namespace dsi::cli
