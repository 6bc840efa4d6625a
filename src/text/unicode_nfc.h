// Unicode Normalization Form C (UAX #15): canonical decomposition, canonical ordering, canonical
// composition; HF tokenizers' "NFC" normalizer. Tables: unicode_nfc_data.inc (Unicode 14.0,
// generated from Python's unicodedata by gen_unicode_nfc.py).
#pragma once

#include <string>
#include <string_view>

namespace dsi {

// NFC of valid UTF-8 text.
std::string nfc(std::string_view text);

}  // namespace dsi
