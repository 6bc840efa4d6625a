// Structured outputs (server/json_schema.h) that combine schemas: oneOf whose alternatives exclude
// each other, and allOf (and $ref beside other keywords) merged into one schema; each against the
// validator (test_json_schema_util.h) and walked through the mask.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_json_schema_util.h"

namespace dsi::server {
namespace {

using namespace schema_test;

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

// anyOf / oneOf beside other keywords: both hold, each alternative read with the rest (an object
// of declared properties that must have one of two keys; a oneOf whose alternatives exclude each
// other only once the rest's properties are in them).
TEST(JsonSchema, AlternativesBesideOtherKeywords) {
  const Json one_of_two = Json::parse(R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string"}},
                                          "additionalProperties":false,"anyOf":[{"required":["a"]},{"required":["b"]}]})");
  EXPECT_EQ(expect_the_validators(one_of_two, {R"({"a":1})", R"({"b":"x"})", R"({"a":1,"b":"x"})", "{}", R"({"c":1})",
                                               R"({"a":"x"})"}),
            3);
  EXPECT_FALSE(takes(one_of_two, "{}"));
  for (uint64_t seed : {71, 72}) EXPECT_GT(walks_that_end(one_of_two, seed, 20), 10);
  const Json kinds = Json::parse(R"({"type":"object","properties":{"kind":{"type":"string"},"n":{"type":"integer"}},
                                     "required":["kind"],
                                     "oneOf":[{"properties":{"kind":{"const":"one"}}},{"properties":{"kind":{"const":"two"}},"required":["n"]}]})");
  EXPECT_EQ(expect_the_validators(kinds, {R"({"kind":"one"})", R"({"kind":"two","n":2})", R"({"kind":"two"})", R"({"kind":"three"})",
                                          R"({"n":1})", R"({"kind":"one","n":"x"})"}),
            2);
  // Scalars: a string alternative with the rest's minLength, and the number alternative untouched
  // by it.
  EXPECT_EQ(expect_the_validators(Json::parse(R"({"anyOf":[{"type":"string"},{"type":"integer"}],"minLength":2,"maximum":5})"),
                                  {R"("ab")", R"("a")", "5", "6", "null"}),
            2);
  // Alternatives the rest leaves no value in are left out; none left: no value.
  EXPECT_EQ(expect_the_validators(Json::parse(R"({"type":"string","anyOf":[{"type":"integer"},{"maxLength":1}]})"),
                                  {R"("a")", R"("ab")", "1"}),
            1);
  EXPECT_NE(message(R"({"type":"string","anyOf":[{"type":"integer"},{"type":"null"}]})").find("none in common"), std::string::npos);
  // Both beside other keywords.
  EXPECT_EQ(expect_the_validators(Json::parse(R"({"type":["string","integer"],"anyOf":[{"minLength":2},{"minimum":0}],
                                                "oneOf":[{"type":"string"},{"type":"integer","maximum":10}]})"),
                                  {R"("ab")", R"("a")", "5", "11", "-1", "null"}),
            4);
  // A oneOf whose alternatives still overlap with the rest is refused, as alone.
  EXPECT_NE(message(R"({"type":"object","oneOf":[{"required":["a"]},{"required":["b"]}]})").find("may both match"),
            std::string::npos);
}

TEST(JsonSchema, WalksThroughMergedAllOfEndInValidValues) { EXPECT_GT(walks_that_end(named_thing(), 31, 30), 20); }

}  // namespace
}  // namespace dsi::server
