// JSON text's strings and numbers, byte by byte; see json_scan.h.
#include "server/json_scan.h"

#include <string_view>

namespace dsi::server {

namespace {
bool is_hex(unsigned char c) { return json_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }
}  // namespace

JsonStringScan::Step JsonStringScan::step(unsigned char c) {
  started_ = false;
  if (escape_) {
    if (hex_left > 0) {  // surrogates only in pairs, high then low
      if (!is_hex(c)) return Step::kReject;
      const int v = json_digit(c) ? c - '0' : (c | 0x20) - 'a' + 10;
      if (hex_left == 4) {
        first_d = v == 0xD;
        if (want_low && !first_d) return Step::kReject;
      } else if (hex_left == 3 && first_d) {
        if (want_low ? v < 0xC : v >= 0xC) return Step::kReject;
        high = !want_low && v >= 0x8;
      }
      if (--hex_left == 0) {
        escape_ = false;
        want_low = !want_low && high;
        high = false;
      }
      return Step::kMore;
    }
    if (want_low && c != 'u') return Step::kReject;
    if (c == 'u') {
      hex_left = 4;
      return Step::kMore;
    }
    if (std::string_view("\"\\/bfnrt").find(char(c)) == std::string_view::npos) return Step::kReject;
    escape_ = false;
    return Step::kMore;
  }
  if (utf8_left > 0) {  // a continuation byte, within the lead byte's range (no overlongs, surrogates)
    unsigned char lo = 0x80, hi = 0xBF;
    if (utf8_lead == 0xE0) lo = 0xA0;
    if (utf8_lead == 0xED) hi = 0x9F;
    if (utf8_lead == 0xF0) lo = 0x90;
    if (utf8_lead == 0xF4) hi = 0x8F;
    if (c < lo || c > hi) return Step::kReject;
    utf8_lead = 0;  // the range applies to the first continuation byte only
    --utf8_left;
    return Step::kMore;
  }
  if (want_low && c != '\\') return Step::kReject;  // a high surrogate's low one must follow
  if (c == '"') return Step::kClosed;
  if (c == '\\') {
    escape_ = true;
    started_ = !want_low;
    return Step::kMore;
  }
  if (c < 0x20) return Step::kReject;  // control characters must be escaped
  started_ = true;
  if (c < 0x80) return Step::kMore;
  if (c >= 0xC2 && c <= 0xDF) utf8_left = 1;
  else if (c >= 0xE0 && c <= 0xEF) utf8_left = 2;
  else if (c >= 0xF0 && c <= 0xF4) utf8_left = 3;
  else return Step::kReject;
  utf8_lead = c;
  return Step::kMore;
}

bool json_string_text(std::string_view bytes) {
  JsonStringScan scan;
  for (char c : bytes) {
    const unsigned char b = static_cast<unsigned char>(c);
    if (b == '\\' || scan.step(b) != JsonStringScan::Step::kMore) return false;
  }
  return scan.at_rest();
}

void JsonStringScan::key(std::string& out) const {
  for (uint8_t b : {utf8_left, utf8_lead, uint8_t(escape_), hex_left, uint8_t(first_d), uint8_t(high), uint8_t(want_low)})
    out += char(b);
}

JsonNumberScan::Step JsonNumberScan::step(unsigned char c) {
  const bool digit = json_digit(c);
  switch (at) {
    case At::kMinus:
      if (!digit) return Step::kReject;
      at = c == '0' ? At::kZero : At::kInt;
      return Step::kMore;
    case At::kZero:
    case At::kInt:
      if (digit && at == At::kInt) return Step::kMore;
      if (integer) break;
      if (c == '.') return at = At::kDot, Step::kMore;
      if (c == 'e' || c == 'E') return at = At::kExp, Step::kMore;
      break;
    case At::kDot:
      if (!digit) return Step::kReject;
      at = At::kFrac;
      return Step::kMore;
    case At::kFrac:
      if (digit) return Step::kMore;
      if (c == 'e' || c == 'E') return at = At::kExp, Step::kMore;
      break;
    case At::kExp:
      if (c == '+' || c == '-') return at = At::kExpSign, Step::kMore;
      [[fallthrough]];
    case At::kExpSign:
      if (!digit) return Step::kReject;
      at = At::kExpInt;
      return Step::kMore;
    case At::kExpInt:
      if (digit) return Step::kMore;
      break;
  }
  return Step::kEnded;
}

}  // namespace dsi::server
