// Filters, tests and globals, transcribed from jinja2/filters.py, jinja2/tests.py and jinja2/defaults.py
// (3.1), plus HF's additions: tojson as transformers defines it (json.dumps, ensure_ascii=False, no HTML
// escaping), raise_exception and strftime_now.
//
// Filters: abs attr batch capitalize center count d default dictsort e escape first float format indent
//   int items join last length list lower map max min reject rejectattr replace reverse round safe select
//   selectattr sort string sum title tojson trim unique upper wordcount.
// Tests: boolean callable defined divisibleby eq equalto escaped even false filter float ge gt greaterthan
//   in integer iterable le lessthan lower lt mapping ne none number odd sameas sequence string test true
//   undefined upper == != < <= > >=.
// Globals: range namespace dict raise_exception strftime_now.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>

#include "dsinfer/error.h"
#include "text/jinja.h"
#include "text/jinja_internal.h"
#include "text/jinja_utf8.h"

namespace dsi::jinja {

std::vector<Value> bind_args(const CallArgs& args, const std::vector<ParamSpec>& spec, const std::string& fname) {
  std::vector<Value> out(spec.size());
  std::vector<bool> set(spec.size(), false);
  if (args.pos.size() > spec.size()) {
    raise(fname + "() takes at most " + std::to_string(spec.size()) + " argument(s) (" +
          std::to_string(args.pos.size()) + " given)");
  }
  for (size_t i = 0; i < args.pos.size(); ++i) {
    out[i] = args.pos[i];
    set[i] = true;
  }
  for (const auto& [k, v] : args.kw) {
    size_t i = 0;
    while (i < spec.size() && k != spec[i].name) ++i;
    if (i == spec.size()) raise(fname + "() got an unexpected keyword argument '" + k + "'");
    if (set[i]) raise(fname + "() got multiple values for argument '" + k + "'");
    out[i] = v;
    set[i] = true;
  }
  for (size_t i = 0; i < spec.size(); ++i) {
    if (set[i]) continue;
    if (spec[i].required) raise(fname + "() missing required argument '" + spec[i].name + "'");
    out[i] = spec[i].def;
  }
  return out;
}

namespace {

std::string soft_str(const Value& v) { return v.str(); }  // Undefined prints as ""

Value generator(std::vector<Value> items) { return Value::list(std::move(items), ListKind::kGenerator); }

// jinja2's make_attrgetter: "a.b.0" looked up with environment.getitem, part by part.
Value attr_get(Interp& in, const Value& item, const Value& attribute) {
  if (attribute.is_none() || attribute.is_undefined()) return item;
  if (attribute.is_int()) return in.getitem(item, attribute);
  Value cur = item;
  const std::string path = attribute.str();
  size_t b = 0;
  while (true) {
    const size_t e = path.find('.', b);
    const std::string part = path.substr(b, e == std::string::npos ? std::string::npos : e - b);
    const bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    cur = in.getitem(cur, digits ? Value(parse_digits(part)) : Value(part));
    if (e == std::string::npos) break;
    b = e + 1;
  }
  return cur;
}

Value ignore_case(const Value& v) { return v.is_string() ? Value(utf8::lower(v.as_string())) : v; }

// Python's round(x, n) for floats: correctly rounded (ties to even on the exact binary value).
double py_round(double x, int64_t n) {
  if (!std::isfinite(x)) return x;
  if (n == 0) return std::nearbyint(x);
  if (n > 0) {
    if (n > 300) return x;
    char buf[512];
    std::snprintf(buf, sizeof(buf), "%.*f", int(n), x);
    return std::strtod(buf, nullptr);
  }
  const double p = std::pow(10.0, double(-n));
  return std::nearbyint(x / p) * p;
}

// Python int(str, base) for base 10 and the prefixes; returns false when Python would raise ValueError.
bool parse_int(const std::string& s, int base, int64_t* out) {
  std::string t = s;
  auto not_space = [](char c) { return !(c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'); };
  t.erase(t.begin(), std::find_if(t.begin(), t.end(), not_space));
  t.erase(std::find_if(t.rbegin(), t.rend(), not_space).base(), t.end());
  if (t.empty()) return false;
  bool neg = false;
  size_t i = 0;
  if (t[0] == '+' || t[0] == '-') neg = t[i++] == '-';
  if (base == 0 || base == 16 || base == 8 || base == 2) {
    if (t.size() > i + 1 && t[i] == '0') {
      const char p = char(t[i + 1] | 0x20);
      const int pb = p == 'x' ? 16 : p == 'o' ? 8 : p == 'b' ? 2 : 0;
      if (pb && (base == 0 || base == pb)) {
        base = pb;
        i += 2;
      }
    }
    if (base == 0) base = 10;
  }
  std::string digits;
  bool last_us = true;
  for (; i < t.size(); ++i) {
    if (t[i] == '_') {
      if (last_us) return false;
      last_us = true;
      continue;
    }
    const char c = char(t[i] | 0x20);
    const int d = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'z') ? c - 'a' + 10 : 99;
    if (d >= base) return false;
    digits.push_back(t[i]);
    last_us = false;
  }
  if (digits.empty() || last_us) return false;
  errno = 0;
  const unsigned long long v = std::strtoull(digits.c_str(), nullptr, base);
  if (errno == ERANGE || v > uint64_t(INT64_MAX)) raise("integer out of 64-bit range: " + s);
  *out = neg ? -int64_t(v) : int64_t(v);
  return true;
}

bool parse_float(const std::string& s, double* out) {
  std::string t;
  for (char c : s)
    if (c != '_') t.push_back(c);
  const char* b = t.c_str();
  while (*b == ' ' || *b == '\t' || *b == '\n' || *b == '\r' || *b == '\f' || *b == '\v') ++b;
  if (!*b) return false;
  char* end = nullptr;
  const double v = std::strtod(b, &end);
  while (*end == ' ' || *end == '\t' || *end == '\n' || *end == '\r' || *end == '\f' || *end == '\v') ++end;
  if (*end || end == b) return false;
  if ((b[0] == '0' && (b[1] | 0x20) == 'x') || ((b[0] == '-' || b[0] == '+') && b[1] == '0' && (b[2] | 0x20) == 'x')) {
    return false;  // strtod accepts hex floats, Python does not
  }
  *out = v;
  return true;
}

// ---- filters ---------------------------------------------------------------------------------------

Value f_abs(Interp&, const Value& v, CallArgs& a) {
  bind_args(a, {}, "abs");
  if (v.is_undefined()) raise_undefined(v);
  if (v.is_float()) return Value(std::fabs(v.as_float()));
  if (v.is_number()) return Value(v.int_value() < 0 ? -v.int_value() : v.int_value());
  raise("bad operand type for abs(): '" + v.type_name() + "'");
}

Value f_attr(Interp& in, const Value& v, CallArgs& a) {
  const auto p = bind_args(a, {{"name", Value(), true}}, "attr");
  if (v.is_undefined()) raise_undefined(v);
  const std::string name = p[0].str();
  if (v.is_namespace()) {
    const Value* x = v.as_namespace().attrs.find(name);
    return x ? *x : Value::undefined("'Namespace object' has no attribute '" + name + "'");
  }
  bool found = false;
  Value m = method(in, v, name, &found);
  return found ? m : Value::undefined(fmt::format("'{} object' has no attribute '{}'", v.type_name(), name));
}

Value f_batch(Interp&, const Value& v, CallArgs& a) {
  const auto p = bind_args(a, {{"linecount", Value(), true}, {"fill_with", Value::none()}}, "batch");
  const int64_t n = p[0].int_value();
  if (n <= 0) raise("batch size must be positive");
  std::vector<Value> out, cur;
  for (const Value& x : iterate(v)) {
    cur.push_back(x);
    if (int64_t(cur.size()) == n) out.push_back(Value::list(std::exchange(cur, {})));
  }
  if (!cur.empty()) {
    if (!p[1].is_none()) {
      while (int64_t(cur.size()) < n) cur.push_back(p[1]);
    }
    out.push_back(Value::list(std::move(cur)));
  }
  return generator(std::move(out));
}

Value f_capitalize(Interp&, const Value& v, CallArgs& a) {
  bind_args(a, {}, "capitalize");
  return Value(pystr::capitalize(soft_str(v)));
}

Value f_center(Interp&, const Value& v, CallArgs& a) {
  const auto p = bind_args(a, {{"width", Value(80)}}, "center");
  return Value(pystr::center(soft_str(v), p[0].int_value()));
}

Value f_length(Interp&, const Value& v, CallArgs& a) {
  bind_args(a, {}, "length");
  return Value(length(v));
}

Value f_default(Interp&, const Value& v, CallArgs& a) {
  const auto p = bind_args(a, {{"default_value", Value("")}, {"boolean", Value(false)}}, "default");
  if (v.is_undefined() || (p[1].truthy() && !v.truthy())) return p[0];
  return v;
}

Value f_dictsort(Interp&, const Value& v, CallArgs& a) {
  const auto p = bind_args(
      a, {{"case_sensitive", Value(false)}, {"by", Value("key")}, {"reverse", Value(false)}}, "dictsort");
  if (!v.is_dict()) raise("dictsort filter needs a mapping");
  const bool by_value = p[1].str() == "value";
  if (!by_value && p[1].str() != "key") raise("You can only sort by either \"key\" or \"value\"");
  std::vector<Value> items;
  for (const auto& [k, x] : v.as_dict().items()) items.push_back(Value::list({Value(k), x}, ListKind::kTuple));
  const bool cs = p[0].truthy(), rev = p[2].truthy();
  auto key = [&](const Value& t) {
    const Value& x = t.as_list().items[by_value ? 1 : 0];
    return cs ? x : ignore_case(x);
  };
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    return rev ? less_than(key(y), key(x)) : less_than(key(x), key(y));
  });
  return Value::list(std::move(items));
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

Value f_escape(Interp&, const Value& v, CallArgs& a) {
  bind_args(a, {}, "escape");
  return Value(html_escape(v.str()));
}

Value f_first(Interp&, const Value& v, CallArgs& a) {
  bind_args(a, {}, "first");
  std::vector<Value> items = iterate(v);
  if (items.empty()) return Value::undefined("No first item, sequence was empty.");
  return items.front();
}

Value f_last(Interp&, const Value& v, CallArgs& a) {
  bind_args(a, {}, "last");
  if (v.is_list() && v.as_list().kind == ListKind::kGenerator) raise("'generator' object is not reversible");
  std::vector<Value> items = iterate(v);
  if (items.empty()) return Value::undefined("No last item, sequence was empty.");
  return items.back();
}

Value f_float(Interp&, const Value& v, CallArgs& a) {
  const auto p = bind_args(a, {{"default", Value(0.0)}}, "float");
  if (v.is_undefined()) raise_undefined(v);
  if (v.is_number()) return Value(v.number_value());
  double d;
  if (v.is_string() && parse_float(v.as_string(), &d)) return Value(d);
  return p[0];
}

Value f_format(Interp&, const Value& v, CallArgs& a) {
  if (!a.pos.empty() && !a.kw.empty()) raise("can't handle positional and keyword arguments at the same time");
  if (!a.kw.empty()) {
    Dict d;
    for (const auto& [k, x] : a.kw) d.set(k, x);
    return Value(python_format(soft_str(v), Value::dict(std::move(d))));
  }
  return Value(python_format(soft_str(v), Value::list(a.pos, ListKind::kTuple)));
}

Value f_indent(Interp&, const Value& v, CallArgs& a) {
  const auto p = bind_args(a, {{"width", Value(4)}, {"first", Value(false)}, {"blank", Value(false)}}, "indent");
  if (v.is_undefined()) raise_undefined(v);
  if (!v.is_string()) raise("unsupported operand type(s) for +=: '" + v.type_name() + "' and 'str'");
  if (!p[0].is_string()) check_size(p[0].int_value());
  const std::string ind = p[0].is_string() ? p[0].as_string() : std::string(size_t(std::max<int64_t>(0, p[0].int_value())), ' ');
  const std::string s = v.as_string() + "\n";  // jinja2's quirk for splitlines
  std::vector<std::string> lines = pystr::splitlines(s, false);
  std::string rv;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i) rv.push_back('\n');
    if (i && (p[2].truthy() || !lines[i].empty())) rv.append(ind);
    rv.append(lines[i]);
  }
  if (p[1].truthy()) rv.insert(0, ind);
  return Value(rv);
}

