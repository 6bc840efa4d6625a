// Structured outputs: allOf, and $ref beside other keywords, merged into one schema that accepts
// what all of them accept (see json_schema.h for what merges); the compiler (json_schema.cpp) then
// compiles the result.
#include "server/json_schema_merge.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <tuple>

#include "dsinfer/error.h"
#include "server/json_pattern.h"
#include "server/json_schema.h"

namespace dsi::server::schema_merge {

using Json = nlohmann::json;

bool annotation(const std::string& k) {
  static const std::set<std::string> kIgnored = {
      "title", "description", "default", "examples", "$schema", "$id", "$comment", "$anchor",
      "readOnly", "writeOnly", "deprecated", "format", "$defs", "definitions", "contentMediaType",
      "contentEncoding", "discriminator", "strict", "name"};
  return kIgnored.count(k) > 0 || k == kRewriteNames;
}

std::set<std::string> rewrite_names(const Json& s) {
  std::set<std::string> out;
  if (const auto m = s.is_object() ? s.find(kRewriteNames) : s.end(); s.is_object() && m != s.end() && m->is_array())
    for (const Json& name : *m)
      if (name.is_string()) out.insert(name.get<std::string>());
  return out;
}

std::string part(const std::string& name) {
  std::string out;
  for (unsigned char c : name.substr(0, 40)) out += c < 0x20 || c == 0x7f ? fmt::format("\\x{:02x}", c) : std::string(1, char(c));
  return out + (name.size() > 40 ? "..." : "");
}

const Json& target(const Json& root, const std::string& r, const std::string& path) {
  if (r.rfind('#', 0) != 0) fail("{}: only references inside the schema (\"#...\") are supported", path);
  try {
    const Json::json_pointer ptr(r.substr(1));
    if (root.contains(ptr)) return root.at(ptr);
  } catch (const Json::exception&) {
    fail("{}: {} is not a JSON pointer into the schema", path, Json(r).dump());
  }
  fail("{}: {} points at nothing", path, Json(r).dump());
}

namespace {

// The schemas a not's schema is the anyOf of (itself where it is no anyOf beside annotations).
std::vector<Json> not_alternatives(const Json& c) {
  if (!c.is_object() || !c.contains("anyOf") || !c["anyOf"].is_array() || constrains_beside(c, "anyOf")) return {c};
  return std::vector<Json>(c["anyOf"].begin(), c["anyOf"].end());
}

// An object's properties and required (with type or none): what the merge writes the negation of
// (Merger::negated), where the compiler takes scalars' only (a type, const, enum).
bool object_form(const Json& c) {
  if (!c.is_object() || !(c.contains("properties") || c.contains("required"))) return false;
  for (auto it = c.begin(); it != c.end(); ++it)
    if (it.key() != "type" && it.key() != "properties" && it.key() != "required" && !annotation(it.key())) return false;
  return true;
}

}  // namespace

bool conditional(const Json& s) {
  if (!s.is_object()) return false;
  if (s.contains("if") || s.contains("then") || s.contains("else") || s.contains("dependentSchemas")) return true;
  if (const auto n = s.find("not"); n != s.end()) {
    const std::vector<Json> alts = not_alternatives(*n);
    if (std::any_of(alts.begin(), alts.end(), object_form)) return true;
  }
  const auto d = s.find("dependencies");
  return d != s.end() && d->is_object() && std::any_of(d->begin(), d->end(), [](const Json& x) { return !x.is_array(); });
}

bool constrains_beside(const Json& s, const char* key) {
  for (auto it = s.begin(); it != s.end(); ++it)
    if (it.key() != key && !annotation(it.key())) return true;
  return false;
}

namespace {

class Merger {
 public:
  Merger(const Json& root, int& merges) : root_(root), merges_(merges) {}

