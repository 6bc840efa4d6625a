// JSON Schema patterns as DFAs over code points; see json_pattern.h. A pattern is parsed into a
// tree, the tree into a Thompson NFA (the unanchored search: any characters before and after), and
// the NFA into a DFA by subset construction over the classes of code points that no set splits;
// states from which no match can be reached become kDead.
#include "server/json_pattern.h"

#include <algorithm>
#include <deque>
#include <functional>
#include <map>
#include <utility>

#include "dsinfer/error.h"
#include "text/utf8.h"

namespace dsi::server {

namespace {

constexpr uint32_t kMaxCp = 0x10FFFF;
using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;  // inclusive, sorted, disjoint

Ranges normal(Ranges r) {
  std::sort(r.begin(), r.end());
  Ranges out;
  for (const auto& [lo, hi] : r) {
    if (!out.empty() && lo <= out.back().second + 1) out.back().second = std::max(out.back().second, hi);
    else out.emplace_back(lo, hi);
  }
  return out;
}

Ranges complement(const Ranges& r) {  // within [0, kMaxCp]; r normal
  Ranges out;
  uint32_t next = 0;
  for (const auto& [lo, hi] : r) {
    if (lo > next) out.emplace_back(next, lo - 1);
    next = hi + 1;
  }
  if (next <= kMaxCp) out.emplace_back(next, kMaxCp);
  return out;
}

Ranges intersect(const Ranges& a, const Ranges& b) {
  Ranges out;
  for (size_t i = 0, j = 0; i < a.size() && j < b.size();) {
    const uint32_t lo = std::max(a[i].first, b[j].first), hi = std::min(a[i].second, b[j].second);
    if (lo <= hi) out.emplace_back(lo, hi);
    (a[i].second < b[j].second ? i : j)++;
  }
  return out;
}

Ranges merged(Ranges a, const Ranges& b) {
  a.insert(a.end(), b.begin(), b.end());
  return normal(std::move(a));
}

// What a class may take at all: the Basic Multilingual Plane less the surrogates.
const Ranges kClassChars = {{0, 0xD7FF}, {0xE000, 0xFFFF}};
// Unicode's decimal digits (category Nd) in the Basic Multilingual Plane: Python's \d.
const Ranges kDecimalDigits = {
    {0x30, 0x39},     {0x660, 0x669},   {0x6F0, 0x6F9},   {0x7C0, 0x7C9},   {0x966, 0x96F},   {0x9E6, 0x9EF},
    {0xA66, 0xA6F},   {0xAE6, 0xAEF},   {0xB66, 0xB6F},   {0xBE6, 0xBEF},   {0xC66, 0xC6F},   {0xCE6, 0xCEF},
    {0xD66, 0xD6F},   {0xDE6, 0xDEF},   {0xE50, 0xE59},   {0xED0, 0xED9},   {0xF20, 0xF29},   {0x1040, 0x1049},
    {0x1090, 0x1099}, {0x17E0, 0x17E9}, {0x1810, 0x1819}, {0x1946, 0x194F}, {0x19D0, 0x19D9}, {0x1A80, 0x1A89},
    {0x1A90, 0x1A99}, {0x1B50, 0x1B59}, {0x1BB0, 0x1BB9}, {0x1C40, 0x1C49}, {0x1C50, 0x1C59}, {0xA620, 0xA629},
    {0xA8D0, 0xA8D9}, {0xA900, 0xA909}, {0xA9D0, 0xA9D9}, {0xA9F0, 0xA9F9}, {0xAA50, 0xAA59}, {0xABF0, 0xABF9},
    {0xFF10, 0xFF19}};
// Every space of either reading: Python's str.isspace() and ECMA-262's WhiteSpace and
// LineTerminator.
const Ranges kAnySpace = {{0x9, 0xD},       {0x1C, 0x20},     {0x85, 0x85},     {0xA0, 0xA0},
                          {0x1680, 0x1680}, {0x2000, 0x200A}, {0x2028, 0x2029}, {0x202F, 0x202F},
                          {0x205F, 0x205F}, {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
const Ranges kLineTerminators = {{0xA, 0xA}, {0xD, 0xD}, {0x2028, 0x2029}};

// A class item: `narrow` is what it takes here (both readings take it), `wide` what either
// reading could take (what its negation must leave out).
struct Item {
  Ranges narrow, wide;
};
Item single(uint32_t c) { return {{{c, c}}, {{c, c}}}; }
Item negated(const Item& it) {
  return {intersect(complement(it.wide), kClassChars), complement(it.narrow)};
}
Item shorthand(char letter) {
  Item it;
  switch (letter | 0x20) {
    case 'd':
      it = {{{'0', '9'}}, kDecimalDigits};
      break;
    case 'w':  // Python's \w takes letters and digits of every script: wide is all of non-ASCII
      it = {{{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}},
            {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}, {0x80, kMaxCp}}};
      break;
    default:  // 's'
      it = {{{0x9, 0xD}, {' ', ' '}}, kAnySpace};
      break;
  }
  return letter >= 'a' ? it : negated(it);
}

struct Ast {
  enum class Kind { kSet, kCat, kAlt, kRepeat, kLineStart, kLineEnd };
  Kind kind = Kind::kCat;
  Ranges set;
  std::vector<Ast> kids;
  int min = 0, max = 0;  // kRepeat; max -1: no limit
};

std::u32string decode_utf8(std::string_view s, const std::string& where) {
  if (!utf8::is_valid(s)) fail("{}: not UTF-8", where);
  std::u32string out;
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<unsigned char>(s[i]);
    const int n = b < 0x80 ? 1 : b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : b >= 0xC0 ? 2 : 0;
    uint32_t cp = n == 1 ? b : b & (0x7F >> n);
    for (int k = 1; k < n; ++k) cp = cp << 6 | (static_cast<unsigned char>(s[i + size_t(k)]) & 0x3F);
    out += char32_t(cp);
    i += size_t(n);
  }
  return out;
}

class Parser {
 public:
  Parser(std::u32string text, std::string where) : p_(std::move(text)), where_(std::move(where)) {}

