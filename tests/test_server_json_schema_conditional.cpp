// Structured outputs (server/json_schema.h): if / then / else, where if is a type, const or enum
// of scalars (or an anyOf of such), or an object's properties of such with required; and a
// property whose schema is false (the key never comes). Against the validator
// (test_json_schema_util.h, which reads if / then / else as the standard does), with the
// compiler's messages, and walked through the mask.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_json_schema_util.h"

namespace dsi::server {
namespace {

using namespace schema_test;

// A scalar if: strings take then, other values else.
TEST(JsonSchemaConditional, ScalarIf) {
  const Json s = Json::parse(
      R"({"type":["string","integer"],"if":{"type":"string"},"then":{"maxLength":2},"else":{"minimum":10}})");
  EXPECT_EQ(expect_the_validators(s, {R"("ab")", R"("abc")", R"("")", "12", "5", "10"}), 4);
  EXPECT_FALSE(takes(s, R"("abc)"));
  EXPECT_TRUE(takes(s, "5"));  // (it can still become 50)
  for (uint64_t seed : {1, 2, 3}) EXPECT_GT(walks_that_end(s, seed, 20), 0);
  // A const if: the value 0 takes then (false: never), others else.
  const Json zero = Json::parse(R"({"type":"integer","minimum":0,"maximum":3,"if":{"const":0},"then":false})");
  EXPECT_EQ(expect_the_validators(zero, {"0", "1", "3"}), 2);
  EXPECT_FALSE(takes(zero, "0"));
}

// The discriminated union of JSON Schema's documents: kind says which other property is required.
TEST(JsonSchemaConditional, Discriminator) {
  const Json s = Json::parse(R"({
    "type":"object",
    "properties":{"kind":{"enum":["circle","square"]},"r":{"type":"number"},"side":{"type":"number"}},
    "required":["kind"],"additionalProperties":false,
    "if":{"properties":{"kind":{"const":"circle"}}},
    "then":{"required":["r"]},
    "else":{"required":["side"]}})");
  EXPECT_EQ(expect_the_validators(s, {R"({"kind":"circle","r":1})", R"({"kind":"circle"})", R"({"kind":"square","side":2})",
                                      R"({"kind":"square","r":1})", R"({"kind":"square","side":1,"r":2})",
                                      R"({"r":1,"kind":"circle"})", R"({"side":1,"kind":"circle","r":0})",
                                      R"({"side":1})"}),
            5);
  EXPECT_FALSE(takes(s, R"({"kind":"circle"})"));  // (r must come first)
  EXPECT_TRUE(takes(s, R"({"kind":"circle",)"));
  EXPECT_FALSE(takes(s, R"({"kind":"square","r":1})"));
  EXPECT_TRUE(takes(s, R"({"side":1,"kind":"circle")"));  // (then r can still come)
  for (uint64_t seed : {4, 5, 6}) EXPECT_GT(walks_that_end(s, seed, 20), 0);
  // The same with kind required in if too: the rest requires it anyway, so not-if never lacks it.
  Json both = s;
  both["if"]["required"] = Json::array({"kind"});
  EXPECT_EQ(message(both.dump().c_str()), "");
  EXPECT_EQ(expect_the_validators(both, {R"({"kind":"circle","r":1})", R"({"kind":"circle"})", R"({"kind":"square","side":2})"}),
            2);
}

// An if of required names: where a is written, b must be too.
TEST(JsonSchemaConditional, RequiredIf) {
  const Json s = Json::parse(R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"}},
    "additionalProperties":false,"if":{"required":["a"]},"then":{"required":["b"]}})");
  EXPECT_EQ(expect_the_validators(s, {"{}", R"({"a":1})", R"({"a":1,"b":2})", R"({"b":2})", R"({"b":2,"a":1})"}), 4);
  EXPECT_FALSE(takes(s, R"({"a":1})"));
  for (uint64_t seed : {7, 8}) EXPECT_GT(walks_that_end(s, seed, 20), 0);
  // With type object in if: values that are no object take else.
  const Json typed = Json::parse(R"({"type":["object","integer"],"properties":{"a":{"type":"integer"}},
    "if":{"type":"object","required":["a"]},"then":{"maxProperties":1},"else":{"type":"object"}})");
  EXPECT_EQ(expect_the_validators(typed, {"{}", R"({"a":1})", R"({"a":1,"b":2})", "3"}), 2);
}

