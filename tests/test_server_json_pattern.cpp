// Patterns (server/json_pattern.h) against std::regex's ECMAScript grammar (the C++
// library's implementation of ECMA-262 regular expressions) on ASCII strings, where the two
// validators' readings agree: whole strings, and prefixes (a live state has an ending std::regex
// accepts; a dead one has none within a few characters). Beyond ASCII, the classes against PCRE2's
// Unicode properties; the refusals; and the whole-answer constraint (structured outputs' regex and
// choice) through the bundled vocabulary's masks.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "dsinfer/error.h"
#include "server/constraints.h"
#include "server/json_pattern.h"
#include "test_constraints_util.h"
#include "text/regex.h"

namespace dsi::server {
namespace {

std::string utf8_encode(uint32_t cp) {
  std::string out;
  if (cp < 0x80) return std::string(1, char(cp));
  const int n = cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
  for (int k = n - 1; k > 0; --k) out.insert(out.begin(), char(0x80 | ((cp >> (6 * (n - 1 - k))) & 0x3F)));
  out.insert(out.begin(), char((0xF00 >> n) | (cp >> (6 * (n - 1)))));
  return out;
}

std::u32string wide(const std::string& ascii) { return std::u32string(ascii.begin(), ascii.end()); }

int32_t run(const JsonPattern& p, const std::string& ascii) {
  int32_t s = p.start();
  for (unsigned char c : ascii)
    if ((s = p.step(s, c)) == JsonPattern::kDead) break;
  return s;
}

// The patterns, each with the characters its strings are drawn from (those it names, and others).
struct Case {
  std::string pattern, alphabet;
};
const std::vector<Case>& cases() {
  static const std::vector<Case> c = {
      {"^[a-c]+$", "abcd"},
      {"ab", "abx"},
      {"^a|b$", "abx"},
      {"^(ab|a)*c?$", "abcx"},
      {"^\\d{3}-\\d{2}$", "01-a"},
      {"x{2,3}", "xy"},
      {"^x{2,}y?$", "xy"},
      {"^[^ab]*$", "abc\n"},
      {"^\\w+@\\w+\\.com$", "a_1@.cmo"},
      {"^(?:a|bc){1,3}$", "abc"},
      {"a.c", "ac\n\rb"},
      {"^\\s*$", " \t\na"},
      {"\\S", " \ta"},
      {"^[\\d-]+$", "1-a"},
      {"^$", "a"},
      {"(a|)+b", "ab"},
      {"^[a-]$", "a-b"},
      {"^a?b*?c+?$", "abc"},
      {"^\\x61\\u0062[\\t]$", "ab\tc"},
      {"^[\\]a]$", "]ab"},
      {"^\\D\\W$", "a1 _"},
      {"^[^\\d\\s]{2}$", "a1 b"},
      {"a$|^b", "abc"},
      {"^\\.\\*\\/\\-$", ".*/-a"},
      {"^(a{2}|b{0,2}){2}$", "abc"},
      {"^[\\b]$", "\ba"},
  };
  return c;
}

// Every string over the alphabet of up to n characters.
std::vector<std::string> strings(const std::string& alphabet, int n) {
  std::vector<std::string> out = {""};
  for (size_t from = 0; n-- > 0;) {
    const size_t to = out.size();
    for (size_t i = from; i < to; ++i)
      for (char c : alphabet) out.push_back(out[i] + c);
    from = to;
  }
  return out;
}

TEST(JsonPattern, WholeStringsAreStdRegexs) {
  int matched = 0;
  for (const Case& k : cases()) {
    SCOPED_TRACE(k.pattern);
    const auto p = JsonPattern::compile(k.pattern, "#/pattern");
    const std::regex re(k.pattern, std::regex::ECMAScript);
    for (const std::string& s : strings(k.alphabet, 6)) {
      const bool want = std::regex_search(s, re);
      ASSERT_EQ(p->matches(wide(s)), want) << "'" << s << "'";
      matched += want;
    }
  }
  EXPECT_GT(matched, 1000);
}

// A live state after a prefix can end (the shortest way its distances say) in a string std::regex
// accepts; a dead one has no ending of up to 3 characters of the alphabet that it accepts.
TEST(JsonPattern, LivePrefixesCanEndAndDeadOnesCannot) {
  int live = 0, dead = 0;
  for (const Case& k : cases()) {
    SCOPED_TRACE(k.pattern);
    const auto p = JsonPattern::compile(k.pattern, "#/pattern");
    const std::regex re(k.pattern, std::regex::ECMAScript);
    const std::vector<std::string> endings = strings(k.alphabet, 3);
    for (const std::string& s : strings(k.alphabet, 4)) {
      const int32_t st = run(*p, s);
      if (st == JsonPattern::kDead) {
        ++dead;
        for (const std::string& e : endings)
          ASSERT_FALSE(std::regex_search(s + e, re)) << "'" << s << "' + '" << e << "'";
        continue;
      }
      ++live;
      // The shortest ending, a character at a time among printable ASCII and the alphabet.
      std::string text = s;
      int32_t at = st;
      std::string chars = k.alphabet;
      for (int c = 0x20; c < 0x7f; ++c) chars += char(c);
      for (int left = p->min_left(at); left > 0; --left) {
        bool stepped = false;
        for (char c : chars) {
          const int32_t next = p->step(at, static_cast<unsigned char>(c));
          if (next != JsonPattern::kDead && p->min_left(next) == left - 1) {
            text += c, at = next, stepped = true;
            break;
          }
        }
        ASSERT_TRUE(stepped) << "'" << text << "'";
      }
      ASSERT_TRUE(p->accepts(at)) << "'" << text << "'";
      ASSERT_TRUE(std::regex_search(text, re)) << "'" << s << "' ended as '" << text << "'";
    }
  }
  EXPECT_GT(live, 1000);
  EXPECT_GT(dead, 1000);
}

// Beyond ASCII: each class takes only what both readings put in it. Decimal digits against PCRE2's
// \p{Nd}, spaces against its White_Space; line terminators never in `.`; characters above U+FFFF
// in no class, though one may come as itself.
TEST(JsonPattern, ClassesBeyondAsciiTakeWhatBothReadingsTake) {
  const auto not_digit = JsonPattern::compile("^\\D$", "p");
  const auto not_space = JsonPattern::compile("^\\S$", "p");
  const auto digit = JsonPattern::compile("^\\d$", "p");
  const auto dot = JsonPattern::compile("^.$", "p");
  const auto other = JsonPattern::compile("^[^a]$", "p");
  const Regex nd = Regex::pattern("\\p{Nd}", "test");
  const Regex space = Regex::pattern("\\s", "test");  // Oniguruma's \s: White_Space
  int digits = 0;
  for (uint32_t cp = 0; cp <= 0xFFFF; ++cp) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    const std::u32string one(1, char32_t(cp));
    const std::string utf8 = utf8_encode(cp);
    const bool is_nd = nd.search(utf8);
    digits += is_nd;
    ASSERT_EQ(not_digit->matches(one), !is_nd) << cp;
    ASSERT_EQ(digit->matches(one), cp >= '0' && cp <= '9') << cp;
    if (not_space->matches(one)) {
      ASSERT_FALSE(space.search(utf8)) << cp;
    }
    const bool terminator = cp == '\n' || cp == '\r' || cp == 0x2028 || cp == 0x2029;
    ASSERT_EQ(dot->matches(one), !terminator) << cp;
    ASSERT_EQ(other->matches(one), cp != 'a') << cp;
  }
  EXPECT_GT(digits, 300);
  EXPECT_FALSE(not_space->matches(U"\x1c"));  // a space to Python, not to ECMA-262
  EXPECT_FALSE(not_space->matches(U"\xfeff"));  // a space to ECMA-262, not to Python
  EXPECT_TRUE(not_space->matches(U"\x00e9"));
  for (const auto& p : {dot, other, not_digit, not_space}) EXPECT_FALSE(p->matches(U"\U0001F600"));
  EXPECT_TRUE(JsonPattern::compile("^a\U0001F600$", "p")->matches(U"a\U0001F600"));
  EXPECT_TRUE(JsonPattern::compile("^(?<first>a)b$", "p")->matches(U"ab"));  // a named group
  EXPECT_FALSE(JsonPattern::compile("^(?<first>a)b$", "p")->matches(U"b"));
  EXPECT_TRUE(JsonPattern::compile("^.\U0001F600", "p")->matches(U"a\U0001F600\U0001F600"));  // outside the match: any
  EXPECT_TRUE(JsonPattern::compile("^[\\u00e0-\\u00ff]+$", "p")->matches(U"\x00e9\x00e8"));
  EXPECT_FALSE(JsonPattern::compile("^[\\u00e0-\\u00ff]+$", "p")->matches(U"ete"));
  EXPECT_TRUE(JsonPattern::compile("^\\W$", "p")->matches(U"-"));
  EXPECT_FALSE(JsonPattern::compile("^\\W$", "p")->matches(U"\x00e9"));  // a letter to Python
}

TEST(JsonPattern, DistancesToAMatch) {
  const auto p = JsonPattern::compile("^[a-z]{3,5}@x$", "p");
  EXPECT_EQ(p->min_left(p->start()), 5);
  EXPECT_EQ(p->min_left(run(*p, "ab")), 3);
  EXPECT_EQ(p->min_left(run(*p, "abcde")), 2);
  EXPECT_EQ(run(*p, "abcdef"), JsonPattern::kDead);
  EXPECT_EQ(p->min_left(run(*p, "abc@x")), 0);
  EXPECT_EQ(p->max_left(p->start()), 7);
  EXPECT_EQ(p->max_left(run(*p, "ab")), 5);
  EXPECT_EQ(p->max_left(run(*p, "abcde")), 2);
  EXPECT_EQ(p->max_left(run(*p, "abc@x")), 0);
  EXPECT_EQ(JsonPattern::compile("abc", "p")->min_left(0), 3);
  EXPECT_EQ(JsonPattern::compile("abc", "p")->max_left(0), JsonPattern::kUnbounded);  // a search: anything around
  EXPECT_EQ(JsonPattern::compile("", "p")->min_left(0), 0);
  const auto whole = JsonPattern::compile("(ab|c){1,2}x?", "p", JsonPattern::Match::kWhole);
  EXPECT_EQ(whole->min_left(0), 1);
  EXPECT_EQ(whole->max_left(0), 5);
  EXPECT_EQ(JsonPattern::compile("a(bc)*", "p", JsonPattern::Match::kWhole)->max_left(0), JsonPattern::kUnbounded);
  // Through a range of next characters: [a-b] reaches "ab" (2 to go, 5 at most) and "b" dead.
  const JsonPattern::Reach r = whole->reach_through(0, 'a', 'b');
  EXPECT_EQ(r.min, 2);
  EXPECT_EQ(r.max, 5);
  EXPECT_EQ(whole->reach_through(0, 'd', 'z').min, -1);
}

TEST(JsonPattern, RefusesWhatItCannotReadAsBothValidatorsDo) {
  auto message = [](const std::string& pattern) {
    try {
      JsonPattern::compile(pattern, "#/properties/a/pattern");
    } catch (const dsi::Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"(?=a)", "lookaround"},        {"(?<!a)b", "lookaround"},    {"(a)\\1", "back-reference"},
      {"\\bword", "word boundary"},   {"(?i)a", "inline flags"},    {"\\p{L}", "escape '\\p'"},
      {"a{,3}", "'{,'"},               {"[]", "empty class"},        {"[^]", "empty class"},
      {"[\\d-z]", "class escape"},    {"\\uD800", "surrogate"},     {"a**", "quantifier after"},
      {"*a", "nothing to repeat"},    {"a{2}{3}", "quantifier after"}, {"(a", "unclosed '('"},
      {"a)", "unmatched ')'"},        {"[a", "unclosed '['"},       {"a{1001}", "more than 1000"},
      {"\\q", "escape '\\q'"},        {"[z-a]", "out of order"},    {"a{3,2}", "out of order"},
      {"\\0" "1", "octal"},           {"\\x4", "two hex digits"},   {"a$b", "matches no string"},
      {"(a|b)*a(a|b){14}", "too complex"}, {"^", ""},               {"a{2", ""},
  };
  for (const auto& [pattern, says] : refused) {
    const std::string m = message(pattern);
    if (says.empty()) {
      EXPECT_EQ(m, "") << pattern;
      continue;
    }
    EXPECT_NE(m.find(says), std::string::npos) << pattern << ": " << m;
    EXPECT_NE(m.find("#/properties/a/pattern"), std::string::npos) << m;
  }
  // '{' that is no count is itself, as both readings have it.
  EXPECT_TRUE(JsonPattern::compile("^a{2$", "p")->matches(U"a{2"));
}

}  // namespace
}  // namespace dsi::server

