// The sampling flags; see sampling_flags.h.
#include "sampling_flags.h"

#include <CLI/CLI.hpp>

namespace dsi::cli {

void add_sampling_flags(CLI::App* cmd, SamplingParams& sp) {
  cmd->add_option("--temperature", sp.temperature, "0 = greedy (default)")->check(CLI::NonNegativeNumber);
  cmd->add_option("--top-p", sp.top_p, "nucleus mass in (0, 1] (default 1)")->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--top-k", sp.top_k, "keep the k most likely tokens (default 0: all)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--min-p", sp.min_p,
                  "drop tokens below min-p x the most likely one's probability (default 0)")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--presence-penalty", sp.presence_penalty,
                  "subtracted from the logit of every token already generated, in [-2, 2] (default 0)")
      ->check(CLI::Range(-2.0, 2.0));
  cmd->add_option("--frequency-penalty", sp.frequency_penalty,
                  "times how often a token was generated, subtracted from its logit, in [-2, 2] "
                  "(default 0)")
      ->check(CLI::Range(-2.0, 2.0));
  cmd->add_option("--repetition-penalty", sp.repetition_penalty,
                  "divides positive (multiplies negative) logits of tokens in the prompt or output, "
                  "in (0, 10] (default 1: none)")
      ->check(CLI::Range(1e-6, 10.0));
  cmd->add_option("--seed", sp.seed, "random seed for sampling (default 0)");
}

}  // namespace dsi::cli
