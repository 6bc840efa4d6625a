// What the structured-output tests share (test_server_json_schema*.cpp): a validator written here
// from the JSON Schema text (values parsed by nlohmann::json, an independent reading of the
// standard), the recognizer against it, the compiler's messages, and seeded walks through the mask
// whose every ending validates.
#pragma once

#include <gtest/gtest.h>

#include <arpa/inet.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <random>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dsinfer/error.h"
#include "server/constraints.h"
#include "server/json_schema.h"
#include "test_constraints_util.h"

namespace dsi::server::schema_test {

using Json = nlohmann::json;

// Whether the recognizer takes these bytes as the start of a text (not necessarily a whole one).
inline bool takes(const Json& schema, const std::string& prefix) {
  SchemaPrefix p(JsonSchema::compile(schema));
  return p.push(prefix);
}

// ---- A validator for the keywords the compiler takes (an independent reading of the standard).

inline size_t code_points(const std::string& s) {
  return size_t(std::count_if(s.begin(), s.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; }));
}

// The formats the compiler writes, read here from RFC 3339, RFC 4122 and RFC 791 (not through the
// compiler's patterns): a calendar date, a time with its offset, a UUID, a dotted IPv4 address,
// an e-mail address with a dotted domain.
inline bool valid_format(const std::string& format, const std::string& v) {
  auto two = [&](const std::string& s, size_t at, int most) {
    return at + 2 <= s.size() && std::isdigit(static_cast<unsigned char>(s[at])) &&
           std::isdigit(static_cast<unsigned char>(s[at + 1])) && std::stoi(s.substr(at, 2)) <= most;
  };
  auto date = [&](const std::string& s) {
    if (s.size() != 10 || s[4] != '-' || s[7] != '-') return false;
    for (size_t i : {0, 1, 2, 3, 5, 6, 8, 9})
      if (!std::isdigit(static_cast<unsigned char>(s[i]))) return false;
    const std::chrono::year_month_day d{std::chrono::year{std::stoi(s.substr(0, 4))},
                                        std::chrono::month{unsigned(std::stoi(s.substr(5, 2)))},
                                        std::chrono::day{unsigned(std::stoi(s.substr(8, 2)))}};
    return d.ok();
  };
  auto time = [&](const std::string& s) {
    if (s.size() < 9 || !two(s, 0, 23) || s[2] != ':' || !two(s, 3, 59) || s[5] != ':' || !two(s, 6, 59)) return false;
    size_t at = 8;
    if (at < s.size() && s[at] == '.') {
      const size_t from = ++at;
      while (at < s.size() && std::isdigit(static_cast<unsigned char>(s[at]))) ++at;
      if (at == from) return false;
    }
    if (at < s.size() && s[at] == 'Z') return at + 1 == s.size();
    return at + 6 == s.size() && (s[at] == '+' || s[at] == '-') && two(s, at + 1, 23) && s[at + 3] == ':' &&
           two(s, at + 4, 59);
  };
  if (format == "date") return date(v);
  if (format == "time") return time(v);
  if (format == "date-time") return v.size() > 11 && v[10] == 'T' && date(v.substr(0, 10)) && time(v.substr(11));
  if (format == "uuid") {
    if (v.size() != 36) return false;
    for (size_t i = 0; i < v.size(); ++i)
      if ((i == 8 || i == 13 || i == 18 || i == 23) ? v[i] != '-' : !std::isxdigit(static_cast<unsigned char>(v[i])))
        return false;
    return true;
  }
  if (format == "ipv4") {
    in_addr a;
    return inet_pton(AF_INET, v.c_str(), &a) == 1;
  }
  if (format == "email") {
    const size_t at = v.find('@');
    return at != std::string::npos && at > 0 && v.find('@', at + 1) == std::string::npos &&
           v.find('.', at) != std::string::npos && v.back() != '.';
  }
  return true;  // an annotation
}

inline bool valid(const Json& v, const Json& s, const Json& root);

