// Structured outputs: the values of a compiled schema node; see json_schema_values.h.
#include "server/json_schema_values.h"

#include <algorithm>
#include <bit>
#include <charconv>
#include <cmath>
#include <set>

#include <fmt/format.h>

#include "server/json_scan.h"
#include "text/utf8.h"

namespace dsi::server::schema_values {

namespace {

using Json = nlohmann::json;
using Node = JsonSchema::Node;
using Range = std::pair<uint32_t, uint32_t>;


bool has(const std::vector<std::string>& seen, const std::string& canon) {
  return std::find(seen.begin(), seen.end(), canon) != seen.end();
}

std::string number_text(double v) { return fmt::format("{}", v + 0.0); }  // as JsonSchema::canonical has it

// ---- Validation.

// Another key's value (undeclared), as the recognizer reads it; null where the key may not come.
const Node* other_value(const Node& n, const std::string& name) {
  if (!n.others) return nullptr;
  const std::u32string text = JsonSchema::code_points(name);
  const auto length = int64_t(text.size());
  if (length < n.key_min || (n.key_max >= 0 && length > n.key_max)) return nullptr;
  if (n.pattern_values.empty()) return !n.key_pattern || n.key_pattern->matches(text) ? n.additional : nullptr;
  int32_t state = n.key_pattern->start();  // (the product of propertyNames' and the patterns')
  for (const char32_t cp : text)
    if ((state = n.key_pattern->step(state, uint32_t(cp))) == JsonPattern::kDead) return nullptr;
  return n.key_pattern->accepts(state) ? n.other_value(state) : nullptr;
}

struct Validator {
  const std::function<bool(const Node*)>& busy;

  bool check(const Node* n, const Json& v, bool literals, int depth) const {
    if (n == nullptr) return true;
    if (++depth > 64 || busy(n)) return false;
    if (!n->any_of.empty())
      return std::any_of(n->any_of.begin(), n->any_of.end(), [&](const Node* a) { return check(a, v, true, depth); });
    if (literals && n->has_literals)  // (a list already filtered by the rest of its schema)
      return std::any_of(n->literals.begin(), n->literals.end(), [&](const std::string& t) { return Json::parse(t) == v; });
    if (!(n->types & JsonSchema::type_of(v))) return false;
    if (!n->excluded.empty() && !v.is_structured() &&
        std::binary_search(n->excluded.begin(), n->excluded.end(), JsonSchema::canonical(v.dump())))
      return false;
    if (v.is_number()) return n->within(v.get<double>());
    if (v.is_string()) {
      const std::u32string text = JsonSchema::code_points(v.get_ref<const std::string&>());
      const auto length = int64_t(text.size());
      if (length < n->min_length || (n->max_length >= 0 && length > n->max_length)) return false;
      return !n->pattern || n->pattern->matches(text);
    }
    if (v.is_array()) return array(*n, v, depth);
    if (v.is_object()) return object(*n, v, depth);
    return true;
  }

  bool array(const Node& n, const Json& v, int depth) const {
    const auto size = int64_t(v.size());
    if (size < n.min_items || (n.max_items >= 0 && size > n.max_items)) return false;
    if (!n.more_items && v.size() > n.prefix_items.size()) return false;
    int64_t matched = 0;
    for (size_t i = 0; i < v.size(); ++i) {
      if (!check(i < n.prefix_items.size() ? n.prefix_items[i] : n.items, v[i], true, depth)) return false;
      if (n.unique)
        for (size_t j = 0; j < i; ++j)
          if (v[j] == v[i]) return false;  // (nlohmann::json's equality: 1 equals 1.0)
      if (n.has_contains && !v[i].is_structured() &&
          std::binary_search(n.contains_values.begin(), n.contains_values.end(), JsonSchema::canonical(v[i].dump())))
        ++matched;
    }
    return !n.has_contains || (matched >= n.min_contains && (n.max_contains < 0 || matched <= n.max_contains));
  }

