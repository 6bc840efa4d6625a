// Python's operators on the engine's values (+ - * / // % ** ~, comparisons, `in`, iteration, len,
// slicing), as CPython defines them for int, float, str, list, tuple and dict.
#include <cmath>

#include "dsinfer/error.h"
#include "text/jinja.h"
#include "text/jinja_internal.h"
#include "text/jinja_utf8.h"

namespace dsi::jinja {

void check_overflow(bool overflow) {
  if (overflow) raise("integer overflow (values beyond 64 bits are not supported)");
}

bool plain_list(const Value& v) {
  return v.is_list() && (v.as_list().kind == ListKind::kList || v.as_list().kind == ListKind::kTuple);
}

namespace {

[[noreturn]] void unsupported(const std::string& op, const Value& a, const Value& b) {
  raise("unsupported operand type(s) for " + op + ": '" + a.type_name() + "' and '" + b.type_name() + "'");
}

// Python's float floor division and modulo (Objects/floatobject.c float_divmod).
std::pair<double, double> float_divmod(double vx, double wx) {
  if (wx == 0.0) raise("float divmod()");
  double mod = std::fmod(vx, wx);
  double div = (vx - mod) / wx;
  if (mod != 0.0) {
    if ((wx < 0) != (mod < 0)) {
      mod += wx;
      div -= 1.0;
    }
  } else {
    mod = std::copysign(0.0, wx);
  }
  double floordiv;
  if (div != 0.0) {
    floordiv = std::floor(div);
    if (div - floordiv > 0.5) floordiv += 1.0;
  } else {
    floordiv = std::copysign(0.0, vx / wx);
  }
  return {floordiv, mod};
}

Value repeat(const Value& seq, int64_t n) {
  const int64_t unit = seq.is_string() ? int64_t(seq.as_string().size()) : int64_t(seq.as_list().items.size());
  if (n > 0 && unit > 0) check_size(n > kMaxValueSize ? n : n * unit);
  if (seq.is_string()) {
    std::string out;
    for (int64_t i = 0; i < n; ++i) out += seq.as_string();
    return Value(std::move(out));
  }
  std::vector<Value> items;
  for (int64_t i = 0; i < n; ++i)
    for (const Value& v : seq.as_list().items) items.push_back(v);
  return Value::list(std::move(items), seq.as_list().kind);
}

}  // namespace

// ---- operators -------------------------------------------------------------------------------------

Value binary_op(const std::string& op, const Value& a, const Value& b) {
  if (op == "~") {
    std::string s = a.str();
    s += b.str();
    check_size(int64_t(s.size()));
    return Value(std::move(s));
  }
  if (op == "%" && a.is_string()) return Value(python_format(a.as_string(), b));  // str.__mod__ goes first
  if (a.is_undefined()) raise_undefined(a);
  if (b.is_undefined()) raise_undefined(b);
  const bool nums = a.is_number() && b.is_number();
  const bool ints = nums && !a.is_float() && !b.is_float();
  if (op == "+") {
    if (ints) {
      int64_t r = 0;
      check_overflow(__builtin_add_overflow(a.int_value(), b.int_value(), &r));
      return Value(r);
    }
    if (nums) return Value(a.number_value() + b.number_value());
    if (a.is_string() && b.is_string()) {
      check_size(int64_t(a.as_string().size() + b.as_string().size()));
      return Value(a.as_string() + b.as_string());
    }
    if (a.is_string()) raise("can only concatenate str (not \"" + b.type_name() + "\") to str");
    if (plain_list(a) && plain_list(b)) {
      if (a.as_list().kind != b.as_list().kind) {
        raise("can only concatenate " + a.type_name() + " (not \"" + b.type_name() + "\") to " + a.type_name());
      }
      check_size(int64_t(a.as_list().items.size() + b.as_list().items.size()));
      std::vector<Value> items = a.as_list().items;
      items.insert(items.end(), b.as_list().items.begin(), b.as_list().items.end());
      return Value::list(std::move(items), a.as_list().kind);
    }
    unsupported("+", a, b);
  }
  if (op == "-") {
    if (ints) {
      int64_t r = 0;
      check_overflow(__builtin_sub_overflow(a.int_value(), b.int_value(), &r));
      return Value(r);
    }
    if (nums) return Value(a.number_value() - b.number_value());
    unsupported("-", a, b);
  }
  if (op == "*") {
    if (ints) {
      int64_t r = 0;
      check_overflow(__builtin_mul_overflow(a.int_value(), b.int_value(), &r));
      return Value(r);
    }
    if (nums) return Value(a.number_value() * b.number_value());
    if ((a.is_string() || plain_list(a)) && (b.is_int() || b.is_bool())) return repeat(a, b.int_value());
    if ((b.is_string() || plain_list(b)) && (a.is_int() || a.is_bool())) return repeat(b, a.int_value());
    unsupported("*", a, b);
  }
  if (op == "/") {
    if (!nums) unsupported("/", a, b);
    if (b.number_value() == 0.0) raise(ints ? "division by zero" : "float division by zero");
    return Value(a.number_value() / b.number_value());
  }
  if (op == "//" || op == "%") {
    if (!nums) unsupported(op, a, b);
    if (ints) {
      const int64_t x = a.int_value(), y = b.int_value();
      if (y == 0) raise(op == "%" ? "integer modulo by zero" : "integer division or modulo by zero");
      int64_t q = x / y, r = x % y;
      if (r != 0 && ((r < 0) != (y < 0))) {
        r += y;
        q -= 1;
      }
      return Value(op == "%" ? r : q);
    }
    if (b.number_value() == 0.0) raise(op == "%" ? "float modulo" : "float floor division by zero");
    const auto [fd, md] = float_divmod(a.number_value(), b.number_value());
    return Value(op == "%" ? md : fd);
  }
  if (op == "**") {
    if (!nums) unsupported("** or pow()", a, b);
    if (ints && b.int_value() >= 0) {
      int64_t base = a.int_value(), e = b.int_value(), r = 1;
      while (e > 0) {
        if (e & 1) check_overflow(__builtin_mul_overflow(r, base, &r));
        e >>= 1;
        if (e > 0) check_overflow(__builtin_mul_overflow(base, base, &base));
      }
      return Value(r);
    }
    if (a.number_value() == 0.0 && b.number_value() < 0) raise("0.0 cannot be raised to a negative power");
    const double r = std::pow(a.number_value(), b.number_value());
    if (std::isinf(r) && std::isfinite(a.number_value()) && std::isfinite(b.number_value())) {
      raise("(34, 'Numerical result out of range')");  // Python's float pow raises OverflowError
    }
    return Value(r);
  }
  raise("unknown operator " + op);
}

bool less_than(const Value& a, const Value& b) {
  if (a.is_undefined()) raise_undefined(a);
  if (b.is_undefined()) raise_undefined(b);
  if (a.is_number() && b.is_number()) {
    if (!a.is_float() && !b.is_float()) return a.int_value() < b.int_value();
    return a.number_value() < b.number_value();
  }
  if (a.is_string() && b.is_string()) return a.as_string() < b.as_string();  // UTF-8 order = code point order
  if (plain_list(a) && plain_list(b) && a.as_list().kind == b.as_list().kind) {
    const auto& x = a.as_list().items;
    const auto& y = b.as_list().items;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (equals(x[i], y[i])) continue;
      return less_than(x[i], y[i]);
    }
    return x.size() < y.size();
  }
  raise("'<' not supported between instances of '" + a.type_name() + "' and '" + b.type_name() + "'");
}