  Json merged(const Json& s, const std::string& path, std::vector<std::string>& open) {
    if (open.size() > 64) fail("{}: allOf and $ref nest too deeply", path);
    // (A reference back into the schema through an alternative's branch is merged again at each
    // level, past the references the open list still holds: the nesting bounds it.)
    struct Nest {
      int& depth;
      explicit Nest(int& d) : depth(d) { ++depth; }
      ~Nest() { --depth; }
    } nest(depth_);
    if (depth_ > kMaxDepth) fail("{}: allOf, $ref and if nest more than {} deep", path.substr(0, 200), kMaxDepth);
    if (s.is_boolean()) return s;
    if (!s.is_object()) fail("{}: a schema must be an object or a boolean", path);
    if (s.contains("unevaluatedProperties") || s.contains("unevaluatedItems")) return settled(s, path, open);
    if (schema_merge::conditional(s)) return merged(conditional(s, path, open), path, open);
    Json out = Json::object();  // the keywords beside allOf and $ref
    for (auto it = s.begin(); it != s.end(); ++it)
      if (it.key() != "allOf" && it.key() != "$ref" && (!annotation(it.key()) || it.key() == kRewriteNames))
        out[it.key()] = it.value();
    // anyOf / oneOf beside other keywords: each alternative with the rest (as an allOf of both).
    if (out.size() > 1 && (out.contains("anyOf") || out.contains("oneOf"))) {
      std::vector<Json> alts;
      for (const char* k : {"anyOf", "oneOf"})
        if (out.contains(k)) {
          alts.push_back(Json{{k, out[k]}});
          out.erase(k);
        }
      for (const Json& a : alts) out = both(out, a, path, open);
    }
    if (const auto r = s.find("$ref"); r != s.end()) {
      if (!r->is_string()) fail("{}/$ref: must be a string", path);
      const std::string ref = r->get<std::string>();
      if (std::find(open.begin(), open.end(), ref) != open.end())
        fail("{}/$ref: {} refers back to itself inside an allOf (or beside other keywords), which is not supported",
             path, Json(ref).dump());
      open.push_back(ref);
      out = both(out, merged(target(root_, ref, path + "/$ref"), part(ref), open), path, open);
      open.pop_back();
    }
    if (const auto all = s.find("allOf"); all != s.end()) {
      if (!all->is_array() || all->empty()) fail("{}/allOf: must be a non-empty array of schemas", path);
      for (size_t i = 0; i < all->size(); ++i) {
        const std::string at = path + "/allOf/" + std::to_string(i);
        out = both(out, merged((*all)[i], at, open), at, open);
      }
    }
    return out;
  }

  static bool trivial(const Json& x) { return (x.is_boolean() && x.get<bool>()) || (x.is_object() && x.empty()); }

