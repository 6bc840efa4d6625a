// Structured outputs (server/json_schema.h): what objects say of their keys beside properties:
// required names properties does not declare, dependentRequired (draft 7's dependencies as lists
// of names) and propertyNames; each
// against the validator (test_json_schema_util.h), with the compiler's messages, and walked
// through the mask.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_json_schema_util.h"

namespace dsi::server {
namespace {

using namespace schema_test;

// Once a property has come, those it lists must come too, and each of those's in turn; the object
// closes only then.
TEST(JsonSchemaObjects, DependentRequiredIsTheValidators) {
  const Json s = Json::parse(R"({
    "type": "object",
    "properties": {"card": {"type": "integer"}, "billing": {"type": "string"}, "zip": {"type": "string"},
                   "name": {"type": "string"}},
    "dependentRequired": {"card": ["billing"], "billing": ["zip"]},
    "additionalProperties": false
  })");
  const std::vector<std::string> texts = {
      R"({})",
      R"({"name":"a"})",
      R"({"card":1,"billing":"b","zip":"z"})",
      R"({"zip":"z","billing":"b"})",
      R"({"card":1})",
      R"({"card":1,"billing":"b"})",
      R"({"billing":"b","name":"n"})",
      R"({"zip":"z"})",
  };
  EXPECT_EQ(expect_the_validators(s, texts), 5);
  EXPECT_TRUE(takes(s, R"({"card":1,)"));
  EXPECT_FALSE(takes(s, R"({"card":1})"));  // the brace is refused at once
  EXPECT_FALSE(takes(s, R"({"card":1,"billing":"b"})"));
  // Draft 7's spelling reads the same.
  Json draft7 = s;
  draft7["dependencies"] = draft7["dependentRequired"];
  draft7.erase("dependentRequired");
  EXPECT_EQ(expect_the_validators(draft7, texts), 5);
}

// A name the object may not have: in a closed object the property that lists it may not come (a
// required one is a compile error); in an open one it is another key that must come.
TEST(JsonSchemaObjects, DependentsTheObjectMayNotHave) {
  const Json closed = Json::parse(R"({"type":"object","properties":{"a":{},"b":{}},"additionalProperties":false,
                                      "dependentRequired":{"a":["x"],"b":["a"]}})");
  EXPECT_EQ(expect_the_validators(closed, {R"({})", R"({"a":1})", R"({"b":1})", R"({"a":1,"b":2})"}), 1);
  EXPECT_FALSE(takes(closed, R"({"a")"));
  EXPECT_FALSE(takes(closed, R"({"b")"));  // b needs a, which needs x
  const std::string m = message(R"({"type":"object","properties":{"a":{}},"required":["a"],"additionalProperties":false,
                                    "dependentRequired":{"a":["x"]}})");
  EXPECT_NE(m.find("#/required: \"a\" is required"), std::string::npos) << m;
  EXPECT_NE(m.find("#/dependentRequired/a needs \"x\", which the object may not have"), std::string::npos) << m;

  const Json open = Json::parse(R"({"type":"object","properties":{"a":{"type":"integer"}},
                                    "dependentRequired":{"a":["x"],"t":["a","u"]}})");
  EXPECT_EQ(expect_the_validators(open, {R"({})", R"({"a":1})", R"({"a":1,"x":null})", R"({"x":1})", R"({"t":1})",
                                         R"({"t":1,"u":2})", R"({"t":1,"u":2,"a":3,"x":4})", R"({"z":[]})",
                                         R"({"a":"s","x":1})"}),
            5);
  // Other keys held to maxProperties: what a key needs must still fit.
  const Json counted = Json::parse(R"({"type":"object","properties":{"a":{},"b":{},"c":{}},"maxProperties":3,
                                       "dependentRequired":{"a":["b","c"]}})");
  EXPECT_TRUE(takes(counted, R"({"b":1,"a")"));
  EXPECT_FALSE(takes(counted, R"({"z":1,"b":2,"a")"));
  EXPECT_TRUE(takes(counted, R"({"z":1,"b":2,"c")"));
  EXPECT_EQ(expect_the_validators(counted, {R"({"a":1,"b":2,"c":3})", R"({"z":1,"a":1,"b":2})"}), 1);
  // (So too required names: another key may not take the room one needs.)
  const Json one_left = Json::parse(R"({"type":"object","properties":{"a":{}},"required":["a"],"maxProperties":1})");
  EXPECT_FALSE(takes(one_left, R"({"z)"));
  EXPECT_EQ(expect_the_validators(one_left, {R"({"a":1})", R"({"z":1})", R"({"a":1,"z":1})"}), 1);
  EXPECT_NE(message(R"({"type":"object","properties":{"a":{},"b":{},"c":{}},"required":["a"],"maxProperties":2,
                        "dependentRequired":{"a":["b","c"]}})")
                .find("more properties are required than maxProperties allows"),
            std::string::npos);
  // A name that needs escapes could come only as a key this recognizer does not tell apart.
  EXPECT_NE(message(R"({"type":"object","dependentRequired":{"a":["x\"y"]}})").find("needs escapes"), std::string::npos);
}

