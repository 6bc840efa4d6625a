// Structured outputs (server/json_schema.h): unevaluatedProperties and unevaluatedItems, read at
// their level after its allOf and $ref are merged in; and the items of an allOf's members merged
// position by position. Against the validator (test_json_schema_util.h, which collects the
// keywords' annotations as the standard does), with the compiler's messages, and walked through
// the mask.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_json_schema_util.h"

namespace dsi::server {
namespace {

using namespace schema_test;

// The use it is made for: a schema that extends a base through allOf and closes the object over
// both. (additionalProperties false in its place would refuse the base's id.)
TEST(JsonSchemaUnevaluated, ClosesAnObjectExtendedThroughAllOf) {
  const Json s = Json::parse(R"({
    "allOf":[{"$ref":"#/$defs/base"}],"properties":{"extra":{"type":"string"}},"unevaluatedProperties":false,
    "$defs":{"base":{"type":"object","properties":{"id":{"type":"integer"}},"required":["id"]}}})");
  EXPECT_EQ(expect_the_validators(s, {R"({"id":1})", R"({"id":1,"extra":"x"})", R"({"extra":"x","id":2})",
                                      R"({"id":1,"other":2})", R"({"extra":"x"})", R"({"id":"1"})", R"({"id":1,"extra":3})"}),
            3);
  EXPECT_FALSE(takes(s, R"({"id":1,"o)"));
  for (uint64_t seed : {1, 2, 3}) EXPECT_GT(walks_that_end(s, seed, 20), 10);
  Json closed = s;
  closed.erase("unevaluatedProperties");
  closed["additionalProperties"] = false;
  EXPECT_FALSE(valid(Json::parse(R"({"id":1})"), closed, closed));
  EXPECT_NE(message(closed.dump().c_str()).find("\"id\" is required (or needed by a required property), but its schema is false"),
            std::string::npos);
}

// Its schema takes the keys that neither properties nor patternProperties (of any member) name.
TEST(JsonSchemaUnevaluated, PropertiesTakeTheKeysNothingElseEvaluated) {
  const Json s = Json::parse(R"({"type":"object","properties":{"a":{}},"allOf":[{"patternProperties":{"^x":{"type":"integer"}}}],
                                 "unevaluatedProperties":{"type":"string"}})");
  EXPECT_EQ(expect_the_validators(s, {R"({"a":1,"x1":2,"b":"s"})", R"({"b":1})", R"({"x1":"s"})", R"({"a":[],"c":"d"})", "{}"}),
            3);
  for (uint64_t seed : {4, 5}) EXPECT_GT(walks_that_end(s, seed, 20), 10);
  // A member's additionalProperties (or its own unevaluatedProperties) evaluates every key: then
  // it says nothing more.
  const Json member_closes = Json::parse(R"({"allOf":[{"properties":{"a":{}},"additionalProperties":{"type":"integer"}}],
                                             "properties":{"b":{"type":"string"}},"unevaluatedProperties":false})");
  EXPECT_EQ(expect_the_validators(member_closes, {R"({"a":1})", R"({"c":1})", R"({"b":"s"})", R"({"b":1})", R"({"c":"x"})"}), 2);
  const Json nested = Json::parse(R"({"allOf":[{"properties":{"a":{}},"unevaluatedProperties":false}],
                                      "properties":{"b":{}},"unevaluatedProperties":false})");
  EXPECT_EQ(expect_the_validators(nested, {R"({"a":1})", R"({"b":1})", "{}", R"({"a":1,"b":2})"}), 2);
  // Under a property: that object's own keys.
  const Json inner = Json::parse(R"({"type":"object","properties":{"p":{"allOf":[{"properties":{"q":{"type":"null"}}}],
                                     "unevaluatedProperties":false}}})");
  EXPECT_EQ(expect_the_validators(inner, {R"({"p":{"q":null}})", R"({"p":{"r":null}})", R"({"p":{},"r":1})"}), 2);
}

// unevaluatedItems: the items past every member's prefix, where none says what they are.
TEST(JsonSchemaUnevaluated, Items) {
  const Json tuple = Json::parse(R"({"type":"array","prefixItems":[{"type":"integer"}],"unevaluatedItems":false})");
  EXPECT_EQ(expect_the_validators(tuple, {"[1]", "[1,2]", "[]", R"(["a"])"}), 2);
  EXPECT_FALSE(takes(tuple, "[1,"));
  const Json merged = Json::parse(R"({"allOf":[{"prefixItems":[{"type":"integer"},{"type":"string"}]}],
                                      "unevaluatedItems":{"type":"boolean"}})");
  EXPECT_EQ(expect_the_validators(merged, {R"([1,"a",true])", R"([1,"a",2])", "[1]", R"([1,"a",true,false])", R"(["a"])"}), 3);
  for (uint64_t seed : {6, 7}) EXPECT_GT(walks_that_end(merged, seed, 20), 10);
  // Draft 7's tuple: the items past its array.
  const Json draft7 = Json::parse(R"({"allOf":[{"items":[{"type":"integer"}]}],"unevaluatedItems":{"type":"null"}})");
  EXPECT_EQ(expect_the_validators(draft7, {"[1,null]", "[1,2]", "[null]"}), 1);
  // items evaluates every item after the prefix: then it says nothing.
  const Json said = Json::parse(R"({"items":{"type":"integer"},"unevaluatedItems":false})");
  EXPECT_EQ(expect_the_validators(said, {"[1,2]", "[]", R"(["a"])"}), 2);
}

