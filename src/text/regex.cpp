// PCRE2-backed regexes with Oniguruma semantics; see regex.h.
#include "text/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <optional>

#include "dsinfer/error.h"
#include "text/utf8.h"

namespace dsi {

namespace {

// Oniguruma's Unicode \s (White_Space) and \w, as PCRE2 class contents.
constexpr std::string_view kSpaceItems =
    "\\t-\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}"
    "\\x{205F}\\x{3000}";
constexpr std::string_view kWordItems = "\\p{L}\\p{M}\\p{Nd}\\p{Pc}";
constexpr std::string_view kHexItems = "0-9a-fA-F";

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  const int n = pcre2_get_error_message(code, buf, sizeof(buf));
  return n < 0 ? fmt::format("PCRE2 error {}", code) : std::string(reinterpret_cast<char*>(buf));
}

bool is_hex(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

}  // namespace

std::string onig_to_pcre2(std::string_view p, const std::string& where) {
  std::string out;
  bool in_class = false;
  size_t i = 0;
  const auto copy_char = [&] {  // copies one whole UTF-8 character
    const size_t n = std::min(utf8::seq_len(static_cast<unsigned char>(p[i])), p.size() - i);
    out.append(p.substr(i, n));
    i += n;
  };
  const auto open_class = [&] {  // at '['; a ']' right after '[' or '[^' is a literal
    out += p[i++];
    if (i < p.size() && p[i] == '^') out += p[i++];
    if (i < p.size() && p[i] == ']') out += p[i++];
    in_class = true;
  };
  while (i < p.size()) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[i + 1];
      std::string_view items;
      if (e == 's' || e == 'S') items = kSpaceItems;
      if (e == 'w' || e == 'W') items = kWordItems;
      if (e == 'h' || e == 'H') items = kHexItems;
      if (!items.empty()) {
        const bool negated = e == 'S' || e == 'W' || e == 'H';
        if (in_class && negated)
          fail("{}: regex '{}': a negated class escape \\{} inside [...] is not supported", where,
               utf8::shown(p), e);
        if (in_class)
          out += items;
        else
          out += fmt::format("[{}{}]", negated ? "^" : "", items);
        i += 2;
      } else if (e == 'u' && i + 5 < p.size() && is_hex(p[i + 2]) && is_hex(p[i + 3]) &&
                 is_hex(p[i + 4]) && is_hex(p[i + 5])) {
        out += fmt::format("\\x{{{}}}", p.substr(i + 2, 4));
        i += 6;
      } else {
        out += p[i++];
        copy_char();
      }
    } else if (in_class) {
      if (c == '[') {
        if (i + 1 < p.size() && p[i + 1] == ':') {  // POSIX class [:alpha:]
          const size_t end = p.find(":]", i + 2);
          if (end == std::string_view::npos)
            fail("{}: regex '{}': unterminated POSIX class", where, utf8::shown(p));
          out.append(p.substr(i, end + 2 - i));
          i = end + 2;
          continue;
        }
        fail("{}: regex '{}': nested character classes are not supported", where, utf8::shown(p));
      }
      if (c == '&' && i + 1 < p.size() && p[i + 1] == '&')
        fail("{}: regex '{}': class intersection && is not supported", where, utf8::shown(p));
      if (c == ']') in_class = false;
      copy_char();
    } else if (c == '[') {
      open_class();
    } else if (c == '^' || c == '$') {
      fail("{}: regex '{}': the anchor '{}' is not supported (its meaning differs between "
           "Oniguruma and PCRE2)", where, utf8::shown(p), c);
    } else {
      copy_char();
    }
  }
  return out;
}

struct Regex::Code {
  pcre2_code* code = nullptr;
  ~Code() { pcre2_code_free(code); }
};

namespace {

std::shared_ptr<Regex::Code> compile(std::string_view pattern, uint32_t options,
                                     const std::string& where, std::string_view source) {
  int err = 0;
  PCRE2_SIZE offset = 0;
  auto code = std::make_shared<Regex::Code>();
  code->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                             options, &err, &offset, nullptr);
  if (!code->code)
    fail("{}: regex '{}' does not compile: {} (at offset {} of the PCRE2 form '{}')", where, utf8::shown(source),
         pcre2_message(err), offset, utf8::shown(pattern));
  pcre2_jit_compile(code->code, PCRE2_JIT_COMPLETE);  // no JIT: the interpreter runs it
  return code;
}

}  // namespace

Regex Regex::pattern(std::string_view onig_pattern, const std::string& where) {
  Regex r;
  r.code_ = compile(onig_to_pcre2(onig_pattern, where), PCRE2_UTF | PCRE2_UCP, where, onig_pattern);
  r.where_ = where;
  return r;
}

Regex Regex::literal(std::string_view text, const std::string& where) {
  Regex r;
  r.code_ = compile(text, PCRE2_UTF | PCRE2_LITERAL, where, text);
  r.where_ = where;
  return r;
}

namespace {

struct MatchData {
  pcre2_match_data* md;
  explicit MatchData(const pcre2_code* code) : md(pcre2_match_data_create_from_pattern(code, nullptr)) {
    if (!md) fail("out of memory for regex match data");
  }
  ~MatchData() { pcre2_match_data_free(md); }
};

// The leftmost match starting at or after `start`, or none.
std::optional<std::pair<size_t, size_t>> match_from(const pcre2_code* code, MatchData& m,
                                                    std::string_view text, size_t start,
                                                    const std::string& where) {
  static const char kEmpty[] = "";
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.empty() ? kEmpty : text.data());
  // The text is valid UTF-8 (the tokenizer sanitises its input), so PCRE2 need not check it.
  int rc = pcre2_match(code, subject, text.size(), start, PCRE2_NO_UTF_CHECK, m.md, nullptr);
  if (rc == PCRE2_ERROR_JIT_STACKLIMIT)  // deep backtracking: the interpreter uses the heap
    rc = pcre2_match(code, subject, text.size(), start, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, m.md,
                     nullptr);
  if (rc == PCRE2_ERROR_NOMATCH) return std::nullopt;
  if (rc < 0)
    fail("{}: regex match failed on a {}-byte piece of text: {}", where, text.size(),
         pcre2_message(rc));
  const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(m.md);
  return std::make_pair(size_t(ov[0]), size_t(ov[1]));
}

}  // namespace

std::vector<std::pair<size_t, size_t>> Regex::find_all(std::string_view text) const {
  std::vector<std::pair<size_t, size_t>> out;
  MatchData m(code_->code);
  // The onig crate's FindMatches: search from last_end; an empty match ending where the previous
  // match ended is rejected and the search resumes one character later.
  size_t last_end = 0;
  std::optional<size_t> last_match_end;
  while (last_end <= text.size()) {
    const auto r = match_from(code_->code, m, text, last_end, where_);
    if (!r) break;
    if (r->first == r->second && last_match_end == r->second) {
      last_end += last_end < text.size()
                      ? utf8::seq_len(static_cast<unsigned char>(text[last_end]))
                      : 1;
      continue;
    }
    last_end = r->second;
    last_match_end = r->second;
    out.push_back(*r);
  }
  return out;
}

bool Regex::search(std::string_view text) const {
  MatchData m(code_->code);
  return match_from(code_->code, m, text, 0, where_).has_value();
}

}  // namespace dsi