Value f_int(Interp&, const Value& v, CallArgs& a) {
  const auto p = bind_args(a, {{"default", Value(0)}, {"base", Value(10)}}, "int");
  if (v.is_undefined()) raise_undefined(v);
  if (v.is_int() || v.is_bool()) return Value(v.int_value());
  if (v.is_float()) {
    if (std::isnan(v.as_float())) return p[0];
    if (std::isinf(v.as_float())) raise("cannot convert float infinity to integer");
    return Value(int64_t(std::trunc(v.as_float())));
  }
  if (v.is_string()) {
    int64_t i;
    if (parse_int(v.as_string(), int(p[1].int_value()), &i)) return Value(i);
    double d;
    if (parse_float(v.as_string(), &d) && std::isfinite(d)) return Value(int64_t(std::trunc(d)));
  }
  return p[0];
}

Value f_items(Interp&, const Value& v, CallArgs& a) {
  bind_args(a, {}, "items");
  if (v.is_undefined()) return generator({});
  if (!v.is_dict()) raise("Can only get item pairs from a mapping.");
  std::vector<Value> out;
  for (const auto& [k, x] : v.as_dict().items()) out.push_back(Value::list({Value(k), x}, ListKind::kTuple));
  return generator(std::move(out));
}

Value f_join(Interp& in, const Value& v, CallArgs& a) {
  const auto p = bind_args(a, {{"d", Value("")}, {"attribute", Value::none()}}, "join");
  const std::string sep = p[0].str();
  std::string out;
  bool first = true;
  for (const Value& x : iterate(v)) {
    if (!first) out += sep;
    first = false;
    out += attr_get(in, x, p[1]).str();
  }
  return Value(std::move(out));
}

