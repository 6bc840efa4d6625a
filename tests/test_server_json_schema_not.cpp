// Structured outputs (server/json_schema.h): not, where its schema is a type, a const or enum of
// scalars, both, or an anyOf of such. Against the validator (test_json_schema_util.h), with the
// compiler's messages, and walked through the mask: a value never ends equal to an excluded one
// (1 equal to 1.0, escapes read), a string or number goes on only while it can still end as
// another value (no dead end), the types not names are taken out, the nots of an allOf's members
// hold together, and uniqueItems' written items and not's values are avoided together.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_json_schema_util.h"

namespace dsi::server {
namespace {

using namespace schema_test;

// A string that may not be empty: the closing quote cannot come right after the opening one.
TEST(JsonSchemaNot, StringConstExcluded) {
  const Json s = Json::parse(R"({"type":"string","not":{"const":""}})");
  EXPECT_FALSE(accepts(s, R"("")"));
  EXPECT_FALSE(takes(s, R"("")"));
  EXPECT_TRUE(takes(s, R"(")"));
  EXPECT_TRUE(accepts(s, R"("a")"));
  EXPECT_EQ(expect_the_validators(s, {R"("")", R"("a")", R"(" ")", R"("\u0000")"}), 3);
  // An excluded value written with escapes is the same string.
  const Json a = Json::parse(R"({"type":"string","not":{"const":"a"}})");
  EXPECT_EQ(expect_the_validators(a, {R"("a")", R"("\u0061")", R"("ab")", R"("b")", R"("")"}), 3);
  EXPECT_TRUE(takes(a, R"("\u0061)"));  // (it can still become "ab")
  for (uint64_t seed : {1, 2, 3}) EXPECT_GT(walks_that_end(s, seed, 20), 0);
}

// A string with only a few completions left: it goes on only while it can still end as a value
// that is not excluded (escapes read).
TEST(JsonSchemaNot, StringsNeverDeadEndOnAnExcludedValue) {
  const Json s = Json::parse(R"({"type":"string","pattern":"^(ab|ac)$","not":{"enum":["ab"]}})");
  EXPECT_TRUE(takes(s, R"("a)"));
  EXPECT_FALSE(takes(s, R"("ab)"));  // it could only end as "ab"
  EXPECT_FALSE(takes(s, R"("\u0061b)"));
  EXPECT_TRUE(takes(s, R"("ac)"));
  EXPECT_TRUE(accepts(s, R"("ac")"));
  EXPECT_EQ(expect_the_validators(s, {R"("ab")", R"("ac")", R"("\u0061c")", R"("ad")"}), 2);
  // maxLength: "" and "x" excluded, "y" left.
  const Json one = Json::parse(R"({"type":"string","maxLength":1,"pattern":"^[xy]*$","not":{"enum":["","x"]}})");
  EXPECT_FALSE(takes(one, R"("")"));
  EXPECT_FALSE(takes(one, R"("x)"));
  EXPECT_TRUE(accepts(one, R"("y")"));
  // A type whose strings are all excluded is not started where another type is left.
  const Json mixed = Json::parse(R"({"type":["string","integer"],"maxLength":0,"not":{"const":""}})");
  EXPECT_FALSE(takes(mixed, R"(")"));
  EXPECT_TRUE(accepts(mixed, "1"));
  EXPECT_EQ(expect_the_validators(mixed, {R"("")", "1", "-5"}), 2);
  for (uint64_t seed : {4, 5}) {
    EXPECT_GT(walks_that_end(s, seed, 20), 0);
    EXPECT_GT(walks_that_end(one, seed, 20), 0);
    EXPECT_GT(walks_that_end(mixed, seed, 20), 0);
  }
}

// Bounded integers: only 1 is left of 0..2, so neither 0 nor 2 (nor -0) starts.
TEST(JsonSchemaNot, BoundedIntegersExcluded) {
  const Json s = Json::parse(R"({"type":"integer","minimum":0,"maximum":2,"not":{"enum":[0,2]}})");
  EXPECT_FALSE(takes(s, "0"));
  EXPECT_FALSE(takes(s, "2"));
  EXPECT_FALSE(takes(s, "-"));  // (only -0, which is 0)
  EXPECT_TRUE(accepts(s, "1"));
  EXPECT_EQ(expect_the_validators(s, {"0", "1", "2", "-0"}), 1);
  // Unbounded: 1 may still become 10.
  const Json ints = Json::parse(R"({"type":"integer","not":{"const":1}})");
  EXPECT_TRUE(takes(ints, "1"));
  EXPECT_FALSE(accepts(ints, "1"));
  EXPECT_TRUE(accepts(ints, "10"));
  const Json zero = Json::parse(R"({"type":"integer","not":{"const":0}})");
  EXPECT_FALSE(takes(zero, "0"));  // an integer's leading 0 takes nothing more
  EXPECT_FALSE(takes(zero, "-0"));
  EXPECT_TRUE(takes(zero, "-1"));
  EXPECT_EQ(expect_the_validators(zero, {"0", "-0", "1", "-10", "100"}), 3);
  for (uint64_t seed : {6, 7}) {
    EXPECT_GT(walks_that_end(s, seed, 20), 0);
    EXPECT_GT(walks_that_end(zero, seed, 20), 0);
  }
}

// Numbers compared as validators do: 1 equals 1.0 and 1e0; 1 can still become 1.5 or 10.
TEST(JsonSchemaNot, NumbersComparedByValue) {
  const Json s = Json::parse(R"({"type":"number","not":{"const":1}})");
  EXPECT_FALSE(accepts(s, "1"));
  EXPECT_FALSE(accepts(s, "1.0"));
  EXPECT_TRUE(accepts(s, "1.5"));
  EXPECT_TRUE(accepts(s, "10"));
  EXPECT_TRUE(takes(s, "1"));
  EXPECT_TRUE(takes(s, "1.0"));  // (1.05)
  EXPECT_TRUE(takes(s, "1e"));   // (1e1)
  EXPECT_EQ(expect_the_validators(s, {"1", "1.0", "1.00", "1e0", "10e-1", "0.1e1", "100E-2", "1.5", "10", "-1", "0"}),
            4);
  // 0: 0 times any power is 0, so 0e is refused at once; 0. may still become 0.5.
  const Json zero = Json::parse(R"({"type":"number","not":{"const":0}})");
  EXPECT_FALSE(takes(zero, "0e"));
  EXPECT_FALSE(takes(zero, "-0.0E"));
  EXPECT_TRUE(takes(zero, "0."));
  EXPECT_TRUE(takes(zero, "-0.00"));
  EXPECT_EQ(expect_the_validators(zero, {"0", "-0", "0.0", "-0.0", "0.5", "-0.25", "1e-3"}), 3);
  // Bounds: 2 is the last of [1, 2], so a 2 that starts there can only end as 2.
  const Json bounded = Json::parse(R"({"type":"number","minimum":1,"maximum":2,"not":{"enum":[1,2]}})");
  EXPECT_TRUE(takes(bounded, "1"));
  EXPECT_TRUE(takes(bounded, "1.0"));
  EXPECT_FALSE(takes(bounded, "2"));
  EXPECT_EQ(expect_the_validators(bounded, {"1", "1.0", "1.5", "2", "2.0", "1.999"}), 2);
  // Multiples: only 5 is left of 0, 5, 10.
  const Json fives = Json::parse(R"({"type":"number","multipleOf":5,"minimum":0,"maximum":10,"not":{"enum":[0,10]}})");
  EXPECT_FALSE(takes(fives, "0"));
  EXPECT_FALSE(takes(fives, "1"));
  EXPECT_TRUE(accepts(fives, "5"));
  EXPECT_TRUE(accepts(fives, "5.0"));
  // (Walked: zero, not s, since the walks read a long exponent as 0, which would make 1E999 read 1.)
  for (uint64_t seed : {8, 9}) {
    EXPECT_GT(walks_that_end(zero, seed, 20), 0);
    EXPECT_GT(walks_that_end(bounded, seed, 20), 0);
    EXPECT_GT(walks_that_end(fives, seed, 20), 0);
  }
}

// Booleans and null: a literal that could only end as an excluded one is refused at its first byte.
TEST(JsonSchemaNot, BooleansAndNull) {
  const Json s = Json::parse(R"({"type":["boolean","null"],"not":{"enum":[true,null]}})");
  EXPECT_FALSE(takes(s, "t"));
  EXPECT_FALSE(takes(s, "n"));
  EXPECT_TRUE(accepts(s, "false"));
  EXPECT_EQ(expect_the_validators(s, {"true", "false", "null"}), 1);
  // Any type: only true is excluded.
  const Json any = Json::parse(R"({"not":{"const":true}})");
  EXPECT_EQ(expect_the_validators(any, {"true", "false", "null", "1", R"("true")", "[true]", R"({"a":true})"}), 6);
  for (uint64_t seed : {10, 11}) EXPECT_GT(walks_that_end(s, seed, 20), 0);
}

// not of a type takes the type out: of any type, of a list, of enum values; integer alone where
// other numbers stay is refused, and so is a not that leaves no type.
TEST(JsonSchemaNot, TypesTakenOut) {
  const Json s = Json::parse(R"({"not":{"type":["string","object"]}})");
  EXPECT_FALSE(accepts(s, R"("a")"));
  EXPECT_FALSE(accepts(s, "{}"));
  EXPECT_TRUE(accepts(s, "1"));
  EXPECT_TRUE(accepts(s, "[1]"));
  EXPECT_FALSE(takes(s, R"(")"));
  EXPECT_FALSE(takes(s, "{"));
  EXPECT_EQ(expect_the_validators(s, {R"("a")", "{}", R"({"a":1})", "1", "1.5", "[1]", R"(["a"])", "null", "true"}), 6);
  // number takes integers out too; integer alone where only integers are allowed.
  const Json numbers = Json::parse(R"({"type":["integer","string"],"not":{"type":"number"}})");
  EXPECT_EQ(expect_the_validators(numbers, {"1", "1.5", R"("1")"}), 1);
  const Json ints = Json::parse(R"({"type":["integer","boolean"],"not":{"type":"integer"}})");
  EXPECT_EQ(expect_the_validators(ints, {"1", "true", "false"}), 2);
  // Enum values of a type taken out are dropped.
  const Json values = Json::parse(R"({"enum":[1,"a",null],"not":{"type":["string","null"]}})");
  EXPECT_EQ(expect_the_validators(values, {"1", R"("a")", "null"}), 1);
  expect_refused(R"({"type":"number","not":{"type":"integer"}})", "'integer' where other numbers are allowed");
  expect_refused(R"({"not":{"type":"integer"}})", "'integer' where other numbers are allowed");
  expect_refused(R"({"type":"integer","not":{"type":"integer"}})", "excludes every type");
  expect_refused(R"({"type":"integer","not":{"type":"number"}})", "excludes every type");
  expect_refused(R"({"type":["string","null"],"not":{"type":["null","string"]}})", "excludes every type");
  for (uint64_t seed : {12, 13}) EXPECT_GT(walks_that_end(s, seed, 20), 0);
}

// not of a type and values: only the listed values of its types are excluded.
TEST(JsonSchemaNot, TypeAndValuesExcludeOnlyThoseValues) {
  const Json s = Json::parse(R"({"not":{"type":"string","enum":["a",1]}})");
  EXPECT_TRUE(accepts(s, "1"));
  EXPECT_FALSE(accepts(s, R"("a")"));
  EXPECT_TRUE(accepts(s, R"("b")"));
  EXPECT_EQ(expect_the_validators(s, {"1", "1.0", R"("a")", R"("b")", "null"}), 4);
  const Json numbers = Json::parse(R"({"type":["number","string"],"not":{"type":"integer","enum":[2,"2",2.5]}})");
  EXPECT_EQ(expect_the_validators(numbers, {"2", "2.0", R"("2")", "2.5", "3"}), 3);
}

// not of an anyOf: each alternative's values are excluded.
TEST(JsonSchemaNot, AnyOfExcludesEachAlternative) {
  const Json s = Json::parse(R"({"type":"integer","minimum":0,"maximum":3,"not":{"anyOf":[{"const":0},{"enum":[3]}]}})");
  EXPECT_FALSE(takes(s, "0"));
  EXPECT_FALSE(takes(s, "3"));
  EXPECT_TRUE(accepts(s, "1"));
  EXPECT_TRUE(accepts(s, "2"));
  EXPECT_EQ(expect_the_validators(s, {"0", "1", "2", "3"}), 2);
  // Alternatives of types and values together.
  const Json mixed = Json::parse(R"({"not":{"anyOf":[{"type":"null"},{"const":"x"},{"type":"boolean","enum":[false]}]}})");
  EXPECT_EQ(expect_the_validators(mixed, {"null", R"("x")", R"("y")", "false", "true", "0"}), 3);
  for (uint64_t seed : {14, 15}) EXPECT_GT(walks_that_end(s, seed, 20), 0);
}

// In an allOf, each member's not holds (merged into one), also through anyOf alternatives.
TEST(JsonSchemaNot, AllOfMembersNotsHoldTogether) {
  const Json s = Json::parse(R"({"allOf":[{"type":"integer","minimum":0,"maximum":3,"not":{"const":1}},{"not":{"const":2}}]})");
  EXPECT_FALSE(accepts(s, "1"));
  EXPECT_FALSE(accepts(s, "2"));
  EXPECT_TRUE(accepts(s, "0"));
  EXPECT_TRUE(accepts(s, "3"));
  EXPECT_FALSE(takes(s, "1"));
  EXPECT_FALSE(takes(s, "2"));
  EXPECT_EQ(expect_the_validators(s, {"0", "1", "2", "3"}), 2);
  // Three members, one of them an anyOf in its not, one a type.
  const Json three = Json::parse(R"({"allOf":[{"type":"integer","minimum":0,"maximum":5,"not":{"anyOf":[{"const":0},{"const":1}]}},
    {"not":{"const":2}},{"not":{"enum":[5]}},{"not":{"type":"string"}}]})");
  EXPECT_EQ(expect_the_validators(three, {"0", "1", "2", "3", "4", "5"}), 2);
  // An anyOf in one member: each alternative holds to the other member's not.
  const Json alts = Json::parse(R"({"allOf":[{"anyOf":[{"type":"string"},{"type":"integer"}]},{"not":{"enum":["a",1]}}]})");
  EXPECT_EQ(expect_the_validators(alts, {R"("a")", R"("b")", "1", "2", "null"}), 2);
  for (uint64_t seed : {16, 17}) {
    EXPECT_GT(walks_that_end(s, seed, 20), 0);
    EXPECT_GT(walks_that_end(alts, seed, 20), 0);
  }
}

// An enum's values that not excludes are dropped; where none is left the schema is refused.
TEST(JsonSchemaNot, EnumFiltered) {
  const Json s = Json::parse(R"({"enum":["a","b"],"not":{"const":"a"}})");
  EXPECT_FALSE(accepts(s, R"("a")"));
  EXPECT_TRUE(accepts(s, R"("b")"));
  EXPECT_FALSE(takes(s, R"("a)"));
  EXPECT_EQ(expect_the_validators(s, {R"("a")", R"("b")", R"("c")"}), 1);
  const Json numbers = Json::parse(R"({"enum":[1,2.0,3],"not":{"enum":[1.0,2]}})");
  EXPECT_EQ(expect_the_validators(numbers, {"1", "2.0", "3"}), 1);
  const std::string m = message(R"({"enum":["a"],"not":{"const":"a"}})");
  EXPECT_NE(m.find("enum"), std::string::npos) << m;
}

// uniqueItems and not together: an item goes on only while it can still end as a value neither
// written nor excluded; minItems above what is left is refused.
TEST(JsonSchemaNot, UniqueItemsAvoidsBoth) {
  const Json s = Json::parse(
      R"({"type":"array","items":{"type":"integer","minimum":1,"maximum":3,"not":{"const":2}},"uniqueItems":true})");
  EXPECT_FALSE(takes(s, "[1,3,"));  // no value left
  EXPECT_FALSE(takes(s, "[1,2"));
  EXPECT_FALSE(takes(s, "[2"));
  EXPECT_TRUE(takes(s, "[1,"));
  EXPECT_TRUE(accepts(s, "[3,1]"));
  EXPECT_EQ(expect_the_validators(s, {"[]", "[1]", "[2]", "[1,3]", "[3,1]", "[1,1]", "[1,2]"}), 4);
  const std::string m = message(
      R"({"type":"array","items":{"type":"integer","minimum":1,"maximum":3,"not":{"const":2}},"uniqueItems":true,"minItems":3})");
  EXPECT_FALSE(m.empty());
  EXPECT_NE(m.find("minItems"), std::string::npos) << m;
  EXPECT_NE(m.find("2 distinct"), std::string::npos) << m;
  EXPECT_EQ(message(R"({"type":"array","items":{"type":"integer","minimum":1,"maximum":3,"not":{"const":2}},
                        "uniqueItems":true,"minItems":2})"),
            "");
  // Strings of a pattern: "ab" excluded, "ac" and "ad" written, nothing left.
  const Json strings = Json::parse(
      R"({"type":"array","items":{"type":"string","pattern":"^(ab|ac|ad)$","not":{"const":"ab"}},"uniqueItems":true})");
  EXPECT_TRUE(takes(strings, R"(["ac",)"));
  EXPECT_FALSE(takes(strings, R"(["ac","ab)"));
  EXPECT_FALSE(takes(strings, R"(["ac","ad",)"));
  EXPECT_EQ(expect_the_validators(strings, {R"(["ac","ad"])", R"(["ab"])", R"(["ad","ad"])"}), 1);
  for (uint64_t seed : {18, 19}) {
    EXPECT_GT(walks_that_end(s, seed, 20), 0);
    EXPECT_GT(walks_that_end(strings, seed, 20), 0);
  }
}

// A property's value and an array's items hold to their own not.
TEST(JsonSchemaNot, ObjectPropertyAndItems) {
  const Json s = Json::parse(
      R"({"type":"object","properties":{"a":{"type":"string","not":{"const":"x"}}},"required":["a"],"additionalProperties":false})");
  EXPECT_FALSE(accepts(s, R"({"a":"x"})"));
  EXPECT_TRUE(accepts(s, R"({"a":"y"})"));
  EXPECT_FALSE(takes(s, R"({"a":"x")"));
  EXPECT_EQ(expect_the_validators(s, {R"({"a":"x"})", R"({"a":"y"})", R"({"a":"xx"})", R"({"a":"\u0078"})"}), 2);
  const Json n = Json::parse(R"({"type":"object","properties":{"n":{"type":"integer","not":{"const":1}}}})");
  EXPECT_TRUE(takes(n, R"({"n":1)"));  // (10)
  EXPECT_FALSE(takes(n, R"({"n":1})"));
  EXPECT_FALSE(takes(n, R"({"n":1,)"));
  EXPECT_EQ(expect_the_validators(n, {R"({"n":1})", R"({"n":10})", R"({})"}), 2);
  const Json items = Json::parse(R"({"type":"array","items":{"not":{"enum":[null,"",0]}}})");
  EXPECT_EQ(expect_the_validators(items, {"[null]", R"([""])", "[0]", "[-0.0]", R"([1,"a",false,[],{}])", "[]"}), 2);
  const Json scalars = Json::parse(
      R"({"type":"array","items":{"type":["null","string","integer"],"maxLength":3,"not":{"enum":[null,"",0]}},"maxItems":4})");
  EXPECT_EQ(expect_the_validators(scalars, {"[null]", R"([""])", "[0]", "[-0]", R"([1,"a"])", "[]"}), 2);
  EXPECT_FALSE(takes(scalars, "[n"));
  EXPECT_FALSE(takes(scalars, R"([1,"")"));
  // Alternatives: a value one excludes may be the other's.
  const Json alts = Json::parse(R"({"anyOf":[{"type":"string","not":{"const":"a"}},{"const":"a"}]})");
  EXPECT_EQ(expect_the_validators(alts, {R"("a")", R"("b")"}), 2);
  for (uint64_t seed : {20, 21}) {
    EXPECT_GT(walks_that_end(s, seed, 20), 0);
    EXPECT_GT(walks_that_end(scalars, seed, 20), 0);
  }
}

// What the compiler refuses: not of other keywords, of a schema that takes every value, of object
// or array values where the node can take one, and a not that leaves no value.
TEST(JsonSchemaNot, Refusals) {
  expect_refused(R"({"not":{"minimum":1}})", "'minimum'");
  expect_refused(R"({"not":{"not":{"const":1}}})", "'not' in it");
  expect_refused(R"({"not":{"anyOf":[{"const":1}],"type":"string"}})", "beside its 'anyOf'");
  expect_refused(R"({"not":{"anyOf":[{"type":"string","maxLength":2}]}})", "'maxLength'");
  expect_refused(R"({"not":true})", "takes every value");
  expect_refused(R"({"not":{}})", "takes every value");
  expect_refused(R"({"not":{"description":"anything"}})", "takes every value");
  expect_refused(R"({"type":"array","not":{"const":[1]}})", "an object or array value");
  expect_refused(R"({"not":{"enum":[{"a":1}]}})", "an object or array value");
  expect_refused(R"({"type":"boolean","not":{"enum":[true,false]}})", "excludes every value");
  expect_refused(R"({"type":"integer","minimum":1,"maximum":1,"not":{"const":1.0}})", "excludes every value");
  expect_refused(R"({"type":"string","pattern":"^(ab|ac)$","not":{"enum":["ab","ac"]}})", "excludes every value");
  expect_refused(R"({"not":{"type":"strung"}})", "unknown type");
  // An array value cannot be a string: nothing to exclude from a string.
  const Json s = Json::parse(R"({"type":"string","not":{"const":[1]}})");
  EXPECT_EQ(message(R"({"type":"string","not":{"const":[1]}})"), "");
  EXPECT_TRUE(accepts(s, R"("a")"));
  // not of false: any value.
  const Json any = Json::parse(R"({"type":"integer","not":false})");
  EXPECT_EQ(expect_the_validators(any, {"1", "0", R"("a")"}), 2);
}

// Schemas of each kind above against the validator, and walked.
TEST(JsonSchemaNot, TheValidatorsOverAMix) {
  const Json s = Json::parse(R"({
    "type": "object",
    "properties": {
      "word": {"type": "string", "pattern": "^(ab|ac|b)$", "not": {"enum": ["ab", "b"]}},
      "count": {"type": "integer", "minimum": 0, "maximum": 4, "not": {"anyOf": [{"const": 0}, {"enum": [4, 2]}]}},
      "flag": {"type": ["boolean", "null"], "not": {"enum": [null, false]}},
      "set": {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 4, "not": {"const": 3}},
              "uniqueItems": true},
      "other": {"not": {"type": ["object", "array", "string"]}},
      "ratio": {"type": "number", "minimum": -1, "maximum": 1, "not": {"enum": [0, 1]}}
    },
    "required": ["word", "count", "flag", "set", "other", "ratio"],
    "additionalProperties": false
  })");
  EXPECT_EQ(expect_the_validators(s, {
      R"({"word":"ac","count":1,"flag":true,"set":[1,2,4],"other":null,"ratio":0.5})",
      R"({"word":"ab","count":1,"flag":true,"set":[],"other":1,"ratio":0.5})",
      R"({"word":"ac","count":2,"flag":true,"set":[],"other":1,"ratio":0.5})",
      R"({"word":"ac","count":3,"flag":null,"set":[],"other":1,"ratio":0.5})",
      R"({"word":"ac","count":3,"flag":true,"set":[3],"other":1,"ratio":0.5})",
      R"({"word":"ac","count":3,"flag":true,"set":[4,4],"other":1,"ratio":0.5})",
      R"({"word":"ac","count":3,"flag":true,"set":[4],"other":"s","ratio":0.5})",
      R"({"word":"ac","count":3,"flag":true,"set":[4],"other":false,"ratio":1.0})",
      R"({"word":"ac","count":3,"flag":true,"set":[4],"other":false,"ratio":-0.0})",
      R"({"word":"ac","count":3,"flag":true,"set":[4,2,1],"other":false,"ratio":-0.5})",
  }), 2);
  EXPECT_GT(walks_that_end(s, 42, 30), 10);
}

// Each prefix the recognizer takes, up to a few bytes (printable ASCII), has a byte that follows it
// or is a whole value; each whole value validates; and the whole values are those listed.
void expect_every_prefix(const char* text, size_t depth, const std::vector<std::string>& whole) {
  SCOPED_TRACE(text);
  const Json s = Json::parse(text);
  const auto schema = JsonSchema::compile(s);
  std::vector<std::string> layer = {""}, ended;
  for (size_t d = 0; d <= depth && !layer.empty(); ++d) {
    std::vector<std::string> next;
    for (const std::string& p : layer) {
      SchemaPrefix at(schema);
      ASSERT_TRUE(at.push(p)) << p;
      bool goes_on = false;
      if (at.complete()) {
        ended.push_back(p);
        const Json v = Json::parse(p, nullptr, false);
        EXPECT_TRUE(!v.is_discarded() && valid(v, s, s)) << p;
      }
      for (int c = 33; c < 127; ++c) {
        SchemaPrefix q(schema);
        if (q.push(p + char(c))) goes_on = true, next.push_back(p + char(c));
      }
      EXPECT_TRUE(goes_on || at.complete()) << "a dead end: " << p;
    }
    layer = d < depth ? std::move(next) : std::vector<std::string>();
  }
  std::sort(ended.begin(), ended.end());
  std::vector<std::string> want = whole;
  std::sort(want.begin(), want.end());
  EXPECT_EQ(ended, want);
}

TEST(JsonSchemaNot, NoPrefixDeadEnds) {
  expect_every_prefix(R"({"type":"integer","minimum":-2,"maximum":12,"not":{"enum":[-2,-1,0,1,10,11,12]}})", 3,
                      {"2", "3", "4", "5", "6", "7", "8", "9"});
  expect_every_prefix(R"({"type":"number","multipleOf":5,"minimum":0,"maximum":20,"not":{"enum":[0,10,20]}})", 4,
                      {"5", "5.0", "5.00", "15", "15.0"});
  expect_every_prefix(R"({"type":"string","maxLength":2,"pattern":"^[ab]*$","not":{"enum":["","a","ab","aa"]}})", 4,
                      {R"("b")", R"("ba")", R"("bb")"});
  expect_every_prefix(R"({"type":["string","boolean","null"],"pattern":"^(ab|abc|b)$","not":{"enum":["ab","b",true,null]}})",
                      6, {R"("abc")", "false"});
  expect_every_prefix(R"({"type":"array","items":{"type":"integer","minimum":0,"maximum":3,"not":{"enum":[1,2]}},
                          "uniqueItems":true})", 5, {"[]", "[0]", "[3]", "[0,3]", "[3,0]", "[-0]"});
  expect_every_prefix(R"({"type":"array","items":{"enum":[1,"a",true,null],"not":{"enum":[1,null]}},"uniqueItems":true})",
                      8, {"[]", R"(["a"])", "[true]"});
  expect_every_prefix(R"({"type":"object","properties":{"a":{"type":"integer","minimum":0,"maximum":2,"not":{"enum":[0,2]}}},
                          "additionalProperties":false})", 7, {"{}", R"({"a":1})"});
}

// More places a not holds: a boolean beside the string "true", a format, a recursive reference,
// other keys' values (additionalProperties, patternProperties), escapes and non-ASCII strings,
// prefixItems beside uniqueItems.
TEST(JsonSchemaNot, MorePlaces) {
  const Json literal = Json::parse(R"({"type":["boolean","string","null"],"not":{"enum":["true",null]}})");
  EXPECT_EQ(expect_the_validators(literal, {"true", R"("true")", "null", R"("null")", R"("\u0074rue")"}), 2);
  const Json ip = Json::parse(R"({"type":"string","format":"ipv4","not":{"const":"0.0.0.0"}})");
  EXPECT_FALSE(takes(ip, R"("0.0.0.0)"));
  EXPECT_TRUE(takes(ip, R"("0.0.0.)"));
  EXPECT_EQ(expect_the_validators(ip, {R"("0.0.0.0")", R"("0.0.0.1")", R"("10.0.0.0")"}), 2);
  const Json tree = Json::parse(R"({"$defs":{"t":{"type":["integer","array"],"items":{"$ref":"#/$defs/t"},"not":{"const":0}}},
                                    "$ref":"#/$defs/t"})");
  EXPECT_EQ(expect_the_validators(tree, {"0", "[0]", "[[1,0]]", "[[1,2],3]", "[]"}), 2);
  const Json others = Json::parse(R"({"type":"object","additionalProperties":{"type":"string","not":{"const":"x"}},
                                      "patternProperties":{"^p":{"type":"integer","not":{"const":1}}}})");
  EXPECT_EQ(expect_the_validators(others, {R"({"a":"x"})", R"({"a":"y"})", R"({"p":1})", R"({"p":2})", R"({"pa":"x"})"}), 2);
  const Json escapes = Json::parse(R"({"type":"string","not":{"enum":["\u00e9","a\"b"]}})");
  EXPECT_EQ(expect_the_validators(escapes, {R"("\u00e9")", "\"\xc3\xa9\"", R"("a\"b")", R"("a\u0022b")", R"("ab")"}), 1);
  const Json tuple = Json::parse(R"({"type":"array","prefixItems":[{"type":"integer","minimum":0,"maximum":1,"not":{"const":0}}],
                                     "items":{"type":"boolean","not":{"const":true}},"uniqueItems":true})");
  EXPECT_EQ(expect_the_validators(tuple, {"[0]", "[1]", "[1,false]", "[1,true]", "[1,false,false]"}), 2);
  EXPECT_FALSE(takes(tuple, "[1,false,"));
  EXPECT_FALSE(takes(tuple, "[0"));
}

// contains beside items whose not excludes contains' value: that value is no item, so it never
// counts as a match (schema_contains reads the items' not). Where no value of contains is left, no
// array validates and the schema is refused; where another is, an item written to match is that one.
TEST(JsonSchemaNot, ContainsValueExcludedByItems) {
  EXPECT_NE(message(R"({"type":"array","items":{"type":"integer","not":{"const":1}},"contains":{"const":1},"maxItems":2})")
                .find("no array has"),
            std::string::npos);
  EXPECT_NE(message(R"({"type":"array","items":{"type":"string","not":{"const":"x"}},"contains":{"const":"x"}})")
                .find("no array has"),
            std::string::npos);
  const Json s = Json::parse(
      R"({"type":"array","items":{"type":"integer","not":{"const":1}},"contains":{"enum":[1,2]},"maxItems":2})");
  EXPECT_FALSE(takes(s, "[3,1"));  // (the last item must match: only 2 can)
  EXPECT_TRUE(takes(s, "[3,2"));
  EXPECT_EQ(expect_the_validators(s, {"[1]", "[2]", "[3,2]", "[2,1]", "[3]", "[2,3]"}), 3);
  EXPECT_GT(walks_that_end(s, 11, 20), 0);
  // maxContains with a boolean item: true is excluded, false matches contains and is full, so no
  // item can be written once it is.
  const Json flags = Json::parse(
      R"({"type":"array","items":{"type":"boolean","not":{"const":true}},"contains":{"const":false},"maxContains":1})");
  EXPECT_TRUE(accepts(flags, "[false]"));
  EXPECT_FALSE(takes(flags, "[false,"));
}

// In an allOf, a member's not whose anyOf has an annotation beside it is taken apart like a bare
// anyOf: the merged not lists each alternative once.
TEST(JsonSchemaNot, AllOfMergesAnAnnotatedAnyOf) {
  EXPECT_EQ(message(R"({"type":"string","not":{"anyOf":[{"const":"a"}],"description":"d"}})"), "");
  const Json merged = Json::parse(
      R"({"allOf":[{"type":"string","not":{"anyOf":[{"const":"a"}],"description":"d"}},{"not":{"const":"b"}}]})");
  EXPECT_EQ(expect_the_validators(merged, {R"("a")", R"("b")", R"("c")"}), 1);
}

// A number whose negative exponent has taken it below the smallest double is 0, whatever digits
// follow: under not 0 it goes no further (before, 1e-400 was taken and then nothing could end it).
TEST(JsonSchemaNot, ExponentsPastTheSmallestDouble) {
  const Json s = Json::parse(R"({"type":"number","not":{"const":0}})");
  EXPECT_TRUE(takes(s, "1e-40"));
  EXPECT_TRUE(accepts(s, "1e-40"));
  EXPECT_FALSE(takes(s, "1e-400"));
  EXPECT_TRUE(takes(s, "1e-3"));  // (1e-30 and 1e-3 are not 0)
  const Json unique = Json::parse(R"({"type":"array","items":{"type":"number"},"uniqueItems":true})");
  EXPECT_FALSE(takes(unique, "[0,1e-400"));
  EXPECT_TRUE(takes(unique, "[0,1e-40"));
}

// A string under not keeps its text only while an excluded value still starts like it: then its
// states share their signatures (so the masks kept for them) as any other string's do.
TEST(JsonSchemaNot, StringsLetGoOfTheirTextOnceNoExcludedValueIsNear) {
  const auto nonempty = JsonSchema::compile(Json::parse(R"({"type":"string","not":{"const":""}})"));
  SchemaPrefix a(nonempty), b(nonempty);
  ASSERT_TRUE(a.push("\"abc"));
  ASSERT_TRUE(b.push("\"xyz"));
  EXPECT_EQ(a.signature(), b.signature());
  const auto near = JsonSchema::compile(Json::parse(R"({"type":"string","not":{"enum":["abcd","a\"b"]}})"));
  SchemaPrefix c(near), d(near), e(near);
  ASSERT_TRUE(c.push("\"abc"));
  ASSERT_TRUE(d.push("\"abx"));
  ASSERT_TRUE(e.push("\"aby"));
  EXPECT_NE(c.signature(), d.signature());  // (abc can still become abcd)
  EXPECT_EQ(d.signature(), e.signature());
  EXPECT_FALSE(c.push("d\""));
  EXPECT_TRUE(c.push("e\""));
  SchemaPrefix f(near);
  EXPECT_TRUE(f.push("\"a\\\""));    // (an escape keeps the text: a\"b is still near)
  EXPECT_FALSE(f.push("b\""));
  EXPECT_EQ(expect_the_validators(Json::parse(R"({"type":"string","not":{"enum":["abcd","a\"b"]}})"),
                                  {R"("abcd")", R"("abce")", R"("a\"b")", R"("a\u0022b")", R"("ab")"}),
            2);
}

