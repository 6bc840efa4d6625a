// Structured outputs (server/json_schema.h): uniqueItems where an item's values run out (bounded
// integers and multiples, a point, strings of a pattern that forks, maxLength), so that no prefix
// the recognizer takes is a dead end, minItems above the distinct values there can be; and enum /
// const values kept only where every other keyword of their schema takes them. Against the
// validator (test_json_schema_util.h), with the compiler's messages, and walked through the mask.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_json_schema_util.h"

namespace dsi::server {
namespace {

using namespace schema_test;

// An integer item starts, and goes on, only while it can still end as an integer not written yet:
// after [1,2 no ',' comes; a second 1 is refused at once where nothing can follow it (10 is past
// the maximum), taken where it can still become another (10 to 19).
TEST(JsonSchemaUnique, BoundedIntegersRunOut) {
  const Json two = Json::parse(R"({"type":"array","items":{"type":"integer","minimum":1,"maximum":2},"uniqueItems":true})");
  EXPECT_TRUE(takes(two, "[1,"));
  EXPECT_TRUE(takes(two, "[1,2"));
  EXPECT_FALSE(takes(two, "[1,2,"));
  EXPECT_FALSE(takes(two, "[1,1"));
  EXPECT_FALSE(takes(two, "[2,2"));
  EXPECT_TRUE(takes(two, "[2,1]"));
  const Json twenty = Json::parse(R"({"type":"array","items":{"type":"integer","minimum":1,"maximum":20},"uniqueItems":true})");
  EXPECT_TRUE(takes(twenty, "[1,1"));
  EXPECT_FALSE(takes(twenty, "[1,1]"));
  EXPECT_TRUE(takes(twenty, "[1,11,2,"));
  EXPECT_FALSE(takes(twenty, "[2,20,2"));  // (2x is past 20)
  // Signs: -0 is 0; a '-' goes on where a negative value is left.
  const Json signs = Json::parse(R"({"type":"array","items":{"type":"integer","minimum":-1,"maximum":0},"uniqueItems":true})");
  EXPECT_TRUE(takes(signs, "[0,-"));
  EXPECT_TRUE(takes(signs, "[-1,-0]"));
  EXPECT_FALSE(takes(signs, "[0,-1,"));
  EXPECT_FALSE(takes(signs, "[-1,0,"));
}

// Numbers whose values lie apart otherwise: multiples within bounds (a fraction's digits too), a
// single point; and 0 written with an exponent.
TEST(JsonSchemaUnique, MultiplesAndPointsRunOut) {
  const Json fives = Json::parse(
      R"({"type":"array","items":{"type":"number","multipleOf":5,"minimum":0,"maximum":10},"uniqueItems":true})");
  EXPECT_FALSE(takes(fives, "[0,5,10,"));
  EXPECT_FALSE(takes(fives, "[0,10,1"));  // (only 10, written)
  EXPECT_FALSE(takes(fives, "[5,10,5."));  // (5.x: only 5, written)
  EXPECT_TRUE(takes(fives, "[5,10,0."));
  EXPECT_TRUE(takes(fives, "[10,5,0.0]"));
  EXPECT_EQ(expect_the_validators(fives, {"[0,5,10]", "[5,5.0]", "[10,0.0]"}), 2);
  const Json point = Json::parse(R"({"type":"array","items":{"type":"number","minimum":1.5,"maximum":1.5},"uniqueItems":true})");
  EXPECT_TRUE(takes(point, "[1.5]"));
  EXPECT_FALSE(takes(point, "[1.5,"));
  const Json numbers = Json::parse(R"({"type":"array","items":{"type":"number"},"uniqueItems":true})");
  EXPECT_TRUE(takes(numbers, "[0.5,0e"));
  EXPECT_FALSE(takes(numbers, "[0.5,0,0e"));  // (0 times any power is 0)
  EXPECT_TRUE(takes(numbers, "[0,1e"));
}

// A string item whose pattern forks: it starts and goes on only while some string it can still
// become is not written (escapes read: \u0061 is a).
TEST(JsonSchemaUnique, StringsOfAPatternThatForksRunOut) {
  const Json ab = Json::parse(R"({"type":"array","items":{"type":"string","pattern":"^(ab|abc)$"},"uniqueItems":true})");
  EXPECT_FALSE(takes(ab, R"(["ab","abc",)"));
  EXPECT_TRUE(takes(ab, R"(["ab","a)"));
  EXPECT_TRUE(takes(ab, R"(["abc","ab"])"));
  EXPECT_FALSE(takes(ab, R"(["ab","ab")"));
  const Json forks = Json::parse(R"({"type":"array","items":{"type":"string","pattern":"^(ab|abc|b)$"},"uniqueItems":true})");
  EXPECT_TRUE(takes(forks, R"(["ab","abc",")"));
  EXPECT_FALSE(takes(forks, R"(["ab","abc","a)"));
  EXPECT_FALSE(takes(forks, R"(["ab","abc","\u0061)"));
  EXPECT_TRUE(takes(forks, R"(["ab","abc","\u006)"));  // (\u0062 is b)
  EXPECT_TRUE(takes(forks, R"(["ab","abc","\u0062"])"));
  EXPECT_FALSE(takes(forks, R"(["b","ab","abc",)"));
  // maxLength: "", "x" and "y" are all there are.
  const Json short_ = Json::parse(
      R"({"type":"array","items":{"type":"string","maxLength":1,"pattern":"^[xy]*$"},"uniqueItems":true})");
  EXPECT_FALSE(takes(short_, R"(["x","y","x)"));
  EXPECT_TRUE(takes(short_, R"(["x","y",""])"));
  EXPECT_FALSE(takes(short_, R"(["x","y","",)"));
  EXPECT_EQ(expect_the_validators(short_, {R"(["x","y",""])", R"(["x","x"])", R"(["y"])"}), 2);
}

// Alternatives: a ',' needs some alternative with a value left; a string alternative that has
// none is not started where the other has some.
TEST(JsonSchemaUnique, AlternativesRunOutTogether) {
  const Json s = Json::parse(R"({"type":"array","uniqueItems":true,
    "items":{"anyOf":[{"type":"string","pattern":"^(ab|abc)$"},{"type":"integer","minimum":0,"maximum":1}]}})");
  EXPECT_TRUE(takes(s, R"(["ab","abc",)"));
  EXPECT_FALSE(takes(s, R"(["ab","abc",")"));
  EXPECT_TRUE(takes(s, R"(["ab","abc",1,0])"));
  EXPECT_FALSE(takes(s, R"(["ab","abc",1,0,)"));
  const Json same = Json::parse(R"({"type":"array","uniqueItems":true,"items":{"anyOf":[{"enum":[1,2]},{"enum":[2,1.0]}]}})");
  EXPECT_FALSE(takes(same, "[1,2,"));
}

// minItems above the distinct values an item can be is refused at compile time (an anyOf's
// values counted once, 1.0 as 1); at the count itself the array is written whole.
TEST(JsonSchemaUnique, MinItemsAboveTheDistinctValuesIsRefused) {
  expect_refused(R"({"type":"array","items":{"type":"integer","minimum":1,"maximum":2},"uniqueItems":true,"minItems":3})",
          "above the 2 distinct");
  expect_refused(R"({"type":"array","items":{"type":"string","pattern":"^(ab|abc)$"},"uniqueItems":true,"minItems":3})",
          "above the 2 distinct");
  expect_refused(R"({"type":"array","items":{"anyOf":[{"enum":[1,2]},{"enum":[2,1.0]}]},"uniqueItems":true,"minItems":3})",
          "above the 2 distinct");
  expect_refused(R"({"type":"array","items":{"enum":[1,1.0]},"uniqueItems":true,"minItems":2})", "above the 1 distinct");
  expect_refused(R"({"type":"array","items":{"type":"number","multipleOf":5,"minimum":0,"maximum":10},"uniqueItems":true,
              "minItems":4})", "above the 3 distinct");
  EXPECT_EQ(message(R"({"type":"array","items":{"type":"integer","minimum":1,"maximum":2},"uniqueItems":true,"minItems":2})"),
            "");
}

const Json& sets() {
  static const Json s = Json::parse(R"({
    "type": "object",
    "properties": {
      "two": {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 2}, "uniqueItems": true},
      "all": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 2}, "uniqueItems": true,
              "minItems": 3},
      "forks": {"type": "array", "items": {"type": "string", "pattern": "^(ab|abc|b)$"}, "uniqueItems": true},
      "fives": {"type": "array", "items": {"type": "number", "multipleOf": 5, "minimum": -5, "maximum": 5},
                "uniqueItems": true},
      "mixed": {"type": "array", "uniqueItems": true,
                "items": {"anyOf": [{"type": "string", "maxLength": 1, "pattern": "^[xy]*$"}, {"type": "boolean"}]}}
    },
    "required": ["two", "all", "forks", "fives", "mixed"],
    "additionalProperties": false
  })");
  return s;
}

// Walks through the mask never meet an empty one (no dead end), and what they end with validates.
TEST(JsonSchemaUnique, WalksNeverDeadEnd) { EXPECT_GT(walks_that_end(sets(), 41, 30), 10); }

// enum and const values are kept only where the rest of their schema takes them: counts, items,
// prefixItems, uniqueItems, lengths, bounds, and an object's values by their properties' schemas.
TEST(JsonSchemaUnique, EnumValuesMeetEveryOtherKeyword) {
  expect_refused(R"({"enum":[[1]],"minItems":2})", "no value of 'enum' meets");
  expect_refused(R"({"const":[1,1],"uniqueItems":true,"items":{"type":"integer"}})", "no value of 'enum' meets");
  const Json arrays = Json::parse(
      R"({"enum":[[1],[1,2],[1,"x"],[2,2],[1,2,3]],"items":{"type":"integer"},"minItems":2,"maxItems":2,"uniqueItems":true})");
  EXPECT_EQ(expect_the_validators(arrays, {"[1]", "[1,2]", R"([1,"x"])", "[2,2]", "[1,2,3]"}), 1);
  const Json tuples = Json::parse(R"({"enum":[[1,"a"],["a",1]],"prefixItems":[{"type":"integer"}]})");
  EXPECT_EQ(expect_the_validators(tuples, {R"([1,"a"])", R"(["a",1])"}), 1);
  const Json nested = Json::parse(R"({"enum":[[[1]],[[1,2]]],"items":{"minItems":2}})");
  EXPECT_EQ(expect_the_validators(nested, {"[[1]]", "[[1,2]]"}), 1);
  const Json objects = Json::parse(R"({"enum":[{"a":1},{"a":"x"},{"b":[]}],"properties":{"a":{"type":"integer"}},
                                      "additionalProperties":{"type":"string"}})");
  EXPECT_EQ(expect_the_validators(objects, {R"({"a":1})", R"({"a":"x"})", R"({"b":[]})"}), 1);
  const Json strings = Json::parse(R"({"enum":["a","bb",1,5],"maxLength":1,"maximum":3})");
  EXPECT_EQ(expect_the_validators(strings, {R"("a")", R"("bb")", "1", "5"}), 2);
  // An item's schema that is a list of its own: [1] is not one of t's values.
  const Json recursive = Json::parse(
      R"({"$defs":{"t":{"enum":[[],[[]],[[],[[]]],[1]],"items":{"$ref":"#/$defs/t"}}},"$ref":"#/$defs/t"})");
  EXPECT_EQ(expect_the_validators(recursive, {"[]", "[[]]", "[[],[[]]]", "[1]"}), 3);
  EXPECT_TRUE(takes(recursive, "[[],[["));
  EXPECT_FALSE(takes(recursive, "[1"));
}

}  // namespace
}  // namespace dsi::server