Value f_list(Interp&, const Value& v, CallArgs& a) {
  bind_args(a, {}, "list");
  return Value::list(iterate(v));
}

Value f_lower(Interp&, const Value& v, CallArgs& a) {
  bind_args(a, {}, "lower");
  return Value(utf8::lower(soft_str(v)));
}

Value f_upper(Interp&, const Value& v, CallArgs& a) {
  bind_args(a, {}, "upper");
  return Value(utf8::upper(soft_str(v)));
}

Value f_map(Interp& in, const Value& v, CallArgs& a) {
  if (!v.truthy()) return generator({});
  std::vector<Value> out;
  if (a.pos.empty()) {
    Value attribute, def = Value::none();
    for (const auto& [k, x] : a.kw) {
      if (k == "attribute") {
        attribute = x;
      } else if (k == "default") {
        def = x;
      } else {
        raise("Unexpected keyword argument '" + k + "'");
      }
    }
    if (attribute.is_undefined()) raise("map requires a filter argument");
    for (const Value& x : iterate(v)) {
      Value r = attr_get(in, x, attribute);
      out.push_back(r.is_undefined() && !def.is_none() ? def : r);
    }
    return generator(std::move(out));
  }
  const std::string name = a.pos[0].str();
  CallArgs rest;
  rest.pos.assign(a.pos.begin() + 1, a.pos.end());
  rest.kw = a.kw;
  for (const Value& x : iterate(v)) {
    CallArgs c = rest;
    out.push_back(in.filter(name, x, c));
  }
  return generator(std::move(out));
}

