// Structured outputs (server/json_schema.h): patternProperties. Other keys whose names match a
// pattern (an unanchored search) take its schema, all of them where several match; declared
// properties meet the patterns their names match; additionalProperties holds only of keys that
// match none. Against the validator (test_json_schema_util.h), with the compiler's messages, and
// walked through the mask.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_json_schema_util.h"

namespace dsi::server {
namespace {

using namespace schema_test;

// Pydantic's dict[str, int] with keys held to a pattern.
TEST(JsonSchemaPatterns, PydanticStyleMapIsTheValidators) {
  const Json s = Json::parse(R"({"type":"object","patternProperties":{"^[a-z]+$":{"type":"integer"}},
                                 "additionalProperties":false})");
  EXPECT_EQ(expect_the_validators(s, {R"({})", R"({"abc":1})", R"({"a":1,"b":2})", R"({"A":1})", R"({"abc":"x"})",
                                      R"({"a1":1})", R"({"":1})", R"({"a":1,"a":2})"}),
            3);
  EXPECT_FALSE(takes(s, R"({"A)"));
  EXPECT_FALSE(takes(s, R"({"")"));
  EXPECT_TRUE(takes(s, R"({"ab":)"));
  EXPECT_FALSE(takes(s, R"({"ab":")"));  // the value is an integer
  EXPECT_GT(walks_that_end(s, 73, 30), 20);
}

// A key matching several patterns meets all their schemas; one matching none takes
// additionalProperties; a declared property meets the patterns its name matches.
TEST(JsonSchemaPatterns, SeveralPatternsAndDeclaredNames) {
  const Json s = Json::parse(R"({"type":"object",
    "properties":{"n_id":{"type":"number"},"plain":{"type":"string"}},
    "patternProperties":{"^n_":{"type":"integer"},"id$":{"minimum":0,"maximum":9},"^s_":{"type":"string","maxLength":3}},
    "additionalProperties":{"type":"boolean"}})");
  EXPECT_EQ(expect_the_validators(s, {R"({"n_a":-4})", R"({"n_a":1.5})", R"({"xid":3})", R"({"xid":30})",
                                      R"({"n_id":5})", R"({"n_id":5.5})", R"({"n_id":-1})", R"({"n_xid":7})",
                                      R"({"n_xid":17})", R"({"s_a":"abc"})", R"({"s_a":"abcd"})", R"({"z":true})",
                                      R"({"z":1})", R"({"plain":"p"})", R"({"s_id":"a"})"}),
            8);
  EXPECT_GT(walks_that_end(s, 79, 30), 20);
}

// A set of patterns whose schemas have no value in common takes no key: a key never starts down a
// way where only such names end.
TEST(JsonSchemaPatterns, SetsWithNoValueTakeNoKey) {
  const Json s = Json::parse(R"({"type":"object","patternProperties":{"^a":{"type":"integer"},"b$":{"type":"string"}},
                                 "additionalProperties":false})");
  EXPECT_EQ(expect_the_validators(s, {R"({"a":1,"xb":"s"})", R"({"ab":1})", R"({"ab":"s"})", R"({"x":1})"}), 1);
  EXPECT_FALSE(takes(s, R"({"ab")"));
  EXPECT_TRUE(takes(s, R"({"ab)"));  // "abc" can still come
  const Json exact = Json::parse(R"({"type":"object","patternProperties":{"^a$":{"type":"integer"},"^ab?$":{"type":"string"}},
                                     "additionalProperties":false})");
  EXPECT_TRUE(takes(exact, R"({"a)"));
  EXPECT_FALSE(takes(exact, R"({"a")"));  // "a" matches both patterns
  EXPECT_TRUE(takes(exact, R"({"ab":"s")"));
  EXPECT_EQ(expect_the_validators(exact, {R"({"ab":"s"})", R"({"a":1})", R"({"a":"s"})"}), 1);
  // With propertyNames beside: both hold of other keys.
  const Json named = Json::parse(R"({"type":"object","patternProperties":{"^x":{"type":"integer"}},
                                     "propertyNames":{"maxLength":3},"additionalProperties":{"type":"null"}})");
  EXPECT_EQ(expect_the_validators(named, {R"({"x":1,"xyz":2,"q":null})", R"({"xyzw":1})", R"({"x":null})"}), 1);
  EXPECT_GT(walks_that_end(named, 83, 30), 20);
  // A declared property whose schema has no value in common with a pattern its name matches: the
  // key never comes (the object stays), also where an anyOf beside reads each alternative with it.
  const Json clash = Json::parse(R"({"patternProperties":{"^a":{"type":"integer"}},"properties":{"ab":{"type":"string"}}})");
  EXPECT_EQ(expect_the_validators(clash, {"{}", R"({"ab":"x"})", R"({"ab":1})", R"({"a":1})", R"({"c":"x"})"}), 3);
  const Json beside = Json::parse(R"({"patternProperties":{"^a":{"type":"integer"}},
                                      "anyOf":[{"properties":{"ab":{"type":"string"}}},{"required":["b"]}]})");
  EXPECT_EQ(expect_the_validators(beside, {"{}", R"({"a":1})", R"({"b":1})", R"({"ab":"x","b":1})"}), 3);
}

