// The Jinja lexer, a transcription of jinja2/lexer.py's state machine for the default delimiters:
// root text up to the next {{ {% {#, tag contents as tokens, whitespace control applied to the text
// around tags exactly as jinja2's OptionalLStrip and block-suffix rules do.
#include "text/jinja_lexer.h"

#include <cerrno>
#include <cstring>

#include "dsinfer/error.h"
#include "text/jinja.h"
#include "text/jinja_utf8.h"

namespace dsi::jinja {

namespace {

bool is_ascii_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v' || (c >= 0x1c && c <= 0x1f);
}

// Length of the whitespace character (regex \s, Unicode) starting at s[p], or 0.
size_t space_len(const std::string& s, size_t p) {
  if (p >= s.size()) return 0;
  if (is_ascii_space(s[p])) return 1;
  if (static_cast<unsigned char>(s[p]) < 0x80) return 0;
  size_t n = 1;
  while (p + n < s.size() && n < 4 && (static_cast<unsigned char>(s[p + n]) >> 6) == 0x2) ++n;
  const std::u32string u = utf8::decode(std::string_view(s).substr(p, n));
  return (u.size() == 1 && utf8::is_space(u[0])) ? n : 0;
}

size_t skip_space(const std::string& s, size_t p) {
  while (size_t n = space_len(s, p)) p += n;
  return p;
}
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

// Python's str.rstrip(): removes trailing Unicode whitespace.
std::string rstrip_unicode(const std::string& s) {
  std::u32string u = utf8::decode(s);
  size_t end = u.size();
  while (end > 0 && utf8::is_space(u[end - 1])) --end;
  if (end == u.size()) return s;
  return utf8::encode(std::u32string_view(u).substr(0, end));
}

// True when s is non-empty and all (Unicode) whitespace: jinja2's whitespace_re.fullmatch.
bool all_space(std::string_view s) {
  if (s.empty()) return false;
  for (char32_t c : utf8::decode(s))
    if (!utf8::is_space(c)) return false;
  return true;
}

class Lexer {
 public:
  Lexer(const std::string& source, const std::string& name, const Options& opt) : name_(name), opt_(opt) {
    // jinja2 normalises \r\n and \r to \n and, unless keep_trailing_newline, drops one trailing newline.
    src_.reserve(source.size());
    for (size_t i = 0; i < source.size(); ++i) {
      if (source[i] == '\r') {
        src_.push_back('\n');
        if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
      } else {
        src_.push_back(source[i]);
      }
    }
    if (!opt_.keep_trailing_newline && !src_.empty() && src_.back() == '\n') src_.pop_back();
  }

  std::vector<Token> run() {
    while (pos_ < src_.size()) root();
    push(Tok::kEof, "");
    return std::move(out_);
  }

 private:
  [[noreturn]] void error(const std::string& msg, int line) const { fail("{}:{}: {}", name_, line, msg); }

  void push(Tok t, std::string text, int line = 0) {
    Token tok;
    tok.type = t;
    tok.text = std::move(text);
    tok.line = line ? line : line_;
    out_.push_back(std::move(tok));
  }

  // Advances pos_ to `to`, counting newlines.
  void advance(size_t to) {
    for (size_t i = pos_; i < to; ++i) line_ += src_[i] == '\n';
    pos_ = to;
  }

  // Text before a tag, with jinja2's OptionalLStrip: "-" strips all whitespace before the tag; otherwise,
  // with lstrip_blocks and a block or comment tag (not "+"), spaces between the line start and the tag go.
  void emit_text(std::string text, char sign, bool is_variable, int line) {
    if (sign == '-') {
      text = rstrip_unicode(text);
    } else if (sign != '+' && opt_.lstrip_blocks && !is_variable) {
      const size_t nl = text.rfind('\n');
      const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
      if ((l_pos > 0 || line_starting_) && all_space(std::string_view(text).substr(l_pos))) {
        text.resize(l_pos);
      }
    }
    if (!text.empty()) push(Tok::kData, std::move(text), line);
  }

  // Consumes a tag's end delimiter (block or comment style, whose end may be trimmed) at pos_:
  // "+%}" keeps what follows, "-%}" eats all following whitespace, "%}" eats one newline with trim_blocks.
  void consume_end(char sign, size_t delim_end) {
    size_t p = delim_end;
    if (sign == '-') {
      p = skip_space(src_, p);
    } else if (sign != '+' && opt_.trim_blocks && p < src_.size() && src_[p] == '\n') {
      ++p;
    }
    line_starting_ = p > 0 && src_[p - 1] == '\n';
    advance(p);
  }