Value min_max(Interp& in, const Value& v, CallArgs& a, bool is_max) {
  const auto p = bind_args(a, {{"case_sensitive", Value(false)}, {"attribute", Value::none()}}, is_max ? "max" : "min");
  std::vector<Value> items = iterate(v);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  auto key = [&](const Value& x) {
    Value k = attr_get(in, x, p[1]);
    return p[0].truthy() ? k : ignore_case(k);
  };
  size_t best = 0;
  for (size_t i = 1; i < items.size(); ++i) {
    if (is_max ? less_than(key(items[best]), key(items[i])) : less_than(key(items[i]), key(items[best]))) best = i;
  }
  return items[best];
}
Value f_max(Interp& in, const Value& v, CallArgs& a) { return min_max(in, v, a, true); }
Value f_min(Interp& in, const Value& v, CallArgs& a) { return min_max(in, v, a, false); }

Value select_or_reject(Interp& in, const Value& v, CallArgs& a, bool select, bool attr) {
  if (!v.truthy()) return generator({});
  size_t off = 0;
  Value attribute;
  if (attr) {
    if (a.pos.empty()) raise("Missing parameter for attribute name");
    attribute = a.pos[0];
    off = 1;
  }
  const bool has_test = a.pos.size() > off;
  const std::string test_name = has_test ? a.pos[off].str() : "";
  CallArgs targs;
  if (has_test) targs.pos.assign(a.pos.begin() + std::ptrdiff_t(off + 1), a.pos.end());
  targs.kw = a.kw;
  std::vector<Value> out;
  for (const Value& item : iterate(v)) {
    const Value x = attr ? attr_get(in, item, attribute) : item;
    bool r;
    if (has_test) {
      CallArgs c = targs;
      r = in.test(test_name, x, c);
    } else {
      r = x.truthy();
    }
    if (r == select) out.push_back(item);
  }
  return generator(std::move(out));
}
Value f_select(Interp& in, const Value& v, CallArgs& a) { return select_or_reject(in, v, a, true, false); }
Value f_reject(Interp& in, const Value& v, CallArgs& a) { return select_or_reject(in, v, a, false, false); }
Value f_selectattr(Interp& in, const Value& v, CallArgs& a) { return select_or_reject(in, v, a, true, true); }
Value f_rejectattr(Interp& in, const Value& v, CallArgs& a) { return select_or_reject(in, v, a, false, true); }

Value f_replace(Interp&, const Value& v, CallArgs& a) {
  const auto p = bind_args(a, {{"old", Value(), true}, {"new", Value(), true}, {"count", Value::none()}}, "replace");
  const int64_t count = p[2].is_none() ? -1 : p[2].int_value();
  return Value(pystr::replace(v.str(), p[0].str(), p[1].str(), count));
}