// Alternatives in place that evaluate no keys (required, types, bounds) leave every branch the same
// keys evaluated: it holds in each.
TEST(JsonSchemaUnevaluated, BesideAlternativesThatEvaluateNothing) {
  const Json s = Json::parse(R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string"}},
                                 "anyOf":[{"required":["a"]},{"required":["b"]}],"not":{"required":["a","b"]},
                                 "unevaluatedProperties":false})");
  EXPECT_EQ(expect_the_validators(s, {R"({"a":1})", R"({"b":"x"})", R"({"a":1,"b":"x"})", "{}", R"({"a":1,"c":2})",
                                      R"({"c":2})"}),
            2);
  for (uint64_t seed : {11, 12}) EXPECT_GT(walks_that_end(s, seed, 20), 10);
  const Json nullable = Json::parse(R"({"properties":{"p":{"properties":{"q":{}},"unevaluatedProperties":false,
                                        "oneOf":[{"type":"object"},{"type":"null"}]}}})");
  EXPECT_EQ(expect_the_validators(nullable, {R"({"p":null})", R"({"p":{"q":1}})", R"({"p":{"r":1}})", R"({"p":1})"}), 2);
  const Json conditional = Json::parse(R"({"type":"object","properties":{"a":{},"b":{}},"if":{"required":["a"]},
                                           "then":{"required":["b"]},"unevaluatedProperties":{"type":"integer"}})");
  EXPECT_EQ(expect_the_validators(conditional, {R"({"a":1,"b":2})", R"({"a":1})", R"({"c":1})", R"({"c":"x"})", "{}"}), 3);
}

// Where an alternative in place could evaluate more, it is refused (a 400 naming it), unless
// something evaluates every key (item) anyway.
TEST(JsonSchemaUnevaluated, Refusals) {
  expect_refused(R"({"anyOf":[{"properties":{"a":{}}},{"properties":{"b":{}}}],"unevaluatedProperties":false})",
                 "#: 'unevaluatedProperties' beside 'anyOf' (at #)");
  expect_refused(R"({"allOf":[{"$ref":"#/$defs/x"}],"unevaluatedProperties":false,"$defs":{"x":{"oneOf":[{"type":"object","properties":{"k":{}}},{"type":"string"}]}}})",
                 "beside 'oneOf' (at #/allOf/0/$ref)");
  expect_refused(R"({"type":"object","if":{"required":["a"]},"then":{"properties":{"b":{}}},"unevaluatedProperties":false})",
                 "beside 'if'");
  expect_refused(R"({"contains":{"const":1},"unevaluatedItems":false})", "'unevaluatedItems' beside 'contains'");
  expect_refused(R"({"properties":{"a":{"unevaluatedProperties":false,"anyOf":[{"properties":{"x":{}}},{"type":"null"}]}}})",
                 "#/properties/a: 'unevaluatedProperties' beside 'anyOf'");
  expect_refused(R"({"properties":{"a":{}},"not":{"properties":{"b":{"const":1}},"required":["b"]},"unevaluatedProperties":false})",
                 "'unevaluatedProperties' beside 'not'");
  // Every key is evaluated by additionalProperties: the alternatives add nothing to it.
  const Json open = Json::parse(R"({"additionalProperties":{"type":"integer"},"anyOf":[{"required":["a"]},{"required":["b"]}],
                                    "unevaluatedProperties":false})");
  EXPECT_EQ(expect_the_validators(open, {R"({"a":1})", R"({"b":2,"c":3})", R"({"c":3})", R"({"a":"x"})"}), 2);
  EXPECT_EQ(message(R"({"type":"array","items":{},"contains":{"const":1},"unevaluatedItems":false})"), "");
}

// allOf's members' items merge position by position: a member's items hold at the other's prefix
// positions too, and prefixes of different lengths meet.
TEST(JsonSchemaUnevaluated, AllOfMergesItemsByPosition) {
  const Json rest_over_prefix = Json::parse(R"({"allOf":[{"prefixItems":[{"type":"integer"}]},{"items":{"minimum":5}}]})");
  EXPECT_EQ(expect_the_validators(rest_over_prefix, {"[1]", "[6]", "[6,7]", R"([6,"a"])", "[6,2]", "[]"}), 4);
  EXPECT_FALSE(takes(rest_over_prefix, "[1,"));
  const Json lengths = Json::parse(R"({"allOf":[{"prefixItems":[{"type":"integer"}],"items":false},
                                                {"prefixItems":[{},{"type":"string"}]}]})");
  EXPECT_EQ(expect_the_validators(lengths, {"[1]", R"([1,"a"])", "[]", R"(["a"])"}), 2);
  const Json draft7 = Json::parse(R"({"type":"array","allOf":[{"items":[{"type":"integer"}],"additionalItems":{"type":"string"}},
                                               {"items":{"maxLength":1}}]})");
  EXPECT_EQ(expect_the_validators(draft7, {R"([1,"a"])", R"([1,"ab"])", R"(["a"])", "[1]", "[1,2]"}), 2);
  for (uint64_t seed : {8, 9}) EXPECT_GT(walks_that_end(draft7, seed, 20), 10);
}

}  // namespace
}  // namespace dsi::server