// if true / false, then / else without if, and if without then or else (they say nothing).
TEST(JsonSchemaConditional, ConstantIf) {
  EXPECT_EQ(expect_the_validators(Json::parse(R"({"type":"integer","if":{"minimum":1}})"), {"0", "1"}), 2);
  // Inside an anyOf, a branch that takes no value leaves the alternative out.
  EXPECT_EQ(expect_the_validators(Json::parse(R"({"anyOf":[{"type":"string"},{"if":true,"then":false}]})"), {R"("a")", "1"}), 1);
  EXPECT_EQ(expect_the_validators(Json::parse(R"({"anyOf":[{"type":"string"},{"not":{}}]})"), {R"("a")", "1"}), 1);
  // An if property of annotations only takes every value.
  EXPECT_EQ(expect_the_validators(Json::parse(R"({"if":{"properties":{"a":{"description":"d"}}},"then":{"type":"object"}})"),
                                  {"{}", "1"}),
            1);
  EXPECT_EQ(expect_the_validators(Json::parse(R"({"if":true,"then":{"type":"string"},"else":{"type":"integer"}})"),
                                  {R"("a")", "1"}),
            1);
  EXPECT_EQ(expect_the_validators(Json::parse(R"({"if":false,"then":{"type":"string"},"else":{"type":"integer"}})"),
                                  {R"("a")", "1"}),
            1);
  EXPECT_EQ(expect_the_validators(Json::parse(R"({"type":"integer","then":{"minimum":5},"else":{"maximum":0}})"), {"1"}), 1);
}

// Inside allOf, a property's schema and a recursive definition.
TEST(JsonSchemaConditional, Nested) {
  const Json s = Json::parse(R"({
    "type":"object","required":["items"],"additionalProperties":false,
    "properties":{"items":{"type":"array","maxItems":3,"items":{"$ref":"#/$defs/item"}}},
    "$defs":{"item":{"allOf":[
      {"type":"object","properties":{"t":{"enum":["n","s"]},"v":{}},"required":["t","v"],"additionalProperties":false},
      {"if":{"properties":{"t":{"const":"n"}}},"then":{"properties":{"v":{"type":"integer"}}},
       "else":{"properties":{"v":{"type":"string","maxLength":3}}}}]}}})");
  EXPECT_EQ(expect_the_validators(s, {R"({"items":[{"t":"n","v":1},{"t":"s","v":"ab"}]})", R"({"items":[{"t":"n","v":"1"}]})",
                                      R"({"items":[{"t":"s","v":2}]})", R"({"items":[]})"}),
            2);
  EXPECT_FALSE(takes(s, R"({"items":[{"t":"n","v":")"));
  EXPECT_FALSE(takes(s, R"({"items":[{"t":"s","v":1)"));
  for (uint64_t seed : {9, 10}) EXPECT_GT(walks_that_end(s, seed, 20), 0);
}

// dependentSchemas (draft 7: dependencies whose values are schemas): where its key is written, the
// object takes its schema too, as an if of that required name.
TEST(JsonSchemaConditional, DependentSchemas) {
  const Json s = Json::parse(R"({"type":"object","additionalProperties":false,
    "properties":{"card":{"type":"string","maxLength":4},"billing":{"type":"string","maxLength":4},"cvc":{"type":"integer"}},
    "dependentSchemas":{"card":{"required":["billing"],"properties":{"cvc":{"minimum":100,"maximum":999}}}}})");
  EXPECT_EQ(expect_the_validators(s, {"{}", R"({"card":"1"})", R"({"card":"1","billing":"x"})", R"({"billing":"x"})",
                                      R"({"card":"1","billing":"x","cvc":5})", R"({"cvc":5})", R"({"cvc":123,"card":"1","billing":"y"})"}),
            5);
  EXPECT_FALSE(takes(s, R"({"card":"1"})"));
  EXPECT_FALSE(takes(s, R"({"card":"1","cvc":1000)"));  // (past 999 once card is written)
  EXPECT_TRUE(takes(s, R"({"cvc":1000)"));
  EXPECT_FALSE(takes(s, R"({"cvc":1000,"card")"));
  for (uint64_t seed : {12, 13, 14}) EXPECT_GT(walks_that_end(s, seed, 20), 0);
  // Draft 7's spelling, beside a list of names; and a dependency on a name the object requires anyway.
  const Json draft7 = Json::parse(R"({"type":"object","properties":{"a":{},"b":{},"c":{"type":"integer"}},"required":["a"],
    "dependencies":{"a":{"properties":{"c":{"maximum":1}}},"b":["c"]}})");
  EXPECT_EQ(expect_the_validators(draft7, {R"({"a":1})", R"({"a":1,"c":2})", R"({"a":1,"c":0})", R"({"a":1,"b":1})",
                                           R"({"a":1,"b":1,"c":1})", R"({"b":1,"c":1})"}),
            3);
  // A dependency holds of objects only: other values take none, even a false one.
  const Json untyped = Json::parse(R"({"dependentSchemas":{"a":false},"properties":{"a":{},"b":{}}})");
  EXPECT_EQ(expect_the_validators(untyped, {"1", R"("s")", "{}", R"({"a":1})", R"({"b":1})"}), 4);
}

