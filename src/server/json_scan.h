// The byte-level pieces of JSON text (RFC 8259) that the recognizers of constraints.h and
// json_schema.h share: a string's contents after its opening quote, and a number.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

namespace dsi::server {

inline bool json_space(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
inline bool json_digit(unsigned char c) { return c >= '0' && c <= '9'; }

// UTF-8 a byte at a time: no overlong forms, no surrogates, nothing past U+10FFFF.
struct Utf8Scan {
  enum class Step : uint8_t { kReject, kMore, kChar };  // kChar: a character ended, its value cp
  Step step(unsigned char c);
  bool at_rest() const { return left == 0; }
  // A character half-way: the code points it can still become.
  std::pair<uint32_t, uint32_t> pending() const;

  uint8_t left = 0;  // continuation bytes still to come
  uint8_t lead = 0;  // the lead byte, until the first continuation byte (which it limits)
  uint32_t cp = 0;   // the bits so far, or the character that ended
};

// A string after its opening quote: UTF-8 checked (no overlong forms, no surrogates), control
// characters only escaped, \u escapes of surrogates only as a high-low pair (what strict parsers read).
struct JsonStringScan {
  enum class Step : uint8_t { kReject, kMore, kClosed };
  Step step(unsigned char c);
  // A character (code point) began with the last byte taken: a byte that starts one, an escape's
  // backslash, but not a low surrogate's backslash after a high one's escape.
  bool char_started() const { return started_; }
  bool escaping() const { return escape_; }
  // A character (code point) ended with the last byte taken; code_point() is its value.
  bool char_ended() const { return ended_; }
  uint32_t code_point() const { return cp; }
  // A character half-way (not at_rest()): the code points it can still become, as up to three
  // ranges [first, second]; returns how many.
  size_t pending(std::pair<uint32_t, uint32_t> out[3]) const;
  // Between characters, no escape open and no surrogate pair half-way: where json_string_text()
  // bytes fit whatever came before.
  bool at_rest() const { return utf8.at_rest() && !escape_ && !want_low; }
  void key(std::string& out) const;  // appends the state's bytes (for signatures)
  Step continue_char(unsigned char c);  // a byte of a character written as itself

  Utf8Scan utf8;          // a character written as itself
  bool escape_ = false;   // after a backslash
  uint8_t hex_left = 0;   // hex digits of \uXXXX still to come
  bool first_d = false;   // this \uXXXX starts with D (a surrogate's range)
  bool high = false;      // this \uXXXX is a high surrogate
  bool want_low = false;  // a high surrogate's \uXXXX came: its low one must follow
  bool started_ = false;
  bool ended_ = false;
  uint16_t hex = 0;  // this \uXXXX's digits so far
  uint32_t cp = 0;   // the character that ended (an escape's: in progress, a pair's high surrogate)
};

// Bytes that a string at rest takes as they are and stays at rest after: whole UTF-8 characters,
// none of them a control character, a quote or a backslash (most tokens of a vocabulary).
bool json_string_text(std::string_view bytes);

// A number: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?. kEnded: the byte is not part of it
// and what came is a whole number (the byte belongs to what follows).
struct JsonNumberScan {
  enum class Step : uint8_t { kReject, kMore, kEnded };
  enum class At : uint8_t { kMinus, kZero, kInt, kDot, kFrac, kExp, kExpSign, kExpInt };
  static bool starts(unsigned char c) { return c == '-' || json_digit(c); }
  // first: the number's first byte (starts(first)); integer: no fraction, no exponent.
  explicit JsonNumberScan(unsigned char first = '0', bool integer = false)
      : at(first == '-' ? At::kMinus : first == '0' ? At::kZero : At::kInt), integer(integer) {}
  Step step(unsigned char c);
  bool whole() const { return at == At::kZero || at == At::kInt || at == At::kFrac || at == At::kExpInt; }

  At at;
  bool integer;
};

}  // namespace dsi::server
