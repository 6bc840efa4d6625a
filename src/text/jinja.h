// A Jinja2 template engine for the subset chat templates use, matching jinja2 3.1 byte for byte as HF
// transformers runs it (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols, its
// tojson/raise_exception/strftime_now). Values follow Python semantics (jinja_value.h).
//
// Statements: if/elif/else, for (loop.*, else, inline if filter, break/continue), set (names, tuples,
// namespace attributes, block set with filters), macro and call blocks, filter blocks, with, raw,
// generation/endgeneration (HF), comments. Expressions: literals, list/dict/tuple, attribute and item
// access with negative indices and slices, arithmetic (+ - * / // % ** ~), comparisons and chains,
// in/not in, and/or/not, `a if c else b`, calls with keyword arguments, filters and `is` tests.
// The filters, tests, globals and str/dict/list methods supported are listed in jinja_builtins.cpp.
#pragma once

#include <ctime>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "text/jinja_value.h"

namespace dsi::jinja {

struct Options {
  bool trim_blocks = true;    // drop the first newline after a block tag (HF sets this)
  bool lstrip_blocks = true;  // strip spaces and tabs before a block tag at line start (HF sets this)
  bool keep_trailing_newline = false;
  // ImmutableSandboxedEnvironment: list.append, dict.update, ... raise SecurityError as they do in HF.
  // With false they mutate, as in a plain jinja2 Environment.
  bool immutable = true;
  // The clock behind strftime_now(fmt) (local time); tests inject a fixed date. Default: now.
  std::function<std::tm()> now;
  int max_depth = 256;  // macro/call nesting limit (a recursive macro fails instead of overflowing the stack)
  // Work and size limits, so a hostile template ends with a dsi::Error instead of hanging or
  // exhausting memory: loop iterations plus macro calls per render, and bytes of output.
  int64_t max_steps = 10'000'000;
  int64_t max_output_bytes = int64_t(1) << 26;
};

struct Program;  // the parsed template (jinja_ast.h)

class Template {
 public:
  // Parses the template; throws dsi::Error("<name>:<line>: <message>") on a syntax error.
  explicit Template(std::string_view source, std::string name = "template", Options opt = {});
  ~Template();
  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;

  // Renders with `vars` as the template's context. A runtime error throws dsi::Error naming the line;
  // raise_exception(msg) throws dsi::Error(msg) with the message unchanged.
  std::string render(const Dict& vars) const;
  std::string render(const nlohmann::json& vars) const;  // vars: a JSON object (keys sorted)
  std::string render(const nlohmann::ordered_json& vars) const;  // keys in document order

  const std::string& name() const;

 private:
  std::unique_ptr<Program> program_;
};

}  // namespace dsi::jinja
