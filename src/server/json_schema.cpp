// Structured outputs: JSON Schema compiled for generation; see json_schema.h (the recognizer is in
// json_schema_prefix.cpp).
#include "server/json_schema.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <map>
#include <mutex>
#include <numeric>
#include <optional>
#include <set>
#include <tuple>

#include "dsinfer/error.h"
#include "server/json_schema_contains.h"
#include "server/json_schema_merge.h"
#include "server/json_schema_oneof.h"
#include "server/json_schema_values.h"

namespace dsi::server {

using Json = nlohmann::json;

bool JsonSchema::Node::within(double v) const {
  return (v > lo || (v == lo && !lo_open)) && (v < hi || (v == hi && !hi_open)) &&
         (multiple_of == 0 || std::fmod(v, multiple_of) == 0);
}

namespace {

// A text's code points within [lo, hi] (hi -1: no end) and matching the pattern (null: none).
bool text_fits(const std::u32string& cps, int64_t lo, int64_t hi, const JsonPattern* pattern) {
  const auto length = int64_t(cps.size());
  return length >= lo && (hi < 0 || length <= hi) && (pattern == nullptr || pattern->matches(cps));
}

}  // namespace

bool JsonSchema::Node::string_fits(const std::string& text) const {
  return text_fits(code_points(text), min_length, max_length, pattern.get());
}

uint32_t JsonSchema::Node::matched(const std::string& name) const {
  uint32_t set = 0;
  const std::u32string text = key_patterns.empty() ? std::u32string() : code_points(name);
  for (size_t i = 0; i < key_patterns.size(); ++i)
    if (key_patterns[i]->matches(text)) set |= uint32_t(1) << i;
  return set;
}

const JsonSchema::Node* JsonSchema::Node::other_value(const std::string& name) const {
  if (keys_limited() && !text_fits(code_points(name), key_min, key_max, key_pattern.get()))  // propertyNames'
    return nullptr;
  return pattern_values.empty() ? additional : pattern_values[matched(name)];
}

const JsonSchema::Node* JsonSchema::Node::value_of(const std::string& name) const {
  const auto at = std::find(names.begin(), names.end(), name);
  if (at == names.end()) return other_value(name);
  const auto i = size_t(at - names.begin());
  return banned >> i & 1 ? nullptr : props[i];
}

const JsonSchema::Node* JsonSchema::unwrap(const Node* n) {
  for (int hops = 0; n != nullptr && n->any_of.size() == 1 && hops < 64; ++hops) n = n->any_of[0];
  return n;
}

bool JsonSchema::meets(double a, double b, bool integer, double lo, bool lo_open, double hi, bool hi_open,
                       double step) {
  if (integer || step > 0) {
    const double ilo = lo_open ? std::floor(lo) + 1 : std::ceil(lo);
    const double ihi = hi_open ? std::ceil(hi) - 1 : std::floor(hi);
    const double first = std::max(a, ilo);
    if (step > 0) {
      const double m = std::ceil(first / step) * step;  // exact: magnitudes below 2^53
      return m < b && m <= ihi;
    }
    return first <= std::min(b - 1, ihi);
  }
  const double lower = std::max(a, lo);
  const bool lower_in = a > lo || !lo_open;
  const double upper = std::min(b, hi);
  const bool upper_in = hi < b && !hi_open;
  return lower < upper || (lower == upper && lower_in && upper_in);
}

// ---------------------------------------------------------------------------------------------
// The compiler.

std::u32string JsonSchema::code_points(const std::string& text) {
  std::u32string out;
  Utf8Scan utf8;
  for (const char c : text)
    if (utf8.step(static_cast<unsigned char>(c)) == Utf8Scan::Step::kChar) out += char32_t(utf8.cp);
  return out;
}

void JsonSchema::no_values_of(Node& n, uint8_t types, const std::string& why) {
  n.types &= uint8_t(~types);
  if (n.types == 0) schema_merge::fail_empty("{}", why);
}

uint8_t JsonSchema::type_of(const Json& v) {
  if (v.is_null()) return kNull;
  if (v.is_boolean()) return kBoolean;
  if (v.is_number_integer()) return kInteger;
  if (v.is_number()) return v.get<double>() == std::floor(v.get<double>()) ? kInteger : kNumber;
  if (v.is_string()) return kString;
  return v.is_array() ? kArray : kObject;
}

class JsonSchema::Compiler {
 public:
  Compiler(JsonSchema& out, const Json& root, bool closed_objects)
      : out_(out), root_(root), closed_objects_(closed_objects) {}

  const Node* compile(const Json& s, const std::string& path) {
    if (s.is_boolean()) {
      if (!s.get<bool>()) fail("{}: the schema false accepts no value", path);
      return out_.any_;
    }
    if (!s.is_object()) fail("{}: a schema must be an object or a boolean", path);
    if (++depth_ > 64) fail("{}: the schema nests too deeply", path);
    Node& n = out_.nodes_.emplace_back();
    const Filling filling(filling_, &n);
    fill(n, s, path);
    --depth_;
    return &n;
  }

 private:
  static bool annotation(const std::string& k) { return schema_merge::annotation(k); }
  static bool refused(const std::string& k) {
    static const std::set<std::string> kRefused = {"$dynamicRef", "$recursiveRef"};
    return kRefused.count(k) > 0;
  }
  static std::string part(const std::string& name) { return schema_merge::part(name); }
  static constexpr const char* kRewritten = "the path is in the rewrite of";