Value f_reverse(Interp&, const Value& v, CallArgs& a) {
  bind_args(a, {}, "reverse");
  if (v.is_string()) {
    std::u32string u = utf8::decode(v.as_string());
    std::reverse(u.begin(), u.end());
    return Value(utf8::encode(u));
  }
  std::vector<Value> items = iterate(v);
  std::reverse(items.begin(), items.end());
  const bool was_generator = v.is_list() && v.as_list().kind == ListKind::kGenerator;
  return was_generator ? Value::list(std::move(items)) : generator(std::move(items));  // reversed(x) is lazy
}

Value f_round(Interp&, const Value& v, CallArgs& a) {
  const auto p = bind_args(a, {{"precision", Value(0)}, {"method", Value("common")}}, "round");
  const std::string method = p[1].str();
  if (method != "common" && method != "ceil" && method != "floor") raise("method must be common, ceil or floor");
  if (v.is_undefined()) raise_undefined(v);
  if (!v.is_number()) raise("type " + v.type_name() + " doesn't define __round__ method");
  const int64_t n = p[0].int_value();
  if (method == "common") {
    if (!v.is_float()) {  // round(int, n) stays an int
      if (n >= 0) return Value(v.int_value());
      return Value(int64_t(py_round(double(v.int_value()), n)));
    }
    return Value(py_round(v.as_float(), n));
  }
  const double scale = std::pow(10.0, double(n));
  const double x = v.number_value() * scale;
  return Value((method == "ceil" ? std::ceil(x) : std::floor(x)) / scale);
}

Value f_safe(Interp&, const Value& v, CallArgs& a) {
  bind_args(a, {}, "safe");
  return Value(v.str());
}

Value f_sort(Interp& in, const Value& v, CallArgs& a) {
  const auto p = bind_args(
      a, {{"reverse", Value(false)}, {"case_sensitive", Value(false)}, {"attribute", Value::none()}}, "sort");
  std::vector<Value> items = iterate(v);
  const bool rev = p[0].truthy(), cs = p[1].truthy();
  // make_multi_attrgetter: "a,b" sorts by several attributes.
  std::vector<Value> attrs;
  if (p[2].is_string() && p[2].as_string().find(',') != std::string::npos) {
    for (const auto& part : pystr::split(p[2].as_string(), Value(","), -1, false)) attrs.emplace_back(part);
  } else {
    attrs.push_back(p[2]);
  }
  auto key = [&](const Value& x) {
    std::vector<Value> ks;
    for (const Value& at : attrs) {
      Value k = attr_get(in, x, at);
      ks.push_back(cs ? k : ignore_case(k));
    }
    return ks.size() == 1 ? ks[0] : Value::list(std::move(ks));
  };
  std::vector<std::pair<Value, Value>> keyed;
  for (Value& x : items) keyed.emplace_back(key(x), std::move(x));
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
    return rev ? less_than(y.first, x.first) : less_than(x.first, y.first);
  });
  std::vector<Value> out;
  for (auto& kv : keyed) out.push_back(std::move(kv.second));
  return Value::list(std::move(out));
}

Value f_string(Interp&, const Value& v, CallArgs& a) {
  bind_args(a, {}, "string");
  return Value(soft_str(v));
}

Value f_sum(Interp& in, const Value& v, CallArgs& a) {
  const auto p = bind_args(a, {{"attribute", Value::none()}, {"start", Value(0)}}, "sum");
  Value total = p[1];
  for (const Value& x : iterate(v)) total = binary_op("+", total, attr_get(in, x, p[0]));
  return total;
}

Value f_title(Interp&, const Value& v, CallArgs& a) {
  bind_args(a, {}, "title");
  // jinja2's do_title: split before runs of [-\s({\[<], then upper-case each chunk's first character.
  const std::u32string u = utf8::decode(soft_str(v));
  auto is_sep = [](char32_t c) { return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || utf8::is_space(c); };
  std::u32string out;
  size_t i = 0;
  while (i < u.size()) {
    size_t j = i;
    const bool sep = is_sep(u[i]);
    while (j < u.size() && is_sep(u[j]) == sep) ++j;
    if (sep) {
      out += u.substr(i, j - i);
    } else {
      out += utf8::upper32(u.substr(i, 1));
      out += utf8::lower32(std::u32string_view(u).substr(i + 1, j - i - 1));
    }
    i = j;
  }
  return Value(utf8::encode(out));
}

