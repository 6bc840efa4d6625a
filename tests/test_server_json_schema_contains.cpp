// Structured outputs (server/json_schema.h): contains with minContains and maxContains, against
// the validator (test_json_schema_util.h), with the compiler's messages, and walked through the
// mask: the array never closes short of its matches, an item is made a match where the room left
// needs it, and none matches once maxContains have.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_json_schema_util.h"

namespace dsi::server {
namespace {

using namespace schema_test;

// Without minContains, one item must match; each item that equals a value counts, however it is
// written (escapes, 1.0 for 1, -0.0 for 0).
TEST(JsonSchemaContains, AtLeastOneMatchIsTheValidators) {
  const Json s = Json::parse(R"({"type":"array","items":{"type":"string"},"contains":{"const":"x"}})");
  EXPECT_EQ(expect_the_validators(s, {R"([])", R"(["a"])", R"(["x"])", R"(["a","x"])", R"(["\u0078"])",
                                      R"(["x","x","b"])", R"(["xx"])"}),
            4);
  EXPECT_FALSE(takes(s, R"([])"));
  EXPECT_FALSE(takes(s, R"(["a"])"));  // the bracket is refused at once
  EXPECT_TRUE(takes(s, R"(["a",)"));
  const Json numbers = Json::parse(R"({"type":"array","items":{"type":"number"},"contains":{"enum":[1,0]}})");
  EXPECT_EQ(expect_the_validators(numbers, {R"([1.0])", R"([1e0])", R"([-0.0])", R"([-0])", R"([0.5,2])", R"([10])",
                                            R"([0.1,0])"}),
            5);
}

// minContains and maxContains bound the items that match; an item that would make one too many
// never ends (an integer's 0 is refused at once: nothing can follow it).
TEST(JsonSchemaContains, CountsAreTheValidators) {
  const Json s = Json::parse(R"({"type":"array","items":{"type":"integer"},"contains":{"enum":[1,2,0]},
                                 "minContains":2,"maxContains":3})");
  EXPECT_EQ(expect_the_validators(s, {R"([1,2])", R"([1])", R"([1,5])", R"([1,2,0])", R"([1,2,0,1])", R"([5,1,6,2,7])",
                                      R"([0,0,0,0])", R"([])", R"([10,20,1,2])"}),
            4);
  EXPECT_TRUE(takes(s, "[1,2,0,"));
  EXPECT_TRUE(takes(s, "[1,2,0,2"));  // (it can still become 20)
  EXPECT_FALSE(takes(s, "[1,2,0,2,"));
  EXPECT_FALSE(takes(s, "[1,2,0,2]"));
  EXPECT_FALSE(takes(s, "[1,2,0,0"));
  EXPECT_FALSE(takes(s, "[1,2,0,-0"));
  EXPECT_TRUE(takes(s, "[1,2,0,-1]"));
  // (uniqueItems bars the same way: an integer's 0 after a 0 is refused at once.)
  const Json unique = Json::parse(R"({"type":"array","items":{"type":"integer"},"uniqueItems":true})");
  EXPECT_TRUE(takes(unique, "[0,"));
  EXPECT_FALSE(takes(unique, "[0,0"));
  EXPECT_FALSE(takes(unique, "[0,-0"));
  EXPECT_TRUE(takes(unique, "[0,-1"));
  // maxContains 0: no item may match (minContains 0 beside it).
  const Json none = Json::parse(R"({"type":"array","items":{"type":"string"},"contains":{"const":"x"},
                                    "minContains":0,"maxContains":0})");
  EXPECT_EQ(expect_the_validators(none, {R"([])", R"(["x"])", R"(["xy","a"])", R"(["a","\u0078"])"}), 2);
  EXPECT_TRUE(takes(none, R"(["x)"));
  EXPECT_FALSE(takes(none, R"(["x")"));
  // Literals are steered byte by byte: once true has come, an item starting t cannot be written.
  const Json flags = Json::parse(R"({"type":"array","items":{"type":"boolean"},"contains":{"const":true},"maxContains":1})");
  EXPECT_FALSE(takes(flags, "[true,t"));
  EXPECT_TRUE(takes(flags, "[true,f"));
  EXPECT_EQ(expect_the_validators(flags, {"[true]", "[false,true,false]", "[true,true]", "[false]"}), 2);
}

// The room left: where maxItems leaves no room for an item that misses, each item must match; an
// item that can only match holds the array to maxContains.
TEST(JsonSchemaContains, NoDeadEnds) {
  const Json tight = Json::parse(R"({"type":"array","items":{"type":"integer"},"contains":{"enum":[7,8]},
                                     "minContains":2,"maxItems":2})");
  EXPECT_FALSE(takes(tight, "[1"));
  EXPECT_TRUE(takes(tight, "[7,"));
  EXPECT_FALSE(takes(tight, "[7,1"));
  EXPECT_FALSE(takes(tight, "[7]"));
  EXPECT_EQ(expect_the_validators(tight, {"[7,8]", "[8,8]", "[7]", "[7,1]", "[7,8,7]"}), 2);
  const Json room = Json::parse(R"({"type":"array","items":{"type":"integer"},"contains":{"enum":[7,8]},
                                    "minContains":2,"maxItems":3})");
  EXPECT_TRUE(takes(room, "[1,"));
  EXPECT_FALSE(takes(room, "[1,2"));
  EXPECT_TRUE(takes(room, "[1,7"));
  EXPECT_TRUE(takes(room, "[7,1,8]"));
  // Only "x" can be an item: maxContains bounds the items.
  const Json only = Json::parse(R"({"type":"array","items":{"const":"x"},"contains":{"const":"x"},"maxContains":2})");
  EXPECT_FALSE(takes(only, R"(["x","x",)"));
  EXPECT_EQ(expect_the_validators(only, {R"(["x"])", R"(["x","x"])", R"(["x","x","x"])", R"([])"}), 2);
  // The values items does not take never count: no array is left.
  expect_refused(R"({"type":"array","items":{"type":"integer"},"contains":{"const":"x"}})",
          "no array has between minContains (1) and maxContains");
  expect_refused(R"({"type":"array","contains":{"const":1},"minContains":3,"maxItems":2})", "no array has between");
  expect_refused(R"({"type":"array","contains":{"const":1},"minContains":3,"maxContains":2})", "maxContains is below minContains");
  // (Another type is left where no array can be written.)
  EXPECT_EQ(expect_the_validators(Json::parse(R"({"type":["array","null"],"contains":{"const":1},"maxItems":0})"),
                                  {"null", "[]"}),
            1);
  for (const char* schema : {
           R"({"type":"array","items":{"type":"integer"},"contains":{"enum":[7,8]},"minContains":2,"maxItems":3})",
           R"({"type":"array","items":{"type":"integer"},"contains":{"enum":[1,2,0]},"minContains":2,"maxContains":3,"maxItems":6})",
           R"({"type":"array","items":{"enum":["a","b",null]},"contains":{"enum":["a",null]},"minContains":1,"maxContains":1,"minItems":3})",
           R"({"type":"array","items":{"type":["string","boolean"]},"contains":{"enum":["x",true]},"minContains":2,"maxContains":2,"minItems":4})",
           R"({"type":"object","properties":{"t":{"type":"array","items":{"enum":["k","m",1]},"contains":{"const":"k"},"maxContains":1,"minItems":2}},"required":["t"],"additionalProperties":false})",
       }) {
    SCOPED_TRACE(schema);
    EXPECT_GT(walks_that_end(Json::parse(schema), 5, 8), 0);
  }
}

