// JSON text's strings and numbers, byte by byte; see json_scan.h.
#include "server/json_scan.h"

#include <algorithm>
#include <string_view>

namespace dsi::server {

namespace {
bool is_hex(unsigned char c) { return json_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }
}  // namespace

JsonStringScan::Step JsonStringScan::step(unsigned char c) {
  started_ = false;
  ended_ = false;
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
      hex = uint16_t(hex << 4 | v);
      if (--hex_left == 0) {
        escape_ = false;
        const bool low = want_low;
        want_low = !want_low && high;
        high = false;
        if (want_low) {
          cp = hex;  // a high surrogate: the character ends with its low one
        } else {
          cp = low ? 0x10000 + ((cp - 0xD800) << 10) + (hex - 0xDC00u) : hex;
          ended_ = true;
        }
      }
      return Step::kMore;
    }
    if (want_low && c != 'u') return Step::kReject;
    if (c == 'u') {
      hex_left = 4;
      hex = 0;
      return Step::kMore;
    }
    const size_t e = std::string_view("\"\\/bfnrt").find(char(c));
    if (e == std::string_view::npos) return Step::kReject;
    escape_ = false;
    cp = static_cast<unsigned char>("\"\\/\b\f\n\r\t"[e]);
    ended_ = true;
    return Step::kMore;
  }
  if (!utf8.at_rest()) return continue_char(c);
  if (want_low && c != '\\') return Step::kReject;  // a high surrogate's low one must follow
  if (c == '"') return Step::kClosed;
  if (c == '\\') {
    escape_ = true;
    started_ = !want_low;
    return Step::kMore;
  }
  if (c < 0x20) return Step::kReject;  // control characters must be escaped
  started_ = true;
  return continue_char(c);
}

JsonStringScan::Step JsonStringScan::continue_char(unsigned char c) {
  switch (utf8.step(c)) {
    case Utf8Scan::Step::kReject:
      return Step::kReject;
    case Utf8Scan::Step::kChar:
      cp = utf8.cp;
      ended_ = true;
      break;
    case Utf8Scan::Step::kMore:
      break;
  }
  return Step::kMore;
}

Utf8Scan::Step Utf8Scan::step(unsigned char c) {
  if (left > 0) {  // a continuation byte, within the lead byte's range (no overlongs, surrogates)
    unsigned char lo = 0x80, hi = 0xBF;
    if (lead == 0xE0) lo = 0xA0;
    if (lead == 0xED) hi = 0x9F;
    if (lead == 0xF0) lo = 0x90;
    if (lead == 0xF4) hi = 0x8F;
    if (c < lo || c > hi) return Step::kReject;
    lead = 0;  // the range applies to the first continuation byte only
    cp = cp << 6 | (c & 0x3Fu);
    return --left == 0 ? Step::kChar : Step::kMore;
  }
  if (c < 0x80) {
    cp = c;
    return Step::kChar;
  }
  if (c >= 0xC2 && c <= 0xDF) left = 1, cp = c & 0x1Fu;
  else if (c >= 0xE0 && c <= 0xEF) left = 2, cp = c & 0x0Fu;
  else if (c >= 0xF0 && c <= 0xF4) left = 3, cp = c & 0x07u;
  else return Step::kReject;
  lead = c;
  return Step::kMore;
}

std::pair<uint32_t, uint32_t> Utf8Scan::pending() const {  // the bits so far, then any continuation bits
  uint32_t lo = cp << (6 * left);
  uint32_t hi = std::min<uint32_t>(lo | ((1u << (6 * left)) - 1), 0x10FFFF);
  if (lead != 0) {  // only the lead byte: no overlong form, no surrogate
    lo = std::max<uint32_t>(lo, left == 1 ? 0x80 : left == 2 ? 0x800 : 0x10000);
    if (lead == 0xED) hi = 0xD7FF;
  }
  return {lo, hi};
}

size_t JsonStringScan::pending(std::pair<uint32_t, uint32_t> out[3]) const {
  if (!utf8.at_rest()) {
    out[0] = utf8.pending();
    return 1;
  }
  // A \uXXXX's digits so far (all four to come before its 'u').
  const bool digits = escape_ && hex_left > 0;
  const uint32_t lo = digits ? uint32_t(hex) << (4 * hex_left) : 0;
  const uint32_t hi = digits ? lo | ((1u << (4 * hex_left)) - 1) : 0xFFFF;
  if (want_low) {  // the pair's low half: its range within DC00-DFFF, after the high half's
    const uint32_t base = 0x10000 + ((cp - 0xD800) << 10);
    const uint32_t a = std::max<uint32_t>(lo, 0xDC00), b = std::min<uint32_t>(hi, 0xDFFF);
    if (a > b) return 0;
    out[0] = {base + a - 0xDC00, base + b - 0xDC00};
    return 1;
  }
  if (escape_ && !digits) {  // right after a backslash: any character
    out[0] = {0, 0x10FFFF};
    return 1;
  }
  size_t n = 0;
  if (lo < 0xD800) out[n++] = {lo, std::min<uint32_t>(hi, 0xD7FF)};
  if (hi > 0xDFFF) out[n++] = {std::max<uint32_t>(lo, 0xE000), hi};
  if (lo <= 0xDBFF && hi >= 0xD800)  // high surrogates: the characters their pairs make
    out[n++] = {0x10000 + ((std::max<uint32_t>(lo, 0xD800) - 0xD800) << 10),
                0x10000 + ((std::min<uint32_t>(hi, 0xDBFF) - 0xD800) << 10) + 0x3FF};
  return n;
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
  for (uint8_t b : {utf8.left, utf8.lead, uint8_t(escape_), hex_left, uint8_t(first_d), uint8_t(high), uint8_t(want_low)})
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