  // unevaluatedProperties / unevaluatedItems: the keys (items) that no keyword of the schema, or of
  // the schemas it takes in place (allOf, $ref), has evaluated take its schema. Where one of them
  // evaluates every key (additionalProperties, its own unevaluatedProperties) or every item (items
  // past a prefix, additionalItems after one, unevaluatedItems), it says nothing more. Otherwise
  // the schemas are merged (their properties and patterns all declared) and it becomes the
  // merge's additionalProperties (items past the longest prefix), in each branch of alternatives
  // in place that evaluate nothing themselves (anyOf of required, say). Where a branch's own
  // keywords would evaluate some (anyOf, oneOf, if, dependentSchemas, an object's not written out;
  // for items also contains), it is refused.
  Json settled(const Json& s, const std::string& path, std::vector<std::string>& open) {
    Json rest = s;
    const Json keys = s.value("unevaluatedProperties", Json()), items = s.value("unevaluatedItems", Json());
    rest.erase("unevaluatedProperties");
    rest.erase("unevaluatedItems");
    Evaluated k, i;
    evaluated_.clear();  // (its keys point into this rest)
    if (!keys.is_null()) in_place(rest, false, path, 0, k);
    if (!items.is_null()) in_place(rest, true, path, 0, i);
    for (const auto& [e, name] : {std::pair(&k, "unevaluatedProperties"), std::pair(&i, "unevaluatedItems")})
      if (!e->all && !e->branch.empty())
        fail("{}: '{}' beside '{}' (at {}), whose alternatives may evaluate some {} and not others, is not supported",
             path, name, e->branch, e->at, e == &k ? "keys" : "items");
    Json out = merged(rest, path, open);
    close(out, k.all ? Json() : keys, i.all ? Json() : items);
    return out;
  }
  // The merge x takes keys (null: as it is) as additionalProperties and items past its prefix;
  // each alternative of x in its own place (alternatives that evaluate none leave every
  // alternative the same keys: merged beside the alternatives, these keywords would hold of each
  // one's properties too).
  static void close(Json& x, const Json& keys, const Json& items) {
    if (x.is_boolean() && !x.get<bool>()) return;
    if (x.is_boolean()) x = Json::object();
    for (const char* k : {"anyOf", "oneOf"})
      if (x.contains(k) && x.size() == 1) {
        for (Json& alt : x[k]) close(alt, keys, items);
        return;
      }
    if (!keys.is_null()) x["additionalProperties"] = keys;
    if (!items.is_null()) x[x.contains("items") && x["items"].is_array() ? "additionalItems" : "items"] = items;
  }
  // An array schema's items as its first items' schemas (prefixItems, or draft 7's items as an
  // array) and the rest's (items, or draft 7's additionalItems after such an array; said: the
  // schema says one, else any).
  struct ItemParts {
    Json prefix = Json::array(), rest = true;
    bool said = false;
    const Json& at(size_t i) const { return i < prefix.size() ? prefix[i] : rest; }
  };
  static ItemParts item_parts(const Json& x, const std::string& path) {
    ItemParts parts;
    const auto items = x.find("items");
    if (const auto p = x.find("prefixItems"); p != x.end()) {
      if (!p->is_array()) fail("{}/prefixItems: must be an array of schemas", path);
      if (items != x.end() && items->is_array()) fail("{}: 'items' as an array beside 'prefixItems'", path);
      parts.prefix = *p;
    }
    const auto rest = items != x.end() && items->is_array() ? x.find("additionalItems") : items;
    if (items != x.end() && items->is_array()) parts.prefix = *items;
    if (rest != x.end()) std::tie(parts.rest, parts.said) = std::tuple(*rest, true);
    return parts;
  }
  struct Evaluated {
    bool all = false;         // a schema in place evaluates every key (item)
    std::string branch, at;  // an alternative in place that may evaluate some: its keyword, and where
  };
  // The subschemas of s's alternatives (anyOf, oneOf, if / then / else, dependentSchemas and draft
  // 7's schema dependencies), each with its keyword; for keys also not's schema (not evaluates
  // nothing, but the merge writes an object's not with the properties it names).
  static std::vector<std::pair<const char*, const Json*>> alternatives(const Json& s, bool items) {
    std::vector<std::pair<const char*, const Json*>> out;
    if (const auto n = s.find("not"); n != s.end() && !items) out.emplace_back("not", &*n);
    for (const char* k : {"anyOf", "oneOf"})
      if (const auto a = s.find(k); a != s.end() && a->is_array())
        for (const Json& x : *a) out.emplace_back(k, &x);
    if (s.contains("if"))
      for (const char* k : {"if", "then", "else"})
        if (const auto a = s.find(k); a != s.end()) out.emplace_back("if", &*a);
    for (const char* k : {"dependentSchemas", "dependencies"})
      if (const auto d = s.find(k); d != s.end() && d->is_object())
        for (const Json& x : *d)
          if (!x.is_array()) out.emplace_back(k, &x);
    return out;
  }
  // What s and the schemas it takes in place (allOf, $ref) evaluate of an object's keys (items:
  // of an array's items).
  void in_place(const Json& s, bool items, const std::string& path, int depth, Evaluated& e) {
    if (!s.is_object()) return;
    if (depth > 16) fail("{}: allOf and $ref nest too deeply around 'unevaluatedProperties' or 'unevaluatedItems'", path);
    if (++visits_ > kMaxVisits)
      fail("{}: 'unevaluatedProperties' or 'unevaluatedItems' over more than {} schemas in place", path, kMaxVisits);
    if (items ? item_parts(s, path).said || s.contains("unevaluatedItems")
              : s.contains("additionalProperties") || s.contains("unevaluatedProperties"))
      e.all = true;
    if (e.branch.empty() && items && s.contains("contains")) std::tie(e.branch, e.at) = std::tuple("contains", path);
    for (const auto& [k, x] : alternatives(s, items))
      if (e.branch.empty() && evaluates(*x, items, path, depth + 1)) std::tie(e.branch, e.at) = std::tuple(k, path);
    if (const auto r = s.find("$ref"); r != s.end() && r->is_string())
      in_place(target(root_, r->get<std::string>(), path + "/$ref"), items, path + "/$ref", depth + 1, e);
    if (const auto all = s.find("allOf"); all != s.end() && all->is_array())
      for (size_t n = 0; n < all->size(); ++n) in_place((*all)[n], items, path + "/allOf/" + std::to_string(n), depth + 1, e);
  }
  // Whether x, or a schema it takes in place or as an alternative, has a keyword that evaluates
  // some keys (items); past the depth bound, that it may.
  bool evaluates(const Json& x, bool items, const std::string& path, int depth) {
    if (!x.is_object()) return false;
    if (depth > 16) return true;
    // (A schema reached again, through references that share it, is answered once: a true from the
    // depth bound only makes the answer more careful.)
    const auto key = std::pair(&x, items);
    if (const auto known = evaluated_.find(key); known != evaluated_.end()) return known->second;
    if (++visits_ > kMaxVisits)
      fail("{}: 'unevaluatedProperties' or 'unevaluatedItems' over more than {} schemas", path, kMaxVisits);
    const bool yes = evaluates_here(x, items, path, depth);
    evaluated_[key] = yes;
    return yes;
  }
  bool evaluates_here(const Json& x, bool items, const std::string& path, int depth) {
    static const std::set<std::string> kKeys = {"properties", "patternProperties", "additionalProperties",
                                                "unevaluatedProperties"};
    static const std::set<std::string> kItems = {"prefixItems", "items", "additionalItems", "contains", "unevaluatedItems"};
    for (auto k = x.begin(); k != x.end(); ++k)
      if ((items ? kItems : kKeys).count(k.key())) return true;
    if (const auto r = x.find("$ref"); r != x.end() && r->is_string() &&
                                       evaluates(target(root_, r->get<std::string>(), path + "/$ref"), items, path, depth + 1))
      return true;
    if (const auto all = x.find("allOf"); all != x.end() && all->is_array())
      for (const Json& m : *all)
        if (evaluates(m, items, path, depth + 1)) return true;
    for (const auto& alt : alternatives(x, items))
      if (evaluates(*alt.second, items, path, depth + 1)) return true;
    return false;
  }