Value f_tojson(Interp&, const Value& v, CallArgs& a) {
  const auto p = bind_args(a,
                           {{"ensure_ascii", Value(false)},
                            {"indent", Value::none()},
                            {"separators", Value::none()},
                            {"sort_keys", Value(false)}},
                           "tojson");
  DumpOptions o;
  o.ensure_ascii = p[0].truthy();
  if (p[1].is_string()) {
    o.indent_str = p[1].as_string();
    o.has_indent_str = true;
  } else if (p[1].is_int() || p[1].is_bool()) {
    check_size(p[1].int_value());
    o.indent = int(std::max<int64_t>(0, p[1].int_value()));
  } else if (!p[1].is_none()) {
    raise("tojson: indent must be an int, a string or None");
  }
  if (!p[2].is_none()) {
    if (!p[2].is_list() || p[2].as_list().items.size() != 2) raise("tojson: separators must be a pair of strings");
    o.item_sep = p[2].as_list().items[0].str();
    o.key_sep = p[2].as_list().items[1].str();
    o.has_item_sep = true;
  }
  o.sort_keys = p[3].truthy();
  try {
    return Value(dumps(v, o));
  } catch (const Error& e) {
    raise(e.what());
  }
}

Value f_trim(Interp&, const Value& v, CallArgs& a) {
  const auto p = bind_args(a, {{"chars", Value::none()}}, "trim");
  return Value(pystr::strip(soft_str(v), p[0], true, true));
}

Value f_unique(Interp& in, const Value& v, CallArgs& a) {
  const auto p = bind_args(a, {{"case_sensitive", Value(false)}, {"attribute", Value::none()}}, "unique");
  std::vector<Value> seen, out;
  for (const Value& x : iterate(v)) {
    Value k = attr_get(in, x, p[1]);
    if (!p[0].truthy()) k = ignore_case(k);
    if (std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return equals(s, k); })) continue;
    seen.push_back(k);
    out.push_back(x);
  }
  return generator(std::move(out));
}

Value f_wordcount(Interp&, const Value& v, CallArgs& a) {
  bind_args(a, {}, "wordcount");
  int64_t n = 0;
  bool in_word = false;
  for (char32_t c : utf8::decode(soft_str(v))) {
    const bool w = utf8::is_word(c);
    if (w && !in_word) ++n;
    in_word = w;
  }
  return Value(n);
}

// ---- tests -----------------------------------------------------------------------------------------

Value one_arg(CallArgs& a, const char* name) { return bind_args(a, {{"other", Value(), true}}, name)[0]; }

