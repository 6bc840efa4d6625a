// The Jinja value type: Python's str/repr/bool/== and json.dumps, as CPython 3 defines them.
#include "text/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "dsinfer/error.h"
#include "text/jinja_utf8.h"

namespace dsi::jinja {

const Value* Dict::find(std::string_view key) const {
  auto it = index_.find(std::string(key));
  return it == index_.end() ? nullptr : &items_[it->second].second;
}

Value* Dict::find(std::string_view key) {
  auto it = index_.find(std::string(key));
  return it == index_.end() ? nullptr : &items_[it->second].second;
}

void Dict::set(const std::string& key, Value v) {
  auto it = index_.find(key);
  if (it != index_.end()) {
    items_[it->second].second = std::move(v);
    return;
  }
  index_.emplace(key, items_.size());
  items_.emplace_back(key, std::move(v));
}

bool Dict::erase(std::string_view key) {
  auto it = index_.find(std::string(key));
  if (it == index_.end()) return false;
  items_.erase(items_.begin() + std::ptrdiff_t(it->second));
  index_.clear();
  for (size_t i = 0; i < items_.size(); ++i) index_.emplace(items_[i].first, i);
  return true;
}

Value Value::list(std::vector<Value> items, ListKind kind) {
  auto l = std::make_shared<List>();
  l->items = std::move(items);
  l->kind = kind;
  return Value(std::move(l));
}

Value Value::dict(Dict d) { return Value(std::make_shared<Dict>(std::move(d))); }

Value Value::callable(std::string name, std::function<Value(Interp&, CallArgs&)> fn, std::string kind) {
  auto c = std::make_shared<Callable>();
  c->name = std::move(name);
  c->kind = std::move(kind);
  c->fn = std::move(fn);
  return Value(std::move(c));
}

const void* Value::identity() const {
  if (is_list()) return &as_list();
  if (is_dict()) return &as_dict();
  if (is_namespace()) return &as_namespace();
  if (is_callable()) return &as_callable();
  return nullptr;
}

bool Value::truthy() const {
  struct V {
    bool operator()(const Undefined&) const { return false; }
    bool operator()(const None&) const { return false; }
    bool operator()(bool b) const { return b; }
    bool operator()(int64_t i) const { return i != 0; }
    bool operator()(double d) const { return d != 0.0; }
    bool operator()(const std::string& s) const { return !s.empty(); }
    bool operator()(const std::shared_ptr<List>& l) const {
      return l->kind == ListKind::kGenerator || !l->items.empty();
    }
    bool operator()(const std::shared_ptr<Dict>& d) const { return !d->empty(); }
    bool operator()(const std::shared_ptr<Namespace>&) const { return true; }
    bool operator()(const std::shared_ptr<Callable>&) const { return true; }
  };
  return std::visit(V{}, data_);
}

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  const std::string sci(buf, res.ptr);  // "-d.ddde+XX"
  std::string out;
  size_t i = 0;
  if (sci[0] == '-') {
    out.push_back('-');
    i = 1;
  }
  const size_t e = sci.find('e');
  std::string digits;
  for (size_t k = i; k < e; ++k)
    if (sci[k] != '.') digits.push_back(sci[k]);
  const int exp10 = std::atoi(sci.c_str() + e + 1);
  const int decpt = exp10 + 1;  // value = 0.digits * 10^decpt
  const int nd = int(digits.size());
  if (d == 0.0) return out + "0.0";
  if (decpt <= -4 || decpt > 16) {
    out.push_back(digits[0]);
    if (nd > 1) out.append(".").append(digits, 1, std::string::npos);
    char eb[16];
    std::snprintf(eb, sizeof(eb), "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
    return out.append(eb);
  }
  if (decpt <= 0) return out.append("0.").append(size_t(-decpt), '0').append(digits);
  if (decpt >= nd) return out.append(digits).append(size_t(decpt - nd), '0').append(".0");
  return out.append(digits, 0, size_t(decpt)).append(".").append(digits, size_t(decpt), std::string::npos);
}

std::string string_repr(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, quote);
  for (char32_t c : utf8::decode(s)) {
    if (c == char32_t(quote) || c == '\\') {
      out.push_back('\\');
      out.push_back(char(c));
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == ' ' || (c > 0x20 && c < 0x7f)) {
      out.push_back(char(c));
    } else if (!utf8::is_printable(c)) {
      char b[16];
      if (c < 0x100) {
        std::snprintf(b, sizeof(b), "\\x%02x", unsigned(c));
      } else if (c < 0x10000) {
        std::snprintf(b, sizeof(b), "\\u%04x", unsigned(c));
      } else {
        std::snprintf(b, sizeof(b), "\\U%08x", unsigned(c));
      }
      out += b;
    } else {
      utf8::append(out, c);
    }
  }
  out.push_back(quote);
  return out;
}

namespace {

std::string join_repr(const std::vector<Value>& items) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += ", ";
    out += items[i].repr();
  }
  return out;
}

