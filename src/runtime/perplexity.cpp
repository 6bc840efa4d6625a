// Held-out perplexity; see perplexity.h.
#include "runtime/perplexity.h"

#include <algorithm>
#include <cmath>

#include "runtime/generator.h"

namespace dsi {

namespace {
struct Scores {
  double nll = 0.0;
  int64_t n = 0, correct = 0;
};

// Adds -log softmax(row)[target] (in double) for rows [0, rows) of logits against targets.
void score(const Tensor& logits, const int32_t* targets, int64_t rows, Scores& s) {
  const int64_t vocab = logits.dim(1);
  for (int64_t i = 0; i < rows; ++i) {
    const float* l = logits.f32() + i * vocab;
    const float m = *std::max_element(l, l + vocab);
    double sum = 0.0;
    int64_t best = 0;
    for (int64_t v = 0; v < vocab; ++v) {
      sum += std::exp(double(l[v]) - double(m));
      if (l[v] > l[best]) best = v;
    }
    s.nll += double(m) + std::log(sum) - double(l[targets[i]]);
    s.correct += best == targets[i];
    ++s.n;
  }
}
}  // namespace

PerplexityResult perplexity(const DsaModel& model, const std::vector<int32_t>& tokens, int window,
                            bool with_mtp) {
  DSI_CHECK(window >= 2, "perplexity: window {} must be >= 2", window);
  DSI_CHECK(tokens.size() >= 2, "perplexity: needs at least 2 tokens");
  Scores main, mtp;
  PerplexityResult r;
  for (size_t b = 0; b < tokens.size(); b += size_t(window)) {
    const size_t e = std::min(tokens.size(), b + size_t(window));
    if (e - b < 2) break;
    const std::vector<int32_t> w(tokens.begin() + long(b), tokens.begin() + long(e));
    const int64_t n = int64_t(w.size());
    const PromptLogits pl = prompt_logits(model, w, 0, with_mtp);
    score(pl.logits, w.data() + 1, n - 1, main);
    if (with_mtp && n >= 3) score(pl.mtp_logits, w.data() + 2, n - 2, mtp);
    ++r.windows;
  }
  r.tokens_scored = main.n;
  r.ce = main.nll / double(main.n);
  r.ppl = std::exp(r.ce);
  r.top1_acc = double(main.correct) / double(main.n);
  if (mtp.n > 0) {
    r.mtp_tokens_scored = mtp.n;
    r.mtp_ce = mtp.nll / double(mtp.n);
    r.mtp_top1_acc = double(mtp.correct) / double(mtp.n);
  }
  return r;
}

}  // namespace dsi