  // Matches "{%[-+]?\s*raw\s*(-%}\s*|%})" at p; returns the end of the match or npos.
  size_t match_raw_begin(size_t p, char* sign) const {
    if (src_.compare(p, 2, "{%") != 0) return std::string::npos;
    size_t q = p + 2;
    *sign = 0;
    if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) *sign = src_[q++];
    q = skip_space(src_, q);
    if (src_.compare(q, 3, "raw") != 0) return std::string::npos;
    q = skip_space(src_, q + 3);
    if (src_.compare(q, 3, "-%}") == 0) return skip_space(src_, q + 3);
    if (src_.compare(q, 2, "%}") == 0) return q + 2;
    return std::string::npos;
  }

  void root() {
    // The next tag start: "{{", "{%" or "{#".
    size_t k = pos_;
    while (true) {
      k = src_.find('{', k);
      if (k == std::string::npos || k + 1 >= src_.size()) {
        k = std::string::npos;
        break;
      }
      const char c = src_[k + 1];
      if (c == '{' || c == '%' || c == '#') break;
      ++k;
    }
    const int text_line = line_;
    if (k == std::string::npos) {
      push(Tok::kData, src_.substr(pos_), text_line);
      line_starting_ = !src_.empty() && src_.back() == '\n';
      advance(src_.size());
      return;
    }
    std::string text = src_.substr(pos_, k - pos_);
    const char kind = src_[k + 1];
    char sign = 0;
    if (k + 2 < src_.size() && (src_[k + 2] == '-' || src_[k + 2] == '+')) sign = src_[k + 2];

    char raw_sign = 0;
    const size_t raw_end = kind == '%' ? match_raw_begin(k, &raw_sign) : std::string::npos;
    if (raw_end != std::string::npos) {
      emit_text(std::move(text), raw_sign, false, text_line);
      line_starting_ = src_[raw_end - 1] == '\n';
      advance(raw_end);
      raw_body();
      return;
    }
    emit_text(std::move(text), sign, kind == '{', text_line);
    line_starting_ = false;
    advance(k + 2 + (sign ? 1 : 0));
    if (kind == '#') {
      comment();
    } else {
      tag(kind == '{');
    }
  }

  void comment() {
    const int start_line = line_;
    const size_t e = src_.find("#}", pos_);
    if (e == std::string::npos) error("Missing end of comment tag", start_line);
    char sign = 0;
    if (e > pos_ && (src_[e - 1] == '-' || src_[e - 1] == '+')) sign = src_[e - 1];
    consume_end(sign, e + 2);
  }