  bool object(const Node& n, const Json& v, int depth) const {
    const auto size = int64_t(v.size());
    if (size < n.min_props || (n.max_props >= 0 && size > n.max_props)) return false;
    uint64_t seen = 0, need = n.required;
    for (auto it = v.begin(); it != v.end(); ++it) {
      const auto i = size_t(std::find(n.names.begin(), n.names.end(), it.key()) - n.names.begin());
      const Node* value = nullptr;
      if (i < n.names.size()) {
        if (n.banned >> i & 1) return false;
        seen |= uint64_t(1) << i;
        if (!n.dependents.empty()) need |= n.dependents[i];
        value = n.props[i];
      } else if ((value = other_value(n, it.key())) == nullptr) {
        return false;
      }
      if (!check(value, it.value(), true, depth)) return false;
    }
    return (need & ~seen) == 0;
  }
};

// ---- Strings: their values, a code point at a time along the pattern.

// The strings of n that go on from `text` (UTF-8, at pattern state q after chars code points; the
// next character within ranges where one is half-way), in order: fn(canonical text) on each, until
// it returns true. 1: it did; 0: none left; -1: the budget of steps ran out.
struct Walk {
  const Node& n;
  const std::function<bool(const std::string&)>& fn;
  int64_t budget;
  std::string text;