  Ast parse() {
    Ast a = alternation();
    if (i_ < p_.size()) bad("an unmatched ')'");
    return a;
  }

 private:
  [[noreturn]] void bad(const std::string& what) const {
    fail("{}: the pattern's {} at character {} is not supported", where_, what, i_);
  }
  bool more() const { return i_ < p_.size(); }
  char32_t peek(size_t ahead = 0) const { return i_ + ahead < p_.size() ? p_[i_ + ahead] : 0; }
  static bool digit(char32_t c) { return c >= '0' && c <= '9'; }
  static int hex(char32_t c) {
    if (digit(c)) return int(c - '0');
    if ((c | 0x20) >= 'a' && (c | 0x20) <= 'f') return int((c | 0x20) - 'a' + 10);
    return -1;
  }

  Ast alternation() {
    Ast alt;
    alt.kind = Ast::Kind::kAlt;
    alt.kids.push_back(sequence());
    while (more() && peek() == '|') {
      ++i_;
      alt.kids.push_back(sequence());
    }
    return alt.kids.size() == 1 ? std::move(alt.kids[0]) : alt;
  }

  Ast sequence() {
    Ast cat;
    while (more() && peek() != '|' && peek() != ')') cat.kids.push_back(quantified());
    return cat;
  }

  // {n}, {n,}, {n,m} at i_: true with min and max set (i_ past it); false when '{' is a literal.
  bool braces(int& min, int& max) {
    size_t j = i_ + 1;
    auto number = [&](int& v) {
      const size_t from = j;
      long long x = 0;
      while (j < p_.size() && digit(p_[j])) x = std::min<long long>(x * 10 + (p_[j++] - '0'), 1 << 30);
      v = int(x);
      return j > from;
    };
    if (j < p_.size() && p_[j] == ',') bad("'{,' (a literal to JavaScript, a count to Python)");
    if (!number(min)) return false;
    max = min;
    if (j < p_.size() && p_[j] == ',') {
      ++j;
      max = -1;
      if (j < p_.size() && digit(p_[j])) number(max);
    }
    if (j >= p_.size() || p_[j] != '}') return false;
    i_ = j + 1;
    if (max >= 0 && max < min) bad("count range out of order");
    if (min > JsonPattern::kMaxRepeat || max > JsonPattern::kMaxRepeat)
      fail("{}: the pattern repeats more than {} times", where_, JsonPattern::kMaxRepeat);
    return true;
  }

