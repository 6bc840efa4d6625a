// The tokenizer's regular expressions: Oniguruma-syntax patterns (what HF tokenizers compiles
// tokenizer.json's patterns with) run by PCRE2 in UTF + Unicode-property mode, JIT-compiled when
// PCRE2 has a JIT. Matches are enumerated as the Rust `onig` crate's find_iter does.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dsi {

class Regex {
 public:
  // `where` names the pattern's origin for error messages (file and field).
  static Regex pattern(std::string_view onig_pattern, const std::string& where);
  static Regex literal(std::string_view text, const std::string& where);

  // Every match [start, end) in byte offsets of `text` (valid UTF-8), left to right, with the
  // onig crate's rule for empty matches: one right after the previous match's end is skipped.
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view text) const;
  bool search(std::string_view text) const;  // any match at all

  struct Code;  // the compiled PCRE2 pattern

 private:
  std::shared_ptr<const Code> code_;
  std::string where_;
};

// Rewrites an Oniguruma pattern into PCRE2 syntax with the same meaning under PCRE2_UTF|PCRE2_UCP:
// Oniguruma's Unicode \s is White_Space and \w is Letter|Mark|Decimal_Number|Connector_Punctuation,
// which PCRE2's differ from; \h is a hex digit; \uHHHH is \x{HHHH}. Constructs whose meaning differs
// and that these tokenizers do not use (^ and $, nested classes, class intersection) are refused.
std::string onig_to_pcre2(std::string_view pattern, const std::string& where);

}  // namespace dsi
