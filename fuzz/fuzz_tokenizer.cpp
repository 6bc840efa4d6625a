// Fuzzes the tokenizer on the bundled model's tokenizer.json (models/kjv-dsa): encode arbitrary
// bytes, decode the ids back, and decode arbitrary ids. Checks the documented contracts:
// ids lie in the vocabulary, decode(encode(s)) == to_valid(s) (byte-level BPE without a normalizer
// is lossless), and the stream decoder fed one id at a time equals decode().
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_util.h"
#include "text/tokenizer.h"
#include "text/utf8.h"

namespace {

const dsi::Tokenizer& bundled() {
  static const dsi::Tokenizer tok =
      dsi::Tokenizer::load(std::string(DSI_SOURCE_DIR) + "/models/kjv-dsa/tokenizer.json");
  return tok;
}

std::string stream_decode(const dsi::Tokenizer& tok, const std::vector<int32_t>& ids, bool skip) {
  auto d = tok.stream_decoder(skip);
  std::string out;
  for (int32_t id : ids) {
    const std::string piece = d.push(id);
    DSI_FUZZ_ASSERT(dsi::utf8::is_valid(piece));  // never an incomplete UTF-8 sequence
    out += piece;
  }
  out += d.flush();
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const dsi::Tokenizer& tok = bundled();
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  dsi::fuzz::expect_only_dsi_errors("Tokenizer", [&] {
    if ((mode & 3) != 3) {
      // Text -> ids -> text.
      const bool add_special = mode & 1;
      const std::vector<int32_t> ids = tok.encode(text, add_special);
      for (int32_t id : ids) DSI_FUZZ_ASSERT(id >= 0 && id < tok.vocab_size());
      const std::string back = tok.decode(ids);
      if (!add_special) DSI_FUZZ_ASSERT(back == dsi::utf8::to_valid(text));
      DSI_FUZZ_ASSERT(stream_decode(tok, ids, mode & 4) == tok.decode(ids, mode & 4));
    } else {
      // Arbitrary ids (negative, past the vocabulary, special) -> text.
      std::vector<int32_t> ids(text.size() / 4);
      if (!ids.empty()) std::memcpy(ids.data(), text.data(), ids.size() * 4);
      for (int32_t& id : ids)  // mostly in range, so the decoder's byte paths are reached
        if (mode & 8) id = int32_t(uint32_t(id) % uint32_t(tok.vocab_size() + 16)) - 8;
      const bool skip = mode & 4;
      const std::string out = tok.decode(ids, skip);
      DSI_FUZZ_ASSERT(dsi::utf8::is_valid(out));
      DSI_FUZZ_ASSERT(stream_decode(tok, ids, skip) == out);
    }
  });
  return 0;
}