namespace dsi::server {
namespace {

using test::allowed;
using test::kjv_tokenizer;

// Masks of a whole-answer pattern, each token tried alone: at the start, within a word, half-way
// through a character, where only the end may come.
TEST(PatternConstraint, MasksAreEachTokenTriedAlone) {
  const Tokenizer& tok = kjv_tokenizer();
  const int64_t V = tok.vocab_size() + 1;
  const int32_t eos = int32_t(V - 1);
  const auto p = JsonPattern::compile("(In the beginning|And God said), [a-z\\u00e9 ]{1,40}[.!]", "r",
                                      JsonPattern::Match::kWhole);
  for (const std::string& text : {std::string(""), std::string("In the beg"), std::string("And God said, let"),
                                  std::string("And God said, l\xC3"), std::string("In the beginning, x!")}) {
    PatternConstraint c(tok, p, {eos}, -1, -1, false);
    for (unsigned char b : text) c.accept(test::byte_token(tok, b));
    test::expect_mask_is_each_token(c, tok, V, eos, text);
  }
}

// Seeded walks through the masks: each step's mask is each token tried alone, and every walk that
// ends (at the end of sequence, which comes only once the text is whole) wrote a text the pattern
// matches whole, as std::regex_match reads it; a list of choices ends in one of them.
TEST(PatternConstraint, WalksEndInWholeMatches) {
  const Tokenizer& tok = kjv_tokenizer();
  const int64_t V = tok.vocab_size() + 1;
  const int32_t eos = int32_t(V - 1);
  const std::vector<std::string> regexes = {"[A-Z][a-z]+( [a-z]+){2,5}\\.", "\\d{1,3}(,\\d{3})*", "(yes|no|maybe)",
                                            "[^\\n]{0,12}\\n?"};
  const std::vector<std::string> choices = {"Genesis", "Genes", "Exodus 3:14", "Leviticus"};
  std::mt19937_64 rng(17);
  int ended = 0;
  for (size_t k = 0; k <= regexes.size(); ++k) {
    const bool choice = k == regexes.size();
    const auto p = choice ? JsonPattern::any_of(choices, "c")
                          : JsonPattern::compile(regexes[k], "r", JsonPattern::Match::kWhole);
    for (int walk = 0; walk < 8; ++walk) {
      PatternConstraint c(tok, p, {eos}, -1, -1, false);
      std::string text;
      bool done = false;
      for (int step = 0; step < 60 && !done; ++step) {
        const std::vector<int32_t> ok = allowed(c, V);
        ASSERT_FALSE(ok.empty()) << text;
        ASSERT_EQ(ok, test::each_token(c.state(), tok, V, eos)) << text;
        const bool can_end = std::binary_search(ok.begin(), ok.end(), eos);
        const int32_t pick = can_end && (step > 6 || rng() % 3 == 0)
                                 ? eos
                                 : ok[std::uniform_int_distribution<size_t>(0, ok.size() - 1)(rng)];
        if (pick == eos) {
          done = true;
          break;
        }
        c.accept(pick);
        text += *tok.token_bytes(pick);
      }
      if (!done) continue;
      ++ended;
      if (choice) {
        EXPECT_NE(std::find(choices.begin(), choices.end(), text), choices.end()) << text;
      }
      else
        EXPECT_TRUE(std::regex_match(text, std::regex(regexes[k], std::regex::ECMAScript))) << regexes[k] << ": " << text;
    }
  }
  EXPECT_GT(ended, 30);
}

}  // namespace
}  // namespace dsi::server