  Ast quantified() {
    Ast atom = this->atom();
    int min = 0, max = 0;
    bool quantifier = true;
    switch (more() ? peek() : 0) {
      case '*': min = 0, max = -1, ++i_; break;
      case '+': min = 1, max = -1, ++i_; break;
      case '?': min = 0, max = 1, ++i_; break;
      case '{': quantifier = braces(min, max); break;
      default: quantifier = false;
    }
    if (!quantifier) return atom;
    if (atom.kind == Ast::Kind::kLineStart || atom.kind == Ast::Kind::kLineEnd) bad("repeated assertion");
    if (more() && peek() == '?') ++i_;  // lazy: the same strings match
    int m0 = 0, m1 = 0;
    if (more() && (peek() == '*' || peek() == '+' || peek() == '?' || (peek() == '{' && braces(m0, m1))))
      bad("quantifier after a quantifier");
    Ast rep;
    rep.kind = Ast::Kind::kRepeat;
    rep.min = min;
    rep.max = max;
    rep.kids.push_back(std::move(atom));
    return rep;
  }

  static Ast set(const Ranges& r) {
    Ast a;
    a.kind = Ast::Kind::kSet;
    a.set = r;
    return a;
  }

  Ast atom() {
    const char32_t c = p_[i_++];
    switch (c) {
      case '(': {
        if (++depth_ > kMaxDepth) bad("nesting deeper than 64 groups");
        if (peek() == '?') {
          if (peek(1) == ':') {
            i_ += 2;
          } else if (peek(1) == '<' && peek(2) != '=' && peek(2) != '!') {  // a named group
            i_ += 2;
            while (more() && peek() != '>') ++i_;
            if (!more()) bad("unclosed group name");
            ++i_;
          } else {
            bad("'(?' (lookaround or inline flags)");
          }
        }
        Ast inner = alternation();
        if (!more() || peek() != ')') bad("unclosed '('");
        ++i_;
        --depth_;
        return inner;
      }
      case '[':
        return set(klass());
      case '.':
        return set(intersect(complement(kLineTerminators), kClassChars));
      case '^': {
        Ast a;
        a.kind = Ast::Kind::kLineStart;
        return a;
      }
      case '$': {
        Ast a;
        a.kind = Ast::Kind::kLineEnd;
        return a;
      }
      case '\\': {
        const Item it = escape(false);
        return set(it.narrow);
      }
      case '*':
      case '+':
      case '?':
        --i_;
        bad("quantifier with nothing to repeat");
      case '{': {
        int a = 0, b = 0;
        --i_;
        if (braces(a, b)) bad("quantifier with nothing to repeat");
        ++i_;
        return set({{c, c}});
      }
      default:
        if (c >= 0xD800 && c <= 0xDFFF) bad("surrogate");
        return set({{c, c}});
    }
  }