  // if / then / else: a value takes `then` where it takes `if`, and `else` where it does not. As
  // {"allOf": [the rest, {"anyOf": [{"allOf": [if, then]}, {"allOf": [not if, else]}]}]}, with
  // not-if in keywords the compiler takes (negated); a branch that takes no value is left out.
  // then and else without if say nothing.
  Json conditional(const Json& s, const std::string& path, std::vector<std::string>& open) {
    // not of an object's properties and required (or an anyOf with such): not (A or B) as (not A)
    // and (not B), each object's negation written out (negated), the scalars' left to the compiler.
    if (const auto n = s.find("not"); n != s.end()) {
      const std::vector<Json> alts = not_alternatives(*n);
      if (std::any_of(alts.begin(), alts.end(), object_form)) {
        Json rest = s;
        rest.erase("not");
        Json all = Json::array({rest});
        for (const Json& alt : alts)
          all.push_back(object_form(alt) ? negated(alt, rest.value("required", Json::array()), path + "/not", "not")
                                         : Json{{"not", alt}});
        return Json{{"allOf", all}};
      }
    }
    Json rest = s;
    for (const char* k : {"if", "then", "else"}) rest.erase(k);
    // dependentSchemas (and draft 7's schema dependencies): one if / then each, beside the rest.
    Json all = Json::array();
    for (const char* key : {"dependentSchemas", "dependencies"}) {
      const auto d = s.find(key);
      if (d == s.end()) continue;
      if (!d->is_object()) fail("{}/{}: must be an object", path, key);
      Json names = Json::object();  // (draft 7's lists of names stay where they are)
      for (auto it = d->begin(); it != d->end(); ++it) {
        if (it->is_array() && std::string(key) == "dependencies") {
          names[it.key()] = *it;
          continue;
        }
        // (An object with the key: other values take no dependency.)
        Json one = Json::object();
        one["if"] = Json{{"type", "object"}, {"required", Json::array({it.key()})}};
        one["then"] = *it;
        all.push_back(one);
      }
      rest.erase(key);
      if (!names.empty()) rest[key] = names;
    }
    if (!all.empty()) {
      if (const auto c = s.find("if"); c != s.end()) {  // (its own if / then / else too)
        Json own = Json::object();
        for (const char* k : {"if", "then", "else"})
          if (s.contains(k)) own[k] = s[k];
        all.push_back(own);
      }
      all.insert(all.begin(), rest);
      Json out = Json::object();
      out["allOf"] = all;
      return out;
    }
    const auto c = s.find("if");
    if (c == s.end() || (!s.contains("then") && !s.contains("else"))) return rest;  // (then nothing follows from if)
    Json alts = Json::array();
    auto branch = [&](const Json& a, const Json& b) {
      if ((a.is_boolean() && !a.get<bool>()) || (b.is_boolean() && !b.get<bool>())) return;
      alts.push_back(Json{{"allOf", Json::array({a, b})}});
    };
    // Names the rest requires anyway: not-if never lacks them.
    const Json flat = merged(rest, path, open);
    const Json required = flat.is_object() ? flat.value("required", Json::array()) : Json::array();
    Json cond = *c;  // (its properties say what the condition reads, not which keys may come)
    if (cond.is_object() && cond.contains("properties") && cond["properties"].is_object()) {
      std::set<std::string> names = rewrite_names(cond);
      for (auto it = cond["properties"].begin(); it != cond["properties"].end(); ++it) names.insert(it.key());
      cond[kRewriteNames] = names;
    }
    branch(cond, s.value("then", Json(true)));
    branch(negated(*c, required, path + "/if", "if"), s.value("else", Json(true)));
    if (alts.empty()) fail_empty("{}: no value takes 'if' and 'then', or 'else' without 'if'", path);
    Json out = Json::object();
    out["allOf"] = Json::array({rest, alts.size() == 1 ? alts[0] : Json{{"anyOf", alts}}});
    return out;
  }

