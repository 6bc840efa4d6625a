// Structured outputs (server/json_schema.h): the schema compiler's refusals, the recognizer against
// a validator written here from the JSON Schema text (values parsed by nlohmann::json), masks
// against JSON mode's recognizer for the schema {"type": "object"}, and seeded walks through the
// mask whose every ending validates.
#include <gtest/gtest.h>

#include <arpa/inet.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <functional>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dsinfer/error.h"
#include "server/constraints.h"
#include "server/json_schema.h"
#include "test_constraints_util.h"
#include "test_util.h"

namespace dsi::server {
namespace {

using Json = nlohmann::json;

// ---- A validator for the keywords the compiler takes (an independent reading of the standard).

size_t code_points(const std::string& s) {
  return size_t(std::count_if(s.begin(), s.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; }));
}

// The formats the compiler writes, read here from RFC 3339, RFC 4122 and RFC 791 (not through the
// compiler's patterns): a calendar date, a time with its offset, a UUID, a dotted IPv4 address,
// an e-mail address with a dotted domain.
bool valid_format(const std::string& format, const std::string& v) {
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

bool valid(const Json& v, const Json& s, const Json& root);

bool valid_type(const Json& v, const std::string& t) {
  if (t == "null") return v.is_null();
  if (t == "boolean") return v.is_boolean();
  if (t == "integer") return v.is_number_integer() || (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
  if (t == "number") return v.is_number();
  if (t == "string") return v.is_string();
  if (t == "array") return v.is_array();
  if (t == "object") return v.is_object();
  return false;
}

bool valid(const Json& v, const Json& s, const Json& root) {
  if (s.is_boolean()) return s.get<bool>();
  if (s.contains("$ref")) {  // (2020-12: beside other keywords, both hold)
    const std::string r = s["$ref"];
    if (!valid(v, root.at(Json::json_pointer(r.substr(1))), root)) return false;
  }
  if (s.contains("anyOf")) {
    for (const Json& alt : s["anyOf"])
      if (valid(v, alt, root)) return true;
    return false;
  }
  if (s.contains("oneOf")) {
    int matched = 0;
    for (const Json& alt : s["oneOf"]) matched += valid(v, alt, root);
    return matched == 1;
  }
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
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (props.contains(it.key())) {
        if (!valid(it.value(), props[it.key()], root)) return false;
      } else if (s.contains("additionalProperties") && !valid(it.value(), s["additionalProperties"], root)) {
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

// Whether the recognizer takes the whole text and calls it complete.
bool accepts(const Json& schema, const std::string& text) {
  SchemaPrefix p(JsonSchema::compile(schema));
  return p.push(text) && p.complete();
}

// Each text: the recognizer takes it whole exactly when the validator accepts it. Returns how many
// the validator accepts.
int expect_the_validators(const Json& s, const std::vector<std::string>& texts) {
  int valid_texts = 0;
  for (const std::string& t : texts) {
    SCOPED_TRACE(t);
    const Json v = Json::parse(t);
    valid_texts += valid(v, s, s);
    EXPECT_EQ(accepts(s, t), valid(v, s, s));
  }
  return valid_texts;
}

// The compiler's message for a schema it refuses; empty when it compiles.
std::string message(const char* schema) {
  try {
    JsonSchema::compile(Json::parse(schema));
  } catch (const dsi::Error& e) {
    return std::string(e.what());
  }
  return std::string();
}

const Json& person() {
  static const Json s = Json::parse(R"({
    "type": "object",
    "properties": {
      "name": {"type": "string", "minLength": 1, "maxLength": 8},
      "age": {"type": "integer"},
      "height": {"type": "number"},
      "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
      "role": {"enum": ["admin", "user", 7, null]},
      "boss": {"anyOf": [{"$ref": "#"}, {"type": "null"}]},
      "ok": {"type": "boolean"}
    },
    "required": ["name", "age"],
    "additionalProperties": false
  })");
  return s;
}

TEST(JsonSchema, AcceptsWhatTheValidatorAccepts) {
  const Json& s = person();
  const std::vector<std::string> texts = {
      R"({"name":"Ann","age":30})",
      R"({"age": -3, "name": "Bo"})",
      R"({"name":"Ann","age":30,"height":1.75e0,"tags":["a","b"],"role":"admin","ok":true})",
      R"({"name":"Ann","age":30,"role":7})",
      R"({"name":"Ann","age":30,"role":null})",
      R"({"name":"Ann","age":30,"boss":{"name":"Cy","age":50,"boss":null}})",
      R"({"name":"Ann","age":30,"tags":[]})",
      R"({"name":"\u00e9t\u00e9","age":1})",
      // Refused by both:
      R"({"name":"Ann"})",                                  // age is required
      R"({"name":"","age":1})",                             // minLength
      R"({"name":"Annabelle","age":1})",                    // maxLength (9)
      R"({"name":"Ann","age":1.5})",                        // an integer
      R"({"name":"Ann","age":1,"tags":["a","b","c"]})",     // maxItems
      R"({"name":"Ann","age":1,"role":"root"})",            // enum
      R"({"name":"Ann","age":1,"x":1})",                    // no other keys
      R"({"name":"Ann","age":1,"boss":{"name":"Cy"}})",     // the referenced schema's required
      R"({"name":"Ann","age":1,"ok":"yes"})",
      R"(["name"])",
  };
  EXPECT_EQ(expect_the_validators(s, texts), 8);
  // Texts the validator accepts in another spelling than the one generated: a repeated key, an
  // enum value not in its compact form, an escaped key.
  EXPECT_FALSE(accepts(s, R"({"name":"A","name":"B","age":1})"));
  EXPECT_FALSE(accepts(s, R"({"name":"A","age":1,"role":"\u0061dmin"})"));
  EXPECT_FALSE(accepts(s, R"({"n\u0061me":"A","age":1})"));
  // Prefixes: taken, not complete; a byte that cannot continue is refused and changes nothing.
  SchemaPrefix p(JsonSchema::compile(s));
  EXPECT_TRUE(p.push(std::string(R"({"name":"Ann","ag)")));
  EXPECT_FALSE(p.complete());
  EXPECT_FALSE(p.push('x'));  // no declared key starts "agx", and no other keys
  EXPECT_TRUE(p.push(std::string(R"(e":30})")));
  EXPECT_TRUE(p.complete());
  EXPECT_FALSE(p.push(' '));  // nothing after the value
}

TEST(JsonSchema, ScalarsTypeListsAndLiterals) {
  EXPECT_TRUE(accepts(Json::parse(R"({"type":"integer"})"), "-12"));
  EXPECT_FALSE(accepts(Json::parse(R"({"type":"integer"})"), "1.5"));
  EXPECT_TRUE(accepts(Json::parse(R"({"type":"number"})"), "1.5e-3"));
  EXPECT_TRUE(accepts(Json::parse(R"({"type":["string","null"]})"), "null"));
  EXPECT_TRUE(accepts(Json::parse(R"({"type":["string","null"]})"), "\"x\""));
  EXPECT_FALSE(accepts(Json::parse(R"({"type":["string","null"]})"), "true"));
  EXPECT_TRUE(accepts(Json::parse(R"({"enum":[1,12,"a b"]})"), "1"));
  EXPECT_TRUE(accepts(Json::parse(R"({"enum":[1,12,"a b"]})"), "12"));
  EXPECT_TRUE(accepts(Json::parse(R"({"enum":[1,12,"a b"]})"), "\"a b\""));
  EXPECT_FALSE(accepts(Json::parse(R"({"enum":[1,12,"a b"]})"), "123"));
  EXPECT_TRUE(accepts(Json::parse(R"({"type":"array","items":{"enum":[1,12]}})"), "[1,12,1]"));
  EXPECT_TRUE(accepts(Json::parse(R"({"const":{"a":[1,2]}})"), R"({"a":[1,2]})"));
  EXPECT_FALSE(accepts(Json::parse(R"({"const":{"a":[1,2]}})"), R"({"a": [1,2]})"));
  EXPECT_TRUE(accepts(Json::parse(R"({"type":"string","maxLength":2})"), "\"\\ud83d\\ude00\xc3\xa9\""));  // 2 code points
  EXPECT_FALSE(accepts(Json::parse(R"({"type":"string","maxLength":1})"), "\"\\ud83d\\ude00\xc3\xa9\""));
  EXPECT_TRUE(accepts(Json::parse(R"({"type":"array","minItems":1})"), "[{}]"));
  EXPECT_FALSE(accepts(Json::parse(R"({"type":"array","minItems":1})"), "[]"));
  EXPECT_FALSE(accepts(Json::parse(R"({"type":"array"})"), "[1,]"));
  EXPECT_TRUE(accepts(Json::parse(R"({"type":"object","additionalProperties":{"type":"integer"}})"), R"({"a":1,"b":2})"));
  EXPECT_FALSE(accepts(Json::parse(R"({"type":"object","additionalProperties":{"type":"integer"}})"), R"({"a":"x"})"));
  EXPECT_TRUE(accepts(Json::parse(R"({"$defs":{"n":{"type":"integer"}},"type":"array","items":{"$ref":"#/$defs/n"}})"), "[1,2]"));
}

// Alternatives that begin with the same byte are read side by side until one drops out: each
// goes on (none is lost when the readings are deduplicated), and the text is whole only when one
// of them is.
TEST(JsonSchema, ReadingsThatShareAStartGoOn) {
  const Json s = Json::parse(R"({"anyOf":[{"enum":["a"]},{"enum":["c"]},{"type":"string","maxLength":1}]})");
  EXPECT_TRUE(accepts(s, "\"c\""));
  EXPECT_TRUE(accepts(s, "\"x\""));
  EXPECT_FALSE(accepts(s, "\"xy\""));
  SchemaPrefix p(JsonSchema::compile(s));
  EXPECT_TRUE(p.push('"'));
  EXPECT_EQ(p.readings(), 3u);
  EXPECT_FALSE(p.complete());
  EXPECT_TRUE(p.push('a'));
  EXPECT_FALSE(p.complete());
  EXPECT_TRUE(accepts(Json::parse(R"({"properties":{"t":{"anyOf":[{"type":"string"},{"type":"string","maxLength":3}]}}})"),
                      R"({"t":"long enough"})"));
}

// Whitespace between tokens: a newline and two spaces of indent a level, no more.
TEST(JsonSchema, WhitespaceIsBoundedByDepth) {
  const Json s = Json::parse(R"({"type":"object","additionalProperties":{"type":"array"}})");
  EXPECT_TRUE(accepts(s, "{\n  \"a\": [\n    1,\n    2\n  ]\n}"));
  EXPECT_TRUE(accepts(s, "{ \"a\" : [ 1 , 2 ] }"));
  EXPECT_TRUE(accepts(s, "{\n   \"a\": [1]}"));       // 4 blank bytes at depth 1: at most 2 + 2
  EXPECT_FALSE(accepts(s, "{\n    \"a\": [1]}"));     // 5
  EXPECT_TRUE(accepts(s, "{\"a\": [\n     1]}"));      // 6 at depth 2
  EXPECT_FALSE(accepts(s, "{\"a\": [\n      1]}"));    // 7
  EXPECT_FALSE(accepts(s, " {}"));                       // none before the value
  SchemaPrefix wide(JsonSchema::compile(s), JsonPrefix::kMaxSpaceRun);
  EXPECT_TRUE(wide.push(std::string("{") + std::string(32, ' ') + "}"));
}

TEST(JsonSchema, RefusesWhatItCannotEnforce) {
  EXPECT_NE(message(R"x({"type":"string","pattern":"(?=a)"})x").find("#/pattern: the pattern's '(?' (lookaround"),
            std::string::npos);
  EXPECT_NE(message(R"({"type":"string","pattern":"^a{5}","maxLength":4})").find("at least 5 characters, above maxLength"),
            std::string::npos);
  EXPECT_NE(message(R"({"type":"string","pattern":1})").find("pattern: must be a string"), std::string::npos);
  EXPECT_NE(message(R"({"type":"string","pattern":"^a{1,3}$","minLength":4})").find("at most 3 characters, below minLength"),
            std::string::npos);
  EXPECT_NE(message(R"({"enum":["b"],"pattern":"^a"})").find("no value of 'enum'"), std::string::npos);
  EXPECT_NE(message(R"({"type":"object","propertyNames":{"maxLength":3}})").find("'propertyNames' is not supported"),
            std::string::npos);
  EXPECT_NE(message(R"({"type":"number","multipleOf":0.01})").find("only a whole number"), std::string::npos);
  EXPECT_NE(message(R"({"type":"number","multipleOf":0})").find("must be a number above 0"), std::string::npos);
  EXPECT_NE(message(R"({"type":"integer","multipleOf":4,"minimum":1,"maximum":3})").find("within its bounds"),
            std::string::npos);
  EXPECT_NE(message(R"({"type":"integer","minimum":"0"})").find("minimum: must be a finite number"), std::string::npos);
  Json infinite = Json::parse(R"({"type":"number"})");  // (only built, never parsed: JSON has no infinity)
  infinite["maximum"] = HUGE_VAL;
  EXPECT_THROW(
      try { JsonSchema::compile(infinite); } catch (const dsi::Error& e) {
        EXPECT_NE(std::string(e.what()).find("maximum: must be a finite number"), std::string::npos) << e.what();
        throw;
      },
      dsi::Error);
  EXPECT_NE(message(R"({"exclusiveMaximum":"1"})").find("finite number or a boolean"), std::string::npos);
  EXPECT_NE(message(R"({"exclusiveMinimum":true})").find("true without 'minimum'"), std::string::npos);
  EXPECT_NE(message(R"({"type":"integer","minimum":0.2,"maximum":0.8})").find("within its bounds"), std::string::npos);
  EXPECT_NE(message(R"({"type":"number","minimum":1,"exclusiveMaximum":1})").find("within its bounds"), std::string::npos);
  EXPECT_EQ(message(R"({"type":["number","null"],"minimum":1,"maximum":0})"), "");  // null still fits
  EXPECT_NE(message(R"({"properties":{"a":{"not":{}}}})").find("#/properties/a: 'not'"), std::string::npos);
  EXPECT_NE(message(R"({"type":"strin"})").find("unknown type"), std::string::npos);
  EXPECT_NE(message(R"({"required":["a"]})").find("not in 'properties'"), std::string::npos);
  EXPECT_NE(message(R"({"$ref":"#/$defs/none"})").find("points at nothing"), std::string::npos);
  EXPECT_NE(message(R"({"$ref":"http://x/y"})").find("inside the schema"), std::string::npos);
  EXPECT_NE(message(R"({"$ref":"#/$defs/a","type":"object"})").find("points at nothing"), std::string::npos);
  EXPECT_NE(message(R"({"anyOf":[{"type":"string"}],"minLength":1})").find("beside 'anyOf'"), std::string::npos);
  EXPECT_NE(message(R"({"enum":[]})").find("non-empty"), std::string::npos);
  EXPECT_NE(message(R"({"type":"integer","enum":["a"]})").find("no value of 'enum'"), std::string::npos);
  EXPECT_NE(message(R"({"properties":{"a\"b":{}}})").find("needs escapes"), std::string::npos);
  EXPECT_NE(message(R"(false)").find("accepts no value"), std::string::npos);
  EXPECT_NE(message(R"({"minItems":-1})").find("non-negative"), std::string::npos);
  EXPECT_EQ(message(R"({"type":"string","format":"date-time","title":"t","description":"d"})"), "");
  // A reference cycle with no value in between compiles, and accepts nothing rather than looping.
  EXPECT_EQ(message(R"({"$defs":{"a":{"$ref":"#/$defs/a"}},"$ref":"#/$defs/a"})"), "");
  EXPECT_FALSE(accepts(Json::parse(R"({"$defs":{"a":{"$ref":"#/$defs/a"}},"$ref":"#/$defs/a"})"), "1"));
}

// Inheritance as pydantic and OpenAPI write it: a base by reference, more properties beside.
const Json& named_thing() {
  static const Json s = Json::parse(R"({
    "$defs": {
      "Base": {"type": "object", "properties": {"id": {"type": "integer", "minimum": 1},
               "name": {"type": "string", "maxLength": 5}}, "required": ["id"]},
      "Named": {"properties": {"name": {"type": "string", "minLength": 2}}, "required": ["name"]}},
    "allOf": [{"$ref": "#/$defs/Base"}, {"$ref": "#/$defs/Named"},
              {"properties": {"id": true, "name": {}, "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]},
               "maxItems": 2}}, "additionalProperties": false}],
    "description": "a named thing"})");
  return s;
}

// allOf of several schemas, and $ref beside other keywords: merged into one schema that accepts what
// each of them accepts (the validator checks each schema on its own).
TEST(JsonSchema, AllOfIsEverySchemaAtOnce) {
  const Json& inherited = named_thing();
  EXPECT_EQ(expect_the_validators(inherited, {R"({"id":1,"name":"Al"})", R"({"id":1,"name":"Al","tags":["a"]})",
                                              R"({"id":0,"name":"Al"})", R"({"id":1,"name":"A"})",
                                              R"({"id":1,"name":"Alfred"})", R"({"id":1})", R"({"name":"Al"})",
                                              R"({"id":1,"name":"Al","tags":["a","b","c"]})",
                                              R"({"id":1,"name":"Al","x":1})", R"({"id":1.5,"name":"Al"})"}),
            2);
  // A key one schema declares and another's additionalProperties: false leaves out is no key.
  EXPECT_EQ(expect_the_validators(Json::parse(R"({"allOf": [{"properties": {"a": {}}, "additionalProperties": false},
                                                          {"properties": {"b": {}}}]})"),
                                  {R"({"a":1})", R"({})", R"({"b":1})", R"({"a":1,"b":2})"}),
            2);
  // $ref beside keywords; types, enum values and bounds of both.
  EXPECT_EQ(expect_the_validators(Json::parse(R"({"$defs": {"N": {"type": ["integer", "string"]}}, "$ref": "#/$defs/N",
                                                "enum": [0, 1, "x", 2.5, null], "minimum": 1})"),
                                  {"1", R"("x")", "0", "2.5", "null"}),
            2);
  // Alternatives on both sides: every pair (types that do not apply leave their keywords idle).
  EXPECT_EQ(expect_the_validators(
                Json::parse(R"({"allOf": [{"anyOf": [{"type": "string", "maxLength": 3}, {"type": "integer"}]},
                                         {"anyOf": [{"minLength": 2}, {"maximum": 10}]}]})"),
                {R"("a")", R"("abcd")", "50", "1.5", "null", "7"}),
            3);
  // Items of both; multipleOf of both (their least common multiple); counts of both.
  EXPECT_EQ(expect_the_validators(Json::parse(R"({"type": "array", "allOf": [{"items": {"type": "integer", "multipleOf": 2}},
                                                {"items": {"multipleOf": 3}, "minItems": 1}]})"),
                                  {"[6,12]", "[0]", "[]", "[4]", "[9]", "[6,7]"}),
            2);
  // A recursive property stays a reference; a reference back to itself through the merge is refused.
  const Json tree = Json::parse(R"({"$defs": {"T": {"allOf": [{"properties": {"c": {"$ref": "#/$defs/T"}}},
                                                             {"type": "object", "maxProperties": 1}]}},
                                    "$ref": "#/$defs/T"})");
  EXPECT_EQ(expect_the_validators(tree, {R"({"c":{"c":{}}})", R"({})", R"({"c":1})", "1", R"({"c":{},"d":1})"}), 2);
  EXPECT_NE(message(R"({"$defs": {"T": {"allOf": [{"$ref": "#/$defs/T"}, {"type": "object"}]}}, "$ref": "#/$defs/T"})")
                .find("refers back to itself"),
            std::string::npos);
  // What cannot be merged, or accepts nothing.
  EXPECT_NE(message(R"({"allOf": [{"type": "string", "pattern": "^a"}, {"pattern": "b$"}]})").find("'pattern' in two schemas"),
            std::string::npos);
  EXPECT_NE(message(R"({"allOf": [{"type": "string"}, {"type": "integer"}]})").find("none in common"), std::string::npos);
  EXPECT_NE(message(R"({"allOf": [{"enum": [1, 2]}, {"const": 3}]})").find("none in common"), std::string::npos);
  EXPECT_NE(message(R"({"allOf": [{"minimum": 1, "exclusiveMinimum": true}, {"minimum": 2}]})").find("draft 4's boolean"),
            std::string::npos);
  EXPECT_NE(message(R"({"allOf": [{"type": "string"}, false]})").find("the schema false"), std::string::npos);
  EXPECT_NE(message(R"({"allOf": []})").find("non-empty array"), std::string::npos);
}

// Numbers with bounds (and multipleOf): whole texts as the validator says (an exponent never: a
// bounded number is written without one), over integers, decimals and both drafts' exclusive
// forms; and no dead end: every prefix the recognizer takes can still end or take another byte.
TEST(JsonSchema, NumberBoundsAreTheValidators) {
  const std::vector<std::string> schemas = {
      R"({"type":"integer","minimum":-5,"maximum":120})",
      R"({"type":"integer","exclusiveMinimum":0,"exclusiveMaximum":100})",
      R"({"type":"number","minimum":0.5,"exclusiveMaximum":2.25})",
      R"({"type":"number","minimum":-1.5,"maximum":-1.25})",
      R"({"type":"integer","minimum":1000})",
      R"({"type":"number","maximum":-0.001})",
      R"({"type":"number","minimum":0,"maximum":10,"exclusiveMinimum":true})",
      R"({"type":["integer","null"],"minimum":3,"maximum":3})",
      R"({"type":"integer","minimum":10.5,"maximum":19.5})",
      R"({"enum":[1,5,"a",7.5],"minimum":2,"maximum":7})",
      R"({"type":"integer","multipleOf":7,"minimum":-30,"maximum":100})",
      R"({"type":"number","multipleOf":5})",
      R"({"type":"integer","multipleOf":3,"exclusiveMinimum":9})",
      R"({"enum":[3,4,6,"b"],"multipleOf":3})",
  };
  std::vector<std::string> texts = {"-0", "0.5", "0.49", "2.25", "2.2499", "1.25", "-1.25", "-1.3", "-1.5",
                                    "-1.51", "-1.2", "999", "1000", "10000", "-0.001", "-0.0011", "-0.0009",
                                    "0.0", "10.0", "10.5", "19.5", "1e2", "5e-1", "null", "\"a\"", "7.5", "3.0"};
  for (int i = -130; i <= 130; i += 3) texts.push_back(std::to_string(i));
  for (const std::string& schema : schemas) {
    SCOPED_TRACE(schema);
    const Json s = Json::parse(schema);
    for (const std::string& t : texts) {
      SCOPED_TRACE(t);
      // (An integer is written without a fraction, 3 and not 3.0, bounded or not.)
      const bool integers = s.contains("type") && s["type"].dump().find("number") == std::string::npos;
      // (An enum value is written in its compact form, 3 and not 3.0.)
      const bool spelled = t.find('e') == std::string::npos && !(integers && t.find('.') != std::string::npos) &&
                           (!s.contains("enum") || std::any_of(s["enum"].begin(), s["enum"].end(),
                                                                [&](const Json& e) { return e.dump() == t; }));
      EXPECT_EQ(accepts(s, t), valid(Json::parse(t), s, s) && spelled);
    }
    // Every prefix of up to 5 bytes the recognizer takes ends as a whole value within 6 more.
    const std::string alphabet = "0123456789-.enul";
    std::function<bool(const SchemaPrefix&, int)> ends = [&](const SchemaPrefix& p, int bytes) {
      if (p.complete()) return true;
      for (char c : alphabet) {
        SchemaPrefix q = p;
        if (bytes > 0 && q.push(static_cast<unsigned char>(c)) && ends(q, bytes - 1)) return true;
      }
      return false;
    };
    std::vector<std::pair<SchemaPrefix, std::string>> level = {{SchemaPrefix(JsonSchema::compile(s)), ""}};
    int taken = 0;
    for (int depth = 0; depth < 5 && !level.empty(); ++depth) {
      std::vector<std::pair<SchemaPrefix, std::string>> next;
      for (const auto& [p, text] : level) {
        EXPECT_TRUE(ends(p, 6)) << "no whole value after '" << text << "'";
        ++taken;
        for (char c : alphabet) {
          SchemaPrefix q = p;
          if (q.push(static_cast<unsigned char>(c))) next.emplace_back(q, text + c);
        }
      }
      level = std::move(next);
    }
    EXPECT_GT(taken, 1);
  }
}

using test::allowed;
using test::kjv_tokenizer;

// For {"type": "object"}, with JSON mode's whitespace limit, the schema's masks are JSON mode's,
// step for step along seeded walks.
TEST(JsonSchema, AnyObjectMasksAreJsonModes) {
  const Tokenizer& tok = kjv_tokenizer();
  const int64_t V = tok.vocab_size() + 1;
  const int32_t eos = int32_t(V - 1);
  const auto schema = JsonSchema::compile(Json::parse(R"({"type":"object"})"));
  std::mt19937_64 rng(7);
  int steps = 0;
  for (int walk = 0; walk < 12; ++walk) {
    JsonConstraint json(tok, {eos}, -1, -1, false);
    SchemaConstraint sc(tok, schema, {eos}, -1, -1, false, JsonPrefix::kMaxSpaceRun);
    std::string text;
    for (int step = 0; step < 120; ++step) {
      const std::vector<int32_t> ok = allowed(json, V);
      const std::vector<int32_t> ok2 = allowed(sc, V);
      if (ok != ok2) {
        std::string diff;
        for (int32_t id : ok)
          if (!std::binary_search(ok2.begin(), ok2.end(), id)) diff += " json-only:" + Json(*tok.token_bytes(id)).dump();
        for (int32_t id : ok2)
          if (!std::binary_search(ok.begin(), ok.end(), id)) diff += " schema-only:" + Json(id == eos ? "<eos>" : *tok.token_bytes(id)).dump();
        FAIL() << "walk " << walk << " step " << step << " after " << Json(text).dump() << ":" << diff.substr(0, 400);
      }
      ++steps;
      // Mostly structure, so the walks nest and close.
      std::vector<int32_t> structural;
      for (int32_t id : ok)
        if (id == eos || tok.token_bytes(id)->find_first_of("{}[]\":,0123456789tfn") != std::string::npos)
          structural.push_back(id);
      const std::vector<int32_t>& from = !structural.empty() && rng() % 3 != 0 ? structural : ok;
      const int32_t pick = from[std::uniform_int_distribution<size_t>(0, from.size() - 1)(rng)];
      if (pick == eos) break;
      json.accept(pick);
      sc.accept(pick);
      text += *tok.token_bytes(pick);
    }
  }
  EXPECT_GT(steps, 400);
}

// Seeded walks through a schema's mask on the bundled vocabulary: every step's text is a prefix
// the recognizer takes, and every walk that ends wrote a value the validator accepts.
// Inside a string of a schema the masks take the plain-text tokens at once only where the string
// has no maxLength; either way the mask is each token tried alone: a free string, a limited one
// (short of its limit, and at it), a string beside an enum of strings that share its start.
TEST(JsonSchema, MasksInsideStringsAreEachTokenTried) {
  const Tokenizer& tok = kjv_tokenizer();
  const int64_t V = tok.vocab_size() + 1;
  const int32_t eos = int32_t(V - 1);
  const auto schema = JsonSchema::compile(Json::parse(R"({"type": "object", "properties": {
      "free": {"type": "string"}, "short": {"type": "string", "maxLength": 3},
      "either": {"anyOf": [{"enum": ["Moses", "Aaron"]}, {"type": "string", "maxLength": 6}]},
      "or": {"anyOf": [{"enum": ["Moses"]}, {"type": "string"}]}}})"));
  for (const std::string& text : {std::string(R"({"free": "Mo)"), std::string(R"({"short": "a)"),
                                  std::string(R"({"short": "abc)"), std::string(R"({"either": "Mo)"),
                                  std::string(R"({"or": "Mo)"), std::string("{\"free\": \"\xC3")}) {
    SchemaConstraint c(tok, schema, {eos}, -1, -1, false);
    for (unsigned char b : text) c.accept(test::byte_token(tok, b));  // a token a byte
    test::expect_mask_is_each_token(c, tok, V, eos, text);
  }
}

// Masks where numbers have bounds (each state keeps the number's bytes in its signature): each
// token tried alone, at the start of a number, inside one, and where only its end may come.
TEST(JsonSchema, MasksInsideBoundedNumbersAreEachTokenTried) {
  const Tokenizer& tok = kjv_tokenizer();
  const int64_t V = tok.vocab_size() + 1;
  const int32_t eos = int32_t(V - 1);
  const auto schema = JsonSchema::compile(Json::parse(R"({"type": "object", "properties": {
      "n": {"type": "number", "minimum": -2.5, "maximum": 40},
      "k": {"type": "integer", "exclusiveMinimum": 10, "maximum": 999}}})"));
  for (const std::string& prefix : {std::string(R"({"n": )"), std::string(R"({"n": -)"), std::string(R"({"n": -2.)"),
                                    std::string(R"({"n": 4)"), std::string(R"({"n": 40)"), std::string(R"({"k": 1)"),
                                    std::string(R"({"k": 99)"), std::string(R"({"k": 999)"), std::string(R"({"n": 0)")}) {
    SchemaConstraint p(tok, schema, {eos}, -1, -1, false);
    for (int32_t id : tok.encode(prefix)) p.accept(id);
    test::expect_mask_is_each_token(p, tok, V, eos, prefix);
  }
}

// Seeded walks through the schema's mask: each step's mask is each token tried alone and its text
// a prefix the recognizer takes; returns how many walks wrote a whole value, each of which the
// validator must accept.
int walks_that_end(const Json& s, uint64_t seed, int walks) {
  const Tokenizer& tok = kjv_tokenizer();
  const int64_t V = tok.vocab_size() + 1;
  const int32_t eos = int32_t(V - 1);
  const auto schema = JsonSchema::compile(s);
  std::mt19937_64 rng(seed);
  int ended = 0;
  for (int walk = 0; walk < walks; ++walk) {
    SchemaConstraint c(tok, schema, {eos}, -1, -1, false);
    std::string text;
    for (int step = 0; step < 300; ++step) {
      const std::vector<int32_t> ok = allowed(c, V);
      const std::string shown = Json(text).dump(-1, ' ', false, Json::error_handler_t::replace);
      EXPECT_FALSE(ok.empty()) << shown;
      EXPECT_EQ(ok, test::each_token(c.state(), tok, V, eos)) << shown;
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
    }
  }
  return ended;
}

TEST(JsonSchema, WalksThroughTheMaskEndInValidValues) { EXPECT_GT(walks_that_end(person(), 3, 30), 20); }

const Json& patterned() {
  static const Json s = Json::parse(R"({
    "type": "object",
    "properties": {
      "zip": {"type": "string", "pattern": "^\\d{5}(-\\d{4})?$"},
      "code": {"type": "string", "pattern": "^[A-Z]{2}[0-9]+$", "maxLength": 4},
      "word": {"type": "string", "pattern": "^[A-Z]"},
      "pick": {"enum": ["ab", "abc", "b", 1], "pattern": "^a", "minLength": 3},
      "any": {"type": ["string", "integer"], "pattern": "^x"}
    },
    "required": ["zip", "code"],
    "additionalProperties": false
  })");
  return s;
}

// Patterns: whole texts as the validator says (escapes decoded first), enum values filtered by the
// pattern and lengths, a pattern beside maxLength.
TEST(JsonSchema, PatternsAreTheValidators) {
  const Json& s = patterned();
  const std::vector<std::string> texts = {
      R"({"zip":"12345","code":"AB1"})",
      R"({"zip":"12345-6789","code":"XY99"})",
      R"({"zip":"\u00312345","code":"A\u00421"})",
      R"({"zip":"12345","code":"AB1","word":"In the beginning"})",
      R"({"zip":"12345","code":"AB1","pick":"abc"})",
      R"({"zip":"12345","code":"AB1","any":"xyz"})",
      R"({"zip":"12345","code":"AB1","any":-4})",
      R"({"zip":"12345","code":"AB1","pick":1})",
      R"({"zip":"1234","code":"AB1"})",
      R"({"zip":"12345-","code":"AB1"})",
      R"({"zip":"123456","code":"AB1"})",
      R"({"zip":"12345","code":"AB"})",
      R"({"zip":"12345","code":"AB123"})",
      R"({"zip":"12345","code":"ab1"})",
      R"({"zip":"12345","code":"AB1","word":"in the beginning"})",
      R"({"zip":"12345","code":"AB1","pick":"ab"})",
      R"({"zip":"12345","code":"AB1","pick":"b"})",
      R"({"zip":"12345","code":"AB1","any":"yx"})",
  };
  EXPECT_EQ(expect_the_validators(s, texts), 8);
  // A string that could still match takes more; one that cannot is refused at the byte.
  SchemaPrefix p(JsonSchema::compile(s));
  EXPECT_TRUE(p.push(std::string(R"({"zip":"123)")));
  EXPECT_FALSE(p.push('a'));
  EXPECT_FALSE(p.push('"'));
  EXPECT_TRUE(p.push(std::string(R"(45\u002)")));  // an escape half-way: the pattern steps at its end
  EXPECT_FALSE(p.push('a'));                       // \u002a is '*'
  EXPECT_TRUE(p.push(std::string(R"(d1234")")));  // \u002d is '-'
  // A pattern beside minLength: a string the pattern could only end too short is refused early.
  const Json lengths = Json::parse(R"({"type":"string","pattern":"^(a|bbbb|c+)$","minLength":2})");
  EXPECT_TRUE(accepts(lengths, R"("bbbb")"));
  EXPECT_TRUE(accepts(lengths, R"("cc")"));
  EXPECT_FALSE(accepts(lengths, R"("c")"));
  SchemaPrefix q(JsonSchema::compile(lengths));
  EXPECT_TRUE(q.push('"'));
  EXPECT_FALSE(q.push('a'));  // "a" is the pattern's only string that starts so, and it is one character
  EXPECT_TRUE(q.push('b'));
}

// Masks inside patterned strings, each token tried alone: at a string's start, within it, where
// only its end may come, half-way through a character and through an escape.
TEST(JsonSchema, MasksInsidePatternedStringsAreEachTokenTried) {
  const Tokenizer& tok = kjv_tokenizer();
  const int64_t V = tok.vocab_size() + 1;
  const int32_t eos = int32_t(V - 1);
  const auto schema = JsonSchema::compile(patterned());
  for (const std::string& text : {std::string(R"({"zip": ")"), std::string(R"({"zip": "12)"),
                                  std::string(R"({"zip": "12345)"), std::string(R"({"zip": "12345-678)"),
                                  std::string(R"({"code": "AB)"), std::string(R"({"code": "AB12)"),
                                  std::string(R"({"word": ")"), std::string(R"({"word": "The end)"),
                                  std::string(R"({"zip": "\u003)"), std::string("{\"word\": \"\xC3")}) {
    SchemaConstraint c(tok, schema, {eos}, -1, -1, false);
    for (unsigned char b : text) c.accept(test::byte_token(tok, b));  // a token a byte
    test::expect_mask_is_each_token(c, tok, V, eos, text);
  }
}

const Json& pets() {
  static const Json s = Json::parse(R"({
    "$defs": {
      "cat": {"type": "object", "properties": {"kind": {"const": "cat"}, "lives": {"type": "integer", "minimum": 0, "maximum": 9}},
              "required": ["kind", "lives"], "additionalProperties": false},
      "dog": {"type": "object", "properties": {"kind": {"const": "dog"}, "good": {"type": "boolean"}},
              "required": ["kind"], "additionalProperties": false}
    },
    "type": "object",
    "properties": {
      "pet": {"oneOf": [{"$ref": "#/$defs/cat"}, {"$ref": "#/$defs/dog"}], "discriminator": {"propertyName": "kind"}},
      "id": {"oneOf": [{"type": "string", "maxLength": 4}, {"type": "integer"}, {"type": "null"}]},
      "size": {"oneOf": [{"type": "number", "maximum": 1}, {"type": "number", "exclusiveMinimum": 1}]},
      "tag": {"oneOf": [{"enum": ["a", "b"]}, {"enum": ["c"]}, {"type": "integer"}]}
    },
    "required": ["pet"],
    "additionalProperties": false
  })");
  return s;
}

// oneOf where the alternatives exclude each other (a discriminator, types, bounds, enum values) is
// anyOf; where they may overlap it is refused, with the two alternatives named.
TEST(JsonSchema, OneOfOfAlternativesThatExcludeEachOther) {
  const Json& s = pets();
  const std::vector<std::string> texts = {
      R"({"pet":{"kind":"cat","lives":9}})",
      R"({"pet":{"kind":"dog"},"id":"ab12","size":1,"tag":"c"})",
      R"({"pet":{"kind":"dog","good":true},"id":7,"size":1.5,"tag":3})",
      R"({"pet":{"kind":"cat"}})",
      R"({"pet":{"kind":"dog","lives":1}})",
      R"({"pet":{"kind":"cow"}})",
      R"({"pet":{"kind":"dog"},"id":"abcde"})",
      R"({"pet":{"kind":"dog"},"tag":"d"})",
      R"({"pet":{"kind":"dog"},"id":1.5})",
  };
  EXPECT_EQ(expect_the_validators(s, texts), 3);
  for (const char* overlapping : {
           R"({"oneOf":[{"type":"number"},{"type":"integer"}]})",
           R"({"oneOf":[{"type":"number","maximum":1},{"type":"number","minimum":1}]})",
           R"({"oneOf":[{"enum":[1.0]},{"enum":[1,2]}]})",
           R"({"oneOf":[{"enum":[1]},{"type":"number","minimum":0}]})",
           R"({"oneOf":[{"type":"object"},{"type":"object","properties":{"a":{}},"required":["a"]}]})",
           R"({"oneOf":[{"type":"string","maxLength":3},{"type":"string","pattern":"^a"}]})",
           R"({"properties":{"p":{"oneOf":[{"type":"object","properties":{"k":{"enum":["x","y"]}},"required":["k"]},
                                            {"type":"object","properties":{"k":{"const":"y"}},"required":["k"]}]}}})"}) {
    const std::string m = message(overlapping);
    EXPECT_NE(m.find("may both match a value"), std::string::npos) << overlapping << ": " << m;
  }
  EXPECT_NE(message(R"({"properties":{"p":{"oneOf":[{"type":"null"},{"type":"string"},{"type":["null","integer"]}]}}})")
                .find("#/properties/p/oneOf: alternatives 0 and 2"),
            std::string::npos);
  EXPECT_EQ(message(R"({"oneOf":[{"enum":["a"]},{"type":"string","pattern":"^b"}]})"), "");
  EXPECT_EQ(message(R"({"oneOf":[{"type":"object","properties":{"a":{"type":"string"}},"required":["a"]},
                                 {"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]}]})"), "");
}

TEST(JsonSchema, WalksThroughOneOfEndInValidValues) { EXPECT_GT(walks_that_end(pets(), 11, 30), 20); }

const Json& tuples() {
  static const Json s = Json::parse(R"({
    "type": "object",
    "properties": {
      "point": {"type": "array", "prefixItems": [{"type": "number"}, {"type": "number"}], "items": false},
      "row": {"type": "array", "prefixItems": [{"type": "string", "maxLength": 5}, {"type": "integer"}],
              "items": {"type": "boolean"}, "maxItems": 4},
      "old": {"type": "array", "items": [{"const": "v"}, {"type": "null"}], "additionalItems": false, "minItems": 1},
      "meta": {"type": "object", "properties": {"k": {"type": "boolean"}}, "minProperties": 1, "maxProperties": 2,
               "additionalProperties": {"type": "integer"}},
      "set": {"type": "array", "items": {"enum": ["x", "y", 7]}, "uniqueItems": true},
      "names": {"type": "array", "items": {"type": "string", "maxLength": 3}, "uniqueItems": true, "maxItems": 4},
      "nums": {"type": "array", "items": {"type": "number"}, "uniqueItems": true}
    },
    "required": ["point"],
    "additionalProperties": false
  })");
  return s;
}

// Tuples: prefixItems and the items after them (none, or a schema), and draft 7's spelling;
// unique items; objects' minProperties and maxProperties.
TEST(JsonSchema, TuplesAndPropertyCountsAreTheValidators) {
  const Json& s = tuples();
  const std::vector<std::string> texts = {
      R"({"point":[1,2.5]})",
      R"({"point":[1,2],"row":["ab"]})",
      R"({"point":[1,2],"row":["ab",3,true,false]})",
      R"({"point":[1,2],"old":["v",null]})",
      R"({"point":[1,2],"old":["v"]})",
      R"({"point":[1]})",
      R"({"point":[1,2],"row":["ab",3,true,false,true]})",
      R"({"point":[1,2,3]})",
      R"({"point":[1,"2"]})",
      R"({"point":[1,2],"row":[3]})",
      R"({"point":[1,2],"row":["ab",3,4]})",
      R"({"point":[1,2],"row":["abcdef"]})",
      R"({"point":[1,2],"old":["v",null,1]})",
      R"({"point":[1,2],"old":[]})",
      R"({"point":[1,2],"meta":{"k":true}})",
      R"({"point":[1,2],"meta":{"x":1,"k":false}})",
      R"({"point":[1,2],"meta":{}})",
      R"({"point":[1,2],"meta":{"x":1,"y":2,"k":true}})",
      R"({"point":[1,2],"meta":{"x":1,"y":2,"z":3}})",
      R"({"point":[1,2],"set":["x","y",7],"names":["a","b"],"nums":[1,2.5]})",
      R"({"point":[1,2],"set":["x","x"]})",
      R"({"point":[1,2],"names":["a","a"]})",
      R"({"point":[1,2],"nums":[1,1.0]})",
      R"({"point":[1,2],"set":[7,"x",7]})",
  };
  EXPECT_EQ(expect_the_validators(s, texts), 9);  // (point [1] is valid: prefixItems does not ask for the items)
  // Unique items: once every distinct item is written, no ',' comes.
  SchemaPrefix p(JsonSchema::compile(s));
  EXPECT_TRUE(p.push(std::string(R"({"point":[1,2],"set":["y",7,"x")")));
  EXPECT_FALSE(p.push(','));
  EXPECT_TRUE(p.push(']'));
  // A string item at its maxLength that would repeat one is refused at its last character; a
  // number, at the byte after it (1.0 repeats 1).
  EXPECT_TRUE(p.push(std::string(R"(,"names":["abc","ab)")));
  EXPECT_FALSE(p.push('c'));
  EXPECT_TRUE(p.push(std::string(R"(d"],"nums":[1,1.0)")));
  EXPECT_FALSE(p.push(']'));
  EXPECT_TRUE(p.push(std::string("1]}")));
  EXPECT_TRUE(p.complete());
  SchemaPrefix q(JsonSchema::compile(s));  // an enum item that could only repeat one, at its first byte
  EXPECT_TRUE(q.push(std::string(R"({"point":[1,2],"set":[7,)")));
  EXPECT_FALSE(q.push('7'));
  EXPECT_TRUE(q.push('"'));
  EXPECT_NE(message(R"({"prefixItems":[{}],"items":false,"minItems":2})").find("above the 1 items"), std::string::npos);
  EXPECT_NE(message(R"({"prefixItems":[{}],"items":[{}]})").find("beside 'prefixItems'"), std::string::npos);
  EXPECT_NE(message(R"({"prefixItems":{}})").find("#/prefixItems: must be an array"), std::string::npos);
  EXPECT_NE(message(R"({"properties":{"a":{}},"additionalProperties":false,"minProperties":2})").find("above the 1 properties"),
            std::string::npos);
  EXPECT_NE(message(R"({"properties":{"a":{},"b":{}},"required":["a","b"],"maxProperties":1})").find("more properties are required"),
            std::string::npos);
  EXPECT_NE(message(R"({"minProperties":3,"maxProperties":2})").find("maxProperties is below"), std::string::npos);
  EXPECT_NE(message(R"({"items":{"type":"object"},"uniqueItems":true})").find("every item is a scalar"), std::string::npos);
  EXPECT_NE(message(R"({"type":"array","uniqueItems":true})").find("every item is a scalar"), std::string::npos);
  EXPECT_NE(message(R"({"items":{"type":"boolean"},"uniqueItems":true,"minItems":3})").find("above the 2 distinct"),
            std::string::npos);
  EXPECT_EQ(message(R"({"type":"array","uniqueItems":false})"), "");
}

TEST(JsonSchema, WalksThroughTuplesEndInValidValues) { EXPECT_GT(walks_that_end(tuples(), 23, 30), 20); }

const Json& formats() {
  static const Json s = Json::parse(R"({
    "type": "object",
    "properties": {
      "d": {"type": "string", "format": "date"},
      "t": {"type": "string", "format": "time"},
      "dt": {"type": "string", "format": "date-time"},
      "u": {"type": "string", "format": "uuid"},
      "ip": {"type": "string", "format": "ipv4"},
      "e": {"type": "string", "format": "email"},
      "h": {"type": "string", "format": "hostname"},
      "p": {"type": "string", "format": "date", "pattern": "^x"}
    },
    "required": ["d", "dt", "u", "ip", "e"],
    "additionalProperties": false
  })");
  return s;
}

// Formats: what the compiler writes for each (a pattern of the whole string, the schema's own
// pattern first where both are given), against the formats as read here; unknown ones are free.
TEST(JsonSchema, FormatsAreWrittenAsCheckersReadThem) {
  const Json& s = formats();
  const std::string base = R"({"d":"2024-02-28","dt":"1999-12-31T23:59:59.5+01:00","u":"123e4567-e89b-12d3-a456-426614174000","ip":"10.0.255.1","e":"ann.lee@mail.example.org")";
  const std::vector<std::string> texts = {
      base + "}",
      base + R"(,"t":"07:30:00Z","h":"any thing","p":"xyz"})",
      R"({"d":"2023-02-30","dt":"1999-12-31T23:59:59Z","u":"123e4567-e89b-12d3-a456-426614174000","ip":"1.2.3.4","e":"a@b.co"})",
      R"({"d":"2023-04-31","dt":"1999-12-31T23:59:59Z","u":"123e4567-e89b-12d3-a456-426614174000","ip":"1.2.3.4","e":"a@b.co"})",
      base + R"(,"t":"24:00:00Z"})",
      base + R"(,"t":"07:30:00"})",
      R"({"d":"2024-01-01","dt":"1999-12-31 23:59:59Z","u":"123e4567-e89b-12d3-a456-426614174000","ip":"1.2.3.4","e":"a@b.co"})",
      R"({"d":"2024-01-01","dt":"1999-12-31T23:59:59Z","u":"123e4567e89b12d3a456426614174000","ip":"1.2.3.4","e":"a@b.co"})",
      R"({"d":"2024-01-01","dt":"1999-12-31T23:59:59Z","u":"123e4567-e89b-12d3-a456-426614174000","ip":"1.2.3.256","e":"a@b.co"})",
      R"({"d":"2024-01-01","dt":"1999-12-31T23:59:59Z","u":"123e4567-e89b-12d3-a456-426614174000","ip":"1.2.3.4","e":"a.b.co"})",
  };
  EXPECT_EQ(expect_the_validators(s, texts), 2);
  EXPECT_FALSE(accepts(s, base + R"(,"p":"2024-01-01"})"));  // the pattern, not the format
}

TEST(JsonSchema, WalksThroughFormatsEndInValidValues) { EXPECT_GT(walks_that_end(formats(), 29, 30), 20); }

TEST(JsonSchema, WalksThroughPatternsEndInValidValues) { EXPECT_GT(walks_that_end(patterned(), 5, 30), 20); }

TEST(JsonSchema, WalksThroughMergedAllOfEndInValidValues) { EXPECT_GT(walks_that_end(named_thing(), 31, 30), 20); }

}  // namespace
}  // namespace dsi::server