// Bounded numbers past about 16 digits: v + 10^-f rounds back to v in doubles, and the digits
// still to come reach the doubles just above it. So 1.0000000000000002 is written, and under not 1
// the prefix 1.000000000000000 is no dead end.
TEST(JsonSchemaNot, BoundedNumbersPastSixteenDigits) {
  const Json bounded = Json::parse(R"({"type":"number","minimum":0,"maximum":2})");
  EXPECT_EQ(expect_the_validators(bounded, {"1.0000000000000002", "1.00000000000000000", "2.0000000000000004"}), 2);
  const Json s = Json::parse(R"({"type":"number","minimum":0,"maximum":2,"not":{"const":1}})");
  EXPECT_TRUE(takes(s, "1.000000000000000"));
  EXPECT_TRUE(accepts(s, "1.0000000000000002"));
  EXPECT_FALSE(accepts(s, "1.0000000000000000"));
}

// not of an object's properties (of types, consts, enums) and required, as if takes them: an object
// that lacks one of the names or has one of the properties otherwise, and no value of another type
// unless the schema says type object (a non-object holds properties and required).
TEST(JsonSchemaNot, ObjectsPropertiesAndRequired) {
  const Json pair = Json::parse(R"({"type":"object","properties":{"a":{},"b":{}},"not":{"required":["a","b"]}})");
  EXPECT_EQ(expect_the_validators(pair, {"{}", R"({"a":1})", R"({"b":1})", R"({"a":1,"b":2})", R"({"b":1,"c":2})"}), 4);
  EXPECT_FALSE(takes(pair, R"({"a":1,"b")"));
  Json closed = pair;  // (walks: other keys would take most of their steps)
  closed["additionalProperties"] = false;
  for (uint64_t seed : {81, 82}) EXPECT_GT(walks_that_end(closed, seed, 20), 10);
  const Json absent = Json::parse(R"({"not":{"required":["x"]}})");
  EXPECT_EQ(expect_the_validators(absent, {"{}", R"({"x":1})", "1", R"("s")", R"({"y":1})", "null"}), 2);
  const Json typed = Json::parse(R"({"type":["object","null"],
                                     "not":{"type":"object","properties":{"kind":{"const":"bad"}},"required":["kind"]}})");
  EXPECT_EQ(expect_the_validators(typed, {"null", R"({"kind":"bad"})", R"({"kind":"ok"})", "{}", R"({"kind":1})"}), 4);
  const Json kind = Json::parse(R"({"not":{"properties":{"n":{"type":"string"}},"required":["n"]}})");
  EXPECT_EQ(expect_the_validators(kind, {R"({"n":1})", R"({"n":"s"})", "{}", "5"}), 2);
  // An anyOf of both forms: not (A or B) is (not A) and (not B).
  const Json mixed = Json::parse(R"({"type":["object","string"],"not":{"anyOf":[{"required":["a"]},{"const":""}]}})");
  EXPECT_EQ(expect_the_validators(mixed, {"{}", R"({"a":1})", R"("x")", R"("")"}), 1);
  // Beside an allOf's other nots, and inside a property.
  const Json merged = Json::parse(R"({"allOf":[{"not":{"required":["a"]}},{"not":{"required":["b"]}}],"type":"object"})");
  EXPECT_EQ(expect_the_validators(merged, {"{}", R"({"a":1})", R"({"b":1})", R"({"c":1})"}), 2);
  const Json inner = Json::parse(R"({"type":"object","properties":{"p":{"type":"object","not":{"required":["q"]}}}})");
  EXPECT_EQ(expect_the_validators(inner, {R"({"p":{}})", R"({"p":{"q":1}})", R"({"p":{"r":1}})"}), 2);
  // What it does not take is refused with the keyword named.
  expect_refused(R"({"not":{"properties":{"n":{"minimum":0}}}})",
                 "#/not: 'minimum' in its property \"n\"; 'not' is supported where its schema is");
  expect_refused(R"({"not":{"required":["a"],"minProperties":1}})", "#/not: 'minProperties' in it");
  EXPECT_NE(message(R"({"type":"object","required":["a"],"not":{"required":["a"]}})"), "");  // (no value left)
  // A oneOf of a schema and its not: exclusive (a key required on one side may not come on the other).
  const Json either = Json::parse(R"({"type":"object","properties":{"a":{"type":"integer"}},
                                      "oneOf":[{"required":["a"]},{"not":{"required":["a"]}}]})");
  EXPECT_EQ(expect_the_validators(either, {"{}", R"({"a":1})", R"({"b":1})", R"({"a":"x"})"}), 3);
}