  int go(int32_t q, int64_t chars, const Range* ranges, size_t k) {
    if (--budget < 0) return -1;
    const JsonPattern* p = n.pattern.get();
    if (ranges == nullptr) {
      if ((!p || p->accepts(q)) && chars >= n.min_length && (n.max_length < 0 || chars <= n.max_length) &&
          fn(Json(text).dump()))
        return 1;
      if (n.max_length >= 0 && chars >= n.max_length) return 0;
    }
    static const Range kEvery[1] = {{0, 0x10FFFF}};
    if (ranges == nullptr) ranges = kEvery, k = 1;
    const int64_t next = chars + 1;
    auto live = [&](int32_t r) {  // some string goes on from state r within the lengths
      if (r == JsonPattern::kDead) return false;
      if (!p) return n.max_length < 0 || next <= n.max_length;
      const int64_t least = p->min_left(r), most = p->max_left(r);
      return least >= 0 && (n.max_length < 0 || next + least <= n.max_length) &&
             (most == JsonPattern::kUnbounded || next + most >= n.min_length);
    };
    auto each = [&](uint32_t lo, uint32_t hi, int32_t r) {
      if (!live(r)) return 0;
      for (uint32_t cp = lo; cp <= hi; ++cp) {
        if (cp >= 0xD800 && cp <= 0xDFFF) {  // (no string holds a surrogate alone)
          cp = 0xDFFF;
          continue;
        }
        const size_t size = text.size();
        utf8::append(text, cp);
        const int got = go(r, next, nullptr, 0);
        text.resize(size);
        if (got != 0) return got;
      }
      return 0;
    };
    for (size_t i = 0; i < k; ++i) {
      int got = 0;
      if (p) {
        p->any_step(q, ranges[i].first, ranges[i].second, [&](uint32_t lo, uint32_t hi, int32_t r) {
          return (got = each(lo, hi, r)) != 0;
        });
      } else {
        got = each(ranges[i].first, ranges[i].second, 0);
      }
      if (got != 0) return got;
    }
    return 0;
  }
};

// No end to the strings that go on from state q after chars code points.
bool endless(const Node& n, int32_t q) {
  return n.max_length < 0 && (!n.pattern || n.pattern->max_left(q) == JsonPattern::kUnbounded);
}

// ---- Numbers: where a text under way can still go.

// The numbers of n whose magnitude a text with this sign and body (digits and a dot, no exponent)
// can still reach, as may_reach (json_schema_prefix.cpp) reads it: fn(a, b, open_a, open_b) for
// each interval of them (mirrored for a minus sign), until it returns true.
template <class F>
bool reachable(const Node& n, bool neg, std::string_view body, F&& fn) {
  const double lo = neg ? -n.hi : n.lo, hi = neg ? -n.lo : n.hi;
  const bool lo_open = neg ? n.hi_open : n.lo_open, hi_open = neg ? n.lo_open : n.hi_open;
  return magnitudes(body, hi, [&](double a, double b) {  // [a, b) within [lo, hi]
    const double l = std::max(a, lo), u = std::min(b, hi);
    return fn(l, u, lo >= a && lo_open, hi < b ? hi_open : true);
  });
}

// The values of n (one sign) a text can still become: some not in seen.
bool side_unused(const Node& n, bool neg, std::string_view body, bool integer, const std::vector<std::string>& seen) {
  const double step = n.multiple_of > 0 ? n.multiple_of : integer ? 1.0 : 0.0;
  std::vector<std::pair<double, double>> runs;  // the values apart: first, last (step apart)
  double count = 0;
  const bool many = reachable(n, neg, body, [&](double l, double u, bool l_open, bool u_open) {
    if (step == 0) {  // values in a range, a point or none
      if (l < u) return true;
      if (l == u && !l_open && !u_open) runs.emplace_back(l, l), count += 1;
      return false;
    }
    double first = std::ceil(l / step) * step, last = std::floor(u / step) * step;
    if (l_open && first == l) first += step;
    if (u_open && last == u) last -= step;
    if (!(first <= last)) return false;
    if (!std::isfinite(last - first)) return true;
    runs.emplace_back(first, last);
    count += (last - first) / step + 1;
    return count > double(seen.size());  // (seen items are distinct: one of these is not)
  });
  if (many) return true;
  for (const auto& [first, last] : runs)
    for (double x = first; x <= last; x += step > 0 ? step : 1.0)
      if (!has(seen, number_text(neg ? -x : x))) return true;
  return false;
}

}  // namespace

double parse_number_text(std::string_view text) {
  if (!text.empty() && text.back() == '.') text.remove_suffix(1);
  double v = 0.0;
  std::from_chars(text.data(), text.data() + text.size(), v);
  return v;
}

bool validates(const Node* n, const Json& v, const std::function<bool(const Node*)>& busy, bool literals) {
  return Validator{busy}.check(n, v, literals, 0);
}

bool number_unused(const Node& n, std::string_view text, bool integer, const std::vector<std::string>& seen) {
  if (seen.empty()) return true;
  const bool neg = !text.empty() && text[0] == '-';
  const std::string_view body = text.substr(neg ? 1 : 0);
  if (text.empty()) return side_unused(n, false, body, integer, seen) || side_unused(n, true, body, integer, seen);
  if (const size_t e = body.find_first_of("eE"); e != std::string_view::npos) {  // (only unbounded numbers)
    // 0 times any power is 0; a negative exponent whose value is already below the smallest
    // double is 0 too, and more of its digits only make it smaller.
    const std::string_view exp = body.substr(e + 1);
    bool under = false;
    if (exp.size() > 1 && exp[0] == '-') {
      double v = 1.0;
      const auto r = std::from_chars(text.data(), text.data() + text.size(), v);  // (locale-independent)
      under = r.ec == std::errc::result_out_of_range || v == 0.0;
    }
    return (parse_number_text(body.substr(0, e)) != 0 && !under) || !has(seen, "0");
  }
  return side_unused(n, neg, body, integer, seen);
}

bool string_unused(const Node& n, std::string_view raw, const std::vector<std::string>& seen) {
  if (seen.empty() || (n.max_length < 0 && !n.pattern)) return true;  // (no end to the strings)
  const JsonPattern* p = n.pattern.get();
  JsonStringScan scan;
  std::string text;
  int32_t q = p ? p->start() : 0;
  int64_t chars = 0;
  for (const char c : raw) {
    scan.step(static_cast<unsigned char>(c));
    if (!scan.char_ended()) continue;
    utf8::append(text, scan.code_point());
    ++chars;
    if (p && (q = p->step(q, scan.code_point())) == JsonPattern::kDead) return false;
  }
  if (endless(n, q)) return true;
  // The items written that start this way (canonical texts: the string's JSON form).
  std::string open = Json(text).dump();
  open.pop_back();
  std::vector<std::string> near;
  for (const std::string& s : seen)
    if (s.size() > open.size() && s.compare(0, open.size(), open) == 0) near.push_back(s);
  if (near.empty()) return true;
  std::sort(near.begin(), near.end());
  const std::function<bool(const std::string&)> fresh = [&](const std::string& canon) {
    return !std::binary_search(near.begin(), near.end(), canon);
  };
  // (Each string the walk ends at is one of near until one is not; its budget bounds the steps
  // spent on branches that end nowhere. Past it, the string is taken as able to go on.)
  Walk walk{n, fresh, 4096 + 64 * int64_t(near.size()), text};
  Range ranges[3];
  const size_t k = scan.at_rest() ? 0 : scan.pending(ranges);
  return walk.go(q, chars, k == 0 && scan.at_rest() ? nullptr : ranges, k) != 0;
}

const std::vector<std::string>& avoided(const Node& n, const std::vector<std::string>& items,
                                        std::vector<std::string>& both) {
  if (n.excluded.empty()) return items;
  if (items.empty()) return n.excluded;
  both = items;
  both.insert(both.end(), n.excluded.begin(), n.excluded.end());
  return both;
}

bool some_unused(const Node* n, const std::vector<std::string>& items) {
  if (n == nullptr) return true;
  for (int hops = 0; n->any_of.size() == 1 && hops < 64; ++hops) n = n->any_of[0];
  if (!n->any_of.empty())
    return std::any_of(n->any_of.begin(), n->any_of.end(), [&](const Node* a) { return some_unused(a, items); });
  if (n->has_literals)  // (a list without the values not excludes)
    return std::any_of(n->literals.begin(), n->literals.end(),
                       [&](const std::string& t) { return !has(items, JsonSchema::canonical(t)); });
  std::vector<std::string> both;
  const std::vector<std::string>& seen = avoided(*n, items, both);
  if (seen.empty()) return true;
  const uint8_t t = n->types;
  if (t & (JsonSchema::kObject | JsonSchema::kArray)) return true;
  if ((t & JsonSchema::kNull) && !has(seen, "null")) return true;
  if ((t & JsonSchema::kBoolean) && (!has(seen, "false") || !has(seen, "true"))) return true;
  if ((t & (JsonSchema::kInteger | JsonSchema::kNumber)) && number_unused(*n, "", !(t & JsonSchema::kNumber), seen))
    return true;
  return (t & JsonSchema::kString) && string_unused(*n, "", seen);
}

int64_t distinct(const Node* n, int64_t cap) {
  std::set<std::string> values;
  const auto most = size_t(cap);
  std::function<bool(const Node*, int)> collect = [&](const Node* x, int depth) {  // false: too many
    if (x == nullptr || ++depth > 64) return false;
    if (!x->excluded.empty() && !x->has_literals) {  // its own values, less what not excludes
      std::set<std::string> others;
      others.swap(values);
      Node plain = *x;
      plain.excluded.clear();
      const bool few = collect(&plain, depth);
      for (const std::string& e : x->excluded) values.erase(e);
      values.insert(others.begin(), others.end());
      return few && values.size() <= most;
    }
    if (!x->any_of.empty())
      return std::all_of(x->any_of.begin(), x->any_of.end(), [&](const Node* a) { return collect(a, depth); });
    if (x->has_literals) {
      for (const std::string& t : x->literals) values.insert(JsonSchema::canonical(t));
      return values.size() <= most;
    }
    const uint8_t t = x->types;
    if (t & (JsonSchema::kObject | JsonSchema::kArray)) return false;
    if (t & JsonSchema::kNull) values.insert("null");
    if (t & JsonSchema::kBoolean) values.insert("false"), values.insert("true");
    if (t & (JsonSchema::kInteger | JsonSchema::kNumber)) {
      const double step = x->multiple_of > 0 ? x->multiple_of : (t & JsonSchema::kNumber) ? 0.0 : 1.0;
      if (step == 0) {
        if (!(x->lo == x->hi && !x->lo_open && !x->hi_open)) return false;
        values.insert(number_text(x->lo));
      } else {
        double first = std::ceil(x->lo / step) * step, last = std::floor(x->hi / step) * step;
        if (x->lo_open && first == x->lo) first += step;
        if (x->hi_open && last == x->hi) last -= step;
        if (!std::isfinite(first) || !std::isfinite(last) || (last - first) / step + 1 > double(most)) return false;
        for (double v = first; v <= last; v += step) values.insert(number_text(v));
      }
    }
    if (t & JsonSchema::kString) {
      const int32_t start = x->pattern ? x->pattern->start() : 0;
      if (endless(*x, start)) return false;
      const std::function<bool(const std::string&)> add = [&](const std::string& canon) {
        values.insert(canon);
        return values.size() > most;
      };
      Walk walk{*x, add, 64 * cap + 4096, std::string()};
      if (walk.go(start, 0, nullptr, 0) != 0) return false;  // (too many, or too long to tell)
    }
    return values.size() <= most;
  };
  return collect(n, 0) ? int64_t(values.size()) : -1;
}

}  // namespace dsi::server::schema_values