  // What takes exactly the values c does not, in keywords the compiler takes: c a type, const or
  // enum of scalars (or an anyOf of such): {"not": c}; c an object's properties of such and
  // required (with type object or none): an object with one of the properties not as c says,
  // or without one of the required names (other than those in `required`, which it always has),
  // or (type object) no object at all.
  static Json negated(const Json& c, const Json& required, const std::string& path, const char* keyword) {
    if (c.is_boolean()) return Json(!c.get<bool>());
    if (!c.is_object()) fail("{}: a schema must be an object or a boolean", path);
    auto unsupported = [&](const std::string& what) {
      fail("{}: {}; '{}' is supported where its schema is a 'type', a 'const' or 'enum' of scalars (or an 'anyOf' of "
           "such), or an object's 'properties' of such with 'required'", path, what, keyword);
    };
    static const std::set<std::string> kScalar = {"type", "const", "enum", "anyOf"};
    static const std::set<std::string> kObject = {"type", "properties", "required"};
    bool scalar = true, object = true, says = false;
    for (auto it = c.begin(); it != c.end(); ++it) {
      if (annotation(it.key())) continue;
      says = true;
      scalar = scalar && kScalar.count(it.key()) > 0;
      object = object && kObject.count(it.key()) > 0;
      if (!scalar && !object) unsupported(fmt::format("'{}' in it", part(it.key())));
    }
    if (!says) return Json(false);  // (it takes every value)
    if (scalar) return Json{{"not", c}};
    if (c.contains("type") && c["type"] != "object") unsupported("a 'type' other than \"object\" beside 'properties'");
    Json alts = Json::array();
    if (c.contains("type")) alts.push_back(Json{{"not", {{"type", "object"}}}});
    const Json props = c.value("properties", Json::object());
    if (!props.is_object()) fail("{}/properties: must be an object", path);
    for (auto it = props.begin(); it != props.end(); ++it) {
      const Json& p = it.value();
      if (trivial(p) || (p.is_object() && !constrains_beside(p, ""))) continue;  // (annotations only: every value)
      Json alt = {{"type", "object"}, {"required", Json::array({it.key()})}, {kRewriteNames, Json::array({it.key()})}};
      if (!p.is_boolean()) {
        if (!p.is_object()) fail("{}/properties/{}: a schema must be an object or a boolean", path, part(it.key()));
        for (auto k = p.begin(); k != p.end(); ++k)
          if (!annotation(k.key()) && !kScalar.count(k.key()))
            unsupported(fmt::format("'{}' in its property {}", part(k.key()), Json(it.key()).dump()));
        alt["properties"] = Json{{it.key(), Json{{"not", p}}}};
      }
      alts.push_back(alt);
    }
    const Json names = c.value("required", Json::array());
    if (!names.is_array()) fail("{}/required: must be an array of names", path);
    for (const Json& name : names) {
      if (!name.is_string()) fail("{}/required: must be an array of names", path);
      if (required.is_array() && std::find(required.begin(), required.end(), name) != required.end()) continue;
      alts.push_back(Json{{"type", "object"},
                          {"properties", Json{{name.get<std::string>(), false}}},
                          {kRewriteNames, Json::array({name})}});
    }
    if (alts.empty()) return Json(false);
    return alts.size() == 1 ? alts[0] : Json{{"anyOf", alts}};
  }
  // What a and b both accept as a part of a schema (a property's value, other keys', items): false
  // where they take no value in common (then no such key or item comes).
  Json both_part(const Json& a, const Json& b, const std::string& path, std::vector<std::string>& open) {
    const size_t depth = open.size();
    try {
      return both_of(a, b, path, open);
    } catch (const EmptySchema&) {
      open.resize(depth);
      return Json(false);
    }
  }

  // What two schemas of the tree both accept; a side that accepts anything leaves the other as it
  // is (its references unfollowed: a recursive property stays a reference).
  Json both_of(const Json& a, const Json& b, const std::string& path, std::vector<std::string>& open) {
    if (trivial(a)) return b;
    if (trivial(b)) return a;
    return both(merged(a, path, open), merged(b, path, open), path, open);
  }