// Closed objects (strict tool parameters) read a silent object with properties as closed; what a
// negation or an if's condition is rewritten to names properties too, and those neither close an
// object that had none of its own nor come in one that has (schema_merge::kRewriteNames).
TEST(JsonSchemaNot, ClosedObjectsAndRewrites) {
  auto whole = [](const char* schema, const char* text) {
    SchemaPrefix p(JsonSchema::compile(Json::parse(schema), /*closed_objects=*/true));
    return p.push(text) && p.complete();
  };
  const char* bare = R"({"type":"object","not":{"required":["a"]}})";
  EXPECT_TRUE(whole(bare, R"({"b":1})"));
  EXPECT_TRUE(whole(bare, "{}"));
  EXPECT_FALSE(whole(bare, R"({"a":1})"));
  const char* valued = R"({"type":"object","not":{"properties":{"k":{"const":1}},"required":["k"]}})";
  EXPECT_TRUE(whole(valued, R"({"k":2,"z":3})"));
  EXPECT_TRUE(whole(valued, R"({"z":3})"));
  EXPECT_FALSE(whole(valued, R"({"k":1})"));
  const char* cond = R"({"type":"object","if":{"properties":{"k":{"const":1}},"required":["k"]},
                         "then":{"required":["m"]}})";
  EXPECT_TRUE(whole(cond, R"({"k":1,"m":2,"z":3})"));
  EXPECT_TRUE(whole(cond, R"({"k":2,"z":3})"));
  EXPECT_FALSE(whole(cond, R"({"k":1,"z":3})"));
  // Two rewrites in one branch (each with its names).
  const char* both = R"({"type":"object","not":{"required":["a"]},"if":{"properties":{"b":{"const":1}},"required":["b"]},
                         "then":{"required":["c"]}})";
  EXPECT_TRUE(whole(both, R"({"b":1,"c":2,"z":3})"));
  EXPECT_TRUE(whole(both, R"({"z":3})"));
  EXPECT_FALSE(whole(both, R"({"b":1})"));
  EXPECT_FALSE(whole(both, R"({"a":1,"b":2})"));
  // Its own properties close it, with or without the rewrite, and the names only a rewrite reads
  // do not come (the branch that needs one is left out).
  const char* own = R"({"type":"object","properties":{"x":{"type":"integer"}},"not":{"required":["a"]}})";
  EXPECT_TRUE(whole(own, R"({"x":1})"));
  EXPECT_FALSE(whole(own, R"({"b":1})"));
  EXPECT_FALSE(whole(own, R"({"a":1})"));
  const char* own_if = R"({"type":"object","properties":{"x":{"type":"integer"}},
                           "if":{"properties":{"k":{"const":1}},"required":["k"]},"then":{"required":["x"]}})";
  EXPECT_TRUE(whole(own_if, R"({"x":1})"));
  EXPECT_TRUE(whole(own_if, "{}"));
  EXPECT_FALSE(whole(own_if, R"({"k":1,"x":1})"));
  EXPECT_FALSE(whole(own_if, R"({"k":2})"));
  const char* own_not = R"({"type":"object","properties":{"x":{}},"not":{"properties":{"k":{"const":1}},"required":["k"]}})";
  EXPECT_TRUE(whole(own_not, R"({"x":1})"));
  EXPECT_FALSE(whole(own_not, R"({"k":2})"));
  // An allOf's members add their names up: one that a member declares comes.
  const char* members = R"({"allOf":[{"type":"object","properties":{"x":{}},"if":{"properties":{"k":{"const":1}},
                            "required":["k"]},"then":{"required":["x"]}},{"properties":{"k":{}}}]})";
  EXPECT_TRUE(whole(members, R"({"k":1,"x":2})"));
  EXPECT_TRUE(whole(members, R"({"k":2})"));
  EXPECT_FALSE(whole(members, R"({"k":1})"));
  EXPECT_FALSE(whole(members, R"({"z":1})"));
  // Not closed: the rewrite's names and others come as the standard reads them.
  SchemaPrefix open(JsonSchema::compile(Json::parse(own)));
  EXPECT_TRUE(open.push(R"({"b":1})") && open.complete());
}

}  // namespace
}  // namespace dsi::server
