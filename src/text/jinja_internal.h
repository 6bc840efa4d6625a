// The evaluator's interface shared by jinja_eval.cpp (statements, expressions, scoping) and
// jinja_builtins.cpp (filters, tests, globals, methods). Not part of the public API.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "text/jinja_ast.h"
#include "text/jinja_value.h"

namespace dsi::jinja {

// A runtime error before it is given its template line (line 0 until a node catches it). `raw` errors
// (raise_exception) keep their message verbatim.
struct RenderError {
  std::string msg;
  int line = 0;
  bool raw = false;
};

[[noreturn]] inline void raise(std::string msg) { throw RenderError{std::move(msg), 0, false}; }

// The largest string (bytes) or list (items) one operation may build: `'x' * 10**12`, a huge
// center() width or the like fail with an error instead of exhausting memory.
constexpr int64_t kMaxValueSize = int64_t(1) << 26;
inline void check_size(int64_t n) {
  if (n > kMaxValueSize) {
    raise("result too large (" + std::to_string(n) + " > " + std::to_string(kMaxValueSize) +
          " bytes or items; the engine's limit)");
  }
}

// A non-negative decimal integer from all-digit text; raises when it does not fit in int64.
inline int64_t parse_digits(std::string_view s) {
  int64_t v = 0;
  for (char c : s) {
    if (v > (INT64_MAX - (c - '0')) / 10) raise("integer " + std::string(s) + " is too large");
    v = v * 10 + (c - '0');
  }
  return v;
}
// UndefinedError (or SecurityError for a sandbox-blocked attribute) for using an Undefined.
[[noreturn]] void raise_undefined(const Value& u);

// A variable scope: the template's top level, a loop iteration, a macro call.
struct Scope {
  std::unordered_map<std::string, Value> vars;
  std::shared_ptr<Scope> parent;
};

class Interp {
 public:
  Interp(const Program& prog, const Dict& vars);
  ~Interp();
  Interp(const Interp&) = delete;
  Interp& operator=(const Interp&) = delete;
  std::string run();

  const Options& options() const { return prog_.options; }
  // Counts one unit of work (a loop iteration, a macro call) against Options::max_steps.
  void step();
  // A namespace() made during this render: `{% set ns.me = ns %}` makes a reference cycle, which the
  // interpreter breaks when the render ends.
  void track(const std::shared_ptr<Namespace>& ns) { namespaces_.push_back(ns); }

  Value eval(const Expr& e);
  Value getattr(const Value& obj, const std::string& name);
  Value getitem(const Value& obj, const Value& key);
  Value call(const Value& callee, CallArgs& args);
  Value filter(const std::string& name, const Value& input, CallArgs& args);
  bool test(const std::string& name, const Value& input, CallArgs& args);

 private:
  enum class Flow { kNormal, kBreak, kContinue };
  Flow exec(const Body& body, std::string& out);
  Flow exec(const Node& n, std::string& out);
  void exec_for(const Node& n, std::string& out);
  void assign(const Node& n, Value v);
  Value make_macro(const Node& n, const std::string& name);
  Value lookup(const std::string& name) const;
  void check_output(const std::string& out) const;
  Value eval_inner(const Expr& e);
  Value apply_chain(const Expr& chain, Value input);

  const Program& prog_;
  std::shared_ptr<Scope> scope_;
  int depth_ = 0;
  int loop_depth_ = 0;
  int64_t steps_ = 0;
  int frames_ = 0;  // nested eval/exec calls (bounded: see kMaxFrames in jinja_eval.cpp)
  // Scopes that macros were defined in. A macro refers to its scope weakly (the scope holds the
  // macro: a strong reference would be a cycle); these keep the scopes alive for the render.
  std::vector<std::shared_ptr<Scope>> macro_scopes_;
  std::vector<std::weak_ptr<Namespace>> namespaces_;
};

// ---- helpers shared by the evaluator and the builtins ------------------------------------------------

void check_overflow(bool overflow);  // raises for int64 overflow (Python ints are unbounded)
bool plain_list(const Value& v);     // a list or tuple (not a generator or dict view)
// Python iteration (iter(x)) materialised: list items, string characters, dict keys; Undefined is empty.
std::vector<Value> iterate(const Value& v);
int64_t length(const Value& v);              // Python len(x); Undefined has length 0
bool contains(const Value& container, const Value& item);  // Python `item in container`
Value binary_op(const std::string& op, const Value& a, const Value& b);
// Python <, for sorting and comparisons; raises TypeError for unorderable types.
bool less_than(const Value& a, const Value& b);
Value slice(const Value& obj, const Value& start, const Value& stop, const Value& step);
std::string python_format(const std::string& fmt, const Value& args);  // str % args

// Registries (jinja_builtins.cpp).
using FilterFn = Value (*)(Interp&, const Value& input, CallArgs& args);
using TestFn = bool (*)(Interp&, const Value& input, CallArgs& args);
FilterFn find_filter(std::string_view name);
TestFn find_test(std::string_view name);
// The globals every template sees: range, namespace, dict, raise_exception, strftime_now.
const Dict& builtin_globals();
// obj.name as a bound method (str, dict and list methods), or an Undefined when there is none;
// sandbox-blocked mutators return an unsafe Undefined under Options::immutable.
Value method(Interp& in, const Value& obj, const std::string& name, bool* found);

// Python str methods the filters share (jinja_methods.cpp). Indices and lengths count code points.
namespace pystr {
std::string strip(std::string_view s, const Value& chars, bool left, bool right);  // chars: None = whitespace
std::vector<std::string> split(std::string_view s, const Value& sep, int64_t maxsplit, bool from_right);
std::string replace(std::string_view s, std::string_view old, std::string_view rep, int64_t count);
std::vector<std::string> splitlines(std::string_view s, bool keepends);
std::string title(std::string_view s);       // str.title
std::string capitalize(std::string_view s);  // str.capitalize
std::string center(std::string_view s, int64_t width);
std::string format(Interp& in, const std::string& fmt, const CallArgs& args);  // str.format
}  // namespace pystr

// Python-style parameter binding for builtins: positional then keyword, defaults for the rest.
struct ParamSpec {
  const char* name;
  Value def;          // Undefined with hint "required" marks a required parameter
  bool required = false;
};
std::vector<Value> bind_args(const CallArgs& args, const std::vector<ParamSpec>& spec, const std::string& fname);

}  // namespace dsi::jinja