bool t_defined(Interp&, const Value& v, CallArgs& a) { return bind_args(a, {}, "defined"), !v.is_undefined(); }
bool t_undefined(Interp&, const Value& v, CallArgs& a) { return bind_args(a, {}, "undefined"), v.is_undefined(); }
bool t_none(Interp&, const Value& v, CallArgs& a) { return bind_args(a, {}, "none"), v.is_none(); }
bool t_boolean(Interp&, const Value& v, CallArgs& a) { return bind_args(a, {}, "boolean"), v.is_bool(); }
bool t_false(Interp&, const Value& v, CallArgs& a) { return bind_args(a, {}, "false"), v.is_bool() && !v.as_bool(); }
bool t_true(Interp&, const Value& v, CallArgs& a) { return bind_args(a, {}, "true"), v.is_bool() && v.as_bool(); }
bool t_integer(Interp&, const Value& v, CallArgs& a) { return bind_args(a, {}, "integer"), v.is_int(); }
bool t_float(Interp&, const Value& v, CallArgs& a) { return bind_args(a, {}, "float"), v.is_float(); }
bool t_number(Interp&, const Value& v, CallArgs& a) { return bind_args(a, {}, "number"), v.is_number(); }
bool t_string(Interp&, const Value& v, CallArgs& a) { return bind_args(a, {}, "string"), v.is_string(); }
bool t_mapping(Interp&, const Value& v, CallArgs& a) { return bind_args(a, {}, "mapping"), v.is_dict(); }
bool t_callable(Interp&, const Value& v, CallArgs& a) {
  return bind_args(a, {}, "callable"), v.is_callable() || v.is_undefined();  // Undefined has __call__
}
bool t_escaped(Interp&, const Value&, CallArgs& a) { return bind_args(a, {}, "escaped"), false; }
bool t_iterable(Interp&, const Value& v, CallArgs& a) {
  bind_args(a, {}, "iterable");
  return v.is_list() || v.is_string() || v.is_dict() || v.is_undefined();
}
bool t_sequence(Interp&, const Value& v, CallArgs& a) {
  bind_args(a, {}, "sequence");
  if (v.is_list()) return v.as_list().kind == ListKind::kList || v.as_list().kind == ListKind::kTuple;
  return v.is_string() || v.is_dict() || v.is_undefined();
}
bool t_lower(Interp&, const Value& v, CallArgs& a) {
  bind_args(a, {}, "lower");
  const std::string s = v.str();
  bool cased = false;
  for (char32_t c : utf8::decode(s)) {
    if (utf8::to_lower(c) != c) return false;
    cased = cased || utf8::to_upper(c) != c;
  }
  return cased;
}
bool t_upper(Interp&, const Value& v, CallArgs& a) {
  bind_args(a, {}, "upper");
  bool cased = false;
  for (char32_t c : utf8::decode(v.str())) {
    if (utf8::to_upper(c) != c) return false;
    cased = cased || utf8::to_lower(c) != c;
  }
  return cased;
}
// odd, even, divisibleby: value % n == r, with Python's % (floats allowed, strings raise).
bool t_odd(Interp&, const Value& v, CallArgs& a) {
  bind_args(a, {}, "odd");
  return equals(binary_op("%", v, Value(2)), Value(1));
}
bool t_even(Interp&, const Value& v, CallArgs& a) {
  bind_args(a, {}, "even");
  return equals(binary_op("%", v, Value(2)), Value(0));
}
bool t_divisibleby(Interp&, const Value& v, CallArgs& a) {
  const Value d = bind_args(a, {{"num", Value(), true}}, "divisibleby")[0];
  return equals(binary_op("%", v, d), Value(0));
}
bool t_sameas(Interp&, const Value& v, CallArgs& a) {
  const Value o = one_arg(a, "sameas");
  if (v.identity()) return v.identity() == o.identity();
  if (v.is_none() || v.is_bool() || v.is_int()) return v.type_name() == o.type_name() && equals(v, o);
  return false;
}
bool t_in(Interp&, const Value& v, CallArgs& a) { return contains(bind_args(a, {{"seq", Value(), true}}, "in")[0], v); }
bool t_eq(Interp&, const Value& v, CallArgs& a) { return equals(v, one_arg(a, "eq")); }
bool t_ne(Interp&, const Value& v, CallArgs& a) { return !equals(v, one_arg(a, "ne")); }
bool t_lt(Interp&, const Value& v, CallArgs& a) { return less_than(v, one_arg(a, "lt")); }
bool t_gt(Interp&, const Value& v, CallArgs& a) { return less_than(one_arg(a, "gt"), v); }
bool t_le(Interp&, const Value& v, CallArgs& a) {
  const Value o = one_arg(a, "le");
  return !less_than(o, v);
}
bool t_ge(Interp&, const Value& v, CallArgs& a) {
  const Value o = one_arg(a, "ge");
  return !less_than(v, o);
}
bool t_filter(Interp&, const Value& v, CallArgs& a) {
  bind_args(a, {}, "filter");
  return v.is_string() && find_filter(v.as_string()) != nullptr;
}
bool t_test(Interp&, const Value& v, CallArgs& a) {
  bind_args(a, {}, "test");
  return v.is_string() && find_test(v.as_string()) != nullptr;
}

// ---- globals ---------------------------------------------------------------------------------------

Value g_range(Interp&, CallArgs& a) {
  if (!a.kw.empty()) raise("range() takes no keyword arguments");
  if (a.pos.empty() || a.pos.size() > 3) raise("range expected 1 to 3 arguments, got " + std::to_string(a.pos.size()));
  for (const Value& v : a.pos) {
    if (!v.is_int() && !v.is_bool()) raise("'" + v.type_name() + "' object cannot be interpreted as an integer");
  }
  int64_t start = 0, stop, step = 1;
  if (a.pos.size() == 1) {
    stop = a.pos[0].int_value();
  } else {
    start = a.pos[0].int_value();
    stop = a.pos[1].int_value();
    if (a.pos.size() == 3) step = a.pos[2].int_value();
  }
  if (step == 0) raise("range() arg 3 must not be zero");
  const int64_t n = step > 0 ? (stop > start ? (stop - start + step - 1) / step : 0)
                             : (start > stop ? (start - stop - step - 1) / -step : 0);
  constexpr int64_t kMaxRange = 100000;  // jinja2.sandbox.MAX_RANGE
  if (n > kMaxRange) raise("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
  std::vector<Value> out;
  out.reserve(size_t(n));
  for (int64_t i = 0; i < n; ++i) out.emplace_back(start + i * step);
  return Value::list(std::move(out));
}

// dict(*args, **kwargs) as Python builds it (a mapping or pairs, then keywords).
Dict dict_from_args(CallArgs& a, const char* fname) {
  Dict d;
  if (a.pos.size() > 1) raise(std::string(fname) + " expected at most 1 argument, got " + std::to_string(a.pos.size()));
  if (!a.pos.empty()) {
    const Value& src = a.pos[0];
    if (src.is_dict()) {
      d = src.as_dict();
    } else {
      for (const Value& pair : iterate(src)) {
        const std::vector<Value> kv = iterate(pair);
        if (kv.size() != 2 || !kv[0].is_string()) raise("dictionary update sequence element has wrong form");
        d.set(kv[0].as_string(), kv[1]);
      }
    }
  }
  for (const auto& [k, v] : a.kw) d.set(k, v);
  return d;
}

Value g_namespace(Interp& in, CallArgs& a) {
  auto ns = std::make_shared<Namespace>();
  ns->attrs = dict_from_args(a, "namespace");
  in.track(ns);
  return Value(std::move(ns));
}

Value g_dict(Interp&, CallArgs& a) { return Value::dict(dict_from_args(a, "dict")); }

Value g_raise_exception(Interp&, CallArgs& a) {
  const auto p = bind_args(a, {{"message", Value(), true}}, "raise_exception");
  throw RenderError{p[0].str(), 0, true};
}

Value g_strftime_now(Interp& in, CallArgs& a) {
  const auto p = bind_args(a, {{"format", Value(), true}}, "strftime_now");
  std::tm tm{};
  if (in.options().now) {
    tm = in.options().now();
  } else {
    const std::time_t t = std::time(nullptr);
    localtime_r(&t, &tm);
  }
  const std::string fmt = p[0].str();
  if (fmt.empty()) return Value("");
  std::string buf(256 + fmt.size() * 8, '\0');
  const size_t n = std::strftime(buf.data(), buf.size(), fmt.c_str(), &tm);
  buf.resize(n);
  return Value(buf);
}

}  // namespace