bool contains(const Value& container, const Value& item) {
  if (container.is_string()) {
    if (!item.is_string()) {
      raise("'in <string>' requires string as left operand, not " + item.type_name());
    }
    return container.as_string().find(item.as_string()) != std::string::npos;
  }
  if (container.is_list()) {
    for (const Value& v : container.as_list().items)
      if (equals(v, item)) return true;
    return false;
  }
  if (container.is_dict()) {
    if (item.is_dict() || (item.is_list() && item.as_list().kind != ListKind::kTuple)) {
      raise("unhashable type: '" + item.type_name() + "'");
    }
    return item.is_string() && container.as_dict().find(item.as_string()) != nullptr;
  }
  if (container.is_undefined()) return false;  // Undefined iterates as empty
  raise("argument of type '" + container.type_name() + "' is not iterable");
}

std::vector<Value> iterate(const Value& v) {
  if (v.is_list()) return v.as_list().items;
  if (v.is_string()) {
    std::vector<Value> out;
    for (char32_t c : utf8::decode(v.as_string())) out.emplace_back(utf8::encode(std::u32string(1, c)));
    return out;
  }
  if (v.is_dict()) {
    std::vector<Value> out;
    for (const auto& [k, x] : v.as_dict().items()) out.emplace_back(k);
    return out;
  }
  if (v.is_undefined()) return {};
  raise("'" + v.type_name() + "' object is not iterable");
}