// contains true (or {}): every item matches, the counts bound the items; minContains 0 without
// maxContains holds of every array, whatever contains says.
TEST(JsonSchemaContains, TrivialContains) {
  const Json every = Json::parse(R"({"type":"array","contains":true,"minContains":2,"maxContains":3})");
  EXPECT_EQ(expect_the_validators(every, {"[]", "[1]", "[1,2]", "[1,2,3]", "[1,2,3,4]"}), 2);
  const Json any = Json::parse(R"({"type":"array","contains":{"type":"string","minLength":3},"minContains":0})");
  EXPECT_EQ(expect_the_validators(any, {"[]", "[1]", R"(["abc"])"}), 3);
  EXPECT_EQ(expect_the_validators(Json::parse(R"({"type":"array","contains":{"const":1},"minContains":0,"maxContains":1})"),
                                  {"[]", "[1]", "[1,1]", "[2,1]"}),
            3);
  // minContains and maxContains without contains say nothing.
  EXPECT_EQ(expect_the_validators(Json::parse(R"({"type":"array","minContains":2,"maxContains":0})"), {"[]", "[1]"}), 2);
  // An enum's arrays: those whose matches the counts take.
  EXPECT_EQ(expect_the_validators(Json::parse(R"({"enum":[[1],[2],[2,2],"s"],"contains":{"const":2},"maxContains":1})"),
                                  {"[1]", "[2]", "[2,2]", R"("s")"}),
            2);
}

