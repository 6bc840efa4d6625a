// NFC; see unicode_nfc.h. Follows the sample algorithm of UAX #15 with Hangul done arithmetically.
#include "text/unicode_nfc.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "text/utf8.h"

namespace dsi {

namespace {

struct Decomposition {
  char32_t cp, first, second;
};
struct Composition {
  char32_t first, second, composite;
};
struct CombiningClass {
  char32_t lo, hi;
  uint8_t ccc;
};
#include "text/unicode_nfc_data.inc"

// Hangul syllables (Unicode section 3.12).
constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr char32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount,
                   kSCount = kLCount * kNCount;

int ccc(char32_t c) {
  if (c < 0x300) return 0;
  const auto* end = std::end(kCombiningClasses);
  const auto* it = std::upper_bound(std::begin(kCombiningClasses), end, c,
                                    [](char32_t v, const CombiningClass& r) { return v < r.lo; });
  if (it == std::begin(kCombiningClasses)) return 0;
  --it;
  return c <= it->hi ? it->ccc : 0;
}

void decompose(char32_t c, std::vector<char32_t>& out) {
  if (c >= kSBase && c < kSBase + kSCount) {
    const char32_t s = c - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount) out.push_back(kTBase + s % kTCount);
    return;
  }
  const auto* end = std::end(kDecompositions);
  const auto* it = std::lower_bound(std::begin(kDecompositions), end, c,
                                    [](const Decomposition& d, char32_t v) { return d.cp < v; });
  if (it == end || it->cp != c) {
    out.push_back(c);
    return;
  }
  decompose(it->first, out);
  if (it->second) decompose(it->second, out);
}

// The primary composite of (a, b), or 0.
char32_t compose(char32_t a, char32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
      b < kTBase + kTCount)
    return a + (b - kTBase);
  const auto* end = std::end(kCompositions);
  const auto* it = std::lower_bound(std::begin(kCompositions), end, std::make_pair(a, b),
                                    [](const Composition& c, const std::pair<char32_t, char32_t>& v) {
                                      return std::make_pair(c.first, c.second) < v;
                                    });
  return it != end && it->first == a && it->second == b ? it->composite : 0;
}

}  // namespace

std::string nfc(std::string_view text) {
  // Below U+0300 nothing decomposes into something that could change (no combining marks, no
  // exclusions, no Hangul): the common case returns at once.
  bool simple = true;
  for (unsigned char b : text)
    if (b >= 0xCC) {  // the first lead byte of a code point >= U+0300
      simple = false;
      break;
    }
  if (simple) return std::string(text);

  std::vector<char32_t> d;
  d.reserve(text.size());
  for (size_t i = 0; i < text.size();) decompose(utf8::decode(text, i), d);
  // Canonical ordering: a stable sort by class of each run of non-starters.
  for (size_t i = 0; i < d.size();) {
    if (ccc(d[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < d.size() && ccc(d[j]) != 0) ++j;
    std::stable_sort(d.begin() + long(i), d.begin() + long(j),
                     [](char32_t x, char32_t y) { return ccc(x) < ccc(y); });
    i = j;
  }
  // Canonical composition.
  std::vector<char32_t> r;
  r.reserve(d.size());
  size_t starter = 0;
  int last_class = -1;  // class of the last character appended; -1: none yet
  for (char32_t c : d) {
    const int cls = ccc(c);
    if (!r.empty() && (last_class == 0 || (last_class > 0 && last_class < cls)) &&
        ccc(r[starter]) == 0) {
      if (const char32_t comp = compose(r[starter], c)) {
        r[starter] = comp;
        continue;
      }
    }
    if (cls == 0) starter = r.size();
    last_class = (r.empty() && cls != 0) ? 256 : cls;
    r.push_back(c);
  }
  std::string out;
  out.reserve(text.size());
  for (char32_t c : r) utf8::append(out, c);
  return out;
}

}  // namespace dsi