  // s compiled; null where it takes no value (false, or what its own keywords say: EmptySchema,
  // whose message goes to why where it is empty), with the compiler's state as before the try.
  // For the parts of a schema where that means "no such value": an anyOf's alternative, a
  // property's value (the key never comes), other keys' values, items.
  const Node* compile_part(const Json& s, const std::string& path, std::string& why) {
    if (s.is_boolean() && !s.get<bool>()) {
      if (why.empty()) why = path + ": the schema false accepts no value";
      return nullptr;
    }
    const auto refs = refs_;  // (a failed compile leaves nodes half-filled: none may be found later)
    const int depth = depth_;
    try {
      return compile(s, path);
    } catch (const schema_merge::EmptySchema& e) {
      refs_ = refs;
      depth_ = depth;
      if (why.empty()) why = e.what();
      return nullptr;
    }
  }
  // A `type` keyword's value (a name or a list of names) as type bits ("number" takes integers too).
  static uint8_t type_bits(const Json& t, const std::string& path) {
    const Json names = t.is_array() ? t : Json::array({t});
    if (names.empty()) fail("{}: an empty list of types", path);
    uint8_t bits = 0;
    for (const Json& name : names) {
      static const std::map<std::string, uint8_t> kTypes = {
          {"null", kNull},     {"boolean", kBoolean}, {"integer", kInteger}, {"number", kNumber | kInteger},
          {"string", kString}, {"array", kArray},     {"object", kObject}};
      const auto k = name.is_string() ? kTypes.find(name.get<std::string>()) : kTypes.end();
      if (k == kTypes.end()) fail("{}: unknown type {}", path, name.dump());
      bits |= k->second;
    }
    return bits;
  }
  static int64_t count_of(const Json& v, const std::string& path) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0) fail("{}: must be a non-negative integer", path);
    return v.get<int64_t>();
  }

  void fill(Node& n, const Json& s, const std::string& path) {
    // unevaluatedProperties and unevaluatedItems: read at their level, after its allOf and $ref are
    // merged in (json_schema_merge.cpp), as additionalProperties and items.
    if (s.contains("unevaluatedProperties") || s.contains("unevaluatedItems")) {
      n.any_of.push_back(compile(schema_merge::merge(root_, s, path, merges_), path));
      return;
    }
    // allOf of several schemas, or beside other keywords, and $ref beside other keywords (what
    // 2020-12 reads as both): the schemas merged into one (json_schema_merge.cpp), then compiled.
    if (const auto all = s.find("allOf"); all != s.end()) {
      if (!all->is_array() || all->empty()) fail("{}/allOf: must be a non-empty array of schemas", path);
      if (all->size() > 1 || schema_merge::constrains_beside(s, "allOf")) {
        n.any_of.push_back(compile(schema_merge::merge(root_, s, path, merges_), path + "/allOf"));
        return;
      }
    }
    // if / then / else, dependentSchemas and an object's not: rewritten as alternatives
    // (json_schema_merge.cpp), then compiled.
    if (schema_merge::conditional(s)) {
      // (Paths in the rewrite are its own: a message says where the rewritten keywords are.)
      try {
        n.any_of.push_back(compile(schema_merge::merge(root_, s, path, merges_), path));
      } catch (const schema_merge::EmptySchema&) {
        throw;
      } catch (const dsi::Error& e) {
        const std::string m = e.what();
        if (m.find(kRewritten) != std::string::npos) throw;
        fail("{} ({} the 'if' / 'then' / 'else', 'dependentSchemas' or object's 'not' at {})", m, kRewritten, path);
      }
      return;
    }
    // $ref, anyOf or oneOf beside other keywords: merged with them.
    if ((s.contains("$ref") && schema_merge::constrains_beside(s, "$ref")) ||
        (s.contains("anyOf") && schema_merge::constrains_beside(s, "anyOf")) ||
        (s.contains("oneOf") && schema_merge::constrains_beside(s, "oneOf"))) {
      n.any_of.push_back(compile(schema_merge::merge(root_, s, path, merges_), path));
      return;
    }
    // A reference or a combination stands alone (beside annotations): what it points at is the
    // whole schema.
    for (const char* alone : {"$ref", "anyOf", "oneOf", "allOf"}) {
      if (!s.contains(alone)) continue;
      for (auto it = s.begin(); it != s.end(); ++it)
        if (it.key() != alone && !annotation(it.key()))
          fail("{}: '{}' beside '{}' is not supported", path, part(it.key()), alone);
      const Json& v = s.at(alone);
      const std::string at = path + "/" + alone;
      if (std::string(alone) == "$ref") {
        n.any_of.push_back(reference(v, at));
      } else if (std::string(alone) == "allOf") {
        n.any_of.push_back(compile(v[0], at + "/0"));
      } else {
        if (!v.is_array() || v.empty()) fail("{}: must be a non-empty array of schemas", at);
        // An alternative that takes no value (EmptySchema: none of any type) is left out.
        std::string why;
        for (size_t i = 0; i < v.size(); ++i)
          if (const Node* alt = compile_part(v[i], at + "/" + std::to_string(i), why)) n.any_of.push_back(alt);
        if (n.any_of.empty()) schema_merge::fail_empty("{}", why);
        if (std::string(alone) == "oneOf") schema_oneof::exclusive(n.any_of, at);
      }
      return;
    }
    for (auto it = s.begin(); it != s.end(); ++it)
      if (refused(it.key())) fail("{}: '{}' is not supported", path, it.key());

    if (const auto t = s.find("type"); t != s.end()) n.types = type_bits(*t, path + "/type");
    negation(n, s, path);
    // Numbers and strings (before enum, whose values out of bounds are dropped).
    bounds(n, s, path);
    strings(n, s, path);

    // Objects: patternProperties first, whose values a declared property's meets where its name
    // matches.
    std::map<size_t, std::string> bans;  // declared names that may not come, and why
    std::vector<const Json*> pattern_schemas;
    std::vector<std::string> pattern_texts;
    if (const auto pp = s.find("patternProperties"); pp != s.end()) {
      if (!pp->is_object()) fail("{}/patternProperties: must be an object", path);
      if (pp->size() > size_t(kMaxPatterns))
        fail("{}/patternProperties: {} patterns; at most {} are supported", path, pp->size(), kMaxPatterns);
      for (auto it = pp->begin(); it != pp->end(); ++it) {
        n.key_patterns.push_back(JsonPattern::compile(it.key(), path + "/patternProperties/" + part(it.key())));
        pattern_schemas.push_back(&it.value());
        pattern_texts.push_back(it.key());
      }
    }
    const auto props = s.find("properties");
    // Closed objects: only declared names come (those of properties that not only rewrites named).
    const std::set<std::string> rewrite_only = schema_merge::rewrite_names(s);
    bool declares = false;
    if (props != s.end() && props->is_object())
      for (auto it = props->begin(); it != props->end(); ++it) declares = declares || !rewrite_only.count(it.key());
    const bool closed = closed_objects_ && props != s.end() && (rewrite_only.empty() || declares);
    if (props != s.end()) {
      if (!props->is_object()) fail("{}/properties: must be an object", path);
      if (props->size() > size_t(kMaxProperties))
        fail("{}/properties: {} properties; at most {}", path, props->size(), kMaxProperties);
      for (auto it = props->begin(); it != props->end(); ++it) {
        for (unsigned char c : it.key())
          if (c < 0x20 || c == '"' || c == '\\')
            fail("{}/properties: the name {} needs escapes, which keys may not have here", path, Json(it.key()).dump());
        n.names.push_back(it.key());
        if (closed && rewrite_only.count(it.key()) && n.matched(it.key()) == 0) {
          n.banned |= uint64_t(1) << (n.names.size() - 1);
          bans[n.names.size() - 1] = "the object is closed (a strict tool's parameters) and declares no such property";
          n.props.push_back(out_.any_);
          continue;
        }
        const std::string at = path + "/properties/" + part(it.key());
        std::vector<Json> all = {it.value()};
        for (uint32_t set = n.matched(it.key()); set != 0; set &= set - 1)
          all.push_back(*pattern_schemas[size_t(std::countr_zero(set))]);
        if (std::any_of(all.begin(), all.end(), [](const Json& x) { return x == Json(false); })) {
          n.banned |= uint64_t(1) << (n.names.size() - 1);  // (the key takes no value: it never comes)
          bans[n.names.size() - 1] = it.value() == Json(false) ? "its schema is false"
                                                                 : "a 'patternProperties' schema its name matches is false";
          n.props.push_back(out_.any_);
          continue;
        }
        std::string why;
        Json merged = it.value();
        if (all.size() > 1) {
          try {  // (its schema and the patterns' with no value in common: the key never comes)
            merged = schema_merge::all_of(root_, all, at, merges_);
          } catch (const schema_merge::EmptySchema& e) {
            merged = false;
            why = e.what();
          }
        }
        const Node* value = compile_part(merged, at, why);
        if (value == nullptr) {  // (its schema takes no value: the key never comes)
          n.banned |= uint64_t(1) << (n.names.size() - 1);
          bans[n.names.size() - 1] = "its schema takes no value (" + why + ")";
        }
        n.props.push_back(value != nullptr ? value : out_.any_);
      }
    }
    n.additional = closed ? nullptr : out_.any_;
    if (const auto add = s.find("additionalProperties"); add != s.end()) {
      std::string why;
      n.additional = compile_part(*add, path + "/additionalProperties", why);  // (null: no other keys)
    }
    pattern_values(n, pattern_schemas, pattern_texts, path);
    property_names(n, s, path, bans);
    key_automaton(n, path);
    // required: a name not in properties is another key's, declared (with another key's value) so
    // that its coming is seen; where no such key may come, no object is written.
    std::vector<std::string> required;
    if (const auto req = s.find("required"); req != s.end()) {
      if (!req->is_array()) fail("{}/required: must be an array of names", path);
      for (const Json& name : *req) {
        if (!name.is_string()) fail("{}/required: {} is not a name", path, name.dump());
        required.push_back(name.get<std::string>());
        if (std::find(n.names.begin(), n.names.end(), required.back()) != n.names.end()) continue;
        if (n.other_value(required.back()) == nullptr) {
          no_values_of(n, kObject, fmt::format("{}/required: {} is required, but the object may not have it", path,
                                               name.dump()));
          required.pop_back();
          continue;
        }
        add_name(n, required.back(), path + "/required");
      }
    }
    dependencies(n, s, path, bans);
    n.others = n.additional != nullptr || !n.pattern_values.empty();
    for (const std::string& name : required)
      n.required |= uint64_t(1) << (std::find(n.names.begin(), n.names.end(), name) - n.names.begin());
    for (uint64_t r = n.required; r != 0; r &= r - 1)
      if (!n.dependents.empty()) n.required |= n.dependents[size_t(std::countr_zero(r))];
    if (const uint64_t never = n.required & n.banned; never != 0) {
      const auto i = size_t(std::countr_zero(never));
      no_values_of(n, kObject, fmt::format("{}/required: {} is required (or needed by a required property), but {}", path,
                                           Json(n.names[i]).dump(), bans[i]));
    }
    if (const auto m = s.find("minProperties"); m != s.end()) n.min_props = count_of(*m, path + "/minProperties");
    if (const auto m = s.find("maxProperties"); m != s.end()) n.max_props = count_of(*m, path + "/maxProperties");
    if (n.max_props >= 0 && n.max_props < n.min_props)
      no_values_of(n, kObject, fmt::format("{}: maxProperties is below minProperties", path));
    if (n.max_props >= 0 && std::popcount(n.required) > n.max_props)
      no_values_of(n, kObject, fmt::format("{}: more properties are required than maxProperties allows", path));
    const auto allowed = int64_t(n.names.size()) - std::popcount(n.banned);
    if (!n.others && n.min_props > allowed)
      no_values_of(n, kObject, fmt::format("{}: minProperties is above the {} properties the object may have", path, allowed));
    // Each other key comes at most once: where propertyNames leaves them few names (a pattern with
    // no loop, or one beside maxLength), they could run out before minProperties.
    if ((n.types & kObject) && n.others && n.min_props > allowed &&
        (n.key_max == 0 || (n.key_pattern && (n.key_pattern->max_left(n.key_pattern->start()) != JsonPattern::kUnbounded ||
                                              n.key_max >= 0))))
      fail("{}: minProperties above the declared properties beside a 'propertyNames' that takes few names is not "
           "supported", path);
    if (n.min_props > (1 << 20) || n.max_props > (1 << 20)) fail("{}: a property count above 2^20", path);
    // Arrays.
    items(n, s, path);
    if (const auto m = s.find("minItems"); m != s.end()) n.min_items = count_of(*m, path + "/minItems");
    if (const auto m = s.find("maxItems"); m != s.end()) n.max_items = count_of(*m, path + "/maxItems");
    if (!n.more_items) {  // no item past the prefix
      const auto most = int64_t(n.prefix_items.size());
      if (n.min_items > most)
        no_values_of(n, kArray, fmt::format("{}: minItems is above the {} items the array may have", path, most));
      n.max_items = n.max_items < 0 ? most : std::min(n.max_items, most);
    }
    if (n.max_items >= 0 && n.max_items < n.min_items) no_values_of(n, kArray, fmt::format("{}: maxItems is below minItems", path));
    if (const auto u = s.find("uniqueItems"); u != s.end()) {
      if (!u->is_boolean()) fail("{}/uniqueItems: must be a boolean", path);
      if (u->get<bool>()) unique(n, path);
    }
    contains(n, s, path);

    if (n.min_items > (1 << 20) || n.max_items > (1 << 20)) fail("{}: an item count above 2^20", path);
    literals(n, s, path);
    if (!n.excluded.empty() && !n.has_literals && !schema_values::some_unused(&n, {}))
      schema_merge::fail_empty("{}/not: it excludes every value the schema's other keywords take", path);
  }

  // not: what its schema names (a type, const / enum scalars, both, or an anyOf of such) is taken
  // out of n: types from n.types, scalars into n.excluded (each alternative of an anyOf excluded
  // too: not (A or B) is (not A) and (not B)).
  void negation(Node& n, const Json& s, const std::string& path) {
    const auto it = s.find("not");
    if (it == s.end()) return;
    const std::string at = path + "/not";
    auto unsupported = [&](const std::string& why) {
      fail("{}: {}; 'not' is supported where its schema is a 'type', a 'const' or 'enum' of scalars, both, or an "
           "'anyOf' of such, or an object's 'properties' of such with 'required'", at, why);
    };
    std::vector<const Json*> alts = {&*it};
    if (it->is_object() && it->contains("anyOf")) {
      const Json& any = it->at("anyOf");
      if (!any.is_array() || any.empty()) fail("{}/anyOf: must be a non-empty array of schemas", at);
      for (auto k = it->begin(); k != it->end(); ++k)
        if (k.key() != "anyOf" && !annotation(k.key())) unsupported(fmt::format("'{}' beside its 'anyOf'", part(k.key())));
      alts.clear();
      for (const Json& a : any) alts.push_back(&a);
    }
    for (const Json* a : alts) {
      if (a->is_boolean()) {
        if (a->get<bool>()) schema_merge::fail_empty("{}: the schema true takes every value, so 'not' of it takes none", at);
        continue;  // (not false: any value)
      }
      if (!a->is_object()) fail("{}: a schema must be an object or a boolean", at);
      uint8_t named = kAnyType;
      bool listed = false, said = false;
      for (auto k = a->begin(); k != a->end(); ++k) {
        if (annotation(k.key())) continue;
        if (k.key() != "type" && k.key() != "const" && k.key() != "enum") unsupported(fmt::format("'{}' in it", part(k.key())));
        said = true;
      }
      if (!said) schema_merge::fail_empty("{}: its schema takes every value, so 'not' of it takes none", at);
      if (const auto t = a->find("type"); t != a->end()) named = type_bits(*t, at + "/type");
      if (a->contains("enum") && a->contains("const")) fail("{}: both 'enum' and 'const'", at);
      if (a->contains("enum") || a->contains("const")) {
        const Json values = a->contains("const") ? Json::array({a->at("const")}) : a->at("enum");
        if (!values.is_array()) fail("{}/enum: must be an array", at);
        listed = true;
        for (const Json& v : values) {
          // (Not of both: only the values of its types. An object or array only where n takes one.)
          if (!(type_of(v) & named) || !(type_of(v) & n.types)) continue;
          if (v.is_structured()) unsupported("an object or array value in it");
          n.excluded.push_back(canonical(v.dump()));
        }
      }
      if (listed) continue;
      // A type taken out. Integers alone, where numbers with a fraction stay, would leave the
      // numbers whose value has a fraction: not a set this recognizer writes.
      if ((named & kInteger) && !(named & kNumber) && (n.types & kNumber))
        unsupported("'integer' where other numbers are allowed");
      n.types &= uint8_t(~named);
    }
    std::sort(n.excluded.begin(), n.excluded.end());
    n.excluded.erase(std::unique(n.excluded.begin(), n.excluded.end()), n.excluded.end());
    if (n.types == 0) schema_merge::fail_empty("{}: it excludes every type the schema allows", at);
  }

  // enum / const: the values that every other keyword of the schema takes, as a validator applies
  // them all (json_schema_values.cpp). A value whose items or properties lead back to this node
  // is read against the values kept so far, until no more go.
  void literals(Node& n, const Json& s, const std::string& path) {
    if (!s.contains("enum") && !s.contains("const")) return;
    if (s.contains("enum") && s.contains("const")) fail("{}: both 'enum' and 'const'", path);
    const Json values = s.contains("const") ? Json::array({s.at("const")}) : s.at("enum");
    if (!values.is_array() || values.empty()) fail("{}/enum: must be a non-empty array", path);
    n.has_literals = true;
    for (const Json& v : values) n.literals.push_back(v.dump());
    std::sort(n.literals.begin(), n.literals.end());
    n.literals.erase(std::unique(n.literals.begin(), n.literals.end()), n.literals.end());
    const std::function<bool(const Node*)> busy = [&](const Node* x) { return x != &n && filling_.count(x) > 0; };
    for (size_t before = 0; before != n.literals.size();) {  // (the list is read while filtered: a copy)
      before = n.literals.size();
      std::vector<std::string> kept;
      for (const std::string& t : n.literals)
        if (schema_values::validates(&n, Json::parse(t), busy, false)) kept.push_back(t);
      n.literals = std::move(kept);
    }
    if (n.literals.empty()) schema_merge::fail_empty("{}: no value of 'enum' meets the schema's other keywords", path);
  }

  // contains (json_schema_contains.cpp): without it minContains and maxContains say nothing, and
  // minContains 0 without maxContains holds of every array.
  void contains(Node& n, const Json& s, const std::string& path) {
    const auto c = s.find("contains");
    if (c == s.end()) return;
    const auto lo = s.find("minContains"), hi = s.find("maxContains");
    const int64_t least = lo == s.end() ? 1 : count_of(*lo, path + "/minContains");
    const int64_t most = hi == s.end() ? -1 : count_of(*hi, path + "/maxContains");
    if (most >= 0 && most < least) fail("{}: maxContains is below minContains", path);
    if (least == 0 && (most < 0 || *c == Json(false))) return;
    if (*c == Json(false)) fail("{}/contains: false, with minContains above 0, takes no array", path);
    Node& matching = out_.nodes_.emplace_back();
    const bool every = *c == Json(true) || *c == Json::object();
    std::string why;
    const Node* matches = every ? nullptr : compile_part(*c, path + "/contains", why);
    if (!every && matches == nullptr)
      fail("{}/contains: it takes no value, so no array has {} items of it ({})", path, least, why);
    schema_contains::setup(n, matches, matching, least, most, path);
  }

  // ---- Objects: patternProperties, propertyNames and dependentRequired.

  // The value of a key that matches each set of patterns: their schemas merged (as an allOf). A
  // set whose schemas cannot be merged, or that accepts no value, takes no key.
  void pattern_values(Node& n, const std::vector<const Json*>& schemas, const std::vector<std::string>& texts,
                      const std::string& path) {
    if (schemas.empty()) return;
    const uint32_t sets = uint32_t(1) << schemas.size();
    n.pattern_values.assign(sets, nullptr);
    n.pattern_values[0] = n.additional;
    for (uint32_t set = 1; set < sets; ++set) {
      std::vector<Json> all;
      for (uint32_t s = set; s != 0; s &= s - 1) all.push_back(*schemas[size_t(std::countr_zero(s))]);
      const std::string at = path + "/patternProperties";
      if (all.size() == 1) {  // (malformed, or saying what is not supported: refused)
        std::string why;  // (null: a key that matches takes no value, so none comes)
        n.pattern_values[set] = compile_part(all[0], at + "/" + part(texts[size_t(std::countr_zero(set))]), why);
        continue;
      }
      const auto refs = refs_;  // (a failed compile leaves nodes half-filled: none may be found later)
      const int depth = depth_;
      try {
        n.pattern_values[set] = compile(schema_merge::all_of(root_, all, at, merges_), at);
      } catch (const dsi::Error&) {
        refs_ = refs;
        depth_ = depth;
      }
    }
  }

  // The automaton of other keys' names: propertyNames' pattern beside patternProperties', taking
  // the names propertyNames takes whose set of patterns has a value.
  static void key_automaton(Node& n, const std::string& path) {
    if (n.pattern_values.empty()) return;
    std::vector<const JsonPattern*> parts;
    const uint32_t named = n.key_pattern ? 1 : 0;
    if (named) parts.push_back(n.key_pattern.get());
    for (const auto& p : n.key_patterns) parts.push_back(p.get());
    std::vector<uint32_t> tags;
    auto product = JsonPattern::product(
        parts, [&](uint32_t bits) { return (!named || (bits & 1)) && n.pattern_values[bits >> named] != nullptr; }, tags,
        path + "/patternProperties");
    if (!product) {  // no other key may come
      n.additional = nullptr;
      n.pattern_values.clear();
      n.key_pattern = nullptr;
      n.key_min = 0, n.key_max = -1;
      return;
    }
    for (uint32_t& tag : tags) tag >>= named;
    n.key_sets = std::move(tags);
    n.key_pattern = std::move(product);
  }

  static bool needs_escapes(const std::string& name) {
    return std::any_of(name.begin(), name.end(), [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == '"' || c == '\\'; });
  }
  size_t add_name(Node& n, const std::string& name, const std::string& at) {  // (its value: another key's)
    const Node* value = n.other_value(name);
    if (needs_escapes(name))
      fail("{}: the name {} needs escapes, which keys may not have here", at, Json(name).dump());
    if (n.names.size() >= size_t(kMaxProperties))
      fail("{}: with the names it adds, the object has more than {} properties", at, kMaxProperties);
    n.names.push_back(name);
    n.props.push_back(value);
    return n.names.size() - 1;
  }

  // propertyNames, a string schema (pattern, minLength, maxLength, enum, const): declared names it
  // refuses may not come; other keys are held to it while written, or, for enum and const, become
  // the declared names it lists (other keys then none).
  void property_names(Node& n, const Json& s, const std::string& path, std::map<size_t, std::string>& bans) {
    const auto pn = s.find("propertyNames");
    if (pn == s.end()) return;
    const std::string at = path + "/propertyNames";
    if (pn->is_boolean() && pn->get<bool>()) return;
    Node k;
    k.types = kString;
    std::vector<std::string> listed;  // enum / const
    bool has_list = false;
    if (pn->is_object()) {
      for (auto it = pn->begin(); it != pn->end(); ++it) {
        static const std::set<std::string> kTaken = {"type", "pattern", "minLength", "maxLength", "enum", "const"};
        if (kTaken.count(it.key()) || (annotation(it.key()) && it.key() != "format")) continue;
        fail("{}: '{}' is not supported there (a string schema of pattern, minLength, maxLength, enum or const is)",
             at, part(it.key()));
      }
      if (const auto t = pn->find("type"); t != pn->end() && *t != Json("string"))
        fail("{}/type: only \"string\" is supported there (names are strings)", at);
      strings(k, *pn, at);
      if (pn->contains("enum") && pn->contains("const")) fail("{}: both 'enum' and 'const'", at);
      if (pn->contains("enum") || pn->contains("const")) {
        has_list = true;
        const Json values = pn->contains("const") ? Json::array({pn->at("const")}) : pn->at("enum");
        if (!values.is_array() || values.empty()) fail("{}/enum: must be a non-empty array", at);
        for (const Json& v : values)  // (values that are not strings name no key)
          if (v.is_string() && k.string_fits(v.get_ref<const std::string&>())) listed.push_back(v.get<std::string>());
      }
    } else {  // false: no key at all
      if (!pn->is_boolean()) fail("{}: must be a schema", at);
      has_list = true;
    }
    auto taken = [&](const std::string& name) {
      return has_list ? std::find(listed.begin(), listed.end(), name) != listed.end() : k.string_fits(name);
    };
    for (size_t i = 0; i < n.names.size(); ++i)
      if (!taken(n.names[i])) {
        n.banned |= uint64_t(1) << i;
        bans[i] = "'propertyNames' does not take the name";
      }
    if (n.additional == nullptr && n.pattern_values.empty()) return;
    if (has_list) {  // the listed names that are not declared: declared now, with another key's value
      for (const std::string& name : listed)
        if (std::find(n.names.begin(), n.names.end(), name) == n.names.end() && !needs_escapes(name) &&
            n.other_value(name) != nullptr)
          add_name(n, name, at);
      n.additional = nullptr;
      n.pattern_values.clear();
      return;
    }
    std::tie(n.key_min, n.key_max, n.key_pattern) = std::tie(k.min_length, k.max_length, k.pattern);
  }

  // dependentRequired (and draft 7's dependencies as lists of names): once a property has come, the
  // names it lists must come too. A listed name the object cannot have (other keys closed, or
  // propertyNames refuses it) bans the property that lists it; a name the object may have only as
  // another key is declared, with another key's value, so that its coming is seen.
  void dependencies(Node& n, const Json& s, const std::string& path, std::map<size_t, std::string>& bans) {
    struct Entry { std::string name, at; std::vector<std::string> listed; };
    std::vector<Entry> entries;
    for (const char* key : {"dependentRequired", "dependencies"}) {
      const auto d = s.find(key);
      if (d == s.end()) continue;
      if (!d->is_object()) fail("{}/{}: must be an object", path, key);
      for (auto it = d->begin(); it != d->end(); ++it) {
        Entry e{it.key(), path + "/" + key + "/" + part(it.key()), {}};
        if (!it->is_array() && std::string(key) == "dependencies")
          fail("{}: a schema as a dependency is not supported (a list of names is)", e.at);
        if (!it->is_array()) fail("{}: must be an array of names", e.at);
        for (const Json& x : *it) {
          if (!x.is_string()) fail("{}: must be an array of names", e.at);
          e.listed.push_back(x.get<std::string>());
        }
        entries.push_back(std::move(e));
      }
    }
    if (entries.empty()) return;
    auto index = [&n](const std::string& name) { return std::find(n.names.begin(), n.names.end(), name) - n.names.begin(); };
    auto other = [&n](const std::string& name) { return n.other_value(name) != nullptr; };
    std::map<size_t, uint64_t> deps;
    for (const Entry& e : entries) {
      auto a = size_t(index(e.name));
      if (a == n.names.size()) {
        if (!other(e.name)) continue;  // a key the object never has
        a = add_name(n, e.name, e.at);
      }
      for (const std::string& x : e.listed) {
        auto j = size_t(index(x));
        if (j == n.names.size() && other(x)) j = add_name(n, x, e.at);
        if (j == n.names.size()) {
          n.banned |= uint64_t(1) << a;
          bans[a] = fmt::format("{} needs {}, which the object may not have", e.at, Json(x).dump());
        } else {
          deps[a] |= uint64_t(1) << j;
        }
      }
    }
    n.dependents.assign(n.names.size(), 0);
    for (const auto& [a, mask] : deps) n.dependents[a] = mask;
    for (size_t k = 0; k < n.names.size(); ++k)  // what a name needs, and what that needs in turn
      for (uint64_t& mask : n.dependents) mask |= (mask >> k & 1) ? n.dependents[k] : 0;
    const uint64_t banned = n.banned;
    for (size_t i = 0; i < n.names.size(); ++i)
      if (const uint64_t bad = n.dependents[i] & banned & ~(uint64_t(1) << i); bad != 0 && !(banned >> i & 1)) {
        n.banned |= uint64_t(1) << i;
        bans[i] = fmt::format("it needs {}, which may not come", Json(n.names[size_t(std::countr_zero(bad))]).dump());
      }
  }

  // minimum / maximum, and exclusiveMinimum / exclusiveMaximum as numbers (2020-12, draft 6 and
  // 7) or as booleans that make minimum / maximum exclusive (draft 4). Bounds no number meets
  // leave the node's other types; bounds no integer meets leave an integer type none.
  static void bounds(Node& n, const Json& s, const std::string& path) {
    auto number = [&](const char* key) -> const Json* {
      const auto it = s.find(key);
      if (it == s.end()) return nullptr;
      if (!it->is_number() || !std::isfinite(it->get<double>())) fail("{}/{}: must be a finite number", path, key);
      return &*it;
    };
    if (const Json* m = number("minimum")) n.lo = m->get<double>();
    if (const Json* m = number("maximum")) n.hi = m->get<double>();
    for (const bool low : {true, false}) {
      const char* key = low ? "exclusiveMinimum" : "exclusiveMaximum";
      const auto it = s.find(key);
      if (it == s.end()) continue;
      double& edge = low ? n.lo : n.hi;
      bool& open = low ? n.lo_open : n.hi_open;
      if (it->is_boolean()) {
        if (it->get<bool>() && !s.contains(low ? "minimum" : "maximum"))
          fail("{}/{}: true without '{}'", path, key, low ? "minimum" : "maximum");
        open = open || it->get<bool>();
      } else if (it->is_number() && std::isfinite(it->get<double>())) {
        const double x = it->get<double>();
        if (low ? x >= edge : x <= edge) edge = x, open = true;
      } else {
        fail("{}/{}: must be a finite number or a boolean", path, key);
      }
    }
    if (const auto m = s.find("multipleOf"); m != s.end()) {
      if (!m->is_number() || !(m->get<double>() > 0)) fail("{}/multipleOf: must be a number above 0", path);
      const double k = m->get<double>();
      if (k != std::floor(k) || k > kMaxMultiple)
        fail("{}/multipleOf: only a whole number up to 10^15 is supported (validators read a fraction through "
             "binary floating point, each their own way)", path);
      n.multiple_of = k;
      // Multiples are written with at most 15 digits, which every validator reads exactly.
      if (n.lo < -kMaxMultiple) n.lo = -kMaxMultiple, n.lo_open = false;
      if (n.hi > kMaxMultiple) n.hi = kMaxMultiple, n.hi_open = false;
    }
    if (!n.bounded()) return;
    auto some = [&n](bool integer) {
      return meets(-HUGE_VAL, HUGE_VAL, integer, n.lo, n.lo_open, n.hi, n.hi_open, n.multiple_of);
    };
    if (!some(false)) n.types &= uint8_t(~(kNumber | kInteger));
    else if (!some(true) && !(n.types & kNumber)) n.types &= uint8_t(~kInteger);
    if (n.types == 0) schema_merge::fail_empty("{}: no value of the schema's type lies within its bounds", path);
  }

  // A format's strings as a pattern of the whole string (RFC 3339 dates and times, without leap
  // days or leap seconds; lowercase UUIDs; dotted IPv4; plain e-mail addresses): each string
  // written is what format checkers accept. Other formats stay annotations; null for those.
  static std::shared_ptr<const JsonPattern> format(const std::string& name) {
    static const std::string kDate =
        "[0-9]{4}-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)|"
        "02-(0[1-9]|1[0-9]|2[0-8]))";
    static const std::string kTime =
        "([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])";
    static const std::string kOctet = "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])";
    static const std::string kLabel = "[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?";
    static const std::map<std::string, std::string> kFormats = {
        {"date", kDate},
        {"time", kTime},
        {"date-time", kDate + "T" + kTime},
        {"uuid", "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"},
        {"ipv4", "(" + kOctet + "\\.){3}" + kOctet},
        {"email", "[a-z0-9_+-]{1,16}(\\.[a-z0-9_+-]{1,16}){0,2}@" + kLabel + "(\\." + kLabel + "){0,2}\\.[a-z]{2,8}"},
    };
    static std::map<std::string, std::shared_ptr<const JsonPattern>> compiled;  // (guarded below)
    static std::mutex mutex;
    const auto it = kFormats.find(name);
    if (it == kFormats.end()) return nullptr;
    const std::lock_guard<std::mutex> lock(mutex);
    auto& p = compiled[name];
    if (!p) p = JsonPattern::compile(it->second, "format " + name, JsonPattern::Match::kWhole);
    return p;
  }

  // Items: 2020-12's prefixItems (the first items, one schema each) and items (the rest; false:
  // none); draft 7's items as an array (the first items) and additionalItems (the rest).
  void items(Node& n, const Json& s, const std::string& path) {
    // A part that takes no value (false, or empty) ends the array before it.
    std::string why;
    auto rest = [&](const Json& v, const std::string& at) {
      n.items = compile_part(v, at, why);
      if (n.items == nullptr) n.more_items = false;
    };
    auto prefix = [&](const Json& v, const std::string& at) {
      if (!v.is_array()) fail("{}: must be an array of schemas", at);
      for (size_t i = 0; i < v.size(); ++i) {
        const Node* item = compile_part(v[i], at + "/" + std::to_string(i), why);
        if (item == nullptr) {
          n.more_items = false;  // (items after it never come either)
          return false;
        }
        n.prefix_items.push_back(item);
      }
      return true;
    };
    const auto items = s.find("items");
    if (const auto p = s.find("prefixItems"); p != s.end()) {
      if (items != s.end() && items->is_array()) fail("{}: 'items' as an array beside 'prefixItems'", path);
      if (!prefix(*p, path + "/prefixItems")) return;
    }
    if (items != s.end() && items->is_array()) {
      if (!prefix(*items, path + "/items")) return;
      if (const auto a = s.find("additionalItems"); a != s.end()) rest(*a, path + "/additionalItems");
    } else if (items != s.end()) {
      rest(*items, path + "/items");
    }
  }

  // uniqueItems, for items that are scalars: null, booleans, numbers, strings.
  static void unique(Node& n, const std::string& path) {
    std::vector<const Node*> all = n.prefix_items;
    if (n.more_items) all.push_back(n.items != nullptr ? n.items : nullptr);
    for (const Node* item : all)
      if (item == nullptr || !scalar(item, 0))
        fail("{}/uniqueItems: supported where every item is a scalar (null, boolean, number or string)", path);
    n.unique = true;
    if (n.prefix_items.empty() && n.items != nullptr) n.distinct = schema_values::distinct(n.items, kMaxDistinct);
    if (n.distinct >= 0 && n.min_items > n.distinct)
      no_values_of(n, kArray, fmt::format("{}: minItems is above the {} distinct items there can be", path, n.distinct));
  }
  static bool scalar(const Node* n, int depth) {
    n = unwrap(n);
    if (depth > 16) return false;
    if (!n->any_of.empty())
      return std::all_of(n->any_of.begin(), n->any_of.end(), [&](const Node* a) { return scalar(a, depth + 1); });
    if (n->has_literals)
      return std::none_of(n->literals.begin(), n->literals.end(), [](const std::string& t) { return t[0] == '{' || t[0] == '['; });
    return (n->types & (kObject | kArray)) == 0;
  }
  // minLength, maxLength (code points) and pattern.
  static void strings(Node& n, const Json& s, const std::string& path) {
    if (const auto m = s.find("minLength"); m != s.end()) n.min_length = count_of(*m, path + "/minLength");
    if (const auto m = s.find("maxLength"); m != s.end()) n.max_length = count_of(*m, path + "/maxLength");
    if (n.max_length >= 0 && n.max_length < n.min_length)
      no_values_of(n, kString, fmt::format("{}: maxLength is below minLength", path));
    if (n.min_length > (1 << 20) || n.max_length > (1 << 20)) fail("{}: a length above 2^20", path);
    const auto p = s.find("pattern");
    if (p != s.end()) {
      if (!p->is_string()) fail("{}/pattern: must be a string", path);
      n.pattern = JsonPattern::compile(p->get<std::string>(), path + "/pattern");
    } else if (const auto f = s.find("format"); f != s.end() && f->is_string()) {
      n.pattern = format(f->get<std::string>());
    }
    if (!n.pattern) return;
    const int64_t shortest = n.pattern->min_left(n.pattern->start()), longest = n.pattern->max_left(n.pattern->start());
    if (n.max_length >= 0 && shortest > n.max_length && (n.types & kString))
      no_values_of(n, kString, fmt::format("{}: the pattern takes at least {} characters, above maxLength", path, shortest));
    if (longest != JsonPattern::kUnbounded && longest < n.min_length && (n.types & kString))
      no_values_of(n, kString, fmt::format("{}: the pattern takes at most {} characters, below minLength", path, longest));
  }

  // "#", "#/$defs/Name", "#/definitions/Name" (JSON pointer escapes ~0 and ~1 decoded).
  const Node* reference(const Json& ref, const std::string& path) {
    if (!ref.is_string()) fail("{}: must be a string", path);
    const std::string r = ref.get<std::string>();
    if (const auto known = refs_.find(r); known != refs_.end()) return known->second;
    const Json& target = schema_merge::target(root_, r, path);
    // The node is named before it is filled, so a reference back to it (recursion) finds it.
    Node& n = out_.nodes_.emplace_back();
    refs_[r] = &n;
    if (target.is_boolean()) {
      if (!target.get<bool>()) fail("{}: {} is the schema false", path, Json(r).dump());
      n.any_of.push_back(out_.any_);
    } else {
      if (!target.is_object()) fail("{}: {} is not a schema", path, Json(r).dump());
      if (++depth_ > 64) fail("{}: the schema nests too deeply", path);
      const Filling filling(filling_, &n);
      fill(n, target, part(r));
      --depth_;
    }
    return &n;
  }

  JsonSchema& out_;
  const Json& root_;
  const bool closed_objects_;
  std::map<std::string, const Node*> refs_;
  // The nodes being filled (enum values that reach one through a reference are not kept).
  struct Filling {
    std::set<const Node*>& nodes;
    const Node* n;
    Filling(std::set<const Node*>& s, const Node* x) : nodes(s), n(x) { nodes.insert(n); }
    ~Filling() { nodes.erase(n); }
  };
  std::set<const Node*> filling_;
  int depth_ = 0;
  int merges_ = 0;  // pairs of schemas merged (schema_merge bounds them)
};

std::shared_ptr<const JsonSchema> JsonSchema::compile(const Json& schema, bool closed_objects) {
  auto s = std::make_shared<JsonSchema>();
  Node& any = s->nodes_.emplace_back();
  s->any_ = &any;
  any.additional = &any;
  any.others = true;
  Compiler c(*s, schema, closed_objects);
  try {
    s->root_ = c.compile(schema, "#");
  } catch (const dsi::Error& e) {  // (a path through deep merges can be long: its end is kept)
    const std::string m = e.what();
    if (m.size() <= 1000) throw;
    throw dsi::Error("..." + m.substr(m.size() - 1000));
  }
  return s;
}

}  // namespace dsi::server