// allOf: one contains takes the highest minContains and the lowest maxContains of the schemas that
// have it; a schema's counts without contains say nothing; two different contains are refused.
TEST(JsonSchemaContains, AllOfMerges) {
  const Json s = Json::parse(R"({"allOf":[{"type":"array","items":{"type":"integer"},"contains":{"const":1}},
                                          {"contains":{"const":1},"maxContains":2},{"minContains":3}]})");
  EXPECT_EQ(expect_the_validators(s, {"[1]", "[1,1]", "[1,1,1]", "[2]", "[2,1,3,1]"}), 3);
  // (A schema's minContains 0 does not lower another's default 1.)
  const Json zero = Json::parse(R"({"allOf":[{"type":"array","contains":{"const":1}},{"contains":{"const":1},"minContains":0}]})");
  EXPECT_EQ(expect_the_validators(zero, {"[]", "[1]", "[2]"}), 1);
  expect_refused(R"({"allOf":[{"contains":{"const":1}},{"contains":{"const":2}}]})",
          "'contains' in two schemas of an allOf (with different values) cannot be merged");
}

// What cannot be enforced exactly is refused, naming the keyword.
TEST(JsonSchemaContains, Refusals) {
  expect_refused(R"({"type":"array","contains":{"type":"integer"}})",
          "#/contains: only a 'const' or 'enum' of scalars (null, booleans, numbers, strings), or true, is supported");
  expect_refused(R"({"type":"array","contains":{"const":{"a":1}}})", "#/contains: only a 'const' or 'enum' of scalars");
  expect_refused(R"({"type":"array","prefixItems":[{}],"contains":{"const":1}})", "#/contains: beside 'prefixItems'");
  expect_refused(R"({"type":"array","items":{"type":"integer"},"uniqueItems":true,"contains":{"const":1}})",
          "#/contains: beside 'uniqueItems' is not supported");
  expect_refused(R"({"type":"array","contains":{"const":9007199254740993}})", "beyond 2^53");
  expect_refused(R"({"type":"array","contains":false})", "#/contains: false, with minContains above 0, takes no array");
  // maxContains where an item could only be kept from matching through a limit.
  expect_refused(R"({"type":"array","items":{"type":"string","maxLength":2},"contains":{"const":"ab"},"maxContains":1})",
          "#/maxContains: supported where the items that could equal a 'contains' value are enum values");
  expect_refused(R"({"type":"array","items":{"type":"integer","minimum":0,"maximum":9},"contains":{"const":3},"maxContains":1})",
          "#/maxContains: supported where");
  // (A limit that no value meets is no trouble.)
  EXPECT_EQ(message(R"({"type":"array","items":{"anyOf":[{"type":"string","maxLength":1},{"type":"integer"}]},
                        "contains":{"const":7},"maxContains":1})"),
            "");
  EXPECT_EQ(message(R"({"type":"array","items":{"type":"string","pattern":"^a"},"contains":{"const":1},"minContains":0,
                        "maxContains":0})"),
            "");
}

}  // namespace
}  // namespace dsi::server
