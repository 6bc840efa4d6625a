// Parallel layout; see parallel.h.
#include "runtime/parallel.h"

#include <algorithm>

namespace dsi {

void ParallelConfig::validate(const ModelConfig& c) const {
  DSI_CHECK(tp >= 1 && dcp >= 1 && dcp_interleave >= 1,
            "parallel layout: tp = {}, dcp = {}, dcp interleave = {} must all be >= 1", tp, dcp,
            dcp_interleave);
  DSI_CHECK(tp % dcp == 0, "parallel layout: dcp = {} must divide tp = {}", dcp, tp);
  auto divides = [&](int64_t n, const char* what) {
    DSI_CHECK(n % tp == 0, "parallel layout: tp = {} must divide {} = {}", tp, what, n);
  };
  divides(c.n_heads, "num_attention_heads");
  divides(c.intermediate_size, "intermediate_size");
  divides(c.shared_intermediate_size(), "the shared expert's intermediate size");
}

DcpCombine parse_dcp_combine(const std::string& name) {
  if (name == "ag_rs") return DcpCombine::kAgRs;
  if (name == "a2a") return DcpCombine::kA2a;
  fail("unknown DCP combine '{}' (expected ag_rs or a2a)", name);
}

int64_t DcpLayout::local_len(int64_t L) const {
  const int64_t base = (L / interleave / size) * interleave;
  return base + std::clamp<int64_t>(L - base * size - int64_t(rank) * interleave, 0, interleave);
}

RankContext RankContext::make(const ParallelConfig& cfg, int rank, Communicator* comm) {
  DSI_CHECK(rank >= 0 && rank < cfg.tp, "rank {} outside the {} tensor-parallel ranks", rank, cfg.tp);
  DSI_CHECK(cfg.tp == 1 || comm != nullptr, "{} ranks need a communicator", cfg.tp);
  RankContext r;
  r.cfg = cfg;
  r.tp_rank = rank;
  r.comm = comm;
  r.tp_group = Group{"tp", 0, cfg.tp};
  const int g = rank / cfg.dcp;
  r.dcp_group = Group{"dcp" + std::to_string(g), g * cfg.dcp, cfg.dcp};
  r.dcp = DcpLayout{cfg.dcp, rank % cfg.dcp, cfg.dcp_interleave};
  return r;
}

void RankContext::all_reduce_tp(Tensor& partial) const {
  if (cfg.tp > 1) comm->all_reduce(tp_group, partial);
}

}  // namespace dsi