// A property whose schema is false never comes (alone, and through an allOf's member).
TEST(JsonSchemaConditional, FalseProperty) {
  const Json s = Json::parse(R"({"type":"object","properties":{"x":false,"y":{"type":"integer"}}})");
  EXPECT_EQ(expect_the_validators(s, {"{}", R"({"y":1})", R"({"x":1})", R"({"z":null})"}), 3);
  EXPECT_FALSE(takes(s, R"({"x")"));
  const Json merged = Json::parse(R"({"allOf":[{"properties":{"x":false}},{"properties":{"x":{"type":"integer"}}}]})");
  EXPECT_EQ(expect_the_validators(merged, {"{}", R"({"x":1})"}), 1);
  EXPECT_NE(message(R"({"type":"object","properties":{"x":false},"required":["x"]})").find("its schema is false"), std::string::npos);
}

// An alternative that takes no value (alone, or merged with an allOf's other members) is left
// out where others remain, as if's branches are; where none remains the schema is refused.
TEST(JsonSchemaConditional, EmptyAlternativesLeftOut) {
  const Json merged = Json::parse(R"({"allOf":[{"type":"string"},{"anyOf":[{"type":"string","maxLength":1},{"type":"integer"}]}]})");
  EXPECT_EQ(expect_the_validators(merged, {R"("a")", R"("ab")", "1"}), 1);
  const Json alone = Json::parse(R"({"anyOf":[{"type":"string","enum":[1]},{"type":"integer","maximum":2,"minimum":1}]})");
  EXPECT_EQ(expect_the_validators(alone, {"1", "2", R"("1")"}), 2);
  const Json one_of = Json::parse(R"({"oneOf":[{"type":"integer","minimum":3,"maximum":1},{"type":"null"}]})");
  EXPECT_EQ(expect_the_validators(one_of, {"null", "2"}), 1);
  // Items that take no value leave the empty array: the alternative is kept (dropping it would let
  // [] match one alternative only), so this oneOf's alternatives overlap on [] and it is refused.
  expect_refused(R"({"oneOf":[{"type":"array"},{"type":"array","items":{"type":"string","enum":[1]}}]})",
                 "may both match a value");
  const Json no_items = Json::parse(R"({"type":"array","items":{"type":"string","enum":[1]}})");
  EXPECT_EQ(expect_the_validators(no_items, {"[]", "[1]", R"(["1"])"}), 1);
  // Values of one type ruled out leave the others (untyped: objects only).
  const Json untyped = Json::parse(R"({"anyOf":[{"minProperties":2,"maxProperties":1},{"type":"object","properties":{"a":{}},"required":["a"]}]})");
  EXPECT_EQ(expect_the_validators(untyped, {"{}", R"({"a":1})", "1", R"("s")"}), 3);
  expect_refused(R"({"anyOf":[{"type":"string","enum":[1]},{"type":"integer","minimum":3,"maximum":1}]})",
                 "#/anyOf/0: no value of 'enum' meets");
  // (Malformed alternatives are still the schema's error.)
  expect_refused(R"({"anyOf":[{"type":"strin"},{"type":"integer"}]})", "unknown type");
}

TEST(JsonSchemaConditional, Refusals) {
  expect_refused(R"({"if":{"minimum":1},"then":{}})", "'minimum' in it");
  expect_refused(R"({"if":{"properties":{"a":{"minimum":1}}},"then":{"required":["a"]}})", "'minimum' in its property \"a\"");
  expect_refused(R"({"if":{"type":"string","properties":{}},"then":{}})", "a 'type' other than \"object\"");
  expect_refused(R"({"type":"string","if":{"type":"string"},"then":false,"else":false})", "no value takes");
  expect_refused(R"({"if":{"const":[1]},"then":{}})", "an object or array value");
  // A then that refers back to the whole schema would merge without end: refused at the nesting
  // bound, with a message of bounded length.
  const std::string m = message(R"({"if":{"type":"integer"},"then":{"$ref":"#"}})");
  EXPECT_NE(m.find("nest more than 64 deep"), std::string::npos) << m;
  EXPECT_LE(m.size(), 1003u);
  // A type name the merge meets is checked as the compiler checks it (an empty meet of a misspelt
  // type was an alternative left out).
  expect_refused(R"({"anyOf":[{"type":"string"},{"allOf":[{"type":"integer"},{"type":"intger"}]}]})", "unknown type");
}

// An error inside what the merge rewrites names a path of the rewrite, and says where the
// rewritten keywords are.
TEST(JsonSchemaConditional, ErrorsSayWhereTheRewriteIs) {
  expect_refused(R"({"type":"object","properties":{"p":{"if":{"required":["a"]},"then":{"type":"strin"}}}})",
                 "unknown type \"strin\" (the path is in the rewrite of the 'if' / 'then' / 'else', 'dependentSchemas' or "
                 "object's 'not' at #/properties/p)");
  expect_refused(R"({"dependentSchemas":{"a":{"properties":{"b":{"minLength":"x"}}}}})",
                 "must be a non-negative integer (the path is in the rewrite of the 'if' / 'then' / 'else', "
                 "'dependentSchemas' or object's 'not' at #)");
}

}  // namespace
}  // namespace dsi::server