std::string dict_repr(const Dict& d) {
  std::string out = "{";
  bool first = true;
  for (const auto& [k, v] : d.items()) {
    if (!first) out += ", ";
    first = false;
    out += string_repr(k) + ": " + v.repr();
  }
  return out + "}";
}

}  // namespace

std::string Value::str() const {
  struct V {
    std::string operator()(const Undefined&) const { return ""; }
    std::string operator()(const None&) const { return "None"; }
    std::string operator()(bool b) const { return b ? "True" : "False"; }
    std::string operator()(int64_t i) const { return std::to_string(i); }
    std::string operator()(double d) const { return float_repr(d); }
    std::string operator()(const std::string& s) const { return s; }
    std::string operator()(const std::shared_ptr<List>& l) const {
      switch (l->kind) {
        case ListKind::kTuple:
          return fmt::format("({}{}", join_repr(l->items), l->items.size() == 1 ? ",)" : ")");
        case ListKind::kGenerator:
          return "<generator object>";
        case ListKind::kDictItems:
          return fmt::format("dict_items([{}])", join_repr(l->items));
        case ListKind::kDictKeys:
          return fmt::format("dict_keys([{}])", join_repr(l->items));
        case ListKind::kDictValues:
          return fmt::format("dict_values([{}])", join_repr(l->items));
        case ListKind::kList:
          break;
      }
      return fmt::format("[{}]", join_repr(l->items));
    }
    std::string operator()(const std::shared_ptr<Dict>& d) const { return dict_repr(*d); }
    std::string operator()(const std::shared_ptr<Namespace>& n) const {
      return "<Namespace " + dict_repr(n->attrs) + ">";
    }
    std::string operator()(const std::shared_ptr<Callable>& c) const {
      if (c->kind == "Macro") return "<Macro '" + c->name + "'>";
      return "<" + c->kind + " " + c->name + ">";
    }
  };
  return std::visit(V{}, data_);
}

std::string Value::repr() const {
  if (is_string()) return string_repr(as_string());
  if (is_undefined()) return "Undefined";
  return str();
}

std::string Value::type_name() const {
  struct V {
    std::string operator()(const Undefined&) const { return "Undefined"; }
    std::string operator()(const None&) const { return "NoneType"; }
    std::string operator()(bool) const { return "bool"; }
    std::string operator()(int64_t) const { return "int"; }
    std::string operator()(double) const { return "float"; }
    std::string operator()(const std::string&) const { return "str"; }
    std::string operator()(const std::shared_ptr<List>& l) const {
      switch (l->kind) {
        case ListKind::kTuple: return "tuple";
        case ListKind::kGenerator: return "generator";
        case ListKind::kDictItems: return "dict_items";
        case ListKind::kDictKeys: return "dict_keys";
        case ListKind::kDictValues: return "dict_values";
        case ListKind::kList: break;
      }
      return "list";
    }
    std::string operator()(const std::shared_ptr<Dict>&) const { return "dict"; }
    std::string operator()(const std::shared_ptr<Namespace>&) const { return "Namespace"; }
    std::string operator()(const std::shared_ptr<Callable>& c) const { return c->kind; }
  };
  return std::visit(V{}, data_);
}

bool equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (!a.is_float() && !b.is_float()) return a.int_value() == b.int_value();
    return a.number_value() == b.number_value();
  }
  if (a.is_string() && b.is_string()) return a.as_string() == b.as_string();
  if (a.is_none() && b.is_none()) return true;
  if (a.is_undefined() && b.is_undefined()) return true;
  if (a.is_list() && b.is_list()) {
    const List& x = a.as_list();
    const List& y = b.as_list();
    if (&x == &y) return true;
    if (x.kind == ListKind::kGenerator || y.kind == ListKind::kGenerator) return false;
    const bool x_tuple = x.kind == ListKind::kTuple, y_tuple = y.kind == ListKind::kTuple;
    if (x_tuple != y_tuple || x.items.size() != y.items.size()) return false;
    for (size_t i = 0; i < x.items.size(); ++i)
      if (!equals(x.items[i], y.items[i])) return false;
    return true;
  }
  if (a.is_dict() && b.is_dict()) {
    const Dict& x = a.as_dict();
    const Dict& y = b.as_dict();
    if (x.size() != y.size()) return false;
    for (const auto& [k, v] : x.items()) {
      const Value* o = y.find(k);
      if (!o || !equals(v, *o)) return false;
    }
    return true;
  }
  const void* ia = a.identity();
  return ia && ia == b.identity();
}