int64_t length(const Value& v) {
  if (v.is_string()) return int64_t(utf8::length(v.as_string()));
  if (v.is_list() && v.as_list().kind != ListKind::kGenerator) return int64_t(v.as_list().items.size());
  if (v.is_dict()) return int64_t(v.as_dict().size());
  if (v.is_undefined()) return 0;
  raise("object of type '" + v.type_name() + "' has no len()");
}

Value slice(const Value& obj, const Value& start, const Value& stop, const Value& step) {
  // jinja2 compiles slices to a plain Python subscript (no environment.getitem): misuse raises. (When its
  // optimizer folds a constant expression it goes through getitem instead and yields an Undefined;
  // slicing a literal non-sequence is not worth mimicking.)
  if (obj.is_undefined()) raise_undefined(obj);
  const bool is_str = obj.is_string();
  if (obj.is_dict()) raise("unhashable type: 'slice'");
  if (!is_str && !plain_list(obj)) raise("'" + obj.type_name() + "' object is not subscriptable");
  auto as_index = [](const Value& v, bool* ok) -> int64_t {
    *ok = v.is_none() || v.is_undefined() || v.is_int() || v.is_bool();
    return (v.is_int() || v.is_bool()) ? v.int_value() : 0;
  };
  bool ok1, ok2, ok3;
  as_index(start, &ok1);
  as_index(stop, &ok2);
  const int64_t st = (step.is_none() || step.is_undefined()) ? 1 : as_index(step, &ok3);
  if (!(step.is_none() || step.is_undefined()) && !ok3) ok1 = false;
  if (!ok1 || !ok2) raise("slice indices must be integers or None or have an __index__ method");
  if (st == 0) raise("slice step cannot be zero");
  std::u32string chars;
  const std::vector<Value>* items = nullptr;
  int64_t n;
  if (is_str) {
    chars = utf8::decode(obj.as_string());
    n = int64_t(chars.size());
  } else {
    items = &obj.as_list().items;
    n = int64_t(items->size());
  }
  // CPython's PySlice_AdjustIndices.
  auto adjust = [&](const Value& v, int64_t def_pos, int64_t def_neg) -> int64_t {
    if (v.is_none() || v.is_undefined()) return st > 0 ? def_pos : def_neg;
    int64_t i = v.int_value();
    if (i < 0) {
      i += n;
      if (i < 0) i = st < 0 ? -1 : 0;
    } else if (i >= n) {
      i = st < 0 ? n - 1 : n;
    }
    return i;
  };
  const int64_t b = adjust(start, 0, n - 1);
  const int64_t e = adjust(stop, n, -1);
  std::u32string out_s;
  std::vector<Value> out_l;
  for (int64_t i = b; st > 0 ? i < e : i > e; i += st) {
    if (is_str) {
      out_s.push_back(chars[size_t(i)]);
    } else {
      out_l.push_back((*items)[size_t(i)]);
    }
  }
  if (is_str) return Value(utf8::encode(out_s));
  return Value::list(std::move(out_l), obj.as_list().kind);
}

}  // namespace dsi::jinja
