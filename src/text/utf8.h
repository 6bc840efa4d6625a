// UTF-8 helpers for the tokenizer: validation, the lossy decoding Python's
// bytes.decode('utf-8', 'replace') and Rust's String::from_utf8_lossy perform (one U+FFFD per
// maximal ill-formed subpart, Unicode 15 section 3.9 "U+FFFD substitution of maximal subparts"),
// an incremental form of it that holds back incomplete sequences, and Unicode White_Space.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace dsi::utf8 {

inline constexpr char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD

// The result of looking at one sequence that starts at some byte.
struct Step {
  size_t len = 0;          // bytes consumed: the code point, or the maximal ill-formed subpart
  bool valid = false;      // a whole well-formed code point
  bool truncated = false;  // well-formed so far but the input ended before the sequence did
};
Step next(std::string_view s, size_t i);

bool is_valid(std::string_view s);
// s with every maximal ill-formed subpart replaced by U+FFFD (identity for valid UTF-8).
std::string to_valid(std::string_view s);

// Decodes the code point at s[i] of a valid string and advances i past it.
char32_t decode(std::string_view s, size_t& i);
void append(std::string& out, char32_t cp);
inline size_t seq_len(unsigned char lead) {
  return lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
}

// s as error messages quote it: control characters escaped (\n, \r, \t, \xHH), so a message that
// quotes text from a file or a request stays one line (dsi::Error's promise).
std::string shown(std::string_view s);

// Rust's char::is_whitespace: the Unicode White_Space property.
bool is_whitespace(char32_t c);

// Lossy decoding of a byte stream that arrives in pieces: push() returns the valid UTF-8 that is
// now certain (ill-formed subparts as U+FFFD), holding back a trailing sequence that may still
// complete; flush() ends the stream. The concatenated output equals to_valid(all bytes).
class LossyStream {
 public:
  std::string push(std::string_view bytes);
  std::string flush();
  bool pending() const { return !held_.empty(); }

 private:
  std::string held_;
};

}  // namespace dsi::utf8