inline bool valid_type(const Json& v, const std::string& t) {
  if (t == "null") return v.is_null();
  if (t == "boolean") return v.is_boolean();
  if (t == "integer") return v.is_number_integer() || (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
  if (t == "number") return v.is_number();
  if (t == "string") return v.is_string();
  if (t == "array") return v.is_array();
  if (t == "object") return v.is_object();
  return false;
}

// The keys of object v (the positions of array v's items) that s evaluates, v valid against s:
// 2020-12's annotations of properties, patternProperties, additionalProperties, prefixItems,
// items, contains and the unevaluated keywords, taken through $ref, allOf, the alternatives of
// anyOf and oneOf that v is valid against, if with then (else where v is not valid against if),
// and dependentSchemas of the keys there. (not keeps none.)
inline void evaluated(const Json& v, const Json& s, const Json& root, std::set<std::string>& keys,
                      std::vector<bool>& items) {
  if (!s.is_object()) return;
  if (s.contains("$ref")) {
    const std::string r = s["$ref"];
    evaluated(v, root.at(Json::json_pointer(r.substr(1))), root, keys, items);
  }
  for (const char* k : {"allOf", "anyOf", "oneOf"})
    for (const Json& alt : s.value(k, Json::array()))
      if (valid(v, alt, root)) evaluated(v, alt, root, keys, items);
  if (s.contains("if")) {
    const bool took = valid(v, s["if"], root);
    if (took) evaluated(v, s["if"], root, keys, items);
    if (s.contains(took ? "then" : "else")) evaluated(v, s[took ? "then" : "else"], root, keys, items);
  }
  if (v.is_object()) {
    for (const char* k : {"dependentSchemas", "dependencies"}) {
      const Json deps = s.value(k, Json::object());
      for (const auto& [name, schema] : deps.items())
        if (v.contains(name) && !schema.is_array()) evaluated(v, schema, root, keys, items);
    }
    const bool all = s.contains("additionalProperties") || s.contains("unevaluatedProperties");
    const Json props = s.value("properties", Json::object()), patterns = s.value("patternProperties", Json::object());
    for (auto it = v.begin(); it != v.end(); ++it) {
      bool mine = all || props.contains(it.key());
      for (const auto& [pattern, schema] : patterns.items())
        mine = mine || std::regex_search(it.key(), std::regex(pattern, std::regex::ECMAScript));
      if (mine) keys.insert(it.key());
    }
  }
  if (v.is_array()) {
    const bool tuple = s.contains("items") && s["items"].is_array();
    const size_t prefix = s.contains("prefixItems") ? s["prefixItems"].size() : tuple ? s["items"].size() : 0;
    const bool rest = (tuple ? s.contains("additionalItems") : s.contains("items")) || s.contains("unevaluatedItems");
    for (size_t i = 0; i < v.size(); ++i)
      if (i < prefix || rest || (s.contains("contains") && valid(v[i], s["contains"], root))) items[i] = true;
  }
}

inline bool valid(const Json& v, const Json& s, const Json& root) {
  if (s.is_boolean()) return s.get<bool>();
  if (s.contains("$ref")) {  // (2020-12: beside other keywords, both hold)
    const std::string r = s["$ref"];
    if (!valid(v, root.at(Json::json_pointer(r.substr(1))), root)) return false;
  }
  // not: its schema must not hold (checked before anyOf, which returns at once).
  if (s.contains("not") && valid(v, s["not"], root)) return false;
  // if / then / else: then where the value takes if, else where it does not; neither without if.
  if (s.contains("if")) {
    const bool took = valid(v, s["if"], root);
    if (took && s.contains("then") && !valid(v, s["then"], root)) return false;
    if (!took && s.contains("else") && !valid(v, s["else"], root)) return false;
  }
  if (s.contains("anyOf") &&
      std::none_of(s["anyOf"].begin(), s["anyOf"].end(), [&](const Json& alt) { return valid(v, alt, root); }))
    return false;
  if (s.contains("oneOf") &&
      std::count_if(s["oneOf"].begin(), s["oneOf"].end(), [&](const Json& alt) { return valid(v, alt, root); }) != 1)
    return false;
  if (s.contains("allOf")) {
    for (const Json& alt : s["allOf"])
      if (!valid(v, alt, root)) return false;
  }
  if (s.contains("type")) {
    const Json types = s["type"].is_array() ? s["type"] : Json::array({s["type"]});
    if (std::none_of(types.begin(), types.end(), [&](const Json& t) { return valid_type(v, t.get<std::string>()); }))
      return false;
  }
  if (s.contains("const") && v != s["const"]) return false;
  if (s.contains("enum") && std::find(s["enum"].begin(), s["enum"].end(), v) == s["enum"].end()) return false;
  if (v.is_object()) {
    if (s.contains("minProperties") && v.size() < s["minProperties"].get<size_t>()) return false;
    if (s.contains("maxProperties") && v.size() > s["maxProperties"].get<size_t>()) return false;
    const Json props = s.value("properties", Json::object());
    for (const Json& r : s.value("required", Json::array()))
      if (!v.contains(r.get<std::string>())) return false;
    // dependentRequired (draft 7: dependencies whose values are arrays): a key that is there needs
    // each name its array lists.
    for (const char* k : {"dependentRequired", "dependencies"}) {
      const Json deps = s.value(k, Json::object());
      for (const auto& [name, needs] : deps.items())
        if (v.contains(name) && needs.is_array())
          for (const Json& other : needs)
            if (!v.contains(other.get<std::string>())) return false;
    }
    // dependentSchemas (draft 7: dependencies whose values are schemas): a key that is there puts
    // the whole object to its schema.
    for (const char* k : {"dependentSchemas", "dependencies"}) {
      const Json deps = s.value(k, Json::object());
      for (const auto& [name, schema] : deps.items())
        if (v.contains(name) && !schema.is_array() && !valid(v, schema, root)) return false;
    }
    // propertyNames: each key, as a string, valid against its schema.
    if (s.contains("propertyNames"))
      for (auto it = v.begin(); it != v.end(); ++it)
        if (!valid(Json(it.key()), s["propertyNames"], root)) return false;
    // Each key's value: against its property's schema, and each patternProperties schema whose
    // pattern the name matches (an unanchored search); additionalProperties only where neither is.
    const Json patterns = s.value("patternProperties", Json::object());
    for (auto it = v.begin(); it != v.end(); ++it) {
      bool matched = false;
      for (const auto& [pattern, schema] : patterns.items())
        if (std::regex_search(it.key(), std::regex(pattern, std::regex::ECMAScript))) {
          matched = true;
          if (!valid(it.value(), schema, root)) return false;
        }
      if (props.contains(it.key())) {
        if (!valid(it.value(), props[it.key()], root)) return false;
      } else if (!matched && s.contains("additionalProperties") && !valid(it.value(), s["additionalProperties"], root)) {
        return false;
      }
    }
  }
  if (v.is_array()) {
    if (s.contains("minItems") && v.size() < s["minItems"].get<size_t>()) return false;
    if (s.contains("maxItems") && v.size() > s["maxItems"].get<size_t>()) return false;
    // The first items by prefixItems (draft 7: items as an array), the rest by items
    // (additionalItems).
    const bool tuple = s.contains("items") && s["items"].is_array();
    const Json prefix = s.contains("prefixItems") ? s["prefixItems"] : tuple ? s["items"] : Json::array();
    const Json rest = tuple ? s.value("additionalItems", Json(true)) : s.value("items", Json(true));
    for (size_t i = 0; i < v.size(); ++i)
      if (!valid(v[i], i < prefix.size() ? prefix[i] : rest, root)) return false;
    // contains: the items valid against it, between minContains (default 1) and maxContains.
    if (s.contains("contains")) {
      const auto matched = size_t(std::count_if(v.begin(), v.end(), [&](const Json& x) { return valid(x, s["contains"], root); }));
      if (matched < s.value("minContains", size_t(1))) return false;
      if (s.contains("maxContains") && matched > s["maxContains"].get<size_t>()) return false;
    }
    if (s.value("uniqueItems", false))  // (nlohmann::json's equality: 1 equals 1.0, as the standard has it)
      for (size_t i = 0; i < v.size(); ++i)
        for (size_t j = i + 1; j < v.size(); ++j)
          if (v[i] == v[j]) return false;
  }
  if (v.is_number()) {
    const double x = v.get<double>();
    const bool open_min = s.value("exclusiveMinimum", Json(false)) == Json(true);  // draft 4
    const bool open_max = s.value("exclusiveMaximum", Json(false)) == Json(true);
    if (s.contains("minimum") && (x < s["minimum"].get<double>() || (open_min && x == s["minimum"].get<double>())))
      return false;
    if (s.contains("maximum") && (x > s["maximum"].get<double>() || (open_max && x == s["maximum"].get<double>())))
      return false;
    if (s.contains("exclusiveMinimum") && s["exclusiveMinimum"].is_number() && x <= s["exclusiveMinimum"].get<double>())
      return false;
    if (s.contains("exclusiveMaximum") && s["exclusiveMaximum"].is_number() && x >= s["exclusiveMaximum"].get<double>())
      return false;
    if (s.contains("multipleOf")) {  // (whole-number multiples; the values' quotients are exact here)
      const double q = x / s["multipleOf"].get<double>();
      if (q != std::floor(q)) return false;
    }
  }
  // unevaluatedProperties / unevaluatedItems: the keys (items) that no other keyword evaluated,
  // here or in the schemas applied in place, against their schema.
  if ((v.is_object() && s.contains("unevaluatedProperties")) || (v.is_array() && s.contains("unevaluatedItems"))) {
    Json others = s;
    others.erase("unevaluatedProperties");
    others.erase("unevaluatedItems");
    std::set<std::string> keys;
    std::vector<bool> items(v.is_array() ? v.size() : 0, false);
    evaluated(v, others, root, keys, items);
    if (v.is_object())
      for (auto it = v.begin(); it != v.end(); ++it)
        if (!keys.count(it.key()) && !valid(it.value(), s["unevaluatedProperties"], root)) return false;
    for (size_t i = 0; i < items.size(); ++i)
      if (!items[i] && !valid(v[i], s["unevaluatedItems"], root)) return false;
  }
  if (v.is_string()) {
    const size_t n = code_points(v.get<std::string>());
    if (s.contains("minLength") && n < s["minLength"].get<size_t>()) return false;
    if (s.contains("maxLength") && n > s["maxLength"].get<size_t>()) return false;
    // (ECMAScript as the C++ library reads it: the tests' patterns and strings are ASCII.)
    if (s.contains("pattern") &&
        !std::regex_search(v.get<std::string>(), std::regex(s["pattern"].get<std::string>(), std::regex::ECMAScript)))
      return false;
    // (A format is asserted where the schema has no pattern: beside one it is an annotation, as the
    // standard's default vocabulary reads every format.)
    if (s.contains("format") && !s.contains("pattern") &&
        !valid_format(s["format"].get<std::string>(), v.get<std::string>()))
      return false;
  }
  return true;
}

// Whether no object of the text has a key twice (compared after escapes are read). Parsers keep
// one of such keys, so a validator that reads the parsed value would count fewer keys than were
// written: the tests hold a text with a repeated key invalid.
inline bool unique_keys(const std::string& text) {
  std::vector<std::vector<std::string>> open;  // the keys of each object open
  bool unique = true;
  Json::parser_callback_t check = [&](int, Json::parse_event_t event, Json& parsed) {
    if (event == Json::parse_event_t::object_start) open.emplace_back();
    if (event == Json::parse_event_t::object_end && !open.empty()) open.pop_back();
    if (event == Json::parse_event_t::key && !open.empty()) {
      const std::string k = parsed.get<std::string>();
      if (std::find(open.back().begin(), open.back().end(), k) != open.back().end()) unique = false;
      open.back().push_back(k);
    }
    return true;
  };
  const Json v = Json::parse(text, check, false);
  return !v.is_discarded() && unique;
}

// Whether the recognizer takes the whole text and calls it complete.
inline bool accepts(const Json& schema, const std::string& text) {
  SchemaPrefix p(JsonSchema::compile(schema));
  return p.push(text) && p.complete();
}

// Each text: the recognizer takes it whole exactly when the validator accepts it. Returns how many
// the validator accepts.
inline int expect_the_validators(const Json& s, const std::vector<std::string>& texts) {
  int valid_texts = 0;
  for (const std::string& t : texts) {
    SCOPED_TRACE(t);
    const Json v = Json::parse(t);
    const bool ok = unique_keys(t) && valid(v, s, s);
    valid_texts += ok;
    EXPECT_EQ(accepts(s, t), ok);
  }
  return valid_texts;
}

// The compiler's message for a schema it refuses; empty when it compiles.
inline std::string message(const char* schema) {
  try {
    JsonSchema::compile(Json::parse(schema));
  } catch (const dsi::Error& e) {
    return std::string(e.what());
  }
  return std::string();
}

// The compiler refuses the schema with a message that holds part.
inline void expect_refused(const char* schema, const std::string& part) {
  const std::string m = message(schema);
  EXPECT_NE(m.find(part), std::string::npos) << schema << "\n" << m;
}

// Seeded walks through the schema's mask: each step's mask leaves some token, the text is a prefix
// the recognizer takes, and every other step (the odd steps of even walks, the even steps of odd
// ones) the mask is each token tried alone (the plain reading copies the state for every token of
// the vocabulary: on every step it was most of the suite's time); returns how many walks wrote a
// whole value, each of which the validator must accept.
inline int walks_that_end(const Json& s, uint64_t seed, int walks) {
  const Tokenizer& tok = test::kjv_tokenizer();
  const int64_t V = tok.vocab_size() + 1;
  const int32_t eos = int32_t(V - 1);
  const auto schema = JsonSchema::compile(s);
  std::mt19937_64 rng(seed);
  int ended = 0;
  for (int walk = 0; walk < walks; ++walk) {
    SchemaConstraint c(tok, schema, {eos}, -1, -1, false);
    std::string text;
    for (int step = 0; step < 300; ++step) {
      const std::vector<int32_t> ok = test::allowed(c, V);
      const std::string shown = Json(text).dump(-1, ' ', false, Json::error_handler_t::replace);
      EXPECT_FALSE(ok.empty()) << shown;
      if ((step + walk) % 2 == 1) {
        EXPECT_EQ(ok, test::each_token(c.state(), tok, V, eos)) << shown;
      }
      if (ok.empty() || ::testing::Test::HasFailure()) return ended;
      // After some random steps, prefer what ends: the end of sequence, then closing bytes.
      int32_t pick = ok[std::uniform_int_distribution<size_t>(0, ok.size() - 1)(rng)];
      if (step > 15 || rng() % 4 == 0) {
        std::vector<int32_t> closing;
        for (int32_t id : ok)
          if (id == eos) {
            closing.assign(1, eos);
            break;
          } else if (tok.token_bytes(id)->find_first_of("}\"],") != std::string::npos) {
            closing.push_back(id);
          }
        if (!closing.empty()) pick = closing[std::uniform_int_distribution<size_t>(0, closing.size() - 1)(rng)];
      }
      if (pick == eos) break;
      c.accept(pick);
      text += *tok.token_bytes(pick);
      SchemaPrefix check(schema);
      EXPECT_TRUE(check.push(text)) << text;
    }
    if (c.state().complete()) {
      ++ended;
      // nlohmann::json refuses numbers past a double (5E310), which JSON's grammar allows: such
      // exponents are read as 0 for the check (the rest of the value is unchanged).
      const std::string readable = std::regex_replace(text, std::regex("([eE][+-]?)[0-9]{3,}"), "$010");
      const Json v = Json::parse(readable, nullptr, false);
      EXPECT_FALSE(v.is_discarded()) << text;
      EXPECT_TRUE(!v.is_discarded() && valid(v, s, s)) << text;
      EXPECT_TRUE(unique_keys(readable)) << text;
    }
  }
  return ended;
}

}  // namespace dsi::server::schema_test