  // After a backslash. in_class: inside [...] (where \b is a backspace and \- a dash).
  Item escape(bool in_class) {
    if (!more()) bad("'\\' at the end");
    const char32_t c = p_[i_++];
    switch (c) {
      case 'd': case 'D': case 'w': case 'W': case 's': case 'S':
        return shorthand(char(c));
      case 't': return single('\t');
      case 'n': return single('\n');
      case 'r': return single('\r');
      case 'f': return single('\f');
      case 'v': return single('\v');
      case '0':
        if (digit(peek())) bad("octal escape");
        return single(0);
      case 'x':
      case 'u': {
        const int n = c == 'x' ? 2 : 4;
        uint32_t v = 0;
        for (int k = 0; k < n; ++k) {
          const int h = hex(peek());
          if (h < 0) bad(c == 'x' ? "'\\x' without two hex digits" : "'\\u' without four hex digits");
          v = v << 4 | uint32_t(h);
          ++i_;
        }
        if (v >= 0xD800 && v <= 0xDFFF) bad("surrogate escape");
        return single(v);
      }
      case 'b':
        if (in_class) return single('\b');
        bad("word boundary '\\b'");
      case '-':
        if (in_class) return single('-');
        break;
      default:
        break;
    }
    if (c < 0x80 && ((c | 0x20) >= 'a' && (c | 0x20) <= 'z')) bad(std::string("escape '\\") + char(c) + "'");
    if (digit(c)) bad("back-reference");
    if (c >= 0xD800 && c <= 0xDFFF) bad("surrogate");
    return single(c);  // an escaped punctuation mark (or other character) is itself
  }

  // After '[': the class's code points.
  Ranges klass() {
    const bool negate = more() && peek() == '^';
    if (negate) ++i_;
    if (more() && peek() == ']') bad("empty class ('[]' or '[^]': read differently by validators)");
    Item all;
    auto member = [&](bool& is_char, uint32_t& ch) -> Item {
      const char32_t c = p_[i_++];
      is_char = true;
      if (c == '\\') {
        const char32_t e = peek();
        Item it = escape(true);
        is_char = !(e == 'd' || e == 'D' || e == 'w' || e == 'W' || e == 's' || e == 'S');
        ch = is_char ? it.narrow[0].first : 0;
        return it;
      }
      if (c > 0xFFFF) bad("character above U+FFFF in a class");
      if (c >= 0xD800 && c <= 0xDFFF) bad("surrogate");
      ch = c;
      return single(c);
    };
    while (true) {
      if (!more()) bad("unclosed '['");
      if (peek() == ']') break;
      bool lo_char = false;
      uint32_t lo = 0;
      Item it = member(lo_char, lo);
      if (more() && peek() == '-' && peek(1) != ']' && i_ + 1 < p_.size()) {
        ++i_;
        bool hi_char = false;
        uint32_t hi = 0;
        member(hi_char, hi);
        if (!lo_char || !hi_char) bad("range with a class escape at an end");
        if (hi < lo) bad("range out of order");
        it = {{{lo, hi}}, {{lo, hi}}};
      }
      all.narrow = merged(std::move(all.narrow), it.narrow);
      all.wide = merged(std::move(all.wide), it.wide);
    }
    ++i_;  // ']'
    return negate ? negated(all).narrow : intersect(all.narrow, kClassChars);
  }

  static constexpr int kMaxDepth = 64;

  std::u32string p_;
  std::string where_;
  size_t i_ = 0;
  int depth_ = 0;
};

}  // namespace

// The NFA (states with epsilon, character-set and assertion edges) and the subset construction.
class PatternBuilder {
 public:
  explicit PatternBuilder(std::string where) : where_(std::move(where)) {}

  std::shared_ptr<const JsonPattern> build(const Ast& root, JsonPattern::Match match) {
    // A search: any characters, then the pattern, then any characters.
    const bool search = match == JsonPattern::Match::kSearch;
    const int any = add_set({{0, 0xD7FF}, {0xE000, kMaxCp}});
    const int start = add_state();
    if (search) nfa_[size_t(start)].chars.emplace_back(any, start);
    const int end = emit(root, start);
    if (search) nfa_[size_t(end)].chars.emplace_back(any, end);
    accept_ = end;
    return determinize(start);
  }

