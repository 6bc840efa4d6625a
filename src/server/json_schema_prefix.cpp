// Structured outputs: the recognizer of the texts a compiled JSON Schema accepts; see
// json_schema.h. Each reading (Thread) is a stack of frames, the innermost last; a byte steps
// every reading and keeps those it fits, some of them forked (a value's alternatives).
#include <algorithm>
#include <bit>
#include <cmath>
#include <set>

#include <fmt/format.h>

#include "server/json_schema.h"
#include "server/json_schema_values.h"
#include "text/utf8.h"

namespace dsi::server {

namespace {
const std::vector<std::string> kBooleans = {"false", "true"};
const std::vector<std::string> kNulls = {"null"};
const std::vector<std::string> kNoItems;

// The value `text` (a scalar's JSON text) is one that the node's `not` excludes.
bool excluded(const JsonSchema::Node& n, const std::string& text) {
  return !n.excluded.empty() && std::binary_search(n.excluded.begin(), n.excluded.end(), JsonSchema::canonical(text));
}

// Whether a number that began as `text` (no exponent) can still end within the node's bounds: the
// magnitudes it can reach (schema_values::magnitudes) against them, mirrored for a minus sign.
bool may_reach(std::string_view text, bool integer, const JsonSchema::Node& n) {
  const bool neg = !text.empty() && text[0] == '-';
  const std::string_view body = text.substr(neg ? 1 : 0);
  const double lo = neg ? -n.hi : n.lo, hi = neg ? -n.lo : n.hi;
  const bool lo_open = neg ? n.hi_open : n.lo_open, hi_open = neg ? n.lo_open : n.hi_open;
  return schema_values::magnitudes(body, hi, [&](double a, double b) {
    return JsonSchema::meets(a, b, integer, lo, lo_open, hi, hi_open, n.multiple_of);
  });
}

bool within_bounds(std::string_view text, const JsonSchema::Node& n) {
  return n.within(schema_values::parse_number_text(text));
}
}  // namespace

SchemaPrefix::SchemaPrefix(std::shared_ptr<const JsonSchema> schema, int space_run)
    : schema_(std::move(schema)), space_run_(space_run) {
  Thread t;
  Frame root;
  root.node = schema_->root();
  t.stack.push_back(root);
  threads_.push_back(std::move(t));
}

// Bytes that stay inside the one reading's innermost string or number change only its
// frame: stepped in place, without the general path's copies. False: the general path decides
// (nothing changed).
bool SchemaPrefix::push_in_place(unsigned char c) {
  if (threads_.size() != 1 || threads_[0].stack.empty()) return false;
  Thread& t = threads_[0];
  Frame& f = t.stack.back();
  switch (f.kind) {
    case Kind::kString: {
      Frame g = f;
      if (g.str.step(c) != JsonStringScan::Step::kMore || !string_byte(g)) return false;
      if (g.capture && (g.item += char(c), closing_barred(t, g))) return false;
      f = std::move(g);
      if (f.capture) release(below_top(t), f);
      t.space_run = 0;
      return true;
    }
    case Kind::kNumber: {
      if (f.node->bounded()) return false;  // the general path checks the bounds
      JsonNumberScan num = f.num;
      if (num.step(c) != JsonNumberScan::Step::kMore) return false;
      if (f.capture) {
        Frame g = f;
        g.num = num;
        g.item += char(c);
        if (number_barred(below_top(t), g)) return false;
      }
      f.num = num;
      if (f.capture) f.item += char(c);
      t.space_run = 0;
      return true;
    }
    default:
      return false;
  }
}

bool SchemaPrefix::string_byte(Frame& f) {
  const Node& n = *f.node;
  return text_byte(f.str, f.count, f.pat, n.pattern.get(), n.min_length, n.max_length);
}

bool SchemaPrefix::text_byte(const JsonStringScan& str, int32_t& chars, int32_t& pat, const JsonPattern* pattern,
                             int64_t min_length, int64_t max_length) {
  if ((min_length > 0 || max_length >= 0) && str.char_started()) {
    if (max_length >= 0 && chars >= max_length) return false;
    ++chars;
  }
  if (!pattern) return true;
  // The characters a match still needs, at least and at most, against the length limits (the
  // count holds a character half-way already).
  JsonPattern::Reach left;
  int64_t count = chars;
  if (str.char_ended()) {
    pat = pattern->step(pat, str.code_point());
    if (pat == JsonPattern::kDead) return false;
    left = {pattern->min_left(pat), pattern->max_left(pat)};
  } else if (str.at_rest()) {
    return true;
  } else {  // a character half-way: what it can still become
    std::pair<uint32_t, uint32_t> ranges[3];
    for (size_t i = 0, k = str.pending(ranges); i < k; ++i) {
      const JsonPattern::Reach r = pattern->reach_through(pat, ranges[i].first, ranges[i].second);
      if (r.min >= 0 && (left.min < 0 || r.min < left.min)) left.min = r.min;
      left.max = std::max(left.max, r.max);
    }
    if (left.min < 0) return false;
    --count;
  }
  if (max_length >= 0 && count + left.min > max_length) return false;
  return left.max == JsonPattern::kUnbounded || count + left.max >= min_length;
}

uint64_t SchemaPrefix::needed(const Node& n, const Frame& f) {
  uint64_t need = n.required;
  if (!n.dependents.empty())
    for (uint64_t s = f.seen; s != 0; s &= s - 1) need |= n.dependents[size_t(std::countr_zero(s))];
  return need;
}

uint64_t SchemaPrefix::open_names(const Node& n, const Frame& f) {
  const uint64_t declared = n.names.size() == 64 ? ~uint64_t(0) : (uint64_t(1) << n.names.size()) - 1;
  const uint64_t open = declared & ~f.seen & ~n.banned;
  if (n.max_props < 0) return open;
  const uint64_t need = needed(n, f);
  uint64_t out = 0;
  for (uint64_t s = open; s != 0; s &= s - 1) {
    const auto i = size_t(std::countr_zero(s));
    const uint64_t more = (need | (n.dependents.empty() ? 0 : n.dependents[i])) & ~f.seen & ~(uint64_t(1) << i);
    if (f.props + 1 + std::popcount(more) <= n.max_props) out |= uint64_t(1) << i;
  }
  return out;
}

bool SchemaPrefix::other_open(const Node& n, const Frame& f) {
  return n.others &&
         (n.max_props < 0 || f.props + 1 + std::popcount(needed(n, f) & ~f.seen) <= n.max_props);
}

bool SchemaPrefix::key_can_end(const Node& n, const Frame& f, bool start) {
  const uint64_t declared = n.names.size() == 64 ? ~uint64_t(0) : (uint64_t(1) << n.names.size()) - 1;
  const uint64_t cand = start ? declared : f.cand;
  if ((cand & open_names(n, f)) != 0) return true;
  if (!(start ? n.others : f.other) || !other_open(n, f)) return false;
  // (With no limits, a character that no declared name and no key written goes on with can come
  // next, and the key can close after it.)
  if (!n.keys_limited()) return true;
  // The names the key may not end as: the declared ones it still matches (ending as one of them
  // is that property, which open_names answered) and the other keys written that it still matches.
  const std::string_view text = start ? std::string_view() : std::string_view(f.key_text);
  std::vector<const std::string*> avoid;
  for (uint64_t c = cand; c != 0; c &= c - 1) avoid.push_back(&n.names[size_t(std::countr_zero(c))]);
  f.keys_seen.for_each_prefixed(text, [&avoid](const std::string& k) { avoid.push_back(&k); });
  if (start) return other_ends(n, n.key_pattern ? n.key_pattern->start() : 0, 0, avoid, 0, nullptr, 0, 0);
  std::pair<uint32_t, uint32_t> ranges[3];
  const size_t k = f.str.at_rest() ? 0 : f.str.pending(ranges);
  return other_ends(n, f.pat, f.chars, avoid, text.size(), f.str.at_rest() ? nullptr : ranges, k, 0);
}

bool SchemaPrefix::other_ends(const Node& n, int32_t pat, int32_t chars, const std::vector<const std::string*>& avoid,
                              size_t at, const std::pair<uint32_t, uint32_t>* ranges, size_t k, int depth) {
  const JsonPattern* p = n.key_pattern.get();
  // With no name left to avoid, escapes may come: the pattern's reach against the lengths (as
  // string_byte reads a string's).
  auto may_end = [&](int32_t q, int64_t c) {
    const int64_t least = p ? p->min_left(q) : 0, most = p ? p->max_left(q) : JsonPattern::kUnbounded;
    return (n.key_max < 0 || c + least <= n.key_max) && (most == JsonPattern::kUnbounded || c + most >= n.key_min);
  };
  if (avoid.empty()) return ranges != nullptr || may_end(pat, chars);  // (half-way: text_byte read its reach)
  if (depth > 256) return false;
  if (ranges == nullptr) {  // at rest: it can close here unless that makes a name to avoid
    bool named = false;
    for (const std::string* name : avoid) named = named || name->size() == at;
    if (!named && (!p || p->accepts(pat)) && chars >= n.key_min && (n.key_max < 0 || chars <= n.key_max)) return true;
  }
  if (n.key_max >= 0 && chars >= n.key_max && ranges == nullptr) return false;
  // The characters that go on with a name to avoid at `at`, and the names each goes on with.
  std::vector<std::pair<uint32_t, std::vector<const std::string*>>> going_on;
  for (const std::string* name : avoid) {
    if (name->size() <= at) continue;
    Utf8Scan utf8;
    uint32_t cp = 0;
    for (size_t b = at; b < name->size(); ++b)
      if (utf8.step(static_cast<unsigned char>((*name)[b])) == Utf8Scan::Step::kChar) {
        cp = utf8.cp;
        break;
      }
    const auto hit = std::find_if(going_on.begin(), going_on.end(), [cp](const auto& g) { return g.first == cp; });
    if (hit == going_on.end()) going_on.emplace_back(cp, std::vector<const std::string*>{name});
    else hit->second.push_back(name);
  }
  const std::pair<uint32_t, uint32_t> everything[1] = {{0, 0x10FFFF}};
  if (ranges == nullptr) ranges = everything, k = 1;
  const int64_t next_chars = chars + 1;  // (the character under way counted already when half-way)
  const int64_t counted = ranges == everything ? next_chars : chars;
  for (size_t r = 0; r < k; ++r) {
    const auto [from, to] = ranges[r];
    // A character that no name to avoid goes on with and that needs no escape: the rest is free.
    auto free_in = [&](uint32_t lo, uint32_t hi) {
      int64_t count = int64_t(hi) - lo + 1;
      auto drop = [&](uint32_t a, uint32_t b) {
        if (a <= hi && b >= lo) count -= int64_t(std::min(b, hi)) - std::max(a, lo) + 1;
      };
      drop(0, 0x1F), drop('"', '"'), drop('\\', '\\'), drop(0xD800, 0xDFFF);
      for (const auto& g : going_on) drop(g.first, g.first);
      return count > 0;
    };
    if (p ? p->any_step(pat, from, to, [&](uint32_t lo, uint32_t hi, int32_t q) {
              return q != JsonPattern::kDead && free_in(lo, hi) && may_end(q, counted);
            })
          : free_in(from, to) && may_end(0, counted))
      return true;
    for (const auto& [cp, names] : going_on) {
      if (cp < from || cp > to) continue;
      const int32_t q = p ? p->step(pat, cp) : 0;
      if (q == JsonPattern::kDead) continue;
      if (n.key_max >= 0 && counted > n.key_max) continue;
      std::string bytes;
      utf8::append(bytes, cp);
      if (other_ends(n, q, int32_t(counted), names, at + bytes.size(), nullptr, 0, depth + 1)) return true;
    }
  }
  return false;
}

bool SchemaPrefix::push(unsigned char c) {
  if (push_in_place(c)) return true;
  std::vector<Thread> next;
  for (const Thread& t : threads_) step_top(t, c, next);
  if (next.empty()) return false;
  dedupe(next);
  threads_ = std::move(next);
  return true;
}

bool SchemaPrefix::push(std::string_view bytes) {
  SchemaPrefix next = *this;
  if (!next.advance(bytes)) return false;
  *this = std::move(next);
  return true;
}

bool SchemaPrefix::advance(std::string_view bytes) {
  for (char c : bytes)
    if (!push(static_cast<unsigned char>(c))) return false;
  return true;
}

bool SchemaPrefix::takes_string_text() const {
  for (const Thread& t : threads_) {
    if (t.stack.empty()) continue;
    const Frame& f = t.stack.back();
    if (f.kind == Kind::kString && f.node->max_length < 0 && !f.node->pattern && f.str.at_rest()) return true;
  }
  return false;
}

bool SchemaPrefix::complete() const {
  for (const Thread& t : threads_) {
    if (t.stack.empty()) return true;
    if (t.stack.size() != 1) continue;
    const Frame& f = t.stack[0];
    // A root scalar that ends with the text: a number, an enum value that is whole.
    if (f.kind == Kind::kNumber && f.num.whole() &&
        (!f.node->bounded() || within_bounds(std::string_view(f.num_text, f.num_len), *f.node)) &&
        !excluded(*f.node, f.item))
      return true;
    if (f.kind == Kind::kLiteral && (*f.texts)[size_t(f.lo)].size() == size_t(f.count) &&
        !excluded(*f.node, (*f.texts)[size_t(f.lo)]))
      return true;
  }
  return false;
}

void SchemaPrefix::Frame::key(std::string& out) const {
  auto put = [&out](const auto& v) { out.append(reinterpret_cast<const char*>(&v), sizeof(v)); };
  put(node);
  out += char(kind);
  out += char(phase);
  switch (kind) {
    case Kind::kValue:
      break;
    case Kind::kObject:
      put(seen);
      // The other keys written, in order of text (the set decides it, not the order they came in),
      // each after its length.
      keys_seen.for_each([&](std::string_view k) {
        put(uint32_t(k.size()));
        out += k;
      });
      put(UINT32_MAX);
      if (node->min_props > 0 || node->max_props >= 0) put(props);
      if (phase == Phase::kInKey) {
        str.key(out);
        put(cand);
        out += char(other);
        put(count);
        if (node->keys_limited() || !keys_seen.empty()) {  // propertyNames' state, and the character under way
          put(pat);
          put(chars);
          put(at);
          if (!str.at_rest()) put(str.cp), put(str.hex), put(str.utf8.cp);
        }
        if (!keys_seen.empty() && other) {  // (whether it repeats a key written)
          put(uint32_t(key_text.size()));
          out += key_text;
        }
      }
      if (phase == Phase::kColon) put(value);
      break;
    case Kind::kArray:
      if (node->min_items > 0 || node->max_items >= 0 || !node->prefix_items.empty() || node->unique ||
          node->has_contains)
        put(count);
      if (node->has_contains) put(matched);
      if (items_seen)
        for (const std::string& item : *items_seen) out += item + '\0';
      break;
    case Kind::kString:
      str.key(out);
      if (node->min_length > 0 || node->max_length >= 0) put(count);
      if (node->pattern) {
        put(pat);
        if (!str.at_rest()) put(str.cp), put(str.hex), put(str.utf8.cp);  // a character half-way
      }
      break;
    case Kind::kNumber:
      out += char(num.at);
      out += char(num.integer);
      if (node->bounded()) out.append(num_text, num_len);
      break;
    case Kind::kLiteral:
      put(texts);
      put(lo);
      put(hi);
      put(count);
      break;
  }
  if (capture) out += item + '\0';  // an item of unique items or beside contains: what it equals is still to come
}

std::string SchemaPrefix::Thread::key() const {
  std::string k;
  k += char(space_run);
  k += char(started);
  for (const Frame& f : stack) f.key(k);
  return k;
}

std::string SchemaPrefix::signature(size_t) const {
  std::string k;
  for (const Thread& t : threads_) {
    const std::string tk = t.key();
    const uint32_t n = uint32_t(tk.size());
    k.append(reinterpret_cast<const char*>(&n), sizeof(n));
    k += tk;
  }
  return k;
}

void SchemaPrefix::dedupe(std::vector<Thread>& threads) {
  if (threads.size() > 1) {
    std::set<std::string> keys;
    size_t kept = 0;
    for (size_t i = 0; i < threads.size(); ++i) {
      if (!keys.insert(threads[i].key()).second) continue;
      if (kept != i) threads[kept] = std::move(threads[i]);  // (a vector moved onto itself empties)
      ++kept;
    }
    threads.resize(kept);
  }
  if (threads.size() > kMaxReadings) threads.resize(kMaxReadings);
}

// Whitespace between tokens: not before the root value, and within the limit.
bool SchemaPrefix::blank(Thread& t) const {
  const int limit = space_run_ > 0 ? space_run_ : 2 + 2 * t.depth;
  if (!t.started || t.space_run >= limit) return false;
  ++t.space_run;
  return true;
}

// The innermost value is whole and its frame popped: its container goes on.
void SchemaPrefix::end_value(Thread& t) {
  if (t.stack.empty()) return;  // the root value
  Frame& f = t.stack.back();
  if (f.kind == Kind::kArray) ++f.count;
  f.phase = Phase::kAfterValue;
}

static bool seen_item(const std::vector<std::string>* seen, const std::string& canon) {
  return seen != nullptr && std::find(seen->begin(), seen->end(), canon) != seen->end();
}

bool SchemaPrefix::may_match(const Node& n, const Frame& a) {
  return n.contains_items != nullptr && n.contains_room(int64_t(a.count) + 1, int64_t(a.matched) + 1);
}

bool SchemaPrefix::may_avoid(const Node& n, const Frame& a) {
  return n.contains_avoidable && n.contains_room(int64_t(a.count) + 1, a.matched);
}

static bool matches_contains(const JsonSchema::Node& n, const std::string& canon) {
  return std::binary_search(n.contains_values.begin(), n.contains_values.end(), canon);
}

bool SchemaPrefix::barred(const Frame& array, const std::string& text) {
  if (array.kind != Kind::kArray) return false;
  const Node& n = *array.node;
  if (!n.unique && !n.has_contains) return false;
  const std::string canon = JsonSchema::canonical(text);
  if (n.unique && seen_item(array.items_seen.get(), canon)) return true;
  return n.has_contains && !may_match(n, array) && matches_contains(n, canon);
}

const SchemaPrefix::Frame* SchemaPrefix::below_top(const Thread& t) {
  return t.stack.size() >= 2 ? &t.stack[t.stack.size() - 2] : nullptr;
}

bool SchemaPrefix::closing_barred(const Thread& t, const Frame& f) { return string_barred(below_top(t), f); }

void SchemaPrefix::release(const Frame* parent, Frame& f) {
  if (parent != nullptr && parent->kind == Kind::kArray &&
      (parent->node->unique || !parent->node->contains_values.empty()))
    return;  // (the array compares its items)
  // Its text so far, without escapes, is its canonical form so far: where no excluded value
  // starts with it, none can end it.
  if (f.item.find('\\') != std::string::npos) return;
  for (const std::string& e : f.node->excluded)
    if (e.compare(0, f.item.size(), f.item) == 0) return;
  f.capture = false;
  f.item.clear();
}

const std::vector<std::string>* SchemaPrefix::avoided(const Frame* array, const Node& n, std::vector<std::string>& both,
                                                      bool& unique) {
  unique = array != nullptr && array->node->unique;
  const std::vector<std::string>& items = unique && array->items_seen ? *array->items_seen : kNoItems;
  const std::vector<std::string>& seen = schema_values::avoided(n, items, both);
  return seen.empty() ? nullptr : &seen;
}

bool SchemaPrefix::string_barred(const Frame* array, const Frame& f) {
  const Node& n = *f.node;
  if (array != nullptr && array->kind != Kind::kArray) array = nullptr;
  // Unique items and not: every string it can still end as is one of them (json_schema_values.cpp).
  std::vector<std::string> both;
  bool unique = false;
  if (const auto* seen = avoided(array, n, both, unique);
      seen != nullptr && !schema_values::string_unused(n, std::string_view(f.item).substr(1), *seen))
    return true;
  if (unique || array == nullptr) return false;  // (contains is never beside unique items)
  // contains: only the closing quote can come (the length's or the pattern's end), and the string
  // so made is barred.
  if (!f.str.at_rest()) return false;
  const bool full = (n.max_length >= 0 && f.count >= n.max_length) || (n.pattern && n.pattern->max_left(f.pat) == 0);
  return full && barred(*array, f.item + '"');
}

bool SchemaPrefix::number_barred(const Frame* array, const Frame& f) {
  if (array != nullptr && array->kind != Kind::kArray) array = nullptr;
  // Unique items and not: every number it can still become is one of them.
  std::vector<std::string> both;
  bool unique = false;
  if (const auto* seen = avoided(array, *f.node, both, unique);
      seen != nullptr && !schema_values::number_unused(*f.node, f.item, f.num.integer, *seen))
    return true;
  if (unique || array == nullptr) return false;
  // An integer's leading 0 takes nothing more: the item is 0.
  return f.num.integer && f.num.at == JsonNumberScan::At::kZero && barred(*array, f.item);
}

bool SchemaPrefix::literal_barred(const Thread& t) {
  // Every text the literal on top can still become is barred (by the array it is an item of) or
  // excluded (by its node's not).
  const Frame& f = t.stack.back();
  const Frame* array = below_top(t);
  for (int32_t i = f.lo; i < f.hi; ++i) {
    const std::string& text = (*f.texts)[size_t(i)];
    if (!(array != nullptr && barred(*array, text)) && !excluded(*f.node, text)) return false;
  }
  return true;
}

bool SchemaPrefix::item_ends(Thread& t, const std::string& text) {
  if (t.stack.empty() || t.stack.back().kind != Kind::kArray) return true;
  Frame& a = t.stack.back();
  const Node& n = *a.node;
  if (!n.unique && !n.has_contains) return true;
  const std::string canon = JsonSchema::canonical(text);
  if (n.has_contains && matches_contains(n, canon)) {
    if (!may_match(n, a)) return false;
    ++a.matched;
  }
  if (!n.unique) return true;
  if (seen_item(a.items_seen.get(), canon)) return false;
  auto seen = a.items_seen ? std::make_shared<std::vector<std::string>>(*a.items_seen)
                           : std::make_shared<std::vector<std::string>>();
  seen->push_back(canon);
  a.items_seen = std::move(seen);
  return true;
}

void SchemaPrefix::alternatives(const Node* n, std::vector<const Node*>& leaves, std::vector<const Node*>& seen,
                                int hops) {
  if (n == nullptr || hops > 64) return;  // (references that only lead to each other)
  if (std::find(seen.begin(), seen.end(), n) != seen.end()) return;
  seen.push_back(n);
  if (n->any_of.empty()) {
    leaves.push_back(n);
    return;
  }
  for (const Node* alt : n->any_of) alternatives(alt, leaves, seen, hops + 1);
}

void SchemaPrefix::value_start(Thread t, const Node* node, unsigned char c, std::vector<Thread>& out,
                               int hops) const {
  if (node == nullptr) node = schema_->any();
  if (!node->any_of.empty()) {  // each alternative is a reading of its own; a node reached twice, once
    const bool flat = std::none_of(node->any_of.begin(), node->any_of.end(),
                                   [](const Node* a) { return a == nullptr || !a->any_of.empty(); });
    if (flat) {  // (the usual case, with no list to keep: one level of alternatives, as listed)
      for (const Node* alt : node->any_of) value_start(t, alt, c, out, hops);
      return;
    }
    std::vector<const Node*> leaves, seen;
    alternatives(node, leaves, seen, hops);
    for (const Node* leaf : leaves) value_start(t, leaf, c, out, hops);
    return;
  }
  t.started = true;
  t.space_run = 0;
  Frame f;
  f.node = node;
  const Frame* parent = t.stack.empty() ? nullptr : &t.stack.back();
  if ((parent != nullptr && parent->kind == Kind::kArray &&
       (parent->node->unique || !parent->node->contains_values.empty())) ||
      !node->excluded.empty()) {
    f.capture = true;  // (a literal's text is its own)
    f.item = std::string(1, char(c));
  }
  auto literal = [&](const std::vector<std::string>& texts) {
    const auto first = [](const std::string& s, unsigned char ch) { return static_cast<unsigned char>(s[0]) < ch; };
    const auto lo = std::lower_bound(texts.begin(), texts.end(), c, first);
    auto hi = lo;
    while (hi != texts.end() && static_cast<unsigned char>((*hi)[0]) == c) ++hi;
    if (lo == hi) return;
    f.kind = Kind::kLiteral;
    f.texts = &texts;
    f.lo = int32_t(lo - texts.begin());
    f.hi = int32_t(hi - texts.begin());
    f.count = 1;
    t.stack.push_back(f);
    if (literal_barred(t)) return;
    out.push_back(std::move(t));
  };
  if (node->has_literals) return literal(node->literals);
  const uint8_t ty = node->types;
  switch (c) {
    case '{':
    case '[':
      if (!(ty & (c == '{' ? JsonSchema::kObject : JsonSchema::kArray)) || t.depth >= kMaxDepth) return;
      f.kind = c == '{' ? Kind::kObject : Kind::kArray;
      ++t.depth;
      break;
    case '"':
      if (!(ty & JsonSchema::kString)) return;
      f.kind = Kind::kString;
      if (f.capture && string_barred(parent, f)) return;
      break;
    case 't':
    case 'f':
      if (ty & JsonSchema::kBoolean) literal(kBooleans);
      return;
    case 'n':
      if (ty & JsonSchema::kNull) literal(kNulls);
      return;
    default:
      if (!JsonNumberScan::starts(c) || !(ty & (JsonSchema::kInteger | JsonSchema::kNumber))) return;
      f.kind = Kind::kNumber;
      f.num = JsonNumberScan(c, !(ty & JsonSchema::kNumber));
      if (f.capture && number_barred(parent, f)) return;
      if (node->bounded()) {
        f.num_text[0] = char(c);
        f.num_len = 1;
        if (!may_reach(std::string_view(f.num_text, 1), f.num.integer, *node)) return;
      }
      break;
  }
  t.stack.push_back(f);
  out.push_back(std::move(t));
}

void SchemaPrefix::step_top(Thread t, unsigned char c, std::vector<Thread>& out) const {
  if (t.stack.empty()) return;  // the value is whole: nothing may follow
  Frame& f = t.stack.back();
  const Node& n = *f.node;
  const bool space = json_space(c);
  auto keep = [&] {
    t.space_run = 0;
    out.push_back(std::move(t));
  };
  auto blank_kept = [&] {
    if (blank(t)) out.push_back(std::move(t));
  };
  auto close = [&] {  // the container's end: its frame goes, its parent goes on
    t.stack.pop_back();
    --t.depth;
    end_value(t);
    t.space_run = 0;
    out.push_back(std::move(t));
  };
  switch (f.kind) {
    case Kind::kValue: {
      if (space) return blank_kept();
      const Node* node = f.node;
      t.stack.pop_back();
      return value_start(std::move(t), node, c, out, 0);
    }
    case Kind::kObject: {
      const uint64_t declared = n.names.size() == 64 ? ~uint64_t(0) : (uint64_t(1) << n.names.size()) - 1;
      const bool whole = (needed(n, f) & ~f.seen) == 0 && f.props >= n.min_props;
      switch (f.phase) {
        case Phase::kFirst:
        case Phase::kKey:
          if (space) return blank_kept();
          if (c == '}' && f.phase == Phase::kFirst) {
            if (!whole) return;
            return close();
          }
          if (c != '"' || !key_can_end(n, f, true)) return;
          f.phase = Phase::kInKey;
          f.key_text.clear();
          f.str = JsonStringScan();
          f.cand = declared;
          f.other = n.others;
          f.count = 0;
          f.pat = n.key_pattern ? n.key_pattern->start() : 0;
          f.chars = 0;
          f.at = 0;
          return keep();
        case Phase::kInKey: {
          // Escapes only once the key can no longer be a declared name (its bytes so far are then
          // what they say), so a key equal to a declared name is always written as that name.
          if (c == '\\' && !f.str.escaping() && (f.cand != 0 || !f.other)) return;
          const bool escaped = f.str.escaping();
          const JsonStringScan::Step s = f.str.step(c);
          if (s == JsonStringScan::Step::kReject) return;
          if (s == JsonStringScan::Step::kClosed) {  // a declared name, else another key where allowed
            for (size_t i = 0; i < n.names.size(); ++i)
              if ((f.cand >> i & 1) && n.names[i].size() == size_t(f.count)) {
                // Each key at most once, none that may not come, and room for what it needs.
                if (!(open_names(n, f) >> i & 1)) return;
                f.seen |= uint64_t(1) << i;
                ++f.props;
                f.value = n.props[i];
                f.phase = Phase::kColon;
                return keep();
              }
            if (!f.other || !other_open(n, f)) return;
            if ((n.key_pattern && !n.key_pattern->accepts(f.pat)) || f.chars < n.key_min) return;
            if (!f.keys_seen.insert(std::move(f.key_text))) return;  // each key at most once (escapes read)
            f.key_text.clear();
            ++f.props;
            f.value = n.other_value(f.pat);
            f.phase = Phase::kColon;
            return keep();
          }
          if (f.str.char_started()) f.at = f.count;
          if (f.other && f.str.char_ended()) utf8::append(f.key_text, f.str.code_point());
          if (!escaped && f.cand != 0) {
            uint64_t cand = 0;
            for (size_t i = 0; i < n.names.size(); ++i)
              if ((f.cand >> i & 1) && n.names[i].size() > size_t(f.count) &&
                  static_cast<unsigned char>(n.names[i][size_t(f.count)]) == c)
                cand |= uint64_t(1) << i;
            f.cand = cand;
          }
          ++f.count;
          if (f.other && n.keys_limited() && !text_byte(f.str, f.chars, f.pat, n.key_pattern.get(), n.key_min, n.key_max))
            f.other = false;
          if (!key_can_end(n, f)) return;  // no key it can still become
          return keep();
        }
        case Phase::kColon: {
          if (space) return blank_kept();
          if (c != ':') return;
          f.phase = Phase::kAfterValue;
          Frame v;
          v.node = f.value;
          t.stack.push_back(v);
          return keep();
        }
        case Phase::kAfterValue:
          if (space) return blank_kept();
          if (c == '}') {
            if (!whole) return;
            return close();
          }
          if (c != ',' || !key_can_end(n, f, true)) return;
          f.phase = Phase::kKey;
          return keep();
      }
      return;
    }
    case Kind::kArray: {
      if (space) return blank_kept();
      // contains: the next item may match it, or match none of it, where the rest can still be
      // written after it; where only a match can, the item is one of contains' values.
      const bool match = n.has_contains && may_match(n, f), avoid = !n.has_contains || may_avoid(n, f);
      if (c == ']') {  // not right after a ','
        if (f.phase == Phase::kKey || f.count < n.min_items || (n.has_contains && f.matched < n.min_contains)) return;
        return close();
      }
      if (f.phase == Phase::kAfterValue) {
        if (c != ',' || (n.max_items >= 0 && f.count >= n.max_items)) return;
        if (n.distinct >= 0 && f.count >= n.distinct) return;  // no distinct item left to write
        if (n.unique && f.items_seen &&
            !schema_values::some_unused(size_t(f.count) < n.prefix_items.size() ? n.prefix_items[size_t(f.count)] : n.items,
                                        *f.items_seen))
          return;  // (the next item could only repeat one)
        if (!match && !avoid) return;
        f.phase = Phase::kKey;  // (an array's "a value must come")
        return keep();
      }
      if (f.phase == Phase::kFirst && (n.max_items == 0 || (!match && !avoid))) return;
      const Node* items = size_t(f.count) < n.prefix_items.size() ? n.prefix_items[size_t(f.count)] : n.items;
      if (!avoid) items = n.contains_items;
      t.space_run = 0;
      return value_start(std::move(t), items, c, out, 0);
    }
    case Kind::kString: {
      const JsonStringScan::Step s = f.str.step(c);
      if (s == JsonStringScan::Step::kReject) return;
      const bool limited = n.min_length > 0 || n.max_length >= 0;
      if (s == JsonStringScan::Step::kClosed) {
        if (limited && f.count < n.min_length) return;
        if (n.pattern && !n.pattern->accepts(f.pat)) return;
        const std::string item = f.capture ? f.item + '"' : std::string();
        t.stack.pop_back();
        if (!item.empty() && (excluded(n, item) || !item_ends(t, item))) return;
        end_value(t);
        t.space_run = 0;
        out.push_back(std::move(t));
        return;
      }
      if (!string_byte(f)) return;
      if (f.capture && (f.item += char(c), closing_barred(t, f))) return;
      if (f.capture) release(below_top(t), f);
      t.space_run = 0;
      out.push_back(std::move(t));
      return;
    }
    case Kind::kNumber:
      switch (f.num.step(c)) {
        case JsonNumberScan::Step::kReject:
          return;
        case JsonNumberScan::Step::kMore:
          if (n.bounded()) {  // no exponent, at most kMaxBoundedNumber bytes, a value still in reach
            if (c == 'e' || c == 'E' || f.num_len >= JsonSchema::kMaxBoundedNumber) return;
            f.num_text[f.num_len++] = char(c);
            if (!may_reach(std::string_view(f.num_text, f.num_len), f.num.integer, n)) return;
          }
          if (f.capture && (f.item += char(c), number_barred(below_top(t), f))) return;
          return keep();
        case JsonNumberScan::Step::kEnded: {
          if (n.bounded() && !within_bounds(std::string_view(f.num_text, f.num_len), n)) return;
          const std::string item = f.capture ? f.item : std::string();
          t.stack.pop_back();
          if (!item.empty() && (excluded(n, item) || !item_ends(t, item))) return;
          end_value(t);
          return step_top(std::move(t), c, out);  // c belongs to what follows the number
        }
      }
      return;
    case Kind::kLiteral: {
      const std::vector<std::string>& texts = *f.texts;
      const size_t at = size_t(f.count);
      if (texts[size_t(f.lo)].size() == at) {  // a whole value: c may follow it (another reading)
        Thread ended = t;
        ended.stack.pop_back();
        if (!excluded(n, texts[size_t(f.lo)]) && item_ends(ended, texts[size_t(f.lo)])) {
          end_value(ended);
          step_top(std::move(ended), c, out);
        }
      }
      int32_t lo = f.lo, hi = f.lo;
      while (lo < f.hi && (texts[size_t(lo)].size() <= at || static_cast<unsigned char>(texts[size_t(lo)][at]) < c)) ++lo;
      hi = lo;
      while (hi < f.hi && texts[size_t(hi)].size() > at && static_cast<unsigned char>(texts[size_t(hi)][at]) == c) ++hi;
      if (lo == hi) return;
      f.lo = lo;
      f.hi = hi;
      ++f.count;
      if (literal_barred(t)) return;
      t.space_run = 0;
      out.push_back(std::move(t));
      return;
    }
  }
}

}  // namespace dsi::server
