// Fuzzes config.json parsing: bytes -> JSON (as load_config parses it) -> parse_config, which must
// return a consistent ModelConfig or throw dsi::Error naming the field.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include <nlohmann/json.hpp>

#include "fuzz_util.h"
#include "model/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  // load_config's parse: no exceptions, a discarded value for invalid JSON.
  const auto j = nlohmann::json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;
  dsi::fuzz::expect_only_dsi_errors("parse_config", [&] {
    const dsi::ModelConfig c = dsi::parse_config(j, "fuzz/config.json");
    // What the model code relies on once a config is accepted.
    DSI_FUZZ_ASSERT(c.n_layers >= 1);
    DSI_FUZZ_ASSERT(c.indexer_full.size() == size_t(c.n_layers));
    DSI_FUZZ_ASSERT(c.layer_is_moe.size() == size_t(c.n_layers));
    DSI_FUZZ_ASSERT(c.vocab_size > 0 && c.hidden_size > 0 && c.n_heads > 0);
    DSI_FUZZ_ASSERT(c.qk_head_dim() > 0);
    const double scale = c.attn_softmax_scale();
    (void)scale;
  });
  return 0;
}