TEST(JsonSchemaPatterns, AllOfMergesPatterns) {
  const Json s = Json::parse(R"({"allOf":[
    {"type":"object","patternProperties":{"^a":{"type":"integer"}},"properties":{"ab":{"minimum":2}}},
    {"patternProperties":{"^a":{"maximum":5},"^b":{"type":"string"}}}]})");
  EXPECT_EQ(expect_the_validators(s, {R"({"a":3})", R"({"a":6})", R"({"a":"s"})", R"({"ab":1})", R"({"ab":4})",
                                      R"({"b":"s"})", R"({"b":1})", R"({"c":[]})"}),
            4);
  EXPECT_GT(walks_that_end(s, 89, 30), 20);
  EXPECT_NE(message(R"({"allOf":[{"patternProperties":{"^a":{}}},{"additionalProperties":false}]})")
                .find("#/allOf/1: 'patternProperties' in one schema of an allOf beside 'additionalProperties' in another"),
            std::string::npos);
}

TEST(JsonSchemaPatterns, Refusals) {
  auto refused = [](const char* schema, const char* part) {
    const std::string m = message(schema);
    EXPECT_NE(m.find(part), std::string::npos) << schema << ": " << m;
  };
  refused(R"({"patternProperties":[]})", "#/patternProperties: must be an object");
  refused(R"({"patternProperties":{"a":{},"b":{},"c":{},"d":{},"e":{}}})", "#/patternProperties: 5 patterns; at most 4");
  refused(R"x({"patternProperties":{"(?=a)":{}}})x", "#/patternProperties/(?=a)");
  EXPECT_EQ(message(R"({"patternProperties":{"^a":{"not":{}}}})"), "");  // (a key matching ^a takes no value: none comes)
  EXPECT_EQ(expect_the_validators(Json::parse(R"({"patternProperties":{"^a":{"not":{}}}})"), {R"({"ab":1})", R"({"b":1})"}), 1);
  refused(R"({"type":"object","patternProperties":{"^a":{"type":"integer"}},"properties":{"ab":{"type":"string"}},
              "required":["ab"]})",
          "\"ab\" is required (or needed by a required property), but its schema takes no value (#/properties/ab/allOf/1: the types");
  refused(R"({"type":"object","patternProperties":{"b":false},"properties":{"ab":{}},"required":["ab"]})",
          "#/required: \"ab\" is required (or needed by a required property), but a 'patternProperties' schema its name "
          "matches is false");
  refused(R"({"type":"object","patternProperties":{"^a":{}},"propertyNames":{"pattern":"^a"},"minProperties":1,"additionalProperties":false,
              "maxProperties":0})", "maxProperties is below minProperties");
  EXPECT_EQ(message(R"({"patternProperties":{"^a":false},"additionalProperties":false})"), "");
  // An object's enum values: those whose keys the patterns take.
  refused(R"({"type":"object","patternProperties":{"^a":{}},"additionalProperties":false,"enum":[{"b":1}]})",
          "no value of 'enum' meets");
  const Json listed = Json::parse(R"({"type":"object","patternProperties":{"^a":{}},"additionalProperties":false,
                                      "enum":[{"b":1},{"ab":2}]})");
  EXPECT_EQ(expect_the_validators(listed, {R"({"ab":2})", R"({"b":1})"}), 1);
  // A pattern that every name matches, false: no key can come, declared or not.
  const Json none = Json::parse(R"({"type":"object","properties":{"k":{}},"patternProperties":{"":false},
                                    "additionalProperties":{"type":"integer"}})");
  EXPECT_EQ(expect_the_validators(none, {R"({})", R"({"k":1})", R"({"a":1})"}), 1);
  EXPECT_FALSE(takes(none, R"({"a)"));
}

}  // namespace
}  // namespace dsi::server