TEST(JsonSchemaObjects, DependencyRefusals) {
  EXPECT_NE(message(R"({"type":"object","dependentSchemas":[]})").find("#/dependentSchemas: must be an object"),
            std::string::npos);
  EXPECT_NE(message(R"({"type":"object","dependentRequired":{"a":"b"}})").find("#/dependentRequired/a: must be an array of names"),
            std::string::npos);
  EXPECT_NE(message(R"({"type":"object","dependentRequired":{"a":[1]}})").find("must be an array of names"),
            std::string::npos);
  EXPECT_NE(message(R"({"type":"object","dependentRequired":[]})").find("#/dependentRequired: must be an object"),
            std::string::npos);
}

// allOf's members' dependentRequired together: each property needs the names of every member.
TEST(JsonSchemaObjects, AllOfMergesDependentRequired) {
  const Json s = Json::parse(R"({
    "$defs": {"base": {"type": "object", "properties": {"a": {}, "b": {}, "c": {}}, "dependentRequired": {"a": ["b"]}}},
    "allOf": [{"$ref": "#/$defs/base"}, {"dependentRequired": {"a": ["c"], "b": ["c"]}}, {"dependencies": {"c": ["a"]}}]
  })");
  EXPECT_EQ(expect_the_validators(s, {R"({})", R"({"a":1,"b":2})", R"({"a":1,"c":2})", R"({"a":1,"b":2,"c":3})",
                                      R"({"b":1,"c":2})", R"({"c":1})", R"({"d":1})"}),
            3);
  // A member's schema dependency beside another's list of names: both hold.
  const Json mixed = Json::parse(
      R"({"allOf":[{"dependencies":{"a":["b"]}},{"dependencies":{"a":{"properties":{"b":{"type":"integer"}}}}}]})");
  EXPECT_EQ(expect_the_validators(mixed, {R"({"a":1,"b":2})", R"({"a":1,"b":"x"})", R"({"a":1})", R"({"b":"x"})", "3"}), 3);
}

TEST(JsonSchemaObjects, WalksThroughDependentRequiredEndInValidValues) {
  const Json s = Json::parse(R"({
    "type": "object",
    "properties": {"card": {"type": "integer"}, "billing": {"type": "string", "maxLength": 8}, "zip": {"enum": ["a", "b"]},
                   "order": {"type": "object", "properties": {"id": {"type": "integer"}, "gift": {"type": "boolean"},
                                                              "note": {"type": "string", "maxLength": 5}},
                             "dependentRequired": {"gift": ["note", "id"]}, "additionalProperties": false}},
    "dependentRequired": {"card": ["billing", "zip"], "extra": ["card"]},
    "maxProperties": 5
  })");
  EXPECT_GT(walks_that_end(s, 41, 30), 20);
}

