// Methods templates call on values (str, dict and list methods, as CPython defines them). Indices
// count code points, as in Python. The formatting mini-languages are in jinja_format.cpp.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "dsinfer/error.h"
#include "text/jinja.h"
#include "text/jinja_internal.h"
#include "text/jinja_utf8.h"

namespace dsi::jinja {

// ---- str helpers -----------------------------------------------------------------------------------

namespace pystr {

std::string strip(std::string_view s, const Value& chars, bool left, bool right) {
  if (!chars.is_none() && !chars.is_undefined() && !chars.is_string()) raise("strip arg must be None or str");
  const std::u32string u = utf8::decode(s);
  const std::u32string set = chars.is_string() ? utf8::decode(chars.as_string()) : std::u32string();
  auto strip_it = [&](char32_t c) {
    return chars.is_string() ? set.find(c) != std::u32string::npos : utf8::is_space(c);
  };
  size_t b = 0, e = u.size();
  if (left)
    while (b < e && strip_it(u[b])) ++b;
  if (right)
    while (e > b && strip_it(u[e - 1])) --e;
  return utf8::encode(std::u32string_view(u).substr(b, e - b));
}

std::vector<std::string> split(std::string_view s, const Value& sep, int64_t maxsplit, bool from_right) {
  std::vector<std::string> out;
  if (maxsplit < 0) maxsplit = INT64_MAX;
  if (sep.is_none() || sep.is_undefined()) {  // runs of whitespace; no empty strings
    const std::u32string u = utf8::decode(s);
    std::vector<std::u32string> parts;
    if (!from_right) {
      size_t i = 0;
      int64_t splits = 0;
      while (true) {
        while (i < u.size() && utf8::is_space(u[i])) ++i;
        if (i >= u.size()) break;
        if (splits == maxsplit) {
          parts.push_back(u.substr(i));
          break;
        }
        size_t j = i;
        while (j < u.size() && !utf8::is_space(u[j])) ++j;
        parts.push_back(u.substr(i, j - i));
        ++splits;
        i = j;
      }
    } else {
      int64_t i = int64_t(u.size());
      int64_t splits = 0;
      while (true) {
        while (i > 0 && utf8::is_space(u[size_t(i - 1)])) --i;
        if (i <= 0) break;
        if (splits == maxsplit) {
          parts.push_back(u.substr(0, size_t(i)));
          break;
        }
        int64_t j = i;
        while (j > 0 && !utf8::is_space(u[size_t(j - 1)])) --j;
        parts.push_back(u.substr(size_t(j), size_t(i - j)));
        ++splits;
        i = j;
      }
      std::reverse(parts.begin(), parts.end());
    }
    for (const auto& p : parts) out.push_back(utf8::encode(p));
    return out;
  }
  if (!sep.is_string()) raise("must be str or None, not " + sep.type_name());
  const std::string& d = sep.as_string();
  if (d.empty()) raise("empty separator");
  if (!from_right) {
    size_t i = 0;
    int64_t splits = 0;
    while (splits < maxsplit) {
      const size_t k = s.find(d, i);
      if (k == std::string_view::npos) break;
      out.emplace_back(s.substr(i, k - i));
      i = k + d.size();
      ++splits;
    }
    out.emplace_back(s.substr(i));
    return out;
  }
  size_t end = s.size();
  int64_t splits = 0;
  while (splits < maxsplit && end >= d.size()) {
    const size_t k = s.rfind(d, end - d.size());
    if (k == std::string_view::npos) break;
    out.emplace_back(s.substr(k + d.size(), end - k - d.size()));
    end = k;
    ++splits;
  }
  out.emplace_back(s.substr(0, end));
  std::reverse(out.begin(), out.end());
  return out;
}

std::string replace(std::string_view s, std::string_view old, std::string_view rep, int64_t count) {
  if (count < 0) count = INT64_MAX;
  std::string out;
  if (old.empty()) {  // Python inserts `rep` at every boundary
    const std::u32string u = utf8::decode(s);
    int64_t n = 0;
    for (size_t i = 0; i <= u.size(); ++i) {
      if (n < count) {
        out += rep;
        ++n;
      }
      if (i < u.size()) utf8::append(out, u[i]);
    }
    return out;
  }
  size_t i = 0;
  int64_t n = 0;
  while (n < count) {
    const size_t k = s.find(old, i);
    if (k == std::string_view::npos) break;
    out.append(s.substr(i, k - i));
    out.append(rep);
    i = k + old.size();
    ++n;
  }
  out.append(s.substr(i));
  return out;
}

std::vector<std::string> splitlines(std::string_view s, bool keepends) {
  const std::u32string u = utf8::decode(s);
  std::vector<std::string> out;
  size_t start = 0, i = 0;
  auto is_break = [](char32_t c) {
    return c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || c == 0x1c || c == 0x1d || c == 0x1e || c == 0x85 ||
           c == 0x2028 || c == 0x2029;
  };
  while (i < u.size()) {
    if (!is_break(u[i])) {
      ++i;
      continue;
    }
    size_t eol = i + 1;
    if (u[i] == '\r' && eol < u.size() && u[eol] == '\n') ++eol;
    out.push_back(utf8::encode(std::u32string_view(u).substr(start, (keepends ? eol : i) - start)));
    start = i = eol;
  }
  if (start < u.size()) out.push_back(utf8::encode(std::u32string_view(u).substr(start)));
  return out;
}

namespace {
bool is_cased(char32_t c) { return utf8::to_lower(c) != c || utf8::to_upper(c) != c; }
}  // namespace

std::string title(std::string_view s) {
  std::u32string out;
  bool prev_cased = false;
  for (char32_t c : utf8::decode(s)) {
    if (prev_cased) {
      out.push_back(utf8::to_lower(c));
    } else {
      out += utf8::upper32(std::u32string(1, c));
    }
    prev_cased = is_cased(c);
  }
  return utf8::encode(out);
}

std::string capitalize(std::string_view s) {
  std::u32string u = utf8::decode(s);
  if (u.empty()) return "";
  std::u32string out = utf8::upper32(u.substr(0, 1));
  out += utf8::lower32(std::u32string_view(u).substr(1));
  return utf8::encode(out);
}

std::string center(std::string_view s, int64_t width) {
  const int64_t len = int64_t(utf8::length(s));
  if (len >= width) return std::string(s);
  check_size(width);
  const int64_t marg = width - len;
  const int64_t left = marg / 2 + (marg & width & 1);
  return std::string(size_t(left), ' ') + std::string(s) + std::string(size_t(marg - left), ' ');
}

}  // namespace pystr

// ---- bound methods ---------------------------------------------------------------------------------

namespace {

Value str_list(std::vector<std::string> parts) {
  std::vector<Value> items;
  items.reserve(parts.size());
  for (auto& p : parts) items.emplace_back(std::move(p));
  return Value::list(std::move(items));
}

// Python's slice-style clamping of optional start/end arguments to [0, n].
void clamp_range(const std::vector<Value>& a, int64_t n, int64_t* b, int64_t* e) {
  auto get = [n](const Value& v, int64_t def) {
    if (v.is_none() || v.is_undefined()) return def;
    if (!v.is_int() && !v.is_bool()) raise("slice indices must be integers or None");
    int64_t i = v.int_value();
    if (i < 0) i = std::max<int64_t>(0, i + n);
    return std::min(i, n);
  };
  *b = get(a[0], 0);
  *e = get(a[1], n);
}

int64_t find_cp(const std::string& s, const std::string& sub, const std::vector<Value>& range, bool reverse) {
  const std::u32string u = utf8::decode(s);
  const std::u32string x = utf8::decode(sub);
  int64_t b, e;
  clamp_range(range, int64_t(u.size()), &b, &e);
  if (e - b < int64_t(x.size())) return -1;
  const std::u32string_view w = std::u32string_view(u).substr(size_t(b), size_t(e - b));
  const size_t k = reverse ? w.rfind(x) : w.find(x);
  return k == std::u32string_view::npos ? -1 : b + int64_t(k);
}

bool affix_match(const std::string& s, const Value& affix, const std::vector<Value>& range, bool prefix,
                 const char* fname) {
  std::vector<Value> options;
  if (affix.is_string()) {
    options.push_back(affix);
  } else if (affix.is_list() && affix.as_list().kind == ListKind::kTuple) {
    options = affix.as_list().items;
  } else {
    raise(std::string(fname) + " first arg must be str or a tuple of str, not " + affix.type_name());
  }
  const std::u32string u = utf8::decode(s);
  int64_t b, e;
  clamp_range(range, int64_t(u.size()), &b, &e);
  const std::u32string_view w = b <= e ? std::u32string_view(u).substr(size_t(b), size_t(e - b)) : std::u32string_view();
  for (const Value& o : options) {
    if (!o.is_string()) raise(std::string("tuple for ") + fname + " must only contain str, not " + o.type_name());
    const std::u32string x = utf8::decode(o.as_string());
    if (b > e && !x.empty()) continue;
    if (x.size() > w.size()) continue;
    if (prefix ? w.substr(0, x.size()) == x : w.substr(w.size() - x.size()) == x) return true;
  }
  return false;
}

Value string_method(const std::string& s, const std::string& name, Interp& in, CallArgs& args, bool* found) {
  *found = true;
  auto bind = [&](const std::vector<ParamSpec>& spec) { return bind_args(args, spec, name); };
  const Value none = Value::none();
  if (name == "upper") return (bind({}), Value(utf8::upper(s)));
  if (name == "lower") return (bind({}), Value(utf8::lower(s)));
  if (name == "title") return (bind({}), Value(pystr::title(s)));
  if (name == "capitalize") return (bind({}), Value(pystr::capitalize(s)));
  if (name == "swapcase") {
    bind({});
    std::u32string u = utf8::decode(s);
    for (char32_t& c : u) c = utf8::to_lower(c) != c ? utf8::to_lower(c) : utf8::to_upper(c);
    return Value(utf8::encode(u));
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const auto a = bind({{"chars", none}});
    return Value(pystr::strip(s, a[0], name != "rstrip", name != "lstrip"));
  }
  if (name == "split" || name == "rsplit") {
    const auto a = bind({{"sep", none}, {"maxsplit", Value(-1)}});
    if (!a[1].is_int() && !a[1].is_bool()) raise("maxsplit must be an integer");
    return str_list(pystr::split(s, a[0], a[1].int_value(), name == "rsplit"));
  }
  if (name == "splitlines") {
    const auto a = bind({{"keepends", Value(false)}});
    return str_list(pystr::splitlines(s, a[0].truthy()));
  }
  if (name == "startswith" || name == "endswith") {
    const auto a = bind({{"prefix", Value(), true}, {"start", none}, {"end", none}});
    return Value(affix_match(s, a[0], {a[1], a[2]}, name == "startswith", name.c_str()));
  }
  if (name == "replace") {
    const auto a = bind({{"old", Value(), true}, {"new", Value(), true}, {"count", Value(-1)}});
    if (!a[0].is_string() || !a[1].is_string()) raise("replace() arguments must be str");
    return Value(pystr::replace(s, a[0].as_string(), a[1].as_string(), a[2].int_value()));
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex") {
    const auto a = bind({{"sub", Value(), true}, {"start", none}, {"end", none}});
    if (!a[0].is_string()) raise("must be str, not " + a[0].type_name());
    const int64_t k = find_cp(s, a[0].as_string(), {a[1], a[2]}, name[0] == 'r');
    if (k < 0 && (name == "index" || name == "rindex")) raise("substring not found");
    return Value(k);
  }
  if (name == "count") {
    const auto a = bind({{"sub", Value(), true}, {"start", none}, {"end", none}});
    if (!a[0].is_string()) raise("must be str, not " + a[0].type_name());
    const std::u32string u = utf8::decode(s), x = utf8::decode(a[0].as_string());
    int64_t b, e;
    clamp_range({a[1], a[2]}, int64_t(u.size()), &b, &e);
    if (b > e) return Value(0);
    const std::u32string_view w = std::u32string_view(u).substr(size_t(b), size_t(e - b));
    if (x.empty()) return Value(int64_t(w.size()) + 1);
    int64_t n = 0;
    for (size_t k = w.find(x); k != std::u32string_view::npos; k = w.find(x, k + x.size())) ++n;
    return Value(n);
  }
  if (name == "join") {
    const auto a = bind({{"iterable", Value(), true}});
    std::string out;
    size_t i = 0;
    for (const Value& v : iterate(a[0])) {
      if (!v.is_string()) {
        raise("sequence item " + std::to_string(i) + ": expected str instance, " + v.type_name() + " found");
      }
      if (i++) out += s;
      out += v.as_string();
    }
    return Value(std::move(out));
  }
  if (name == "format") return Value(pystr::format(in, s, args));
  if (name == "center" || name == "ljust" || name == "rjust") {
    const auto a = bind({{"width", Value(), true}, {"fillchar", Value(" ")}});
    const int64_t len = int64_t(utf8::length(s)), w = a[0].int_value();
    if (w <= len) return Value(s);
    check_size(w);
    std::string fill;
    const std::u32string fc = utf8::decode(a[1].str());
    if (fc.size() != 1) raise("The fill character must be exactly one character long");
    if (name == "center") {
      const int64_t marg = w - len, left = marg / 2 + (marg & w & 1);
      std::string l, r;
      for (int64_t k = 0; k < left; ++k) utf8::append(l, fc[0]);
      for (int64_t k = 0; k < marg - left; ++k) utf8::append(r, fc[0]);
      return Value(l + s + r);
    }
    for (int64_t k = 0; k < w - len; ++k) utf8::append(fill, fc[0]);
    return Value(name == "ljust" ? s + fill : fill + s);
  }
  if (name == "zfill") {
    const auto a = bind({{"width", Value(), true}});
    const int64_t len = int64_t(utf8::length(s)), w = a[0].int_value();
    if (w <= len) return Value(s);
    check_size(w);
    const bool has_sign = !s.empty() && (s[0] == '+' || s[0] == '-');
    const std::string zeros(size_t(w - len), '0');
    return Value(has_sign ? s.substr(0, 1) + zeros + s.substr(1) : zeros + s);
  }
  if (name == "partition" || name == "rpartition") {
    const auto a = bind({{"sep", Value(), true}});
    if (!a[0].is_string()) raise("must be str, not " + a[0].type_name());
    const std::string& d = a[0].as_string();
    if (d.empty()) raise("empty separator");
    const size_t k = name == "partition" ? s.find(d) : s.rfind(d);
    std::vector<Value> parts;
    if (k == std::string::npos) {
      parts = name == "partition" ? std::vector<Value>{Value(s), Value(""), Value("")}
                                  : std::vector<Value>{Value(""), Value(""), Value(s)};
    } else {
      parts = {Value(s.substr(0, k)), Value(d), Value(s.substr(k + d.size()))};
    }
    return Value::list(std::move(parts), ListKind::kTuple);
  }
  if (name == "removeprefix" || name == "removesuffix") {
    const auto a = bind({{"affix", Value(), true}});
    const std::string x = a[0].str();
    if (name == "removeprefix") return Value(s.compare(0, x.size(), x) == 0 ? s.substr(x.size()) : s);
    return Value(s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0 ? s.substr(0, s.size() - x.size()) : s);
  }
  if (name == "isdigit" || name == "isdecimal" || name == "isnumeric" || name == "isalpha" || name == "isalnum" ||
      name == "isspace" || name == "islower" || name == "isupper") {
    bind({});
    const std::u32string u = utf8::decode(s);
    if (u.empty()) return Value(false);
    if (name == "islower" || name == "isupper") {
      bool cased = false;
      for (char32_t c : u) {
        const bool up = utf8::to_lower(c) != c, lo = utf8::to_upper(c) != c;
        if (name == "islower" ? up : lo) return Value(false);
        cased = cased || up || lo;
      }
      return Value(cased);
    }
    for (char32_t c : u) {
      const bool ok = name == "isspace" ? utf8::is_space(c)
                      : name == "isalpha" ? utf8::is_alpha(c)
                      : name == "isalnum" ? (utf8::is_alpha(c) || utf8::is_digit(c))
                                          : utf8::is_digit(c);
      if (!ok) return Value(false);
    }
    return Value(true);
  }
  *found = false;
  return Value();
}

}  // namespace

Value method(Interp& in, const Value& obj, const std::string& name, bool* found) {
  *found = false;
  const bool immutable = in.options().immutable;
  auto bound = [&](std::function<Value(Interp&, CallArgs&)> fn) {
    *found = true;
    return Value::callable(name, std::move(fn));
  };
  auto unsafe = [&](const char* type) {
    *found = true;
    return Value::undefined(std::string("access to attribute '") + name + "' of '" + type + "' object is unsafe.", true);
  };
  if (obj.is_string()) {
    static const char* const kNames[] = {
        "upper", "lower", "title", "capitalize", "swapcase", "strip", "lstrip", "rstrip", "split", "rsplit",
        "splitlines", "startswith", "endswith", "replace", "find", "rfind", "index", "rindex", "count", "join",
        "format", "center", "ljust", "rjust", "zfill", "partition", "rpartition", "removeprefix", "removesuffix",
        "isdigit", "isdecimal", "isnumeric", "isalpha", "isalnum", "isspace", "islower", "isupper"};
    for (const char* n : kNames) {
      if (name != n) continue;
      const std::string s = obj.as_string();
      return bound([s, name](Interp& i, CallArgs& a) {
        bool f;
        return string_method(s, name, i, a, &f);
      });
    }
    return Value();
  }
  if (obj.is_dict()) {
    const Value self = obj;
    if (name == "items" || name == "keys" || name == "values") {
      return bound([self, name](Interp&, CallArgs& a) {
        bind_args(a, {}, name);
        std::vector<Value> out;
        for (const auto& [k, v] : self.as_dict().items()) {
          if (name == "items") {
            out.push_back(Value::list({Value(k), v}, ListKind::kTuple));
          } else {
            out.push_back(name == "keys" ? Value(k) : v);
          }
        }
        return Value::list(std::move(out), name == "items"  ? ListKind::kDictItems
                                           : name == "keys" ? ListKind::kDictKeys
                                                            : ListKind::kDictValues);
      });
    }
    if (name == "get") {
      return bound([self](Interp&, CallArgs& a) {
        const auto p = bind_args(a, {{"key", Value(), true}, {"default", Value::none()}}, "get");
        if (!p[0].is_string()) return p[1];
        const Value* v = self.as_dict().find(p[0].as_string());
        return v ? *v : p[1];
      });
    }
    if (name == "copy") {
      return bound([self](Interp&, CallArgs& a) {
        bind_args(a, {}, "copy");
        return Value::dict(self.as_dict());
      });
    }
    if (name == "update" || name == "pop" || name == "popitem" || name == "setdefault" || name == "clear") {
      if (immutable) return unsafe("dict");
      return bound([self, name](Interp&, CallArgs& a) -> Value {
        Dict& d = self.as_dict();
        if (name == "update") {
          for (const Value& m : a.pos) {
            if (!m.is_dict()) raise("dict.update() expects a dict");
            for (const auto& [k, v] : m.as_dict().items()) d.set(k, v);
          }
          for (const auto& [k, v] : a.kw) d.set(k, v);
          return Value::none();
        }
        if (name == "clear") {
          d = Dict();
          return Value::none();
        }
        if (name == "popitem") {
          if (d.empty()) raise("popitem(): dictionary is empty");
          const auto last = d.items().back();
          d.erase(last.first);
          return Value::list({Value(last.first), last.second}, ListKind::kTuple);
        }
        const auto p = bind_args(a, {{"key", Value(), true}, {"default", Value::undefined("no default")}}, name);
        const std::string key = p[0].str();
        if (Value* v = d.find(key)) {
          Value r = *v;
          if (name == "pop") d.erase(key);
          return r;
        }
        if (name == "setdefault") {
          const Value def = p[1].is_undefined() ? Value::none() : p[1];
          d.set(key, def);
          return def;
        }
        if (p[1].is_undefined()) raise("KeyError: " + string_repr(key));
        return p[1];
      });
    }
    return Value();
  }
  if (obj.is_list() && (obj.as_list().kind == ListKind::kList || obj.as_list().kind == ListKind::kTuple)) {
    const Value self = obj;
    const bool is_list = obj.as_list().kind == ListKind::kList;
    if (name == "index" || name == "count") {
      return bound([self, name](Interp&, CallArgs& a) -> Value {
        const auto p = bind_args(a, {{"value", Value(), true}}, name);
        int64_t n = 0;
        const auto& items = self.as_list().items;
        for (size_t i = 0; i < items.size(); ++i) {
          if (!equals(items[i], p[0])) continue;
          if (name == "index") return Value(int64_t(i));
          ++n;
        }
        if (name == "index") raise(p[0].repr() + " is not in list");
        return Value(n);
      });
    }
    if (is_list && (name == "append" || name == "extend" || name == "insert" || name == "pop" || name == "remove" ||
                    name == "clear" || name == "reverse" || name == "sort" || name == "copy")) {
      if (name == "copy") {
        return bound([self](Interp&, CallArgs& a) {
          bind_args(a, {}, "copy");
          return Value::list(self.as_list().items);
        });
      }
      if (immutable) return unsafe("list");
      return bound([self, name](Interp&, CallArgs& a) -> Value {
        auto& items = self.as_list().items;
        if (name == "append") {
          items.push_back(bind_args(a, {{"object", Value(), true}}, name)[0]);
        } else if (name == "extend") {
          for (Value& v : iterate(bind_args(a, {{"iterable", Value(), true}}, name)[0])) items.push_back(std::move(v));
        } else if (name == "insert") {
          const auto p = bind_args(a, {{"index", Value(), true}, {"object", Value(), true}}, name);
          int64_t i = p[0].int_value();
          const int64_t n = int64_t(items.size());
          if (i < 0) i = std::max<int64_t>(0, i + n);
          items.insert(items.begin() + std::min(i, n), p[1]);
        } else if (name == "pop") {
          const auto p = bind_args(a, {{"index", Value(-1)}}, name);
          int64_t i = p[0].int_value();
          const int64_t n = int64_t(items.size());
          if (n == 0) raise("pop from empty list");
          if (i < 0) i += n;
          if (i < 0 || i >= n) raise("pop index out of range");
          Value r = items[size_t(i)];
          items.erase(items.begin() + i);
          return r;
        } else if (name == "remove") {
          const auto p = bind_args(a, {{"value", Value(), true}}, name);
          auto it = std::find_if(items.begin(), items.end(), [&](const Value& v) { return equals(v, p[0]); });
          if (it == items.end()) raise("list.remove(x): x not in list");
          items.erase(it);
        } else if (name == "clear") {
          items.clear();
        } else if (name == "reverse") {
          std::reverse(items.begin(), items.end());
        } else {
          bind_args(a, {}, name);
          std::stable_sort(items.begin(), items.end(), [](const Value& x, const Value& y) { return less_than(x, y); });
        }
        return Value::none();
      });
    }
    return Value();
  }
  return Value();
}

}  // namespace dsi::jinja
