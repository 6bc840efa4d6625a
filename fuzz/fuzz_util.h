// Shared by the fuzz targets: the one outcome a parser may have besides success is a dsi::Error.
// Anything else (another exception, a sanitizer report, a broken invariant) aborts, which libFuzzer
// records as a crash with the input that caused it.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string_view>

#include <nlohmann/json.hpp>

#include "dsinfer/error.h"

namespace dsi::fuzz {

// A broken invariant of the code under test: print what and where, then abort.
[[noreturn]] inline void die(const char* what, const char* file, int line) {
  std::fprintf(stderr, "fuzz invariant violated at %s:%d: %s\n", file, line, what);
  std::abort();
}

// Runs `f`; a dsi::Error is the expected way to refuse bad input. A json exception escaping the
// API is a bug (the API promises one-line dsi::Error messages), as is any other exception.
template <typename F>
void expect_only_dsi_errors(const char* api, F&& f) {
  try {
    f();
  } catch (const dsi::Error& e) {
    // Messages are one line: a newline would break the CLI's "error: ..." contract.
    if (std::string_view(e.what()).find('\n') != std::string_view::npos) {
      std::fprintf(stderr, "%s: dsi::Error message spans lines: %s\n", api, e.what());
      std::abort();
    }
  } catch (const nlohmann::json::exception& e) {
    std::fprintf(stderr, "%s: a nlohmann::json exception escaped instead of dsi::Error: %s\n", api,
                 e.what());
    std::abort();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: unexpected exception (not dsi::Error): %s\n", api, e.what());
    std::abort();
  }
}

}  // namespace dsi::fuzz

#define DSI_FUZZ_ASSERT(cond) \
  do {                        \
    if (!(cond)) ::dsi::fuzz::die(#cond, __FILE__, __LINE__); \
  } while (0)