// propertyNames as a string schema: declared names it refuses may not come (a required one is a
// compile error); other keys are held to it while written.
TEST(JsonSchemaObjects, PropertyNamesAreTheValidators) {
  const Json s = Json::parse(R"({"type":"object","properties":{"ok":{"type":"integer"},"Bad":{}},
                                 "propertyNames":{"pattern":"^[a-z_]+$","minLength":2,"maxLength":5}})");
  const std::vector<std::string> texts = {
      R"({})",         R"({"ok":1})",     R"({"ok":1,"abc":"x"})", R"({"abcde":null})", R"({"Bad":1})",
      R"({"a":1})",    R"({"abcdef":1})", R"({"a1":1})",           R"({"ok":"s"})",     R"({"a b":1})",
      R"({"x_y":[]})",
  };
  EXPECT_EQ(expect_the_validators(s, texts), 5);
  EXPECT_FALSE(takes(s, R"({"B)"));
  EXPECT_FALSE(takes(s, R"({"abcdef)"));
  EXPECT_TRUE(takes(s, R"({"abcde)"));
  EXPECT_FALSE(takes(s, R"({"a")"));  // too short
  EXPECT_NE(message(R"({"type":"object","properties":{"Bad":{}},"required":["Bad"],"propertyNames":{"pattern":"^[a-z]+$"}})")
                .find("#/required: \"Bad\" is required (or needed by a required property), but 'propertyNames' does not "
                      "take the name"),
            std::string::npos);
  // A declared name that was written already cannot come again as another key: with no longer key
  // left to write, its start is a dead end that the recognizer refuses.
  const Json full = Json::parse(R"({"type":"object","properties":{"ab":{}},"propertyNames":{"maxLength":2}})");
  EXPECT_FALSE(takes(full, R"({"ab":1,"ab)"));
  EXPECT_TRUE(takes(full, R"({"ab":1,"ac":2,"a":3})"));
  const Json exact = Json::parse(R"({"type":"object","properties":{"ab":{},"a":{}},"propertyNames":{"pattern":"^ab?$"}})");
  EXPECT_TRUE(takes(exact, R"({"a":1,"ab":2})"));
  EXPECT_FALSE(takes(exact, R"({"a":1,"ab":2,")"));  // every name it takes was written
  EXPECT_FALSE(takes(exact, R"({"ab":2,"ab)"));
  EXPECT_TRUE(takes(exact, R"({"ab":2,"a")"));
  // The same half-way through a character of two bytes: a first byte that some name not written
  // yet, or another key, can still go on from.
  const Json wide = Json::parse("{\"type\":\"object\",\"properties\":{\"\u00e9\":{},\"\u00fc\":{}},"
                                "\"propertyNames\":{\"maxLength\":1}}");
  EXPECT_TRUE(takes(wide, "{\"\u00e9\":1,\"\xc3"));
  EXPECT_FALSE(takes(wide, "{\"\u00e9\":1,\"\xc3\xa9"));
  EXPECT_TRUE(takes(wide, "{\"\u00e9\":1,\"\xc3\xbc\":2,\"\xc3\xa0\":3}"));
  EXPECT_FALSE(takes(wide, "{\"\u00e9\":1,\"\xc3\xbc\":2,\"\xc3\xbc"));
  EXPECT_EQ(expect_the_validators(wide, {"{\"\u00e9\":1,\"\u00e0\":2}", "{\"\u00e9a\":1}"}), 1);
}

// enum and const: a closed set of names, each at most once; with other keys allowed, those not
// declared take additionalProperties' values.
TEST(JsonSchemaObjects, PropertyNamesEnumIsAClosedSet) {
  const Json s = Json::parse(R"({"type":"object","properties":{"x":{"type":"string"},"w":{}},
                                 "additionalProperties":{"type":"integer"},"propertyNames":{"enum":["x","y","z",3]}})");
  EXPECT_EQ(expect_the_validators(s, {R"({"x":"a","y":1,"z":2})", R"({"y":1})", R"({"w":1})", R"({"y":"s"})",
                                      R"({"v":1})", R"({"x":1})"}),
            2);
  EXPECT_FALSE(takes(s, R"({"y":1,"y")"));
  const Json one = Json::parse(R"({"type":"object","propertyNames":{"const":"k"},"minProperties":1})");
  EXPECT_EQ(expect_the_validators(one, {R"({"k":[1]})", R"({})", R"({"j":1})"}), 1);
  EXPECT_FALSE(takes(one, R"({"k":1,)"));
  const Json none = Json::parse(R"({"type":"object","properties":{"a":{}},"propertyNames":false})");
  EXPECT_EQ(expect_the_validators(none, {R"({})", R"({"a":1})", R"({"b":1})"}), 1);
  EXPECT_NE(message(R"({"type":"object","propertyNames":{"enum":["a","b"]},"minProperties":3})").find("minProperties is above"),
            std::string::npos);
}

// An object's enum values: those whose keys the object's keywords take are written, no other.
TEST(JsonSchemaObjects, EnumValuesMeetTheKeyKeywords) {
  const Json s = Json::parse(R"({"type":"object","properties":{"a":{},"b":{}},"dependentRequired":{"a":["b"]},
                                 "propertyNames":{"pattern":"^[a-z]$"},
                                 "enum":[{"a":1},{"a":1,"b":2},{"C":1},{"b":1,"cd":2},{"b":3,"c":4}]})");
  EXPECT_EQ(expect_the_validators(s, {R"({"a":1})", R"({"a":1,"b":2})", R"({"C":1})", R"({"b":1,"cd":2})",
                                      R"({"b":3,"c":4})", R"({"b":3})"}),
            2);
  EXPECT_NE(message(R"({"type":"object","properties":{"a":{}},"additionalProperties":false,"enum":[{"a":1,"x":2}]})")
                .find("no value of 'enum' meets"),
            std::string::npos);
  EXPECT_NE(message(R"({"properties":{"a":{},"b":{}},"required":["a"],"maxProperties":1,"const":{"b":1}})")
                .find("no value of 'enum' meets"),
            std::string::npos);
}

TEST(JsonSchemaObjects, PropertyNamesRefusals) {
  expect_refused(R"({"type":"object","propertyNames":{"format":"email"}})", "#/propertyNames: 'format' is not supported there");
  expect_refused(R"({"type":"object","propertyNames":{"anyOf":[{"maxLength":1}]}})", "#/propertyNames: 'anyOf' is not supported");
  expect_refused(R"({"type":"object","propertyNames":{"type":"integer"}})", "#/propertyNames/type: only \"string\"");
  expect_refused(R"x({"type":"object","propertyNames":{"pattern":"(?=a)"}})x", "#/propertyNames/pattern");
  expect_refused(R"({"type":"object","propertyNames":{"minLength":3,"maxLength":2}})", "maxLength is below minLength");
  expect_refused(R"({"type":"object","propertyNames":3})", "#/propertyNames: must be a schema");
  expect_refused(R"({"type":"object","propertyNames":{"pattern":"^[ab]$"},"minProperties":3})",
          "beside a 'propertyNames' that takes few names");
  expect_refused(R"({"properties":{"a":{}},"propertyNames":{"maxLength":1},"allOf":[{"propertyNames":{"maxLength":2}}]})",
          "'propertyNames' in two schemas of an allOf");
  EXPECT_EQ(message(R"({"type":"object","propertyNames":{"type":"string","title":"t","maxLength":4}})"), "");
}

TEST(JsonSchemaObjects, WalksThroughPropertyNamesEndInValidValues) {
  const Json s = Json::parse(R"({
    "type": "object",
    "properties": {"id": {"type": "integer"}, "Tag": {"type": "string"}, "label": {"type": "string", "maxLength": 6}},
    "propertyNames": {"pattern": "^[a-z][a-z0-9_]*$", "maxLength": 6},
    "additionalProperties": {"type": "object", "propertyNames": {"enum": ["k", "kind", "v"]},
                             "additionalProperties": {"type": "integer", "minimum": 0, "maximum": 9},
                             "dependentRequired": {"k": ["v"]}},
    "dependentRequired": {"label": ["id"]},
    "maxProperties": 4
  })");
  EXPECT_GT(walks_that_end(s, 43, 30), 20);
  const Json short_names = Json::parse(R"({"type":"object","properties":{"a":{},"ab":{},"abc":{}},
                                           "propertyNames":{"pattern":"^ab?c?$","maxLength":3},"minProperties":1})");
  EXPECT_GT(walks_that_end(short_names, 47, 30), 20);
  // Most names it takes are declared: a key must not start down a way that only a declared name
  // written already (or one it may not have) would end.
  const Json crowded = Json::parse(R"({"type":"object","properties":{"a":{},"b":{},"aa":{},"ab":{},"bb":{}},
                                       "propertyNames":{"pattern":"^[ab]{1,2}$"},"additionalProperties":{"type":"null"},
                                       "dependentRequired":{"bb":["ba"]},"maxProperties":5})");
  EXPECT_GT(walks_that_end(crowded, 53, 30), 20);
}

