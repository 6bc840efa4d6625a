// Structured outputs (server/json_schema.h): an object's other keys (those not declared, where
// additionalProperties or propertyNames take them), each written at most once; against the
// validator (test_json_schema_util.h, which holds a repeated key invalid), and walked through the
// mask.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_json_schema_util.h"

namespace dsi::server {
namespace {

using namespace schema_test;

// An other key equal to one written before is refused at its closing quote (escapes read), so
// minProperties counts keys as a validator does.
TEST(JsonSchemaKeys, OtherKeysComeOnce) {
  const Json s = Json::parse(R"({"type":"object","properties":{"id":{"type":"integer"}},
                                 "additionalProperties":{"type":"integer"},"minProperties":2})");
  EXPECT_EQ(expect_the_validators(s, {R"({"x":1,"y":2})", R"({"x":1,"x":2})", R"({"x":1,"\u0078":2})",
                                      R"({"a":1,"ab":2})", R"({"x":1})", R"({"id":1,"x":2})",
                                      R"({"x":1,"id":2,"x":3})", R"({"\u00e9":1,"é":2})"}),
            3);
  EXPECT_FALSE(takes(s, R"({"x":1,"x")"));
  EXPECT_TRUE(takes(s, R"({"x":1,"x)"));  // it can still become "xy"
  EXPECT_FALSE(takes(s, R"({"x\n":1,"x\u000a")"));
  EXPECT_TRUE(takes(s, R"({"x\n":1,"x\u000b")"));
  EXPECT_FALSE(unique_keys(R"({"a":{"b":1,"b":2}})"));
  EXPECT_TRUE(unique_keys(R"({"a":{"b":1},"b":{"a":2}})"));
}

// propertyNames that takes few names: a key never starts down a way that only names written
// already end.
TEST(JsonSchemaKeys, FewNamesNeverDeadEnd) {
  const Json s = Json::parse(R"({"type":"object","propertyNames":{"pattern":"^(a|b|ab)$"}})");
  EXPECT_TRUE(takes(s, R"({"a":1,"b":2,"a)"));  // "ab" is left
  EXPECT_FALSE(takes(s, R"({"a":1,"b":2,"a")"));
  EXPECT_FALSE(takes(s, R"({"a":1,"ab":2,"a)"));
  EXPECT_TRUE(takes(s, R"({"a":1,"ab":2,"b)"));
  EXPECT_FALSE(takes(s, R"({"a":1,"ab":2,"b":3,)"));  // no name is left
  EXPECT_EQ(expect_the_validators(s, {R"({"a":1,"b":2,"ab":3})", R"({"ab":1,"ab":2})", R"({"b":1,"a":2})"}), 2);
  // A pattern with a loop, cut short by maxLength: its names are few too.
  EXPECT_NE(message(R"({"type":"object","propertyNames":{"pattern":"^a+$","maxLength":2},"minProperties":3})")
                .find("beside a 'propertyNames' that takes few names"),
            std::string::npos);
  EXPECT_EQ(message(R"({"type":"object","propertyNames":{"pattern":"^a+$"},"minProperties":3})"), "");
}

TEST(JsonSchemaKeys, WalksThroughOtherKeysEndInValidValues) {
  const Json counted = Json::parse(R"({"type":"object","properties":{"id":{"type":"integer"}},
                                       "additionalProperties":{"type":"boolean"},"minProperties":4,"maxProperties":6})");
  EXPECT_GT(walks_that_end(counted, 61, 30), 20);
  // (minProperties beside so few names is refused: they could run out.)
  const Json few = Json::parse(R"({"type":"object","propertyNames":{"pattern":"^[xy]{1,2}$"},
                                   "additionalProperties":{"type":"integer","minimum":0,"maximum":9}})");
  EXPECT_GT(walks_that_end(few, 67, 30), 20);
  const Json short_keys = Json::parse(R"({"type":"object","propertyNames":{"maxLength":1},"minProperties":3,
                                          "additionalProperties":{"const":0}})");
  EXPECT_GT(walks_that_end(short_keys, 71, 30), 20);
}

}  // namespace
}  // namespace dsi::server
