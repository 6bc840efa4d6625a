// Structured outputs: contains, minContains and maxContains (see json_schema.h). The recognizer
// (json_schema_prefix.cpp) counts, per reading, the items that end equal to one of contains' values,
// which it decides exactly once an item is written: contains is a list of scalars. Each item
// starts only where the array can still be completed after it, whether it matches or not; where
// only a match can, it is written as one of those values; where only a miss can, it may not end as
// one (as uniqueItems bars a repeated item).
#include "server/json_schema_contains.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "dsinfer/error.h"
#include "server/json_schema_merge.h"

namespace dsi::server {

using Json = nlohmann::json;

std::string JsonSchema::canonical(const std::string& text) {
  const Json v = Json::parse(text, nullptr, false);
  if (v.is_number()) return fmt::format("{}", v.get<double>() + 0.0);  // (+ 0.0: -0 reads as 0)
  return v.is_discarded() ? text : v.dump();
}

bool JsonSchema::Node::contains_room(int64_t k, int64_t c) const {
  if ((max_contains >= 0 && c > max_contains) || (max_items >= 0 && k > max_items)) return false;
  const int64_t need_c = std::max<int64_t>(0, min_contains - c), need_k = std::max<int64_t>(0, min_items - k);
  const int64_t more = std::max(need_k, need_c);  // the items still to come, at least
  if (need_c > 0 && contains_items == nullptr) return false;
  if (max_items >= 0 && k + more > max_items) return false;
  // The matches still needed, the rest items that match none; where no item can match none,
  // every item still to come matches.
  if (contains_avoidable) return max_contains < 0 || c + need_c <= max_contains;
  return (more == 0 || contains_items != nullptr) && (max_contains < 0 || c + more <= max_contains);
}

namespace schema_contains {

namespace {

using Node = JsonSchema::Node;

// Whether the scalar v is a value of n, exactly (false where that would take more than the
// depth allows: such a value is then not written as a match).
bool takes(const Node* n, const Json& v, int depth) {
  n = JsonSchema::unwrap(n);
  if (n == nullptr) return true;  // any value
  if (++depth > 16) return false;
  if (!n->any_of.empty())
    return std::any_of(n->any_of.begin(), n->any_of.end(), [&](const Node* a) { return takes(a, v, depth); });
  const std::string canon = JsonSchema::canonical(v.dump());
  if (n->has_literals)
    return std::any_of(n->literals.begin(), n->literals.end(),
                       [&](const std::string& t) { return JsonSchema::canonical(t) == canon; });
  if (!(n->types & JsonSchema::type_of(v))) return false;
  if (std::binary_search(n->excluded.begin(), n->excluded.end(), canon)) return false;  // (not)
  if (v.is_number() && !n->within(v.get<double>())) return false;
  return !v.is_string() || n->string_fits(v.get_ref<const std::string&>());
}

// The literal texts of a contains schema (a const or enum, or an anyOf of such); false for any
// other schema, or a value that is not a scalar.
bool listed(const Node* n, std::vector<std::string>& out, int depth) {
  n = JsonSchema::unwrap(n);
  if (n == nullptr || ++depth > 16) return false;
  if (!n->any_of.empty()) {
    for (const Node* a : n->any_of)
      if (!listed(a, out, depth)) return false;
    return true;
  }
  if (!n->has_literals) return false;
  for (const std::string& t : n->literals) {
    if (t[0] == '{' || t[0] == '[') return false;
    out.push_back(t);
  }
  return true;
}

// Whether an item of n that equals none of values can be written (false where unsure), and
// whether some item of n could only be kept from equalling one through a limit the recognizer
// cannot steer by (a string's maxLength or pattern, a number's bounds): then `unsteered`.
bool avoidable(const Node* n, const std::vector<Json>& values, const std::vector<std::string>& canon,
               bool& unsteered, int depth) {
  n = JsonSchema::unwrap(n);
  if (n == nullptr) return true;
  if (++depth > 16) {
    unsteered = true;
    return false;
  }
  if (!n->any_of.empty()) {
    bool some = false;
    for (const Node* a : n->any_of) some = avoidable(a, values, canon, unsteered, depth) || some;
    return some;
  }
  if (n->has_literals)  // (a literal is steered text by text)
    return std::any_of(n->literals.begin(), n->literals.end(), [&](const std::string& t) {
      return !std::binary_search(canon.begin(), canon.end(), JsonSchema::canonical(t));
    });
  for (const Json& v : values) {
    if (!(n->types & JsonSchema::type_of(v))) continue;
    if (v.is_string() && (n->pattern || n->max_length >= 0) && n->string_fits(v.get_ref<const std::string&>())) unsteered = true;
    if (v.is_number() && n->bounded() && n->within(v.get<double>())) unsteered = true;
  }
  // Objects and arrays equal no scalar; strings and numbers that could equal a value are either
  // steered (unbounded: another always follows) or unsteered, refused; others equal none.
  if (n->types & (JsonSchema::kObject | JsonSchema::kArray | JsonSchema::kString | JsonSchema::kNumber |
                  JsonSchema::kInteger))
    return true;
  auto free = [&](const char* text) {  // (a value not excludes is not written either)
    const std::string t(text);
    return !std::binary_search(canon.begin(), canon.end(), t) &&
           !std::binary_search(n->excluded.begin(), n->excluded.end(), t);
  };
  if ((n->types & JsonSchema::kBoolean) && (free("true") || free("false"))) return true;
  return (n->types & JsonSchema::kNull) && free("null");
}

}  // namespace

void setup(Node& n, const Node* contains, Node& matching, int64_t min_contains, int64_t max_contains,
           const std::string& path) {
  n.min_contains = min_contains;
  n.max_contains = max_contains;
  // A list's arrays (enum, const): those whose count of matches lies within the bounds.
  auto keep_literals = [&](auto&& matches) {
    if (!n.has_literals) return;
    std::vector<std::string> kept;
    for (const std::string& t : n.literals) {
      int64_t count = 0;
      if (t[0] == '[')
        for (const Json& item : Json::parse(t)) count += matches(item);
      if (t[0] != '[' || (count >= min_contains && (max_contains < 0 || count <= max_contains))) kept.push_back(t);
    }
    n.literals = std::move(kept);
    if (n.literals.empty()) schema_merge::fail_empty("{}: no value of 'enum' meets the schema's other keywords", path);
  };
  if (contains == nullptr) {  // true: every item matches, and the counts bound the items
    n.min_items = std::max(n.min_items, min_contains);
    if (max_contains >= 0) n.max_items = n.max_items < 0 ? max_contains : std::min(n.max_items, max_contains);
    if (n.max_items >= 0 && n.max_items < n.min_items)
      JsonSchema::no_values_of(
          n, JsonSchema::kArray,
          fmt::format("{}: no array has between minContains and maxContains items within minItems and maxItems", path));
    return keep_literals([](const Json&) { return true; });
  }
  if (!n.prefix_items.empty())
    fail("{}/contains: beside 'prefixItems' (or 'items' as an array) is not supported", path);
  if (n.unique) fail("{}/contains: beside 'uniqueItems' is not supported", path);
  std::vector<std::string> texts;
  if (!listed(contains, texts, 0))
    fail("{}/contains: only a 'const' or 'enum' of scalars (null, booleans, numbers, strings), or true, is "
         "supported", path);
  std::vector<Json> values;
  for (const std::string& t : texts) {
    const Json v = Json::parse(t);
    // (Beyond 2^53 validators read an integer exactly or as a double, each their own way.)
    if (v.is_number() && !(std::fabs(v.get<double>()) < 9007199254740992.0))
      fail("{}/contains: the number {} is beyond 2^53, where validators compare numbers differently", path, t);
    values.push_back(v);
    n.contains_values.push_back(JsonSchema::canonical(t));
  }
  std::sort(n.contains_values.begin(), n.contains_values.end());
  n.contains_values.erase(std::unique(n.contains_values.begin(), n.contains_values.end()), n.contains_values.end());
  // The items that match: contains' values that items takes.
  matching.has_literals = true;
  for (size_t i = 0; i < values.size(); ++i)
    if (takes(n.items, values[i], 0)) matching.literals.push_back(texts[i]);
  std::sort(matching.literals.begin(), matching.literals.end());
  matching.literals.erase(std::unique(matching.literals.begin(), matching.literals.end()), matching.literals.end());
  n.contains_items = matching.literals.empty() ? nullptr : &matching;
  // Without maxContains, an item that happens to match only helps: any item will do.
  bool unsteered = false;
  n.contains_avoidable = max_contains < 0 || avoidable(n.items, values, n.contains_values, unsteered, 0);
  if (max_contains >= 0 && unsteered)
    fail("{}/maxContains: supported where the items that could equal a 'contains' value are enum values, booleans, "
         "null, numbers without bounds or strings without maxLength or pattern", path);
  n.has_contains = true;
  if ((n.types & JsonSchema::kArray) && !n.contains_room(0, 0)) {
    n.types &= uint8_t(~JsonSchema::kArray);
    if (n.types == 0)
      schema_merge::fail_empty("{}: no array has between minContains ({}) and maxContains items matching 'contains' within its "
           "other keywords", path, min_contains);
  }
  keep_literals([&](const Json& item) {
    return !item.is_structured() &&
           std::binary_search(n.contains_values.begin(), n.contains_values.end(), JsonSchema::canonical(item.dump()));
  });
}

}  // namespace schema_contains

}  // namespace dsi::server
