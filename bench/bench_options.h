// Command-line options of the benchmarks (GPU and CPU alike; no CUDA here).
#pragma once

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "dsinfer/error.h"

// Walks "--key [value]" options: on(key, value) handles one (value() returns its argument, an error
// when argv has none) and returns false for a key it does not know (an error).
template <typename On>
inline void parse_options(int argc, char** argv, On on) {
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) dsi::fail("{} needs a value", k);
      return argv[++i];
    };
    if (!on(k, value)) dsi::fail("unknown option {}", k);
  }
}

// "a,b,c" as integers (an error for anything else).
inline std::vector<int> int_list(const std::string& text) {
  std::vector<int> out;
  size_t at = 0;
  while (at <= text.size()) {
    const size_t comma = std::min(text.find(',', at), text.size());
    const std::string item = text.substr(at, comma - at);
    size_t used = 0;
    int v = 0;
    try {
      v = std::stoi(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (item.empty() || used != item.size()) dsi::fail("'{}' is not a comma-separated list of integers", text);
    out.push_back(v);
    at = comma + 1;
  }
  return out;
}
