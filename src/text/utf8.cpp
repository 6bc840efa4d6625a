// UTF-8 validation and lossy decoding; see utf8.h. The byte ranges are Unicode's table 3-7
// (well-formed UTF-8 byte sequences).
#include "text/utf8.h"

#include <fmt/format.h>

namespace dsi::utf8 {

Step next(std::string_view s, size_t i) {
  const auto at = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const unsigned char b0 = at(0);
  if (b0 < 0x80) return {1, true, false};
  size_t n = 0;                    // continuation bytes expected
  unsigned char lo = 0x80, hi = 0xBF;  // range of the first continuation byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    n = 1;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    n = 2;
    if (b0 == 0xE0) lo = 0xA0;  // no overlong forms
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    n = 3;
    if (b0 == 0xF0) lo = 0x90;  // no overlong forms
    if (b0 == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else {
    return {1, false, false};  // 80..C1, F5..FF never start a sequence
  }
  for (size_t k = 1; k <= n; ++k) {
    if (i + k >= s.size()) return {k, false, true};
    const unsigned char b = at(k);
    const bool ok = k == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF);
    if (!ok) return {k, false, false};  // the maximal subpart is the k bytes before b
  }
  return {n + 1, true, false};
}

bool is_valid(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const Step st = next(s, i);
    if (!st.valid) return false;
    i += st.len;
  }
  return true;
}

std::string to_valid(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const Step st = next(s, i);
    if (st.valid)
      out.append(s.substr(i, st.len));
    else
      out += kReplacement;
    i += st.len;
  }
  return out;
}

char32_t decode(std::string_view s, size_t& i) {
  const auto b = [&](size_t k) { return char32_t(static_cast<unsigned char>(s[i + k])); };
  const unsigned char b0 = static_cast<unsigned char>(s[i]);
  char32_t c;
  if (b0 < 0x80) {
    c = b0;
    i += 1;
  } else if (b0 < 0xE0) {
    c = ((b0 & 0x1Fu) << 6) | (b(1) & 0x3F);
    i += 2;
  } else if (b0 < 0xF0) {
    c = ((b0 & 0x0Fu) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
    i += 3;
  } else {
    c = ((b0 & 0x07u) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
    i += 4;
  }
  return c;
}

void append(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += char(c);
  } else if (c < 0x800) {
    out += char(0xC0 | (c >> 6));
    out += char(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += char(0xE0 | (c >> 12));
    out += char(0x80 | ((c >> 6) & 0x3F));
    out += char(0x80 | (c & 0x3F));
  } else {
    out += char(0xF0 | (c >> 18));
    out += char(0x80 | ((c >> 12) & 0x3F));
    out += char(0x80 | ((c >> 6) & 0x3F));
    out += char(0x80 | (c & 0x3F));
  }
}

bool is_whitespace(char32_t c) {
  // PropList.txt White_Space (unchanged since Unicode 6.3).
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

std::string LossyStream::push(std::string_view bytes) {
  held_.append(bytes);
  std::string out;
  size_t i = 0;
  while (i < held_.size()) {
    const Step st = next(held_, i);
    if (st.truncated) break;  // may still complete: hold it back
    if (st.valid)
      out.append(held_, i, st.len);
    else
      out += kReplacement;
    i += st.len;
  }
  held_.erase(0, i);
  return out;
}

std::string LossyStream::flush() {
  // What is held is a well-formed prefix of one sequence: one maximal subpart, one U+FFFD.
  std::string out = held_.empty() ? "" : kReplacement;
  held_.clear();
  return out;
}

std::string shown(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '\n')
      out += "\\n";
    else if (c == '\r')
      out += "\\r";
    else if (c == '\t')
      out += "\\t";
    else if (u < 0x20 || u == 0x7f)
      out += fmt::format("\\x{:02x}", u);
    else
      out += c;
  }
  return out;
}

}  // namespace dsi::utf8