namespace {

template <typename Json>
Value from_json_impl(const Json& j) {
  switch (j.type()) {
    case Json::value_t::null:
      return Value::none();
    case Json::value_t::boolean:
      return Value(j.template get<bool>());
    case Json::value_t::number_integer:
      return Value(j.template get<int64_t>());
    case Json::value_t::number_unsigned: {
      const uint64_t u = j.template get<uint64_t>();
      if (u <= uint64_t(INT64_MAX)) return Value(int64_t(u));
      return Value(double(u));
    }
    case Json::value_t::number_float:
      return Value(j.template get<double>());
    case Json::value_t::string:
      return Value(j.template get<std::string>());
    case Json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json_impl(e));
      return Value::list(std::move(items));
    }
    case Json::value_t::object: {
      Dict d;
      for (const auto& [k, v] : j.items()) d.set(k, from_json_impl(v));
      return Value::dict(std::move(d));
    }
    default:
      fail("jinja: cannot convert JSON value of type {} to a template value", j.type_name());
  }
}

}  // namespace

Value from_json(const nlohmann::json& j) { return from_json_impl(j); }
Value from_json(const nlohmann::ordered_json& j) { return from_json_impl(j); }

namespace {

void dump_string(std::string& out, std::string_view s, bool ensure_ascii) {
  out.push_back('"');
  auto escape = [&out](char32_t c) {
    switch (c) {
      case '"': out += "\\\""; return;
      case '\\': out += "\\\\"; return;
      case '\n': out += "\\n"; return;
      case '\r': out += "\\r"; return;
      case '\t': out += "\\t"; return;
      case '\b': out += "\\b"; return;
      case '\f': out += "\\f"; return;
      default: break;
    }
    char b[16];
    std::snprintf(b, sizeof(b), "\\u%04x", unsigned(c));
    out += b;
  };
  if (!ensure_ascii) {
    for (char ch : s) {
      const unsigned char c = static_cast<unsigned char>(ch);
      if (c < 0x20 || c == '"' || c == '\\') {
        escape(c);
      } else {
        out.push_back(ch);
      }
    }
  } else {
    for (char32_t c : utf8::decode(s)) {
      if (c >= 0x20 && c <= 0x7e && c != '"' && c != '\\') {
        out.push_back(char(c));
      } else if (c >= 0x10000) {  // a surrogate pair, as Python writes it
        const char32_t v = c - 0x10000;
        escape(0xd800 | (v >> 10));
        escape(0xdc00 | (v & 0x3ff));
      } else {
        escape(c);
      }
    }
  }
  out.push_back('"');
}

void dump(std::string& out, const Value& v, const DumpOptions& opt, int level) {
  const bool pretty = opt.indent >= 0 || opt.has_indent_str;
  const std::string unit = opt.has_indent_str ? opt.indent_str : std::string(size_t(std::max(opt.indent, 0)), ' ');
  const std::string item_sep = opt.has_item_sep ? opt.item_sep : (pretty ? "," : ", ");
  auto newline = [&](int lvl) {
    out.push_back('\n');
    for (int i = 0; i < lvl; ++i) out += unit;
  };
  if (v.is_none()) {
    out += "null";
  } else if (v.is_bool()) {
    out += v.as_bool() ? "true" : "false";
  } else if (v.is_int()) {
    out += std::to_string(v.as_int());
  } else if (v.is_float()) {
    const double d = v.as_float();
    out += std::isnan(d) ? "NaN" : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity") : float_repr(d);
  } else if (v.is_string()) {
    dump_string(out, v.as_string(), opt.ensure_ascii);
  } else if (v.is_list() && v.as_list().kind != ListKind::kGenerator && v.as_list().kind != ListKind::kDictItems &&
             v.as_list().kind != ListKind::kDictKeys && v.as_list().kind != ListKind::kDictValues) {
    const auto& items = v.as_list().items;
    if (items.empty()) {
      out += "[]";
      return;
    }
    out.push_back('[');
    if (pretty) newline(level + 1);
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) {
        out += item_sep;
        if (pretty) newline(level + 1);
      }
      dump(out, items[i], opt, level + 1);
    }
    if (pretty) newline(level);
    out.push_back(']');
  } else if (v.is_dict()) {
    const Dict& d = v.as_dict();
    if (d.empty()) {
      out += "{}";
      return;
    }
    std::vector<const std::pair<std::string, Value>*> entries;
    for (const auto& e : d.items()) entries.push_back(&e);
    if (opt.sort_keys) {
      std::stable_sort(entries.begin(), entries.end(), [](auto* a, auto* b) { return a->first < b->first; });
    }
    out.push_back('{');
    if (pretty) newline(level + 1);
    for (size_t i = 0; i < entries.size(); ++i) {
      if (i) {
        out += item_sep;
        if (pretty) newline(level + 1);
      }
      dump_string(out, entries[i]->first, opt.ensure_ascii);
      out += opt.key_sep;
      dump(out, entries[i]->second, opt, level + 1);
    }
    if (pretty) newline(level);
    out.push_back('}');
  } else {
    fail("Object of type {} is not JSON serializable", v.type_name());
  }
}

}  // namespace

std::string dumps(const Value& v, const DumpOptions& opt) {
  std::string out;
  dump(out, v, opt, 0);
  return out;
}

}  // namespace dsi::jinja
