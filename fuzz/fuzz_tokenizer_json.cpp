// Fuzzes tokenizer.json loading (Tokenizer::from_json_text): a fuzzed file must load or be refused
// with a dsi::Error; a loaded tokenizer must then encode and decode a fixed text without failing.
#include <cstddef>
#include <cstdio>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_util.h"
#include "text/tokenizer.h"
#include "text/utf8.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view json_text(reinterpret_cast<const char*>(data), size);
  dsi::fuzz::expect_only_dsi_errors("Tokenizer::from_json_text", [&] {
    const dsi::Tokenizer tok = dsi::Tokenizer::from_json_text(json_text, "fuzz/tokenizer.json");
    const std::vector<int32_t> ids = tok.encode("In the beginning God created\n the 12 <sop>\xff", true);
    for (int32_t id : ids) {
      if (id < 0 || id >= tok.vocab_size())
        std::fprintf(stderr, "encode gave id %d, outside [0, vocab_size = %d)\n", id, tok.vocab_size());
      DSI_FUZZ_ASSERT(id >= 0 && id < tok.vocab_size());
    }
    DSI_FUZZ_ASSERT(dsi::utf8::is_valid(tok.decode(ids)));
  });
  return 0;
}
