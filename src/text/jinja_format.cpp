// Python's two string formatting mini-languages as templates use them: str % args (printf style) and
// str.format with format specs, on the engine's values. Mirrors CPython's Objects/unicodeobject.c
// and Python/formatter_unicode.c for the cases chat templates meet.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "dsinfer/error.h"
#include "text/jinja.h"
#include "text/jinja_internal.h"
#include "text/jinja_utf8.h"

namespace dsi::jinja {
namespace {

// ---- format specs (format(value, spec)) ------------------------------------------------------------

struct Spec {
  char32_t fill = ' ';
  char align = 0;
  char sign = '-';
  bool alt = false;
  int64_t width = -1;
  int64_t precision = -1;
  char type = 0;
};

Spec parse_spec(const std::string& spec_s) {
  const std::u32string sp = utf8::decode(spec_s);
  Spec s;
  size_t i = 0;
  auto is_align = [](char32_t c) { return c == '<' || c == '>' || c == '^' || c == '='; };
  if (sp.size() >= 2 && is_align(sp[1])) {
    s.fill = sp[0];
    s.align = char(sp[1]);
    i = 2;
  } else if (!sp.empty() && is_align(sp[0])) {
    s.align = char(sp[0]);
    i = 1;
  }
  if (i < sp.size() && (sp[i] == '+' || sp[i] == '-' || sp[i] == ' ')) s.sign = char(sp[i++]);
  if (i < sp.size() && sp[i] == '#') s.alt = true, ++i;
  if (i < sp.size() && sp[i] == '0') {
    if (!s.align) s.fill = '0', s.align = '=';
    ++i;
  }
  auto num = [&]() {
    int64_t v = 0;
    while (i < sp.size() && sp[i] >= '0' && sp[i] <= '9') {
      v = v * 10 + (sp[i++] - '0');
      check_size(v);
    }
    return v;
  };
  if (i < sp.size() && sp[i] >= '0' && sp[i] <= '9') s.width = num();
  if (i < sp.size() && (sp[i] == ',' || sp[i] == '_')) raise("thousands separators in format specs are not supported");
  if (i < sp.size() && sp[i] == '.') {
    ++i;
    s.precision = num();
  }
  if (i < sp.size()) s.type = char(sp[i++]);
  if (i < sp.size()) raise("Invalid format specifier '" + spec_s + "'");
  return s;
}

std::string pad(const std::string& body, const Spec& s, char default_align, const std::string& sign_part = "") {
  const int64_t len = int64_t(utf8::length(body) + sign_part.size());
  const char align = s.align ? s.align : default_align;
  if (s.width <= len) return sign_part + body;
  check_size(s.width);
  const size_t n = size_t(s.width - len);
  std::string fill;
  for (size_t k = 0; k < n; ++k) utf8::append(fill, s.fill);
  if (align == '<') return sign_part + body + fill;
  if (align == '=') return sign_part + fill + body;
  if (align == '^') {
    std::string l, r;
    for (size_t k = 0; k < n / 2; ++k) utf8::append(l, s.fill);
    for (size_t k = 0; k < n - n / 2; ++k) utf8::append(r, s.fill);
    return l + sign_part + body + r;
  }
  return fill + sign_part + body;
}

std::string format_value(const Value& v, const std::string& spec_s) {
  if (spec_s.empty()) return v.str();
  const Spec s = parse_spec(spec_s);
  if (v.is_string() || (!v.is_number())) {
    if (!v.is_string() || (s.type && s.type != 's')) {
      raise("unsupported format string passed to " + v.type_name() + ".__format__");
    }
    std::string body = v.as_string();
    if (s.precision >= 0) body = utf8::encode(utf8::decode(body).substr(0, size_t(s.precision)));
    return pad(body, s, '<');
  }
  const bool is_intlike = !v.is_float() && (s.type == 0 || std::string("dxXobcn").find(s.type) != std::string::npos);
  std::string sign;
  std::string body;
  if (is_intlike) {
    const int64_t x = v.int_value();
    const uint64_t mag = x < 0 ? uint64_t(0) - uint64_t(x) : uint64_t(x);
    char buf[80];
    switch (s.type) {
      case 'x': std::snprintf(buf, sizeof(buf), s.alt ? "%#llx" : "%llx", (unsigned long long)mag); break;
      case 'X': std::snprintf(buf, sizeof(buf), s.alt ? "%#llX" : "%llX", (unsigned long long)mag); break;
      case 'o': std::snprintf(buf, sizeof(buf), s.alt ? "0o%llo" : "%llo", (unsigned long long)mag); break;
      case 'b': {
        std::string b;
        uint64_t m = mag;
        do {
          b.insert(b.begin(), char('0' + (m & 1)));
          m >>= 1;
        } while (m);
        std::snprintf(buf, sizeof(buf), "%s%s", s.alt ? "0b" : "", b.c_str());
        break;
      }
      case 'c': {
        std::string c;
        utf8::append(c, char32_t(x));
        return pad(c, s, '<');
      }
      default: std::snprintf(buf, sizeof(buf), "%llu", (unsigned long long)mag); break;
    }
    body = buf;
    sign = x < 0 ? "-" : s.sign == '+' ? "+" : s.sign == ' ' ? " " : "";
  } else {
    double x = v.number_value();
    sign = std::signbit(x) ? "-" : s.sign == '+' ? "+" : s.sign == ' ' ? " " : "";
    x = std::fabs(x);
    const int prec = int(s.precision < 0 ? 6 : s.precision);
    char buf[512];
    switch (s.type) {
      case 'f': case 'F': std::snprintf(buf, sizeof(buf), "%.*f", prec, x); break;
      case 'e': case 'E': std::snprintf(buf, sizeof(buf), s.type == 'e' ? "%.*e" : "%.*E", prec, x); break;
      case 'g': case 'G': std::snprintf(buf, sizeof(buf), s.type == 'g' ? "%.*g" : "%.*G", prec == 0 ? 1 : prec, x); break;
      case '%': std::snprintf(buf, sizeof(buf), "%.*f%%", prec, x * 100); break;
      default:
        if (s.precision < 0) {
          std::snprintf(buf, sizeof(buf), "%s", float_repr(x).c_str());
        } else {
          std::snprintf(buf, sizeof(buf), "%.*g", prec == 0 ? 1 : prec, x);
        }
    }
    body = buf;
  }
  if (s.align == '=' || (!s.align && s.fill == '0')) return pad(body, s, '=', sign);
  return pad(sign + body, s, '>');
}

}  // namespace

namespace pystr {

std::string format(Interp& in, const std::string& fmt, const CallArgs& args) {
  std::string out;
  size_t auto_idx = 0;
  bool manual = false;
  for (size_t i = 0; i < fmt.size(); ++i) {
    const char c = fmt[i];
    if (c == '}') {
      if (i + 1 < fmt.size() && fmt[i + 1] == '}') {
        out.push_back('}');
        ++i;
        continue;
      }
      raise("Single '}' encountered in format string");
    }
    if (c != '{') {
      out.push_back(c);
      continue;
    }
    if (i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out.push_back('{');
      ++i;
      continue;
    }
    const size_t close = fmt.find('}', i);
    if (close == std::string::npos) raise("Single '{' encountered in format string");
    std::string field = fmt.substr(i + 1, close - i - 1);
    i = close;
    std::string spec, conv;
    const size_t colon = field.find(':');
    if (colon != std::string::npos) {
      spec = field.substr(colon + 1);
      field.resize(colon);
    }
    const size_t bang = field.find('!');
    if (bang != std::string::npos) {
      conv = field.substr(bang + 1);
      field.resize(bang);
    }
    size_t k = 0;
    while (k < field.size() && field[k] != '.' && field[k] != '[') ++k;
    const std::string arg_name = field.substr(0, k);
    Value v;
    if (arg_name.empty()) {
      if (manual) raise("cannot switch from manual field specification to automatic field numbering");
      if (auto_idx >= args.pos.size()) raise("Replacement index " + std::to_string(auto_idx) + " out of range");
      v = args.pos[auto_idx++];
    } else if (std::all_of(arg_name.begin(), arg_name.end(), [](char ch) { return ch >= '0' && ch <= '9'; })) {
      manual = true;
      const size_t idx = size_t(parse_digits(arg_name));
      if (idx >= args.pos.size()) raise("Replacement index " + arg_name + " out of range");
      v = args.pos[idx];
    } else {
      bool found = false;
      for (const auto& [kn, kv] : args.kw) {
        if (kn == arg_name) {
          v = kv;
          found = true;
        }
      }
      if (!found) raise("KeyError: '" + arg_name + "'");
    }
    while (k < field.size()) {  // .attr and [key] lookups
      if (field[k] == '.') {
        size_t e = k + 1;
        while (e < field.size() && field[e] != '.' && field[e] != '[') ++e;
        v = in.getattr(v, field.substr(k + 1, e - k - 1));
        k = e;
      } else {
        const size_t e = field.find(']', k);
        if (e == std::string::npos) raise("Missing ']' in format string");
        const std::string key = field.substr(k + 1, e - k - 1);
        const bool numeric = !key.empty() && std::all_of(key.begin(), key.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
        v = in.getitem(v, numeric ? Value(parse_digits(key)) : Value(key));
        k = e + 1;
      }
    }
    if (conv == "r") {
      v = Value(v.repr());
    } else if (conv == "s") {
      v = Value(v.str());
    } else if (!conv.empty()) {
      raise("Unknown conversion specifier " + conv);
    }
    out += format_value(v, spec);
  }
  return out;
}

}  // namespace pystr

// ---- printf-style formatting (str % args) -----------------------------------------------------------

std::string python_format(const std::string& fmt, const Value& args) {
  // CPython's PyUnicode_Format: a tuple supplies the arguments, anything else is the one argument;
  // an argument with __getitem__ (dict, list, Undefined) also serves %(key)s and excuses unused args.
  std::vector<Value> seq;
  const bool mapping = args.is_dict() || args.is_undefined() || (args.is_list() && args.as_list().kind == ListKind::kList);
  if (args.is_list() && args.as_list().kind == ListKind::kTuple) {
    seq = args.as_list().items;
  } else {
    seq.push_back(args);
  }
  size_t next_arg = 0;
  auto take = [&]() -> Value {
    if (next_arg >= seq.size()) raise("not enough arguments for format string");
    return seq[next_arg++];
  };
  std::string out;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out.push_back(fmt[i]);
      continue;
    }
    if (++i >= fmt.size()) raise("incomplete format");
    Value key_value;
    bool has_key = false;
    if (fmt[i] == '(') {
      const size_t close = fmt.find(')', i);
      if (close == std::string::npos) raise("incomplete format key");
      if (!args.is_dict()) raise(mapping ? "format keys need a dict" : "format requires a mapping");
      const std::string key = fmt.substr(i + 1, close - i - 1);
      const Value* v = args.as_dict().find(key);
      if (!v) raise("KeyError: '" + key + "'");
      key_value = *v;
      has_key = true;
      i = close + 1;
    }
    std::string flags;
    while (i < fmt.size() && std::string("-+ #0").find(fmt[i]) != std::string::npos) flags.push_back(fmt[i++]);
    std::string width, prec;
    if (i < fmt.size() && fmt[i] == '*') {
      const Value w = take();
      if (!w.is_int() && !w.is_bool()) raise("* wants int");
      const int64_t wv = w.int_value();
      if (wv < 0) flags.push_back('-');  // Python: a negative * width left-justifies
      width = std::to_string(wv < 0 ? -(wv + 1) + 1 : wv);
      ++i;
    }
    while (i < fmt.size() && fmt[i] >= '0' && fmt[i] <= '9') width.push_back(fmt[i++]);
    bool has_prec = false;
    if (i < fmt.size() && fmt[i] == '.') {
      has_prec = true;
      ++i;
      if (i < fmt.size() && fmt[i] == '*') {
        const Value p = take();
        if (!p.is_int() && !p.is_bool()) raise("* wants int");
        prec = std::to_string(std::max<int64_t>(0, p.int_value()));
        ++i;
      }
      while (i < fmt.size() && fmt[i] >= '0' && fmt[i] <= '9') prec.push_back(fmt[i++]);
    }
    if (i >= fmt.size()) raise("incomplete format");
    const char type = fmt[i];
    if (type == '%') {
      out.push_back('%');
      continue;
    }
    const Value v = has_key ? key_value : take();
    for (const std::string* n : {&width, &prec}) {  // bounded before reaching snprintf
      if (n->size() > 9) raise("format width or precision too large");
      if (!n->empty()) check_size(parse_digits(*n));
    }
    const std::string spec = "%" + flags + width + (has_prec ? "." + (prec.empty() ? "0" : prec) : "");
    // C's printf for the numeric conversions (same flags, width and precision syntax as Python's %).
    auto cformat = [&out](const std::string& f, auto x) {
      const int n = std::snprintf(nullptr, 0, f.c_str(), x);
      if (n < 0) raise("invalid format " + f);
      std::string buf(size_t(n) + 1, '\0');
      std::snprintf(buf.data(), buf.size(), f.c_str(), x);
      buf.resize(size_t(n));
      out += buf;
    };
    if (type == 's' || type == 'r' || type == 'a') {
      std::string s = type == 's' ? v.str() : v.repr();
      if (has_prec) s = utf8::encode(utf8::decode(s).substr(0, size_t(prec.empty() ? 0 : parse_digits(prec))));
      const int64_t w = width.empty() ? 0 : parse_digits(width);
      const int64_t len = int64_t(utf8::length(s));
      if (w > len) {
        check_size(w);
        const std::string fill(size_t(w - len), ' ');
        s = flags.find('-') != std::string::npos ? s + fill : fill + s;
      }
      out += s;
    } else if (std::string("diuxXoc").find(type) != std::string::npos) {
      if (!v.is_number()) raise(std::string("%") + type + " format: a real number is required, not " + v.type_name());
      const long long x = v.is_float() ? (long long)std::trunc(v.as_float()) : (long long)v.int_value();
      if (type == 'c') {
        utf8::append(out, char32_t(x));
        continue;
      }
      const char t = (type == 'i' || type == 'u') ? 'd' : type;
      cformat(spec + "ll" + t, x);
    } else if (std::string("eEfFgG").find(type) != std::string::npos) {
      if (!v.is_number()) raise("must be real number, not " + v.type_name());
      cformat(spec + type, v.number_value());
    } else {
      raise(std::string("unsupported format character '") + type + "'");
    }
  }
  if (!mapping && next_arg < seq.size()) raise("not all arguments converted during string formatting");
  return out;
}

}  // namespace dsi::jinja
