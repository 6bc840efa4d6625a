// UTF-8 helpers with Python str semantics; see jinja_utf8.h. Case mapping and letter classes beyond ASCII
// come from the C library's C.UTF-8 locale (glibc ships it); without it they fall back to ASCII.
#include "text/jinja_utf8.h"

#include <clocale>
#include <cwctype>
#include <locale.h>

namespace dsi::jinja::utf8 {

namespace {

locale_t utf8_locale() {
  // Created once and never modified: a read-only handle, not mutable state.
  static const locale_t loc = [] {
    locale_t l = newlocale(LC_CTYPE_MASK, "C.UTF-8", locale_t(0));
    if (!l) l = newlocale(LC_CTYPE_MASK, "C.utf8", locale_t(0));
    return l;
  }();
  return loc;
}

}  // namespace

std::u32string decode(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = s[i];
    int n = 0;  // continuation bytes expected
    char32_t cp = c;
    if ((c >> 5) == 0x6) {
      n = 1, cp = c & 0x1f;
    } else if ((c >> 4) == 0xe) {
      n = 2, cp = c & 0x0f;
    } else if ((c >> 3) == 0x1e) {
      n = 3, cp = c & 0x07;
    }
    bool ok = c < 0x80 || n > 0;
    for (int k = 1; ok && k <= n; ++k) {
      const size_t j = i + size_t(k);
      ok = j < s.size() && (static_cast<unsigned char>(s[j]) >> 6) == 0x2;
      if (ok) cp = (cp << 6) | (static_cast<unsigned char>(s[j]) & 0x3f);
    }
    if (!ok) {  // not UTF-8: keep the byte as a Latin-1 code point
      out.push_back(c);
      ++i;
      continue;
    }
    out.push_back(cp);
    i += size_t(n) + 1;
  }
  return out;
}

void append(std::string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(char(c));
  } else if (c < 0x800) {
    out.push_back(char(0xc0 | (c >> 6)));
    out.push_back(char(0x80 | (c & 0x3f)));
  } else if (c < 0x10000) {
    out.push_back(char(0xe0 | (c >> 12)));
    out.push_back(char(0x80 | ((c >> 6) & 0x3f)));
    out.push_back(char(0x80 | (c & 0x3f)));
  } else {
    out.push_back(char(0xf0 | (c >> 18)));
    out.push_back(char(0x80 | ((c >> 12) & 0x3f)));
    out.push_back(char(0x80 | ((c >> 6) & 0x3f)));
    out.push_back(char(0x80 | (c & 0x3f)));
  }
}

std::string encode(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) append(out, c);
  return out;
}

size_t length(std::string_view s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c >> 6) != 0x2;  // count every byte that does not continue a sequence
  return n;
}

bool is_space(char32_t c) {
  switch (c) {
    case 0x09: case 0x0a: case 0x0b: case 0x0c: case 0x0d: case 0x1c: case 0x1d: case 0x1e: case 0x1f:
    case 0x20: case 0x85: case 0xa0: case 0x1680: case 0x2028: case 0x2029: case 0x202f: case 0x205f:
    case 0x3000:
      return true;
    default:
      return c >= 0x2000 && c <= 0x200a;
  }
}

// Python's isprintable is false for categories Cc, Cf, Cs, Co, Cn, Zl, Zp and Zs other than the space.
// This covers the controls, separators, format characters and private-use ranges that occur in practice;
// unassigned code points (Cn) are treated as printable.
bool is_printable(char32_t c) {
  if (c < 0x20 || (c >= 0x7f && c <= 0xa0) || c == 0xad) return false;
  if (c == 0x1680 || (c >= 0x2000 && c <= 0x200f) || (c >= 0x2028 && c <= 0x202f)) return false;
  if ((c >= 0x205f && c <= 0x206f) || c == 0x3000 || c == 0xfeff || (c >= 0xfff9 && c <= 0xfffb)) return false;
  if ((c >= 0xd800 && c <= 0xf8ff) || c == 0x061c || c == 0x180e) return false;
  if (c >= 0xf0000) return false;
  return true;
}

bool is_alpha(char32_t c) {
  if (c < 0x80) return (c | 0x20) >= 'a' && (c | 0x20) <= 'z';
  const locale_t l = utf8_locale();
  return l && iswalpha_l(wint_t(c), l);
}

bool is_digit(char32_t c) { return c >= '0' && c <= '9'; }

bool is_word(char32_t c) { return c == '_' || is_digit(c) || is_alpha(c); }

char32_t to_upper(char32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') ? c - 32 : c;
  const locale_t l = utf8_locale();
  return l ? char32_t(towupper_l(wint_t(c), l)) : c;
}

char32_t to_lower(char32_t c) {
  if (c < 0x80) return (c >= 'A' && c <= 'Z') ? c + 32 : c;
  const locale_t l = utf8_locale();
  return l ? char32_t(towlower_l(wint_t(c), l)) : c;
}

bool is_cased_upper(char32_t c) { return to_lower(c) != c; }
bool is_cased_lower(char32_t c) { return to_upper(c) != c || c == 0xdf; }

std::u32string upper32(std::u32string_view s) {
  std::u32string out;
  out.reserve(s.size());
  for (char32_t c : s) {
    if (c == 0xdf) {  // ß has no one-character upper case; Python maps it to "SS"
      out += U"SS";
    } else {
      out.push_back(to_upper(c));
    }
  }
  return out;
}

std::u32string lower32(std::u32string_view s) {
  std::u32string out;
  out.reserve(s.size());
  for (char32_t c : s) out.push_back(to_lower(c));
  return out;
}

std::string upper(std::string_view s) {
  bool ascii = true;
  for (unsigned char c : s) ascii &= c < 0x80;
  if (ascii) {
    std::string out(s);
    for (char& c : out) c = char(to_upper(static_cast<unsigned char>(c)));
    return out;
  }
  return encode(upper32(decode(s)));
}

std::string lower(std::string_view s) {
  bool ascii = true;
  for (unsigned char c : s) ascii &= c < 0x80;
  if (ascii) {
    std::string out(s);
    for (char& c : out) c = char(to_lower(static_cast<unsigned char>(c)));
    return out;
  }
  return encode(lower32(decode(s)));
}

}  // namespace dsi::jinja::utf8
