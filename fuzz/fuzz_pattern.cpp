// Fuzzes the compiler of JSON Schema patterns (server/json_pattern.h): any bytes compile or are
// refused with a one-line dsi::Error, in bounded time and memory. A compiled pattern keeps the
// promises the recognizer relies on along any string: the start can reach a match; a state that is
// not dead can, in min_left() characters, and min_left() falls by at most one a character; a state
// accepts exactly when min_left() is 0; max_left() is at least min_left(), and a bounded one falls
// by at least one a character. Input: the pattern up to the first 0 byte; after it, the
// string, two bytes a code point of the Basic Multilingual Plane (a dead state starts it over).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include "fuzz_util.h"
#include "server/json_pattern.h"

using dsi::server::JsonPattern;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t cut = std::min(in.find('\0'), in.size());
  std::shared_ptr<const JsonPattern> p;
  dsi::fuzz::expect_only_dsi_errors("JsonPattern::compile",
                                    [&] { p = JsonPattern::compile(in.substr(0, cut), "#/pattern"); });
  if (!p) return 0;
  DSI_FUZZ_ASSERT(p->start() == 0 && p->states() > 0);
  DSI_FUZZ_ASSERT(p->min_left(p->start()) >= 0);
  int32_t s = p->start();
  for (size_t i = cut + 1; i + 1 < size; i += 2) {
    const uint32_t cp = uint32_t(data[i]) << 8 | data[i + 1];
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;  // never a character of a string
    const int32_t next = p->step(s, cp);
    if (next == JsonPattern::kDead) {
      s = p->start();
      continue;
    }
    DSI_FUZZ_ASSERT(next >= 0 && size_t(next) < p->states());
    DSI_FUZZ_ASSERT(p->min_left(next) >= 0 && p->min_left(next) >= p->min_left(s) - 1);
    DSI_FUZZ_ASSERT(p->accepts(next) == (p->min_left(next) == 0));
    DSI_FUZZ_ASSERT(p->max_left(next) >= p->min_left(next));
    DSI_FUZZ_ASSERT(p->max_left(s) == JsonPattern::kUnbounded || p->max_left(s) >= p->max_left(next) + 1);
    s = next;
  }
  return 0;
}
