// dsinfer's one exception type and the checks that throw it.
// Every check at an API, config or file boundary names the bad value and where it came from.
#pragma once

#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace dsi {

// The error every dsinfer boundary throws: a one-line, human-readable message.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace dsi

// DSI_CHECK(cond, "format {}", args...): throws dsi::Error with the formatted message when cond is false.
#define DSI_CHECK(cond, ...)        \
  do {                              \
    if (!(cond)) ::dsi::fail(__VA_ARGS__); \
  } while (0)

// Debug-only check for hot paths (compiled out in release builds).
#ifdef NDEBUG
#define DSI_DCHECK(cond, ...) \
  do {                        \
  } while (0)
#else
#define DSI_DCHECK(cond, ...) DSI_CHECK(cond, __VA_ARGS__)
#endif