// A required name that properties does not declare is another key: it must come, with the value
// patternProperties or additionalProperties give it; where no such key may come, no object.
TEST(JsonSchemaObjects, RequiredNamesOutsideProperties) {
  const Json s = Json::parse(R"({"type":"object","properties":{"a":{"type":"integer"}},"required":["a","b"],
                                 "additionalProperties":{"type":"string"}})");
  EXPECT_EQ(expect_the_validators(s, {R"({"a":1,"b":"x"})", R"({"b":"x","a":1})", R"({"a":1})", R"({"b":"x"})",
                                      R"({"a":1,"b":2})", R"({"a":1,"b":"x","c":"y"})", R"({"a":1,"c":"y"})"}),
            3);
  EXPECT_FALSE(takes(s, R"({"a":1})"));
  EXPECT_FALSE(takes(s, R"({"a":1,"b":2)"));
  EXPECT_TRUE(takes(s, R"({"a":1,"c":"y",)"));  // (b can still come)
  // (Walks: where other keys may be any name, a walk seldom writes b before its steps run out; with
  // propertyNames leaving b the only other name, they end.)
  Json named = s;
  named["propertyNames"] = Json::parse(R"({"pattern":"^[ab]$"})");
  for (uint64_t seed : {61, 62, 63}) EXPECT_GT(walks_that_end(named, seed, 20), 10);
  // No properties at all, and a name that patternProperties holds to its schema.
  const Json bare = Json::parse(R"({"required":["id"],"patternProperties":{"^i":{"type":"integer"}},"maxProperties":2})");
  EXPECT_EQ(expect_the_validators(bare, {R"({"id":3})", R"({"id":"3"})", R"({})", R"({"x":1,"id":2})", R"({"x":1,"y":2})",
                                         "3", R"("id")"}),
            4);
  EXPECT_FALSE(takes(bare, R"({"x":1,"y")"));  // (then id could not come)
  Json bare_named = bare;
  bare_named["propertyNames"] = Json::parse(R"({"enum":["id","x"]})");
  for (uint64_t seed : {64, 65}) EXPECT_GT(walks_that_end(bare_named, seed, 20), 10);
  // Where the name may not come, objects are ruled out (the schema's other types stay).
  const Json closed = Json::parse(R"({"type":["object","null"],"properties":{"a":{}},"required":["b"],
                                      "additionalProperties":false})");
  EXPECT_EQ(expect_the_validators(closed, {"null", R"({"a":1})", R"({"b":1})", "{}"}), 1);
  expect_refused(R"({"type":"object","properties":{"a":{}},"required":["b"],"additionalProperties":false})",
                 "#/required: \"b\" is required, but the object may not have it");
  expect_refused(R"({"type":"object","required":["bb"],"propertyNames":{"maxLength":1}})", "may not have it");
  expect_refused(R"({"type":"object","required":[1]})", "#/required: 1 is not a name");
  expect_refused(R"({"type":"object","required":["a\"b"]})", "needs escapes");
  // Closed objects (strict tool parameters): only declared names, so an undeclared required one
  // leaves no object.
  EXPECT_THROW(JsonSchema::compile(Json::parse(R"({"type":"object","properties":{"a":{}},"required":["b"]})"),
                                   /*closed_objects=*/true),
               dsi::Error);
  EXPECT_NE(JsonSchema::compile(Json::parse(R"({"type":"object","properties":{"a":{}},"required":["b"]})")), nullptr);
  // In an if: a required name that properties do not declare (else: the object without it).
  const Json cond = Json::parse(R"({"type":"object","properties":{"a":{"type":"integer"}},
                                    "if":{"required":["b"]},"then":{"required":["a"]},"else":{"maxProperties":1}})");
  EXPECT_EQ(expect_the_validators(cond, {R"({"b":1,"a":2})", R"({"b":1})", R"({"a":2})", R"({"a":2,"c":3})", "{}"}), 3);
}

}  // namespace
}  // namespace dsi::server