 private:
  struct State {
    std::vector<int> eps;
    std::vector<std::pair<int, int>> chars;  // (set, target)
    std::vector<int> line_start, line_end;   // targets of ^ and $
  };

  int add_state() {
    if (nfa_.size() >= JsonPattern::kMaxNfaStates)
      fail("{}: the pattern is too complex (over {} automaton states)", where_, JsonPattern::kMaxNfaStates);
    nfa_.emplace_back();
    return int(nfa_.size() - 1);
  }
  int add_set(const Ranges& r) {
    sets_.push_back(r);
    return int(sets_.size() - 1);
  }

  // Adds states for a starting at `from`; returns the state where a ends.
  int emit(const Ast& a, int from) {
    switch (a.kind) {
      case Ast::Kind::kSet: {
        const int to = add_state();
        const int s = add_set(a.set);
        nfa_[size_t(from)].chars.emplace_back(s, to);
        return to;
      }
      case Ast::Kind::kLineStart:
      case Ast::Kind::kLineEnd: {
        const int to = add_state();
        (a.kind == Ast::Kind::kLineStart ? nfa_[size_t(from)].line_start : nfa_[size_t(from)].line_end).push_back(to);
        return to;
      }
      case Ast::Kind::kCat: {
        int at = from;
        for (const Ast& k : a.kids) at = emit(k, at);
        return at;
      }
      case Ast::Kind::kAlt: {
        const int end = add_state();
        for (const Ast& k : a.kids) {
          const int in = add_state();
          nfa_[size_t(from)].eps.push_back(in);
          nfa_[size_t(emit(k, in))].eps.push_back(end);
        }
        return end;
      }
      case Ast::Kind::kRepeat: {
        const Ast& k = a.kids[0];
        int at = from;
        for (int i = 0; i < a.min; ++i) at = emit(k, at);
        if (a.max < 0) {  // a loop: in -> k -> in
          const int in = add_state();
          nfa_[size_t(at)].eps.push_back(in);
          nfa_[size_t(emit(k, in))].eps.push_back(in);
          return in;
        }
        const int end = add_state();
        for (int i = a.min; i < a.max; ++i) {
          nfa_[size_t(at)].eps.push_back(end);
          const int in = add_state();
          nfa_[size_t(at)].eps.push_back(in);
          at = emit(k, in);
        }
        nfa_[size_t(at)].eps.push_back(end);
        return end;
      }
    }
    return from;
  }

  // A fresh mark for a walk over the NFA; every state a walk visits counts towards kMaxWork.
  uint32_t fresh_mark() {
    if (mark_.size() != nfa_.size()) mark_.assign(nfa_.size(), 0);
    return ++epoch_;
  }
  bool visit(int s, uint32_t epoch) {
    if (mark_[size_t(s)] == epoch) return false;
    mark_[size_t(s)] = epoch;
    if (++work_ > kMaxWork) fail("{}: the pattern is too complex to compile", where_);
    return true;
  }