  // What a and b (merged already: no allOf or $ref at the top) both accept.
  Json both(const Json& a, const Json& b, const std::string& path, std::vector<std::string>& open) {
    if (trivial(a)) return b;
    if (trivial(b)) return a;
    if (++merges_ > kMaxMerges) fail("{}: allOf merges more than {} pairs of schemas", path, kMaxMerges);
    for (const Json* x : {&a, &b})
      for (const char* k : {"exclusiveMinimum", "exclusiveMaximum"})
        if (x->contains(k) && (*x)[k].is_boolean())
          fail("{}: draft 4's boolean '{}' inside an allOf is not supported", path, k);
    if ((a.is_boolean() && !a.get<bool>()) || (b.is_boolean() && !b.get<bool>()))
      fail_empty("{}: an allOf with the schema false accepts no value", path);
    // An alternative on either side: each alternative with the other side (anyOf stays anyOf, and
    // oneOf oneOf: the compiler checks that its alternatives still exclude each other).
    for (const auto& [x, y] : {std::pair<const Json&, const Json&>(a, b), std::pair<const Json&, const Json&>(b, a)})
      for (const char* k : {"anyOf", "oneOf"}) {
        const auto alts = x.find(k);
        if (alts == x.end()) continue;
        if (!alts->is_array() || alts->empty()) fail("{}/{}: must be a non-empty array of schemas", path, k);
        if (x.size() > 1) fail("{}: '{}' beside other keywords inside an allOf is not supported", path, k);
        // An alternative that takes no value with y is left out.
        Json out = Json::array();
        std::optional<EmptySchema> none;
        for (size_t i = 0; i < alts->size(); ++i) {
          const std::string at = path + "/" + k + "/" + std::to_string(i);
          const size_t depth = open.size();
          try {
            out.push_back(both(merged((*alts)[i], at, open), y, at, open));
          } catch (const EmptySchema& e) {
            open.resize(depth);
            if (!none) none = e;
          }
        }
        if (out.empty()) throw *none;
        if (out.size() > 64) fail("{}: an allOf of alternatives makes more than 64 of them", path);
        return Json{{k, out}};
      }
    Json out = a;
    auto refuse = [&](const std::string& k) {
      fail("{}: '{}' in two schemas of an allOf (with different values) cannot be merged", path, part(k));
    };
    for (auto it = b.begin(); it != b.end(); ++it) {
      const std::string& k = it.key();
      const Json& v = it.value();
      if (k == "properties" || k == "additionalProperties" || k == "patternProperties") continue;  // below, together
      if (k == "contains" || k == "minContains" || k == "maxContains") continue;  // below, together
      if (k == "prefixItems" || k == "items" || k == "additionalItems") continue;  // below, together
      if (k == kRewriteNames) continue;  // below
      const auto have = out.find(k);
      if (have == out.end() && k != "enum" && k != "const") {
        out[k] = v;
        continue;
      }
      if (have != out.end() && *have == v) continue;
      static const std::set<std::string> kLowest = {"maximum", "exclusiveMaximum", "maxLength", "maxItems",
                                                    "maxProperties"};
      static const std::set<std::string> kHighest = {"minimum", "exclusiveMinimum", "minLength", "minItems",
                                                     "minProperties"};
      if (k == "type") {
        out[k] = common_types(*have, v, path);
      } else if (k == "enum" || k == "const") {
        const Json mine = out.contains("const") ? Json::array({out["const"]}) : out.value("enum", Json());
        const Json theirs = k == "const" ? Json::array({v}) : v;
        if (!theirs.is_array()) fail("{}/{}: must be an array", path, k);
        Json kept = Json::array();
        for (const Json& x : theirs)
          if (mine.is_null() || (mine.is_array() && std::find(mine.begin(), mine.end(), x) != mine.end()))
            kept.push_back(x);
        if (kept.empty()) fail_empty("{}: the enum values of an allOf's schemas have none in common", path);
        out.erase("const");
        out["enum"] = kept;
      } else if ((kLowest.count(k) || kHighest.count(k)) && have->is_number() && v.is_number()) {
        const bool low = kLowest.count(k) > 0;
        out[k] = (low ? v.get<double>() < have->get<double>() : v.get<double>() > have->get<double>()) ? v : *have;
      } else if (k == "required" && have->is_array() && v.is_array()) {
        for (const Json& name : v)
          if (std::find(have->begin(), have->end(), name) == have->end()) have->push_back(name);
      } else if ((k == "dependentRequired" || k == "dependencies") && have->is_object() && v.is_object()) {
        for (auto d = v.begin(); d != v.end(); ++d) {  // the names each property needs, of both
          const auto mine = have->find(d.key());
          if (mine == have->end()) {
            (*have)[d.key()] = d.value();
            continue;
          }
          if (!mine->is_array() || !d->is_array())
            fail("{}/{}/{}: a schema as a dependency is not supported (a list of names is)", path, k, part(d.key()));
          for (const Json& name : *d)
            if (std::find(mine->begin(), mine->end(), name) == mine->end()) mine->push_back(name);
        }
      } else if (k == "not") {  // (not A) and (not B): not (A or B)
        Json alts = Json::array();
        for (const Json* x : {static_cast<const Json*>(&*have), &v})
          for (const Json& alt : not_alternatives(*x)) alts.push_back(alt);
        out[k] = Json{{"anyOf", alts}};
      } else if (k == "uniqueItems" && have->is_boolean() && v.is_boolean()) {
        out[k] = have->get<bool>() || v.get<bool>();
      } else if (k == "multipleOf" && have->is_number_integer() && v.is_number_integer() && have->get<int64_t>() > 0 &&
                 v.get<int64_t>() > 0) {
        out[k] = std::lcm(have->get<int64_t>(), v.get<int64_t>());
      } else {
        refuse(k);
      }
    }
    if (b.contains("properties") || b.contains("additionalProperties") || b.contains("patternProperties"))
      objects(out, b, path, open);
    if (b.contains("prefixItems") || b.contains("items") || b.contains("additionalItems")) arrays(out, b, path, open);
    contains(out, a, b, path);
    // The names only rewrites named: those of either side that neither side declares.
    const std::set<std::string> ra = rewrite_names(a), rb = rewrite_names(b);
    std::set<std::string> only = ra;
    only.insert(rb.begin(), rb.end());
    for (const auto& [x, mine] : {std::pair<const Json&, const std::set<std::string>&>(a, ra),
                                  std::pair<const Json&, const std::set<std::string>&>(b, rb)})
      if (const auto p = x.find("properties"); p != x.end() && p->is_object())
        for (auto it = p->begin(); it != p->end(); ++it)
          if (!mine.count(it.key())) only.erase(it.key());
    if (only.empty()) out.erase(kRewriteNames);
    else out[kRewriteNames] = only;
    return out;
  }

