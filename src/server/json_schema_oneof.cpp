// Structured outputs: oneOf read as anyOf where its alternatives exclude each other; see
// json_schema_oneof.h.
#include "server/json_schema_oneof.h"

#include <algorithm>
#include <utility>

#include "dsinfer/error.h"

namespace dsi::server::schema_oneof {

namespace {

using Json = nlohmann::json;
using Node = JsonSchema::Node;
constexpr int kMaxDepth = 16;  // past it two schemas may overlap, and a value may match

bool admits(const Node& n, const Json& v, int depth);

// No value matches both a and b (false: it may). A node still being filled (a reference back into
// a schema under way) is any value.
bool apart(const Node* a, const Node* b, int depth) {
  if (++depth > kMaxDepth) return false;
  a = JsonSchema::unwrap(a);
  b = JsonSchema::unwrap(b);
  for (const auto& [x, y] : {std::pair(a, b), std::pair(b, a)}) {
    if (x->any_of.empty()) continue;
    for (const Node* alt : x->any_of)
      if (!apart(alt, y, depth)) return false;
    return true;
  }
  if (a->has_literals || b->has_literals) {
    const Node* lit = a->has_literals ? a : b;
    const Node* other = lit == a ? b : a;
    for (const std::string& text : lit->literals)
      if (admits(*other, Json::parse(text), depth)) return false;
    return true;
  }
  const uint8_t both = a->types & b->types;
  if (both & (JsonSchema::kNull | JsonSchema::kBoolean | JsonSchema::kString | JsonSchema::kArray)) return false;
  if (both & (JsonSchema::kInteger | JsonSchema::kNumber)) {
    auto below = [](double hi, bool hi_open, double lo, bool lo_open) {
      return hi < lo || (hi == lo && (hi_open || lo_open));
    };
    if (!below(a->hi, a->hi_open, b->lo, b->lo_open) && !below(b->hi, b->hi_open, a->lo, a->lo_open)) return false;
  }
  if (both & JsonSchema::kObject) {
    // A property one requires whose value the other cannot take there.
    auto keyed = [depth](const Node& x, const Node& y) {
      for (size_t i = 0; i < x.names.size(); ++i) {
        if (!(x.required >> i & 1)) continue;
        const Node* there = y.value_of(x.names[i]);
        if (there == nullptr || apart(x.props[i], there, depth)) return true;
      }
      return false;
    };
    if (!keyed(*a, *b) && !keyed(*b, *a)) return false;
  }
  return true;
}

// Whether value v may match node n (false only where the schema shows it cannot).
bool admits(const Node& n, const Json& v, int depth) {
  if (++depth > kMaxDepth) return true;
  if (!n.any_of.empty())
    return std::any_of(n.any_of.begin(), n.any_of.end(), [&](const Node* alt) { return admits(*alt, v, depth); });
  if (!(n.types & JsonSchema::type_of(v))) return false;
  if (n.has_literals)
    return std::any_of(n.literals.begin(), n.literals.end(), [&](const std::string& t) { return Json::parse(t) == v; });
  if (v.is_number() && !n.within(v.get<double>())) return false;
  if (v.is_string() && !n.string_fits(v.get_ref<const std::string&>())) return false;
  if (v.is_object()) {
    if (int64_t(v.size()) < n.min_props || (n.max_props >= 0 && int64_t(v.size()) > n.max_props)) return false;
    for (size_t i = 0; i < n.names.size(); ++i)
      if ((n.required >> i & 1) && !v.contains(n.names[i])) return false;
    for (auto it = v.begin(); it != v.end(); ++it) {
      const Node* there = n.value_of(it.key());
      if (there == nullptr || !admits(*there, it.value(), depth)) return false;
    }
  }
  if (v.is_array()) {
    if (int64_t(v.size()) < n.min_items || (n.max_items >= 0 && int64_t(v.size()) > n.max_items)) return false;
    for (size_t i = 0; i < v.size(); ++i) {
      const Node* item = i < n.prefix_items.size() ? n.prefix_items[i] : n.items;
      if (item != nullptr && !admits(*item, v[i], depth)) return false;
    }
  }
  return true;
}

}  // namespace

void exclusive(const std::vector<const Node*>& alts, const std::string& at) {
  for (size_t i = 0; i < alts.size(); ++i)
    for (size_t j = i + 1; j < alts.size(); ++j)
      if (!apart(alts[i], alts[j], 0))
        fail("{}: alternatives {} and {} may both match a value; a oneOf is supported where its alternatives "
             "exclude each other (other types, other enum values, bounds that do not meet, a required property "
             "whose values differ)",
             at, i, j);
}

}  // namespace dsi::server::schema_oneof