  // The states reachable over epsilon edges (and ^ edges at the string's start), sorted.
  std::vector<int> closure(std::vector<int> seeds, bool at_start) {
    const uint32_t epoch = fresh_mark();
    std::vector<int> out;
    while (!seeds.empty()) {
      const int s = seeds.back();
      seeds.pop_back();
      if (!visit(s, epoch)) continue;
      out.push_back(s);
      for (int t : nfa_[size_t(s)].eps) seeds.push_back(t);
      if (at_start)
        for (int t : nfa_[size_t(s)].line_start) seeds.push_back(t);
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  // Whether the string may end in one of these states: the accepting state over epsilon and $
  // edges (and ^ edges for the empty string).
  bool ends(const std::vector<int>& states, bool at_start) {
    const uint32_t epoch = fresh_mark();
    std::vector<int> todo = states;
    while (!todo.empty()) {
      const int s = todo.back();
      todo.pop_back();
      if (!visit(s, epoch)) continue;
      if (s == accept_) return true;
      const State& st = nfa_[size_t(s)];
      for (int t : st.eps) todo.push_back(t);
      for (int t : st.line_end) todo.push_back(t);
      if (at_start)
        for (int t : st.line_start) todo.push_back(t);
    }
    return false;
  }

  std::shared_ptr<const JsonPattern> determinize(int start) {
    auto out = std::make_shared<JsonPattern>();
    // The classes: code points between consecutive edges of any set.
    std::vector<uint32_t> b = {0, kMaxCp + 1};
    for (const Ranges& r : sets_)
      for (const auto& [lo, hi] : r) b.push_back(lo), b.push_back(hi + 1);
    std::sort(b.begin(), b.end());
    b.erase(std::unique(b.begin(), b.end()), b.end());
    const size_t classes = b.size() - 1;
    // Each set's classes.
    std::vector<std::vector<uint32_t>> set_classes(sets_.size());
    for (size_t s = 0; s < sets_.size(); ++s)
      for (const auto& [lo, hi] : sets_[s])
        for (size_t c = size_t(std::lower_bound(b.begin(), b.end(), lo) - b.begin()); c < classes && b[c] <= hi; ++c)
          set_classes[s].push_back(uint32_t(c));

    std::map<std::vector<int>, int32_t> ids;
    std::vector<const std::vector<int>*> subsets;  // the DFA's states: keys of ids
    auto id_of = [&](std::vector<int> subset) -> int32_t {
      if (subset.empty()) return JsonPattern::kDead;
      const auto [it, fresh] = ids.emplace(std::move(subset), int32_t(subsets.size()));
      if (fresh) {
        if (subsets.size() >= JsonPattern::kMaxDfaStates || (subsets.size() + 1) * classes > (size_t(1) << 22))
          fail("{}: the pattern is too complex (over {} automaton states)", where_, JsonPattern::kMaxDfaStates);
        subsets.push_back(&it->first);
      }
      return it->second;
    };
    id_of(closure({start}, true));
    std::vector<std::vector<int>> targets(classes);
    for (size_t d = 0; d < subsets.size(); ++d) {
      for (auto& t : targets) t.clear();
      for (int s : *subsets[d])
        for (const auto& [set, to] : nfa_[size_t(s)].chars)
          for (uint32_t c : set_classes[size_t(set)]) {
            targets[c].push_back(to);
            if (++work_ > kMaxWork) fail("{}: the pattern is too complex to compile", where_);
          }
      out->next_.resize((d + 1) * classes, JsonPattern::kDead);
      for (size_t c = 0; c < classes; ++c) {
        if (targets[c].empty()) continue;
        const int32_t id = id_of(closure(targets[c], false));
        out->next_[d * classes + c] = id;
      }
      out->accept_.push_back(ends(*subsets[d], d == 0) ? 1 : 0);
    }

    if (!finish(*out, std::move(b), classes)) fail("{}: the pattern matches no string that can be written here", where_);
    return out;
  }

  // The automaton's last steps, its states and transitions made (next_, accept_): the distances to
  // a match backwards from the accepting states (min_left), the transitions into states that reach
  // none cut, the classes' bounds, and max_left. False when the start reaches no match.
  static bool finish(JsonPattern& out, std::vector<uint32_t> bounds, size_t classes) {
    const size_t n = out.accept_.size();
    std::vector<std::vector<int32_t>> back(n);
    for (size_t d = 0; d < n; ++d)
      for (size_t c = 0; c < classes; ++c)
        if (const int32_t t = out.next_[d * classes + c]; t >= 0) back[size_t(t)].push_back(int32_t(d));
    out.min_left_.assign(n, -1);
    std::deque<int32_t> queue;
    for (size_t d = 0; d < n; ++d)
      if (out.accept_[d]) out.min_left_[d] = 0, queue.push_back(int32_t(d));
    while (!queue.empty()) {
      const int32_t d = queue.front();
      queue.pop_front();
      for (int32_t p : back[size_t(d)])
        if (out.min_left_[size_t(p)] < 0) {
          out.min_left_[size_t(p)] = out.min_left_[size_t(d)] + 1;
          queue.push_back(p);
        }
    }
    if (out.min_left_[0] < 0) return false;
    for (int32_t& t : out.next_)
      if (t >= 0 && out.min_left_[size_t(t)] < 0) t = JsonPattern::kDead;
    out.bounds_ = std::move(bounds);
    out.classes_ = classes;
    longest(out);
    return true;
  }

  // max_left: the longest way to a match from each live state, by a depth-first walk of the
  // live transitions; a state whose walk meets a state still open (a loop) is unbounded, and so is
  // each state that reaches one.
  static void longest(JsonPattern& p) {
    const size_t n = p.accept_.size();
    p.max_left_.assign(n, -1);
    std::vector<uint8_t> open(n, 0);
    std::function<void(size_t)> walk = [&](size_t d) {
      open[d] = 1;
      int32_t best = p.accept_[d] ? 0 : -1;
      for (size_t c = 0; c < p.classes_; ++c) {
        const int32_t t = p.next_[d * p.classes_ + c];
        if (t < 0) continue;
        if (open[size_t(t)]) {
          best = JsonPattern::kUnbounded;
          continue;
        }
        if (p.max_left_[size_t(t)] < 0) walk(size_t(t));
        const int32_t m = p.max_left_[size_t(t)];
        best = m == JsonPattern::kUnbounded || best == JsonPattern::kUnbounded ? JsonPattern::kUnbounded
                                                                               : std::max(best, m + 1);
      }
      open[d] = 0;
      p.max_left_[d] = best;
    };
    for (size_t d = 0; d < n; ++d)
      if (p.min_left_[d] >= 0 && p.max_left_[d] < 0) walk(d);
  }

 public:
  // The automaton of several patterns run side by side (JsonPattern::product).
  static std::shared_ptr<const JsonPattern> product(const std::vector<const JsonPattern*>& parts,
                                                    const std::function<bool(uint32_t)>& accept,
                                                    std::vector<uint32_t>& tags, const std::string& where) {
    auto out = std::make_shared<JsonPattern>();
    std::vector<uint32_t> b = {0, 0xD800, 0xE000, kMaxCp + 1};  // (no string holds a surrogate)
    for (const JsonPattern* p : parts) b.insert(b.end(), p->bounds_.begin(), p->bounds_.end());
    std::sort(b.begin(), b.end());
    b.erase(std::unique(b.begin(), b.end()), b.end());
    while (b.size() > 2 && b.back() > kMaxCp + 1) b.pop_back();
    const size_t classes = b.size() - 1;
    std::map<std::vector<int32_t>, int32_t> ids;
    std::vector<std::vector<int32_t>> states;
    auto id_of = [&](std::vector<int32_t> s) {
      const auto [it, fresh] = ids.emplace(s, int32_t(states.size()));
      if (fresh) {
        if (states.size() >= JsonPattern::kMaxDfaStates || (states.size() + 1) * classes > (size_t(1) << 22))
          fail("{}: the patterns together are too complex (over {} automaton states)", where, JsonPattern::kMaxDfaStates);
        states.push_back(std::move(s));
      }
      return it->second;
    };
    std::vector<int32_t> first;
    for (const JsonPattern* p : parts) first.push_back(p->start());
    id_of(first);
    tags.clear();
    for (size_t d = 0; d < states.size(); ++d) {
      uint32_t bits = 0;
      for (size_t i = 0; i < parts.size(); ++i)
        if (states[d][i] >= 0 && parts[i]->accepts(states[d][i])) bits |= uint32_t(1) << i;
      tags.push_back(bits);
      out->accept_.push_back(accept(bits) ? 1 : 0);
      out->next_.resize((d + 1) * classes, JsonPattern::kDead);
      for (size_t c = 0; c < classes; ++c) {
        if (b[c] >= 0xD800 && b[c] <= 0xDFFF) continue;
        std::vector<int32_t> to(parts.size());
        for (size_t i = 0; i < parts.size(); ++i) to[i] = parts[i]->step(states[d][i], b[c]);
        out->next_[d * classes + c] = id_of(std::move(to));  // (states may move: d indexes)
      }
    }
    if (!finish(*out, std::move(b), classes)) return nullptr;
    return out;
  }

 private:
  static constexpr size_t kMaxWork = size_t(1) << 22;  // states visited and edges followed

  std::string where_;
  std::vector<State> nfa_;
  std::vector<Ranges> sets_;
  int accept_ = -1;
  std::vector<uint32_t> mark_;
  uint32_t epoch_ = 0;
  size_t work_ = 0;
};

std::shared_ptr<const JsonPattern> JsonPattern::compile(std::string_view pattern, const std::string& where,
                                                     Match match) {
  Parser parser(decode_utf8(pattern, where), where);
  const Ast root = parser.parse();
  return PatternBuilder(where).build(root, match);
}

std::shared_ptr<const JsonPattern> JsonPattern::any_of(const std::vector<std::string>& texts,
                                                    const std::string& where) {
  if (texts.empty()) fail("{}: no text to choose from", where);
  Ast alt;
  alt.kind = Ast::Kind::kAlt;
  for (const std::string& t : texts) {
    Ast cat;
    for (const char32_t c : decode_utf8(t, where)) {
      if (c >= 0xD800 && c <= 0xDFFF) fail("{}: a surrogate code point", where);
      Ast one;
      one.kind = Ast::Kind::kSet;
      one.set = {{uint32_t(c), uint32_t(c)}};
      cat.kids.push_back(std::move(one));
    }
    alt.kids.push_back(std::move(cat));
  }
  return PatternBuilder(where).build(alt, Match::kWhole);
}

std::shared_ptr<const JsonPattern> JsonPattern::product(const std::vector<const JsonPattern*>& parts,
                                                    const std::function<bool(uint32_t)>& accept,
                                                    std::vector<uint32_t>& tags, const std::string& where) {
  if (parts.empty() || parts.size() > 31) fail("{}: {} patterns to run together", where, parts.size());
  return PatternBuilder::product(parts, accept, tags, where);
}

int32_t JsonPattern::step(int32_t state, uint32_t cp) const {
  if (state < 0 || cp > kMaxCp) return kDead;
  const size_t c = size_t(std::upper_bound(bounds_.begin(), bounds_.end(), cp) - bounds_.begin()) - 1;
  return next_[size_t(state) * classes_ + c];
}

JsonPattern::Reach JsonPattern::reach_through(int32_t state, uint32_t lo, uint32_t hi) const {
  Reach r;
  if (state < 0 || lo > hi || lo > kMaxCp) return r;
  const size_t first = size_t(std::upper_bound(bounds_.begin(), bounds_.end(), lo) - bounds_.begin()) - 1;
  for (size_t c = first; c < classes_ && bounds_[c] <= hi; ++c) {
    const int32_t t = next_[size_t(state) * classes_ + c];
    if (t < 0) continue;
    const int32_t least = min_left_[size_t(t)] + 1, most = max_left_[size_t(t)];
    if (r.min < 0 || least < r.min) r.min = least;
    r.max = std::max(r.max, most == kUnbounded ? kUnbounded : most + 1);
  }
  return r;
}

bool JsonPattern::matches(std::u32string_view text) const {
  int32_t s = start();
  for (char32_t c : text)
    if ((s = step(s, uint32_t(c))) < 0) return false;
  return accepts(s);
}

}  // namespace dsi::server