  // The items of a (in place) and b together. Each side is its first items' schemas (prefixItems,
  // or draft 7's items as an array) and the rest's (items, or draft 7's additionalItems after such
  // an array; any where it says none): the item at each position takes both sides' schemas there,
  // and the items past both prefixes both rests. Written as prefixItems and items.
  void arrays(Json& a, const Json& b, const std::string& path, std::vector<std::string>& open) {
    const ItemParts x = item_parts(a, path), y = item_parts(b, path);
    for (const char* k : {"prefixItems", "items", "additionalItems"}) a.erase(k);
    Json prefix = Json::array();
    for (size_t i = 0; i < std::max(x.prefix.size(), y.prefix.size()); ++i)
      prefix.push_back(both_part(x.at(i), y.at(i), path + "/prefixItems/" + std::to_string(i), open));
    if (!prefix.empty()) a["prefixItems"] = prefix;
    const Json rest = both_part(x.rest, y.rest, path + "/items", open);
    if (!trivial(rest)) a["items"] = rest;
  }

  // contains with its counts, of a and b together into out: a side's minContains (default 1) and
  // maxContains hold only of its own contains, so two different contains schemas are refused; one
  // contains takes the highest minContains and the lowest maxContains of the sides that have it.
  static void contains(Json& out, const Json& a, const Json& b, const std::string& path) {
    struct Count { const Json* schema = nullptr; Json least = 1, most; };
    auto count = [](const Json& x) {
      Count c;
      if (const auto it = x.find("contains"); it != x.end()) c.schema = &*it;
      if (const auto it = x.find("minContains"); it != x.end()) c.least = *it;
      if (const auto it = x.find("maxContains"); it != x.end()) c.most = *it;
      // (minContains 0 without maxContains holds of every array.)
      if (c.least == Json(0) && c.most.is_null()) c.schema = nullptr;
      return c;
    };
    const Count x = count(a), y = count(b);
    for (const char* k : {"contains", "minContains", "maxContains"}) out.erase(k);
    if (x.schema && y.schema && *x.schema != *y.schema)
      fail("{}: 'contains' in two schemas of an allOf (with different values) cannot be merged", path);
    const Count& c = x.schema ? x : y;
    if (!c.schema) return;
    out["contains"] = *c.schema;
    out["minContains"] = c.least;
    if (!c.most.is_null()) out["maxContains"] = c.most;
    if (!x.schema || !y.schema) return;
    if (x.least.is_number() && y.least.is_number()) out["minContains"] = std::max(x.least, y.least);
    else if (x.least != y.least) fail("{}/minContains: must be a non-negative integer", path);
    if (x.most.is_number() && y.most.is_number()) out["maxContains"] = std::min(x.most, y.most);
    else if (!x.most.is_null() && !y.most.is_null() && x.most != y.most)
      fail("{}/maxContains: must be a non-negative integer", path);
    else if (!y.most.is_null()) out["maxContains"] = y.most;
  }

