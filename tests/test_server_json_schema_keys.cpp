// Structured outputs (server/json_schema.h): an object's other keys (those not declared, where
// additionalProperties or propertyNames take them), each written at most once; against the
// validator (test_json_schema_util.h, which holds a repeated key invalid), and walked through the
// mask.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
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

// An object of 20,000 other keys, each byte pushed alone (a copy of the state each time): the keys
// written are a persistent set that copies share (not a list copied whole for each new key and
// searched through), so it takes well under a second in release, not the square of the keys. At
// the end, each key is refused again (escapes read), and a copy taken halfway still takes the
// keys that came after it.
TEST(JsonSchemaKeys, ManyOtherKeysEachOnce) {
  constexpr int kKeys = 20000;
  for (const char* text : {R"({"type":"object"})",
                           R"({"type":"object","additionalProperties":{"type":"integer"},"minProperties":2})"}) {
    const auto schema = JsonSchema::compile(Json::parse(text));
    const auto start = std::chrono::steady_clock::now();
    auto p = std::make_unique<SchemaPrefix>(schema);
    ASSERT_TRUE(p->push(static_cast<unsigned char>('{')));
    std::unique_ptr<SchemaPrefix> half;
    for (int i = 0; i < kKeys; ++i) {
      if (i == kKeys / 2) half = std::make_unique<SchemaPrefix>(*p);
      for (const char c : (i > 0 ? ",\"k" : "\"k") + std::to_string(i) + "\":0")
        ASSERT_TRUE(p->push(static_cast<unsigned char>(c))) << text << " " << i;
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_LT(seconds, 10.0) << text;  // (0.1 s or so in release; the list took the square of the keys)
    for (int i = 0; i < kKeys; i += 997) {
      SchemaPrefix again = *p;
      EXPECT_FALSE(again.push(",\"k" + std::to_string(i) + "\"")) << text << " " << i;
      EXPECT_TRUE(again.push(",\"k" + std::to_string(i) + "x\":1")) << text << " " << i;
      SchemaPrefix escaped = *p;
      EXPECT_FALSE(escaped.push(",\"\\u006b" + std::to_string(i) + "\"")) << text << " " << i;
      SchemaPrefix before = *half;
      EXPECT_EQ(before.push(",\"k" + std::to_string(i) + "\""), i >= kKeys / 2) << text << " " << i;
    }
    EXPECT_FALSE(p->push(",\"k" + std::to_string(kKeys - 1) + "\""));
    EXPECT_TRUE(p->push(",\"k\":0}"));
    EXPECT_TRUE(p->complete());
  }
}

}  // namespace
}  // namespace dsi::server
