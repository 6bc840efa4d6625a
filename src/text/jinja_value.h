// The value type of the Jinja engine: Python's data model as chat templates see it (None, bool, int, float,
// str, list/tuple, insertion-ordered dict, namespace, callables) plus jinja2's default Undefined.
// Printing, truthiness, equality and JSON follow CPython 3 and jinja2 3.1 (see docs in jinja.h).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

namespace dsi::jinja {

class Value;
class Interp;  // the evaluator (jinja_internal.h); native callables receive it

// jinja2's default Undefined: prints as "", is falsy, iterates as empty; most other uses raise. The hint is
// the UndefinedError message ("'x' is undefined"); `unsafe` marks the sandbox's blocked attributes
// (calling one raises SecurityError with the hint as message).
struct Undefined {
  std::string hint;
  bool unsafe = false;
};
struct None {};

// What a list value looks like to Python: a list, a tuple, a lazy iterator (filters such as select and map
// return generators: no len(), not subscriptable, always truthy), or one of dict's views.
enum class ListKind { kList, kTuple, kGenerator, kDictItems, kDictKeys, kDictValues };

struct List {
  std::vector<Value> items;
  ListKind kind = ListKind::kList;
};

// A dict with string keys that remembers insertion order (Python 3.7+ semantics).
class Dict {
 public:
  const Value* find(std::string_view key) const;
  Value* find(std::string_view key);
  void set(const std::string& key, Value v);  // insert at the end, or replace in place
  bool erase(std::string_view key);
  size_t size() const { return items_.size(); }
  bool empty() const { return items_.empty(); }
  const std::vector<std::pair<std::string, Value>>& items() const { return items_; }

 private:
  std::vector<std::pair<std::string, Value>> items_;
  std::unordered_map<std::string, size_t> index_;
};

// jinja2's namespace(): the one object whose attributes templates may assign ({% set ns.x = ... %}).
struct Namespace {
  Dict attrs;
};

struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
};

// Builtin functions, bound methods and macros. `kind` is what Python's type(x).__name__ would print in
// error messages ("function", "builtin_function_or_method", "Macro").
struct Callable {
  std::string name;
  std::string kind;
  std::function<Value(Interp&, CallArgs&)> fn;
};

class Value {
 public:
  using Data = std::variant<Undefined, None, bool, int64_t, double, std::string, std::shared_ptr<List>,
                            std::shared_ptr<Dict>, std::shared_ptr<Namespace>, std::shared_ptr<Callable>>;

  Value() : data_(Undefined{}) {}
  Value(None) : data_(None{}) {}
  Value(bool b) : data_(b) {}
  Value(int v) : data_(int64_t(v)) {}
  Value(int64_t v) : data_(v) {}
  Value(double v) : data_(v) {}
  Value(std::string s) : data_(std::move(s)) {}
  Value(std::string_view s) : data_(std::string(s)) {}
  Value(const char* s) : data_(std::string(s)) {}
  Value(std::shared_ptr<List> l) : data_(std::move(l)) {}
  Value(std::shared_ptr<Dict> d) : data_(std::move(d)) {}
  Value(std::shared_ptr<Namespace> n) : data_(std::move(n)) {}
  Value(std::shared_ptr<Callable> c) : data_(std::move(c)) {}

  static Value undefined(std::string hint, bool unsafe = false) {
    Value v;
    v.data_ = Undefined{std::move(hint), unsafe};
    return v;
  }
  static Value none() { return Value(None{}); }
  static Value list(std::vector<Value> items, ListKind kind = ListKind::kList);
  static Value dict(Dict d = {});
  static Value callable(std::string name, std::function<Value(Interp&, CallArgs&)> fn,
                        std::string kind = "builtin_function_or_method");

  const Data& data() const { return data_; }
  bool is_undefined() const { return std::holds_alternative<Undefined>(data_); }
  bool is_none() const { return std::holds_alternative<None>(data_); }
  bool is_bool() const { return std::holds_alternative<bool>(data_); }
  bool is_int() const { return std::holds_alternative<int64_t>(data_); }  // excludes bool
  bool is_float() const { return std::holds_alternative<double>(data_); }
  bool is_number() const { return is_bool() || is_int() || is_float(); }  // Python: bool is an int
  bool is_string() const { return std::holds_alternative<std::string>(data_); }
  bool is_list() const { return std::holds_alternative<std::shared_ptr<List>>(data_); }
  bool is_dict() const { return std::holds_alternative<std::shared_ptr<Dict>>(data_); }
  bool is_namespace() const { return std::holds_alternative<std::shared_ptr<Namespace>>(data_); }
  bool is_callable() const { return std::holds_alternative<std::shared_ptr<Callable>>(data_); }

  const Undefined& as_undefined() const { return std::get<Undefined>(data_); }
  bool as_bool() const { return std::get<bool>(data_); }
  int64_t as_int() const { return std::get<int64_t>(data_); }
  double as_float() const { return std::get<double>(data_); }
  const std::string& as_string() const { return std::get<std::string>(data_); }
  List& as_list() const { return *std::get<std::shared_ptr<List>>(data_); }
  Dict& as_dict() const { return *std::get<std::shared_ptr<Dict>>(data_); }
  Namespace& as_namespace() const { return *std::get<std::shared_ptr<Namespace>>(data_); }
  Callable& as_callable() const { return *std::get<std::shared_ptr<Callable>>(data_); }
  const void* identity() const;  // the shared object's address (for `is sameas`), null for scalars

  // int or bool as int64 (Python's int(True) == 1); requires is_int() or is_bool().
  int64_t int_value() const { return is_bool() ? int64_t(as_bool()) : as_int(); }
  // Any number as double; requires is_number().
  double number_value() const { return is_float() ? as_float() : double(int_value()); }

  bool truthy() const;                // Python's bool(x); Undefined is false, generators are true
  std::string str() const;            // Python's str(x); Undefined prints as ""
  std::string repr() const;           // Python's repr(x)
  std::string type_name() const;      // Python's type(x).__name__: "int", "str", "dict", "NoneType", ...

 private:
  Data data_;
};

// Python's ==, between any two values (1 == 1.0 == True, lists and dicts elementwise).
bool equals(const Value& a, const Value& b);

// JSON in. Objects become dicts, arrays lists, numbers int or float as parsed. Key order is the JSON
// value's: nlohmann::ordered_json keeps the document's order (as Python does), nlohmann::json sorts keys.
Value from_json(const nlohmann::json& j);
Value from_json(const nlohmann::ordered_json& j);

// Python's json.dumps(x, ensure_ascii, indent, separators, sort_keys), which is what HF's tojson filter
// calls. indent < 0 means None; separators default as in Python. Throws on values JSON cannot hold.
struct DumpOptions {
  bool ensure_ascii = false;
  int indent = -1;
  std::string indent_str;   // used instead of `indent` spaces when set (Python allows a string indent)
  bool has_indent_str = false;
  std::string item_sep;     // defaults: ", " without indent, "," with
  std::string key_sep = ": ";
  bool has_item_sep = false;
  bool sort_keys = false;
};
std::string dumps(const Value& v, const DumpOptions& opt);

// Python's repr(float): the shortest round-tripping digits, exponent form outside [1e-4, 1e16).
std::string float_repr(double d);
// Python's repr(str): quotes and escapes as CPython does (printable non-ASCII kept).
std::string string_repr(std::string_view s);

}  // namespace dsi::jinja