  // The properties of a (in place) and b together: each key's value schema is what each side says
  // of it (its own property; else, where it matches a patternProperties pattern, those patterns',
  // which stay beside it; else its additionalProperties), merged; additionalProperties the merge
  // of both sides' (false where either is); patternProperties those of both (merged where both
  // name one pattern). A side's patterns beside the other side's additionalProperties (other than
  // true) are refused: a key could then match one side's pattern and be the other's other key.
  void objects(Json& a, const Json& b, const std::string& path, std::vector<std::string>& open) {
    static const Json kAny = true;
    const Json none = Json::object();
    const Json& qa = a.contains("patternProperties") ? a["patternProperties"] : none;
    const Json& qb = b.contains("patternProperties") ? b["patternProperties"] : none;
    if (!qa.is_object() || !qb.is_object()) fail("{}/patternProperties: must be an object", path);
    const bool a_open = !a.contains("additionalProperties") || trivial(a["additionalProperties"]);
    const bool b_open = !b.contains("additionalProperties") || trivial(b["additionalProperties"]);
    if ((!qa.empty() && !b_open) || (!qb.empty() && !a_open))
      fail("{}: 'patternProperties' in one schema of an allOf beside 'additionalProperties' in another is not "
           "supported", path);
    Json patterns = qa;
    for (auto it = qb.begin(); it != qb.end(); ++it)
      patterns[it.key()] = patterns.contains(it.key())
                               ? both_part(patterns[it.key()], it.value(), path + "/patternProperties/" + part(it.key()), open)
                               : it.value();
    auto matched = [&](const Json& q, const std::string& name) {
      const std::u32string text = JsonSchema::code_points(name);
      for (auto it = q.begin(); it != q.end(); ++it)
        if (JsonPattern::compile(it.key(), path + "/patternProperties/" + part(it.key()))->matches(text)) return true;
      return false;
    };
    const Json& pa = a.contains("properties") ? a["properties"] : none;
    const Json& pb = b.contains("properties") ? b["properties"] : none;
    if (!pa.is_object() || !pb.is_object()) fail("{}/properties: must be an object", path);
    const Json& aa = a.contains("additionalProperties") ? a["additionalProperties"] : kAny;
    const Json& ab = b.contains("additionalProperties") ? b["additionalProperties"] : kAny;
    auto closed = [](const Json& x) { return x.is_boolean() && !x.get<bool>(); };
    Json props = Json::object();
    std::vector<std::string> names;
    for (const Json* p : {&pa, &pb})
      for (auto it = p->begin(); it != p->end(); ++it)
        if (std::find(names.begin(), names.end(), it.key()) == names.end()) names.push_back(it.key());
    for (const std::string& name : names) {
      const Json& sa = pa.contains(name) ? pa[name] : matched(qa, name) ? kAny : aa;
      const Json& sb = pb.contains(name) ? pb[name] : matched(qb, name) ? kAny : ab;
      if (closed(sa) || closed(sb)) {  // no such key (a side's false, or its additionalProperties false)
        props[name] = false;
        continue;
      }
      const std::string at = path + "/properties/" + part(name);
      props[name] = both_part(sa, sb, at, open);
    }
    Json additional = closed(aa) || closed(ab) ? Json(false) : both_part(aa, ab, path + "/additionalProperties", open);
    // Other keys open on both sides: said so where a side says it (closed_objects reads a silent
    // object with properties as closed).
    const bool said_open = (a.contains("additionalProperties") && aa == kAny) || (b.contains("additionalProperties") && ab == kAny);
    a["properties"] = props;
    if (!patterns.empty()) a["patternProperties"] = patterns;
    if (additional == kAny && !said_open) a.erase("additionalProperties");
    else a["additionalProperties"] = additional;
  }

  // The types both "type" values name (a name or a list; "number" takes integers too).
  static Json common_types(const Json& a, const Json& b, const std::string& path) {
    auto names = [&](const Json& t) {
      std::set<std::string> out;
      for (const Json& x : t.is_array() ? t : Json::array({t})) {
        static const std::set<std::string> kTypes = {"null", "boolean", "integer", "number", "string", "array", "object"};
        if (!x.is_string() || !kTypes.count(x.get<std::string>())) fail("{}/type: unknown type {}", path, x.dump());
        out.insert(x.get<std::string>());
      }
      return out;
    };
    const std::set<std::string> x = names(a), y = names(b);
    Json out = Json::array();
    for (const std::string& t : x) {
      if (y.count(t)) out.push_back(t);
      else if (t == "integer" && y.count("number")) out.push_back(t);
      else if (t == "number" && y.count("integer") && !x.count("integer")) out.push_back("integer");
    }
    if (out.empty()) fail_empty("{}: the types of an allOf's schemas have none in common", path);
    return out.size() == 1 ? out[0] : out;
  }

 private:
  static constexpr int kMaxMerges = 4096;  // (alternatives inside allOf pair up: a bound on the work)
  const Json& root_;
  int& merges_;
  static constexpr int kMaxDepth = 64;  // merged() inside merged()
  int depth_ = 0;
  static constexpr int kMaxVisits = 4096;  // schemas read for the unevaluated keywords (a bound on the work)
  int visits_ = 0;
  std::map<std::pair<const Json*, bool>, bool> evaluated_;  // evaluates(), by schema and keys / items
};

}  // namespace

Json merge(const Json& root, const Json& s, const std::string& path, int& merges) {
  std::vector<std::string> open;  // the references being taken in
  return Merger(root, merges).merged(s, path, open);
}

Json all_of(const Json& root, const std::vector<Json>& all, const std::string& path, int& merges) {
  Json s = Json::object();
  s["allOf"] = all;
  return merge(root, s, path, merges);
}

}  // namespace dsi::server::schema_merge