  // The body of {% raw %}: everything up to "{%[-+]?\s*endraw\s*(+%}|-%}\s*|%}\n?)".
  void raw_body() {
    const int start_line = line_;
    size_t p = pos_;
    while (true) {
      p = src_.find("{%", p);
      if (p == std::string::npos) error("Missing end of raw directive", start_line);
      size_t q = p + 2;
      char sign = 0;
      if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) sign = src_[q++];
      q = skip_space(src_, q);
      if (src_.compare(q, 6, "endraw") == 0) {
        q = skip_space(src_, q + 6);
        char end_sign = 0;
        if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) end_sign = src_[q++];
        if (src_.compare(q, 2, "%}") == 0) {
          emit_text(src_.substr(pos_, p - pos_), sign, false, line_);
          advance(p);
          consume_end(end_sign, q + 2);
          return;
        }
      }
      p += 2;
    }
  }

  // Tokens inside {{ }} or {% %} up to the end delimiter (only when brackets are balanced, as in jinja2).
  void tag(bool variable) {
    push(variable ? Tok::kVarBegin : Tok::kBlockBegin, "");
    std::string stack;  // open brackets
    const int start_line = line_;
    while (true) {
      if (pos_ >= src_.size()) {
        error(std::string("unexpected end of template, expected '") + (variable ? "end of print statement" : "end of statement block") + "'.", start_line);
      }
      if (stack.empty()) {
        if (variable) {
          if (src_.compare(pos_, 3, "-}}") == 0) {
            push(Tok::kVarEnd, "");
            const size_t p = skip_space(src_, pos_ + 3);
            line_starting_ = src_[p - 1] == '\n';
            advance(p);
            return;
          }
          if (src_.compare(pos_, 2, "}}") == 0) {
            push(Tok::kVarEnd, "");
            line_starting_ = false;
            advance(pos_ + 2);
            return;
          }
        } else {
          if (src_.compare(pos_, 3, "-%}") == 0 || src_.compare(pos_, 3, "+%}") == 0) {
            push(Tok::kBlockEnd, "");
            consume_end(src_[pos_], pos_ + 3);
            return;
          }
          if (src_.compare(pos_, 2, "%}") == 0) {
            push(Tok::kBlockEnd, "");
            consume_end(0, pos_ + 2);
            return;
          }
        }
      }
      const char c = src_[pos_];
      if (const size_t n = space_len(src_, pos_)) {
        advance(pos_ + n);
      } else if (is_digit(c)) {
        number();
      } else if (is_name_start(c)) {
        size_t p = pos_;
        while (p < src_.size() && is_name_char(src_[p])) ++p;
        push(Tok::kName, src_.substr(pos_, p - pos_));
        advance(p);
      } else if (c == '\'' || c == '"') {
        string_literal();
      } else {
        op(stack);
      }
    }
  }

  void number() {
    // jinja2's float_re (tried first) and integer_re, with "_" digit separators.
    auto digits = [&](size_t p) {  // (\d+_)*\d+ starting at p; returns end or p when no digit
      size_t q = p;
      if (q >= src_.size() || !is_digit(src_[q])) return p;
      while (q < src_.size() && (is_digit(src_[q]) || (src_[q] == '_' && q + 1 < src_.size() && is_digit(src_[q + 1])))) ++q;
      return q;
    };
    auto clean = [](std::string s) {
      std::string r;
      for (char ch : s)
        if (ch != '_') r.push_back(ch);
      return r;
    };
    const size_t start = pos_;
    const bool after_dot = start > 0 && src_[start - 1] == '.';
    size_t p = digits(start);
    if (!after_dot) {
      size_t q = p;
      bool frac = false, expo = false;
      if (q < src_.size() && src_[q] == '.' && digits(q + 1) != q + 1) {
        q = digits(q + 1);
        frac = true;
      }
      if (q < src_.size() && (src_[q] == 'e' || src_[q] == 'E')) {
        size_t r = q + 1;
        if (r < src_.size() && (src_[r] == '+' || src_[r] == '-')) ++r;
        const size_t r2 = digits(r);
        if (r2 != r) {
          q = r2;
          expo = true;
        }
      }
      if (frac || expo) {
        Token t;
        t.type = Tok::kFloat;
        t.text = src_.substr(start, q - start);
        t.fval = std::strtod(clean(t.text).c_str(), nullptr);  // overflow gives inf, as Python's float()
        t.line = line_;
        out_.push_back(std::move(t));
        advance(q);
        return;
      }
    }
    Token t;
    t.type = Tok::kInt;
    t.line = line_;
    if (src_[start] == '0' && start + 1 < src_.size() && std::strchr("bBoOxX", src_[start + 1])) {
      const char base_c = char(src_[start + 1] | 0x20);
      const int base = base_c == 'b' ? 2 : base_c == 'o' ? 8 : 16;
      size_t q = start + 2;
      std::string ds;
      while (q < src_.size()) {
        const char ch = src_[q];
        const int v = is_digit(ch) ? ch - '0' : (ch | 0x20) >= 'a' && (ch | 0x20) <= 'f' ? (ch | 0x20) - 'a' + 10 : 99;
        if (ch == '_' || v < base) {
          if (ch != '_') ds.push_back(ch);
          ++q;
        } else {
          break;
        }
      }
      if (!ds.empty()) {
        t.text = src_.substr(start, q - start);
        errno = 0;
        const unsigned long long v = std::strtoull(ds.c_str(), nullptr, base);
        if (errno == ERANGE || v > uint64_t(INT64_MAX)) error("integer literal " + t.text + " is too large", line_);
        t.ival = int64_t(v);
        out_.push_back(std::move(t));
        advance(q);
        return;
      }
    }
    if (src_[start] == '0') {  // 0(_?0)*
      size_t q = start + 1;
      while (true) {
        if (q < src_.size() && src_[q] == '0') {
          ++q;
        } else if (q + 1 < src_.size() && src_[q] == '_' && src_[q + 1] == '0') {
          q += 2;
        } else {
          break;
        }
      }
      p = q;
    }
    t.text = src_.substr(start, p - start);
    const std::string c = clean(t.text);
    errno = 0;
    const unsigned long long v = std::strtoull(c.c_str(), nullptr, 10);
    if (errno == ERANGE || v > uint64_t(INT64_MAX)) error("integer literal " + t.text + " is too large", line_);
    t.ival = int64_t(v);
    out_.push_back(std::move(t));
    advance(p);
  }

  // A quoted string; the value is decoded with Python's unicode-escape rules (jinja2 does the same).
  void string_literal() {
    const char q = src_[pos_];
    size_t p = pos_ + 1;
    std::string raw;
    while (true) {
      if (p >= src_.size()) error(std::string("unexpected char \"") + q + "\" at " + std::to_string(pos_), line_);
      if (src_[p] == '\\' && p + 1 < src_.size()) {
        raw.push_back(src_[p]);
        raw.push_back(src_[p + 1]);
        p += 2;
        continue;
      }
      if (src_[p] == q) break;
      raw.push_back(src_[p++]);
    }
    Token t;
    t.type = Tok::kString;
    t.line = line_;
    t.text = unescape(raw);
    out_.push_back(std::move(t));
    advance(p + 1);
  }

  std::string unescape(const std::string& raw) {
    std::string out;
    for (size_t i = 0; i < raw.size(); ++i) {
      if (raw[i] != '\\' || i + 1 >= raw.size()) {
        out.push_back(raw[i]);
        continue;
      }
      const char e = raw[++i];
      auto hex = [&](size_t n) -> char32_t {
        if (i + n >= raw.size()) error("invalid \\x, \\u or \\U escape in string literal", line_);
        char32_t v = 0;
        for (size_t k = 1; k <= n; ++k) {
          const char h = raw[i + k];
          const int d = is_digit(h) ? h - '0' : (h | 0x20) >= 'a' && (h | 0x20) <= 'f' ? (h | 0x20) - 'a' + 10 : -1;
          if (d < 0) error("invalid \\x, \\u or \\U escape in string literal", line_);
          v = v * 16 + char32_t(d);
        }
        i += n;
        return v;
      };
      switch (e) {
        case '\n': break;  // line continuation
        case '\\': out.push_back('\\'); break;
        case '\'': out.push_back('\''); break;
        case '"': out.push_back('"'); break;
        case 'a': out.push_back('\a'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'n': out.push_back('\n'); break;
        case 'r': out.push_back('\r'); break;
        case 't': out.push_back('\t'); break;
        case 'v': out.push_back('\v'); break;
        case 'x': utf8::append(out, hex(2)); break;
        case 'u': utf8::append(out, hex(4)); break;
        case 'U': utf8::append(out, hex(8)); break;
        default:
          if (e >= '0' && e <= '7') {
            char32_t v = char32_t(e - '0');
            for (int k = 0; k < 2 && i + 1 < raw.size() && raw[i + 1] >= '0' && raw[i + 1] <= '7'; ++k) {
              v = v * 8 + char32_t(raw[++i] - '0');
            }
            utf8::append(out, v);
          } else {  // unknown escapes stay as written
            out.push_back('\\');
            out.push_back(e);
          }
      }
    }
    return out;
  }

  void op(std::string& stack) {
    static const char* const kTwo[] = {"//", "**", "==", "!=", ">=", "<="};
    for (const char* o : kTwo) {
      if (src_.compare(pos_, 2, o) == 0) {
        push(Tok::kOp, o);
        advance(pos_ + 2);
        return;
      }
    }
    const char c = src_[pos_];
    if (!std::strchr("+-/*%~[](){}><=.:|,;", c)) {
      error(std::string("unexpected char '") + c + "' at " + std::to_string(pos_), line_);
    }
    if (c == '(' || c == '[' || c == '{') {
      stack.push_back(c);
    } else if (c == ')' || c == ']' || c == '}') {
      const char open = c == ')' ? '(' : c == ']' ? '[' : '{';
      if (stack.empty()) error(std::string("unexpected '") + c + "'", line_);
      if (stack.back() != open) {
        const char want = stack.back() == '(' ? ')' : stack.back() == '[' ? ']' : '}';
        error(std::string("unexpected '") + c + "', expected '" + want + "'", line_);
      }
      stack.pop_back();
    }
    push(Tok::kOp, std::string(1, c));
    advance(pos_ + 1);
  }

  const std::string& name_;
  const Options& opt_;
  std::string src_;
  size_t pos_ = 0;
  int line_ = 1;
  bool line_starting_ = true;
  std::vector<Token> out_;
};

}  // namespace

std::vector<Token> tokenize(const std::string& source, const std::string& name, const Options& opt) {
  return Lexer(source, name, opt).run();
}

std::string describe(const Token& t) {
  std::string d;
  switch (t.type) {
    case Tok::kData: d = "template data / text"; break;
    case Tok::kVarBegin: d = "begin of print statement"; break;
    case Tok::kVarEnd: d = "end of print statement"; break;
    case Tok::kBlockBegin: d = "begin of statement block"; break;
    case Tok::kBlockEnd: d = "end of statement block"; break;
    case Tok::kEof: d = "end of template"; break;
    case Tok::kString: d = "string"; break;
    case Tok::kInt: d = "integer"; break;
    case Tok::kFloat: d = "float"; break;
    case Tok::kName:
    case Tok::kOp: d = t.text; break;
  }
  return "'" + d + "'";
}

}  // namespace dsi::jinja