FilterFn find_filter(std::string_view name) {
  static const std::map<std::string_view, FilterFn> kFilters = {
      {"abs", f_abs},         {"attr", f_attr},           {"batch", f_batch},
      {"capitalize", f_capitalize}, {"center", f_center}, {"count", f_length},
      {"d", f_default},       {"default", f_default},     {"dictsort", f_dictsort},
      {"e", f_escape},        {"escape", f_escape},       {"first", f_first},
      {"float", f_float},     {"format", f_format},       {"indent", f_indent},
      {"int", f_int},         {"items", f_items},         {"join", f_join},
      {"last", f_last},       {"length", f_length},       {"list", f_list},
      {"lower", f_lower},     {"map", f_map},             {"max", f_max},
      {"min", f_min},         {"reject", f_reject},       {"rejectattr", f_rejectattr},
      {"replace", f_replace}, {"reverse", f_reverse},     {"round", f_round},
      {"safe", f_safe},       {"select", f_select},       {"selectattr", f_selectattr},
      {"sort", f_sort},       {"string", f_string},       {"sum", f_sum},
      {"title", f_title},     {"tojson", f_tojson},       {"trim", f_trim},
      {"unique", f_unique},   {"upper", f_upper},         {"wordcount", f_wordcount},
  };
  auto it = kFilters.find(name);
  return it == kFilters.end() ? nullptr : it->second;
}

TestFn find_test(std::string_view name) {
  static const std::map<std::string_view, TestFn> kTests = {
      {"boolean", t_boolean}, {"callable", t_callable}, {"defined", t_defined},   {"divisibleby", t_divisibleby},
      {"eq", t_eq},           {"equalto", t_eq},        {"==", t_eq},             {"escaped", t_escaped},
      {"even", t_even},       {"false", t_false},       {"filter", t_filter},     {"float", t_float},
      {"ge", t_ge},           {">=", t_ge},             {"gt", t_gt},             {">", t_gt},
      {"greaterthan", t_gt},  {"in", t_in},             {"integer", t_integer},   {"iterable", t_iterable},
      {"le", t_le},           {"<=", t_le},             {"lessthan", t_lt},       {"lower", t_lower},
      {"lt", t_lt},           {"<", t_lt},              {"mapping", t_mapping},   {"ne", t_ne},
      {"!=", t_ne},           {"none", t_none},         {"number", t_number},     {"odd", t_odd},
      {"sameas", t_sameas},   {"sequence", t_sequence}, {"string", t_string},     {"test", t_test},
      {"true", t_true},       {"undefined", t_undefined}, {"upper", t_upper},
  };
  auto it = kTests.find(name);
  return it == kTests.end() ? nullptr : it->second;
}

const Dict& builtin_globals() {
  static const Dict kGlobals = [] {
    Dict d;
    d.set("range", Value::callable("range", g_range, "type"));
    d.set("namespace", Value::callable("namespace", g_namespace, "type"));
    d.set("dict", Value::callable("dict", g_dict, "type"));
    d.set("raise_exception", Value::callable("raise_exception", g_raise_exception, "function"));
    d.set("strftime_now", Value::callable("strftime_now", g_strftime_now, "function"));
    return d;
  }();
  return kGlobals;
}

}  // namespace dsi::jinja
