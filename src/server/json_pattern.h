// JSON Schema's "pattern": an ECMA-262 regular expression that a string matches somewhere (an
// unanchored search, as validators run it), compiled for generation into a DFA over the string's
// code points. The same automaton serves structured outputs' regular expressions, which match the
// whole answer (Match::kWhole), and lists of choices (any_of).
//
// Validators read patterns two ways: JavaScript's (ECMA-262, UTF-16 code units without the u
// flag) and Python's `re` (jsonschema), whose \d, \w, \s and `.` take more characters. A string
// made here matches under both readings: each class takes only what both readings put in it, and
// a negated class leaves out what either reading puts in what it negates. So:
// - \d is [0-9], \w is [A-Za-z0-9_], \s is [\t\n\v\f\r ];
// - \D leaves out every Unicode decimal digit, \S every space of either reading, \W every
//   character that is not ASCII (some of them are letters under Python's reading);
// - `.` takes no line terminator (\n \r U+2028 U+2029); no class takes a character above U+FFFF
//   (a pair of code units to JavaScript), though one may come as itself, outside a class.
// Refused, with what is refused named: back-references, word boundaries, lookaround, inline
// flags, \p{...}, \c, unknown letter escapes, `{,n}`, empty classes, surrogate escapes, ranges
// that start or end with a class escape. Repetition counts are at most kMaxRepeat; a pattern
// whose automaton grows past kMaxNfaStates or kMaxDfaStates is refused as too complex.
#pragma once

#include <algorithm>
#include <climits>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace dsi::server {

class JsonPattern {
 public:
  // kSearch: a string matches when the pattern matches somewhere in it (JSON Schema's reading);
  // kWhole: when the pattern matches all of it (a regular expression for the whole answer).
  enum class Match { kSearch, kWhole };
  // Throws dsi::Error that names `where` (the keyword's path in the schema, or the field).
  static std::shared_ptr<const JsonPattern> compile(std::string_view pattern, const std::string& where,
                                                    Match match = Match::kSearch);
  // A pattern that matches exactly these texts (each UTF-8), for a list of choices.
  static std::shared_ptr<const JsonPattern> any_of(const std::vector<std::string>& texts, const std::string& where);

  static constexpr int32_t kDead = -1;  // no string that starts this way matches
  int32_t start() const { return 0; }
  // The state after code point cp; kDead when no continuation can match any more.
  int32_t step(int32_t state, uint32_t cp) const;
  bool accepts(int32_t state) const { return accept_[size_t(state)] != 0; }
  // The fewest code points after which a string in this state can match.
  int32_t min_left(int32_t state) const { return min_left_[size_t(state)]; }
  // The most code points after which a string in this state can still match; kUnbounded when a
  // loop can be taken on the way.
  int32_t max_left(int32_t state) const { return max_left_[size_t(state)]; }
  static constexpr int32_t kUnbounded = INT32_MAX;
  // min_left and max_left through one of the code points [lo, hi] next (that one counted); min
  // is -1 when none of them keeps the string live.
  struct Reach {
    int32_t min = -1, max = -1;
  };
  Reach reach_through(int32_t state, uint32_t lo, uint32_t hi) const;
  // fn(lo, hi, next) for each class of code points that meets [from, to] (clipped to it), with the
  // state after it (kDead too), until fn returns true; returns whether one did.
  template <class F>
  bool any_step(int32_t state, uint32_t from, uint32_t to, F&& fn) const {
    if (state < 0 || from > to || bounds_.empty()) return false;
    size_t c = size_t(std::upper_bound(bounds_.begin(), bounds_.end(), from) - bounds_.begin()) - 1;
    for (; c < classes_ && bounds_[c] <= to; ++c)
      if (fn(std::max(bounds_[c], from), std::min(bounds_[c + 1] - 1, to), next_[size_t(state) * classes_ + c])) return true;
    return false;
  }
  // The patterns of parts run side by side over one string: a state of the product stands for a
  // state of each part (kDead parts match nothing more); tags (out) has, per state, bit i set where
  // part i matches, and the product accepts where accept(tags) holds. Null where it accepts no
  // string; throws dsi::Error naming `where` past kMaxDfaStates.
  static std::shared_ptr<const JsonPattern> product(const std::vector<const JsonPattern*>& parts,
                                                    const std::function<bool(uint32_t)>& accept,
                                                    std::vector<uint32_t>& tags, const std::string& where);
  size_t states() const { return accept_.size(); }
  // Whether the whole string matches (a test's and the enum filter's question).
  bool matches(std::u32string_view text) const;

  static constexpr int kMaxRepeat = 1000;
  static constexpr size_t kMaxNfaStates = 20000;
  static constexpr size_t kMaxDfaStates = 4096;

 private:
  std::vector<uint32_t> bounds_;  // class c holds the code points [bounds_[c], bounds_[c + 1])
  size_t classes_ = 0;
  std::vector<int32_t> next_;  // next_[state * classes_ + class]
  std::vector<uint8_t> accept_;
  std::vector<int32_t> min_left_;
  std::vector<int32_t> max_left_;
  friend class PatternBuilder;
};

}  // namespace dsi::server
