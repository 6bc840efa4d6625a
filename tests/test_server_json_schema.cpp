// Structured outputs (server/json_schema.h): the schema compiler's refusals, the recognizer against
// the validator of test_json_schema_util.h, masks against JSON mode's recognizer for the schema
// {"type": "object"}, and seeded walks through the mask whose every ending validates (oneOf and
// allOf: test_server_json_schema_combined.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dsinfer/error.h"
#include "server/constraints.h"
#include "server/json_schema.h"
#include "test_constraints_util.h"
#include "test_json_schema_util.h"
#include "test_util.h"

namespace dsi::server {
namespace {

using namespace schema_test;

const Json& person() {
  static const Json s = Json::parse(R"({
    "type": "object",
    "properties": {
      "name": {"type": "string", "minLength": 1, "maxLength": 8},
      "age": {"type": "integer"},
      "height": {"type": "number"},
      "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
      "role": {"enum": ["admin", "user", 7, null]},
      "boss": {"anyOf": [{"$ref": "#"}, {"type": "null"}]},
      "ok": {"type": "boolean"}
    },
    "required": ["name", "age"],
    "additionalProperties": false
  })");
  return s;
}

TEST(JsonSchema, AcceptsWhatTheValidatorAccepts) {
  const Json& s = person();
  const std::vector<std::string> texts = {
      R"({"name":"Ann","age":30})",
      R"({"age": -3, "name": "Bo"})",
      R"({"name":"Ann","age":30,"height":1.75e0,"tags":["a","b"],"role":"admin","ok":true})",
      R"({"name":"Ann","age":30,"role":7})",
      R"({"name":"Ann","age":30,"role":null})",
      R"({"name":"Ann","age":30,"boss":{"name":"Cy","age":50,"boss":null}})",
      R"({"name":"Ann","age":30,"tags":[]})",
      R"({"name":"\u00e9t\u00e9","age":1})",
      // Refused by both:
      R"({"name":"Ann"})",                                  // age is required
      R"({"name":"","age":1})",                             // minLength
      R"({"name":"Annabelle","age":1})",                    // maxLength (9)
      R"({"name":"Ann","age":1.5})",                        // an integer
      R"({"name":"Ann","age":1,"tags":["a","b","c"]})",     // maxItems
      R"({"name":"Ann","age":1,"role":"root"})",            // enum
      R"({"name":"Ann","age":1,"x":1})",                    // no other keys
      R"({"name":"Ann","age":1,"boss":{"name":"Cy"}})",     // the referenced schema's required
      R"({"name":"Ann","age":1,"ok":"yes"})",
      R"(["name"])",
  };
  EXPECT_EQ(expect_the_validators(s, texts), 8);
  // Texts the validator accepts in another spelling than the one generated: a repeated key, an
  // enum value not in its compact form, an escaped key.
  EXPECT_FALSE(accepts(s, R"({"name":"A","name":"B","age":1})"));
  EXPECT_FALSE(accepts(s, R"({"name":"A","age":1,"role":"\u0061dmin"})"));
  EXPECT_FALSE(accepts(s, R"({"n\u0061me":"A","age":1})"));
  // Prefixes: taken, not complete; a byte that cannot continue is refused and changes nothing.
  SchemaPrefix p(JsonSchema::compile(s));
  EXPECT_TRUE(p.push(std::string(R"({"name":"Ann","ag)")));
  EXPECT_FALSE(p.complete());
  EXPECT_FALSE(p.push('x'));  // no declared key starts "agx", and no other keys
  EXPECT_TRUE(p.push(std::string(R"(e":30})")));
  EXPECT_TRUE(p.complete());
  EXPECT_FALSE(p.push(' '));  // nothing after the value
}

TEST(JsonSchema, ScalarsTypeListsAndLiterals) {
  EXPECT_TRUE(accepts(Json::parse(R"({"type":"integer"})"), "-12"));
  EXPECT_FALSE(accepts(Json::parse(R"({"type":"integer"})"), "1.5"));
  EXPECT_TRUE(accepts(Json::parse(R"({"type":"number"})"), "1.5e-3"));
  EXPECT_TRUE(accepts(Json::parse(R"({"type":["string","null"]})"), "null"));
  EXPECT_TRUE(accepts(Json::parse(R"({"type":["string","null"]})"), "\"x\""));
  EXPECT_FALSE(accepts(Json::parse(R"({"type":["string","null"]})"), "true"));
  EXPECT_TRUE(accepts(Json::parse(R"({"enum":[1,12,"a b"]})"), "1"));
  EXPECT_TRUE(accepts(Json::parse(R"({"enum":[1,12,"a b"]})"), "12"));
  EXPECT_TRUE(accepts(Json::parse(R"({"enum":[1,12,"a b"]})"), "\"a b\""));
  EXPECT_FALSE(accepts(Json::parse(R"({"enum":[1,12,"a b"]})"), "123"));
  EXPECT_TRUE(accepts(Json::parse(R"({"type":"array","items":{"enum":[1,12]}})"), "[1,12,1]"));
  EXPECT_TRUE(accepts(Json::parse(R"({"const":{"a":[1,2]}})"), R"({"a":[1,2]})"));
  EXPECT_FALSE(accepts(Json::parse(R"({"const":{"a":[1,2]}})"), R"({"a": [1,2]})"));
  EXPECT_TRUE(accepts(Json::parse(R"({"type":"string","maxLength":2})"), "\"\\ud83d\\ude00\xc3\xa9\""));  // 2 code points
  EXPECT_FALSE(accepts(Json::parse(R"({"type":"string","maxLength":1})"), "\"\\ud83d\\ude00\xc3\xa9\""));
  EXPECT_TRUE(accepts(Json::parse(R"({"type":"array","minItems":1})"), "[{}]"));
  EXPECT_FALSE(accepts(Json::parse(R"({"type":"array","minItems":1})"), "[]"));
  EXPECT_FALSE(accepts(Json::parse(R"({"type":"array"})"), "[1,]"));
  EXPECT_TRUE(accepts(Json::parse(R"({"type":"object","additionalProperties":{"type":"integer"}})"), R"({"a":1,"b":2})"));
  EXPECT_FALSE(accepts(Json::parse(R"({"type":"object","additionalProperties":{"type":"integer"}})"), R"({"a":"x"})"));
  EXPECT_TRUE(accepts(Json::parse(R"({"$defs":{"n":{"type":"integer"}},"type":"array","items":{"$ref":"#/$defs/n"}})"), "[1,2]"));
}

// Alternatives that begin with the same byte are read side by side until one drops out: each
// goes on (none is lost when the readings are deduplicated), and the text is whole only when one
// of them is.
TEST(JsonSchema, ReadingsThatShareAStartGoOn) {
  const Json s = Json::parse(R"({"anyOf":[{"enum":["a"]},{"enum":["c"]},{"type":"string","maxLength":1}]})");
  EXPECT_TRUE(accepts(s, "\"c\""));
  EXPECT_TRUE(accepts(s, "\"x\""));
  EXPECT_FALSE(accepts(s, "\"xy\""));
  SchemaPrefix p(JsonSchema::compile(s));
  EXPECT_TRUE(p.push('"'));
  EXPECT_EQ(p.readings(), 3u);
  EXPECT_FALSE(p.complete());
  EXPECT_TRUE(p.push('a'));
  EXPECT_FALSE(p.complete());
  EXPECT_TRUE(accepts(Json::parse(R"({"properties":{"t":{"anyOf":[{"type":"string"},{"type":"string","maxLength":3}]}}})"),
                      R"({"t":"long enough"})"));
}

// Whitespace between tokens: a newline and two spaces of indent a level, no more.
TEST(JsonSchema, WhitespaceIsBoundedByDepth) {
  const Json s = Json::parse(R"({"type":"object","additionalProperties":{"type":"array"}})");
  EXPECT_TRUE(accepts(s, "{\n  \"a\": [\n    1,\n    2\n  ]\n}"));
  EXPECT_TRUE(accepts(s, "{ \"a\" : [ 1 , 2 ] }"));
  EXPECT_TRUE(accepts(s, "{\n   \"a\": [1]}"));       // 4 blank bytes at depth 1: at most 2 + 2
  EXPECT_FALSE(accepts(s, "{\n    \"a\": [1]}"));     // 5
  EXPECT_TRUE(accepts(s, "{\"a\": [\n     1]}"));      // 6 at depth 2
  EXPECT_FALSE(accepts(s, "{\"a\": [\n      1]}"));    // 7
  EXPECT_FALSE(accepts(s, " {}"));                       // none before the value
  SchemaPrefix wide(JsonSchema::compile(s), JsonPrefix::kMaxSpaceRun);
  EXPECT_TRUE(wide.push(std::string("{") + std::string(32, ' ') + "}"));
}

TEST(JsonSchema, RefusesWhatItCannotEnforce) {
  EXPECT_NE(message(R"x({"type":"string","pattern":"(?=a)"})x").find("#/pattern: the pattern's '(?' (lookaround"),
            std::string::npos);
  EXPECT_NE(message(R"({"type":"string","pattern":"^a{5}","maxLength":4})").find("at least 5 characters, above maxLength"),
            std::string::npos);
  EXPECT_NE(message(R"({"type":"string","pattern":1})").find("pattern: must be a string"), std::string::npos);
  EXPECT_NE(message(R"({"type":"string","pattern":"^a{1,3}$","minLength":4})").find("at most 3 characters, below minLength"),
            std::string::npos);
  EXPECT_NE(message(R"({"enum":["b"],"pattern":"^a"})").find("no value of 'enum'"), std::string::npos);
  EXPECT_NE(message(R"({"type":"object","propertyNames":{"minimum":3}})").find("#/propertyNames: 'minimum' is not supported"),
            std::string::npos);
  EXPECT_NE(message(R"({"type":"number","multipleOf":0.01})").find("only a whole number"), std::string::npos);
  EXPECT_NE(message(R"({"type":"number","multipleOf":0})").find("must be a number above 0"), std::string::npos);
  EXPECT_NE(message(R"({"type":"integer","multipleOf":4,"minimum":1,"maximum":3})").find("within its bounds"),
            std::string::npos);
  EXPECT_NE(message(R"({"type":"integer","minimum":"0"})").find("minimum: must be a finite number"), std::string::npos);
  Json infinite = Json::parse(R"({"type":"number"})");  // (only built, never parsed: JSON has no infinity)
  infinite["maximum"] = HUGE_VAL;
  EXPECT_THROW(
      try { JsonSchema::compile(infinite); } catch (const dsi::Error& e) {
        EXPECT_NE(std::string(e.what()).find("maximum: must be a finite number"), std::string::npos) << e.what();
        throw;
      },
      dsi::Error);
  EXPECT_NE(message(R"({"exclusiveMaximum":"1"})").find("finite number or a boolean"), std::string::npos);
  EXPECT_NE(message(R"({"exclusiveMinimum":true})").find("true without 'minimum'"), std::string::npos);
  EXPECT_NE(message(R"({"type":"integer","minimum":0.2,"maximum":0.8})").find("within its bounds"), std::string::npos);
  EXPECT_NE(message(R"({"type":"number","minimum":1,"exclusiveMaximum":1})").find("within its bounds"), std::string::npos);
  EXPECT_EQ(message(R"({"type":["number","null"],"minimum":1,"maximum":0})"), "");  // null still fits
  EXPECT_NE(message(R"({"properties":{"a":{"$recursiveRef":"#"}}})").find("#/properties/a: '$recursiveRef'"),
            std::string::npos);
  EXPECT_NE(message(R"({"properties":{"a":{"not":{"minimum":1}}}})").find("#/properties/a/not: 'minimum' in it"),
            std::string::npos);
  EXPECT_NE(message(R"({"type":"strin"})").find("unknown type"), std::string::npos);
  EXPECT_NE(message(R"({"required":[1]})").find("is not a name"), std::string::npos);
  EXPECT_NE(message(R"({"$ref":"#/$defs/none"})").find("points at nothing"), std::string::npos);
  EXPECT_NE(message(R"({"$ref":"http://x/y"})").find("inside the schema"), std::string::npos);
  EXPECT_NE(message(R"({"$ref":"#/$defs/a","type":"object"})").find("points at nothing"), std::string::npos);
  EXPECT_NE(message(R"({"anyOf":[{"type":"string"}],"$dynamicRef":"#a"})").find("'$dynamicRef' is not supported"),
            std::string::npos);
  EXPECT_NE(message(R"({"enum":[]})").find("non-empty"), std::string::npos);
  EXPECT_NE(message(R"({"type":"integer","enum":["a"]})").find("no value of 'enum'"), std::string::npos);
  EXPECT_NE(message(R"({"properties":{"a\"b":{}}})").find("needs escapes"), std::string::npos);
  EXPECT_NE(message(R"(false)").find("accepts no value"), std::string::npos);
  EXPECT_NE(message(R"({"minItems":-1})").find("non-negative"), std::string::npos);
  EXPECT_EQ(message(R"({"type":"string","format":"date-time","title":"t","description":"d"})"), "");
  // A reference cycle with no value in between compiles, and accepts nothing rather than looping.
  EXPECT_EQ(message(R"({"$defs":{"a":{"$ref":"#/$defs/a"}},"$ref":"#/$defs/a"})"), "");
  EXPECT_FALSE(accepts(Json::parse(R"({"$defs":{"a":{"$ref":"#/$defs/a"}},"$ref":"#/$defs/a"})"), "1"));
}

// Numbers with bounds (and multipleOf): whole texts as the validator says (an exponent never: a
// bounded number is written without one), over integers, decimals and both drafts' exclusive
// forms; and no dead end: every prefix the recognizer takes can still end or take another byte.
TEST(JsonSchema, NumberBoundsAreTheValidators) {
  const std::vector<std::string> schemas = {
      R"({"type":"integer","minimum":-5,"maximum":120})",
      R"({"type":"integer","exclusiveMinimum":0,"exclusiveMaximum":100})",
      R"({"type":"number","minimum":0.5,"exclusiveMaximum":2.25})",
      R"({"type":"number","minimum":-1.5,"maximum":-1.25})",
      R"({"type":"integer","minimum":1000})",
      R"({"type":"number","maximum":-0.001})",
      R"({"type":"number","minimum":0,"maximum":10,"exclusiveMinimum":true})",
      R"({"type":["integer","null"],"minimum":3,"maximum":3})",
      R"({"type":"integer","minimum":10.5,"maximum":19.5})",
      R"({"enum":[1,5,"a",7.5],"minimum":2,"maximum":7})",
      R"({"type":"integer","multipleOf":7,"minimum":-30,"maximum":100})",
      R"({"type":"number","multipleOf":5})",
      R"({"type":"integer","multipleOf":3,"exclusiveMinimum":9})",
      R"({"enum":[3,4,6,"b"],"multipleOf":3})",
  };
  std::vector<std::string> texts = {"-0", "0.5", "0.49", "2.25", "2.2499", "1.25", "-1.25", "-1.3", "-1.5",
                                    "-1.51", "-1.2", "999", "1000", "10000", "-0.001", "-0.0011", "-0.0009",
                                    "0.0", "10.0", "10.5", "19.5", "1e2", "5e-1", "null", "\"a\"", "7.5", "3.0"};
  for (int i = -130; i <= 130; i += 3) texts.push_back(std::to_string(i));
  for (const std::string& schema : schemas) {
    SCOPED_TRACE(schema);
    const Json s = Json::parse(schema);
    for (const std::string& t : texts) {
      SCOPED_TRACE(t);
      // (An integer is written without a fraction, 3 and not 3.0, bounded or not.)
      const bool integers = s.contains("type") && s["type"].dump().find("number") == std::string::npos;
      // (An enum value is written in its compact form, 3 and not 3.0.)
      const bool spelled = t.find('e') == std::string::npos && !(integers && t.find('.') != std::string::npos) &&
                           (!s.contains("enum") || std::any_of(s["enum"].begin(), s["enum"].end(),
                                                                [&](const Json& e) { return e.dump() == t; }));
      EXPECT_EQ(accepts(s, t), valid(Json::parse(t), s, s) && spelled);
    }
    // Every prefix of up to 5 bytes the recognizer takes ends as a whole value within 6 more.
    const std::string alphabet = "0123456789-.enul";
    std::function<bool(const SchemaPrefix&, int)> ends = [&](const SchemaPrefix& p, int bytes) {
      if (p.complete()) return true;
      for (char c : alphabet) {
        SchemaPrefix q = p;
        if (bytes > 0 && q.push(static_cast<unsigned char>(c)) && ends(q, bytes - 1)) return true;
      }
      return false;
    };
    std::vector<std::pair<SchemaPrefix, std::string>> level = {{SchemaPrefix(JsonSchema::compile(s)), ""}};
    int taken = 0;
    for (int depth = 0; depth < 5 && !level.empty(); ++depth) {
      std::vector<std::pair<SchemaPrefix, std::string>> next;
      for (const auto& [p, text] : level) {
        EXPECT_TRUE(ends(p, 6)) << "no whole value after '" << text << "'";
        ++taken;
        for (char c : alphabet) {
          SchemaPrefix q = p;
          if (q.push(static_cast<unsigned char>(c))) next.emplace_back(q, text + c);
        }
      }
      level = std::move(next);
    }
    EXPECT_GT(taken, 1);
  }
}

using test::allowed;
using test::kjv_tokenizer;

// For {"type": "object"}, with JSON mode's whitespace limit, the schema's masks are JSON mode's,
// step for step along seeded walks.
TEST(JsonSchema, AnyObjectMasksAreJsonModes) {
  const Tokenizer& tok = kjv_tokenizer();
  const int64_t V = tok.vocab_size() + 1;
  const int32_t eos = int32_t(V - 1);
  const auto schema = JsonSchema::compile(Json::parse(R"({"type":"object"})"));
  std::mt19937_64 rng(7);
  int steps = 0;
  for (int walk = 0; walk < 12; ++walk) {
    JsonConstraint json(tok, {eos}, -1, -1, false);
    SchemaConstraint sc(tok, schema, {eos}, -1, -1, false, JsonPrefix::kMaxSpaceRun);
    std::string text;
    for (int step = 0; step < 120; ++step) {
      const std::vector<int32_t> ok = allowed(json, V);
      const std::vector<int32_t> ok2 = allowed(sc, V);
      if (ok != ok2) {
        std::string diff;
        for (int32_t id : ok)
          if (!std::binary_search(ok2.begin(), ok2.end(), id)) diff += " json-only:" + Json(*tok.token_bytes(id)).dump();
        for (int32_t id : ok2)
          if (!std::binary_search(ok.begin(), ok.end(), id)) diff += " schema-only:" + Json(id == eos ? "<eos>" : *tok.token_bytes(id)).dump();
        FAIL() << "walk " << walk << " step " << step << " after " << Json(text).dump() << ":" << diff.substr(0, 400);
      }
      ++steps;
      // Mostly structure, so the walks nest and close.
      std::vector<int32_t> structural;
      for (int32_t id : ok)
        if (id == eos || tok.token_bytes(id)->find_first_of("{}[]\":,0123456789tfn") != std::string::npos)
          structural.push_back(id);
      const std::vector<int32_t>& from = !structural.empty() && rng() % 3 != 0 ? structural : ok;
      const int32_t pick = from[std::uniform_int_distribution<size_t>(0, from.size() - 1)(rng)];
      if (pick == eos) break;
      json.accept(pick);
      sc.accept(pick);
      text += *tok.token_bytes(pick);
    }
  }
  EXPECT_GT(steps, 400);
}

// Seeded walks through a schema's mask on the bundled vocabulary: every step's text is a prefix
// the recognizer takes, and every walk that ends wrote a value the validator accepts.
// Inside a string of a schema the masks take the plain-text tokens at once only where the string
// has no maxLength; either way the mask is each token tried alone: a free string, a limited one
// (short of its limit, and at it), a string beside an enum of strings that share its start.
TEST(JsonSchema, MasksInsideStringsAreEachTokenTried) {
  const Tokenizer& tok = kjv_tokenizer();
  const int64_t V = tok.vocab_size() + 1;
  const int32_t eos = int32_t(V - 1);
  const auto schema = JsonSchema::compile(Json::parse(R"({"type": "object", "properties": {
      "free": {"type": "string"}, "short": {"type": "string", "maxLength": 3},
      "either": {"anyOf": [{"enum": ["Moses", "Aaron"]}, {"type": "string", "maxLength": 6}]},
      "or": {"anyOf": [{"enum": ["Moses"]}, {"type": "string"}]}}})"));
  for (const std::string& text : {std::string(R"({"free": "Mo)"), std::string(R"({"short": "a)"),
                                  std::string(R"({"short": "abc)"), std::string(R"({"either": "Mo)"),
                                  std::string(R"({"or": "Mo)"), std::string("{\"free\": \"\xC3")}) {
    SchemaConstraint c(tok, schema, {eos}, -1, -1, false);
    for (unsigned char b : text) c.accept(test::byte_token(tok, b));  // a token a byte
    test::expect_mask_is_each_token(c, tok, V, eos, text);
  }
}

// Masks where numbers have bounds (each state keeps the number's bytes in its signature): each
// token tried alone, at the start of a number, inside one, and where only its end may come.
TEST(JsonSchema, MasksInsideBoundedNumbersAreEachTokenTried) {
  const Tokenizer& tok = kjv_tokenizer();
  const int64_t V = tok.vocab_size() + 1;
  const int32_t eos = int32_t(V - 1);
  const auto schema = JsonSchema::compile(Json::parse(R"({"type": "object", "properties": {
      "n": {"type": "number", "minimum": -2.5, "maximum": 40},
      "k": {"type": "integer", "exclusiveMinimum": 10, "maximum": 999}}})"));
  for (const std::string& prefix : {std::string(R"({"n": )"), std::string(R"({"n": -)"), std::string(R"({"n": -2.)"),
                                    std::string(R"({"n": 4)"), std::string(R"({"n": 40)"), std::string(R"({"k": 1)"),
                                    std::string(R"({"k": 99)"), std::string(R"({"k": 999)"), std::string(R"({"n": 0)")}) {
    SchemaConstraint p(tok, schema, {eos}, -1, -1, false);
    for (int32_t id : tok.encode(prefix)) p.accept(id);
    test::expect_mask_is_each_token(p, tok, V, eos, prefix);
  }
}

TEST(JsonSchema, WalksThroughTheMaskEndInValidValues) { EXPECT_GT(walks_that_end(person(), 3, 30), 20); }

const Json& patterned() {
  static const Json s = Json::parse(R"({
    "type": "object",
    "properties": {
      "zip": {"type": "string", "pattern": "^\\d{5}(-\\d{4})?$"},
      "code": {"type": "string", "pattern": "^[A-Z]{2}[0-9]+$", "maxLength": 4},
      "word": {"type": "string", "pattern": "^[A-Z]"},
      "pick": {"enum": ["ab", "abc", "b", 1], "pattern": "^a", "minLength": 3},
      "any": {"type": ["string", "integer"], "pattern": "^x"}
    },
    "required": ["zip", "code"],
    "additionalProperties": false
  })");
  return s;
}

// Patterns: whole texts as the validator says (escapes decoded first), enum values filtered by the
// pattern and lengths, a pattern beside maxLength.
TEST(JsonSchema, PatternsAreTheValidators) {
  const Json& s = patterned();
  const std::vector<std::string> texts = {
      R"({"zip":"12345","code":"AB1"})",
      R"({"zip":"12345-6789","code":"XY99"})",
      R"({"zip":"\u00312345","code":"A\u00421"})",
      R"({"zip":"12345","code":"AB1","word":"In the beginning"})",
      R"({"zip":"12345","code":"AB1","pick":"abc"})",
      R"({"zip":"12345","code":"AB1","any":"xyz"})",
      R"({"zip":"12345","code":"AB1","any":-4})",
      R"({"zip":"12345","code":"AB1","pick":1})",
      R"({"zip":"1234","code":"AB1"})",
      R"({"zip":"12345-","code":"AB1"})",
      R"({"zip":"123456","code":"AB1"})",
      R"({"zip":"12345","code":"AB"})",
      R"({"zip":"12345","code":"AB123"})",
      R"({"zip":"12345","code":"ab1"})",
      R"({"zip":"12345","code":"AB1","word":"in the beginning"})",
      R"({"zip":"12345","code":"AB1","pick":"ab"})",
      R"({"zip":"12345","code":"AB1","pick":"b"})",
      R"({"zip":"12345","code":"AB1","any":"yx"})",
  };
  EXPECT_EQ(expect_the_validators(s, texts), 8);
  // A string that could still match takes more; one that cannot is refused at the byte.
  SchemaPrefix p(JsonSchema::compile(s));
  EXPECT_TRUE(p.push(std::string(R"({"zip":"123)")));
  EXPECT_FALSE(p.push('a'));
  EXPECT_FALSE(p.push('"'));
  EXPECT_TRUE(p.push(std::string(R"(45\u002)")));  // an escape half-way: the pattern steps at its end
  EXPECT_FALSE(p.push('a'));                       // \u002a is '*'
  EXPECT_TRUE(p.push(std::string(R"(d1234")")));  // \u002d is '-'
  // A pattern beside minLength: a string the pattern could only end too short is refused early.
  const Json lengths = Json::parse(R"({"type":"string","pattern":"^(a|bbbb|c+)$","minLength":2})");
  EXPECT_TRUE(accepts(lengths, R"("bbbb")"));
  EXPECT_TRUE(accepts(lengths, R"("cc")"));
  EXPECT_FALSE(accepts(lengths, R"("c")"));
  SchemaPrefix q(JsonSchema::compile(lengths));
  EXPECT_TRUE(q.push('"'));
  EXPECT_FALSE(q.push('a'));  // "a" is the pattern's only string that starts so, and it is one character
  EXPECT_TRUE(q.push('b'));
}

// Masks inside patterned strings, each token tried alone: at a string's start, within it, where
// only its end may come, half-way through a character and through an escape.
TEST(JsonSchema, MasksInsidePatternedStringsAreEachTokenTried) {
  const Tokenizer& tok = kjv_tokenizer();
  const int64_t V = tok.vocab_size() + 1;
  const int32_t eos = int32_t(V - 1);
  const auto schema = JsonSchema::compile(patterned());
  for (const std::string& text : {std::string(R"({"zip": ")"), std::string(R"({"zip": "12)"),
                                  std::string(R"({"zip": "12345)"), std::string(R"({"zip": "12345-678)"),
                                  std::string(R"({"code": "AB)"), std::string(R"({"code": "AB12)"),
                                  std::string(R"({"word": ")"), std::string(R"({"word": "The end)"),
                                  std::string(R"({"zip": "\u003)"), std::string("{\"word\": \"\xC3")}) {
    SchemaConstraint c(tok, schema, {eos}, -1, -1, false);
    for (unsigned char b : text) c.accept(test::byte_token(tok, b));  // a token a byte
    test::expect_mask_is_each_token(c, tok, V, eos, text);
  }
}

const Json& tuples() {
  static const Json s = Json::parse(R"({
    "type": "object",
    "properties": {
      "point": {"type": "array", "prefixItems": [{"type": "number"}, {"type": "number"}], "items": false},
      "row": {"type": "array", "prefixItems": [{"type": "string", "maxLength": 5}, {"type": "integer"}],
              "items": {"type": "boolean"}, "maxItems": 4},
      "old": {"type": "array", "items": [{"const": "v"}, {"type": "null"}], "additionalItems": false, "minItems": 1},
      "meta": {"type": "object", "properties": {"k": {"type": "boolean"}}, "minProperties": 1, "maxProperties": 2,
               "additionalProperties": {"type": "integer"}},
      "set": {"type": "array", "items": {"enum": ["x", "y", 7]}, "uniqueItems": true},
      "names": {"type": "array", "items": {"type": "string", "maxLength": 3}, "uniqueItems": true, "maxItems": 4},
      "nums": {"type": "array", "items": {"type": "number"}, "uniqueItems": true}
    },
    "required": ["point"],
    "additionalProperties": false
  })");
  return s;
}

// Tuples: prefixItems and the items after them (none, or a schema), and draft 7's spelling;
// unique items; objects' minProperties and maxProperties.
TEST(JsonSchema, TuplesAndPropertyCountsAreTheValidators) {
  const Json& s = tuples();
  const std::vector<std::string> texts = {
      R"({"point":[1,2.5]})",
      R"({"point":[1,2],"row":["ab"]})",
      R"({"point":[1,2],"row":["ab",3,true,false]})",
      R"({"point":[1,2],"old":["v",null]})",
      R"({"point":[1,2],"old":["v"]})",
      R"({"point":[1]})",
      R"({"point":[1,2],"row":["ab",3,true,false,true]})",
      R"({"point":[1,2,3]})",
      R"({"point":[1,"2"]})",
      R"({"point":[1,2],"row":[3]})",
      R"({"point":[1,2],"row":["ab",3,4]})",
      R"({"point":[1,2],"row":["abcdef"]})",
      R"({"point":[1,2],"old":["v",null,1]})",
      R"({"point":[1,2],"old":[]})",
      R"({"point":[1,2],"meta":{"k":true}})",
      R"({"point":[1,2],"meta":{"x":1,"k":false}})",
      R"({"point":[1,2],"meta":{}})",
      R"({"point":[1,2],"meta":{"x":1,"y":2,"k":true}})",
      R"({"point":[1,2],"meta":{"x":1,"y":2,"z":3}})",
      R"({"point":[1,2],"set":["x","y",7],"names":["a","b"],"nums":[1,2.5]})",
      R"({"point":[1,2],"set":["x","x"]})",
      R"({"point":[1,2],"names":["a","a"]})",
      R"({"point":[1,2],"nums":[1,1.0]})",
      R"({"point":[1,2],"set":[7,"x",7]})",
  };
  EXPECT_EQ(expect_the_validators(s, texts), 9);  // (point [1] is valid: prefixItems does not ask for the items)
  // Unique items: once every distinct item is written, no ',' comes.
  SchemaPrefix p(JsonSchema::compile(s));
  EXPECT_TRUE(p.push(std::string(R"({"point":[1,2],"set":["y",7,"x")")));
  EXPECT_FALSE(p.push(','));
  EXPECT_TRUE(p.push(']'));
  // A string item at its maxLength that would repeat one is refused at its last character; a
  // number, at the byte after it (1.0 repeats 1).
  EXPECT_TRUE(p.push(std::string(R"(,"names":["abc","ab)")));
  EXPECT_FALSE(p.push('c'));
  EXPECT_TRUE(p.push(std::string(R"(d"],"nums":[1,1.0)")));
  EXPECT_FALSE(p.push(']'));
  EXPECT_TRUE(p.push(std::string("1]}")));
  EXPECT_TRUE(p.complete());
  SchemaPrefix q(JsonSchema::compile(s));  // an enum item that could only repeat one, at its first byte
  EXPECT_TRUE(q.push(std::string(R"({"point":[1,2],"set":[7,)")));
  EXPECT_FALSE(q.push('7'));
  EXPECT_TRUE(q.push('"'));
  EXPECT_NE(message(R"({"type":"array","prefixItems":[{}],"items":false,"minItems":2})").find("above the 1 items"), std::string::npos);
  EXPECT_NE(message(R"({"prefixItems":[{}],"items":[{}]})").find("beside 'prefixItems'"), std::string::npos);
  EXPECT_NE(message(R"({"prefixItems":{}})").find("#/prefixItems: must be an array"), std::string::npos);
  EXPECT_NE(message(R"({"type":"object","properties":{"a":{}},"additionalProperties":false,"minProperties":2})").find("above the 1 properties"),
            std::string::npos);
  EXPECT_NE(message(R"({"type":"object","properties":{"a":{},"b":{}},"required":["a","b"],"maxProperties":1})").find("more properties are required"),
            std::string::npos);
  EXPECT_NE(message(R"({"type":"object","minProperties":3,"maxProperties":2})").find("maxProperties is below"), std::string::npos);
  EXPECT_NE(message(R"({"items":{"type":"object"},"uniqueItems":true})").find("every item is a scalar"), std::string::npos);
  EXPECT_NE(message(R"({"type":"array","uniqueItems":true})").find("every item is a scalar"), std::string::npos);
  EXPECT_NE(message(R"({"type":"array","items":{"type":"boolean"},"uniqueItems":true,"minItems":3})").find("above the 2 distinct"),
            std::string::npos);
  EXPECT_EQ(message(R"({"type":"array","uniqueItems":false})"), "");
}

TEST(JsonSchema, WalksThroughTuplesEndInValidValues) { EXPECT_GT(walks_that_end(tuples(), 23, 30), 20); }

const Json& formats() {
  static const Json s = Json::parse(R"({
    "type": "object",
    "properties": {
      "d": {"type": "string", "format": "date"},
      "t": {"type": "string", "format": "time"},
      "dt": {"type": "string", "format": "date-time"},
      "u": {"type": "string", "format": "uuid"},
      "ip": {"type": "string", "format": "ipv4"},
      "e": {"type": "string", "format": "email"},
      "h": {"type": "string", "format": "hostname"},
      "p": {"type": "string", "format": "date", "pattern": "^x"}
    },
    "required": ["d", "dt", "u", "ip", "e"],
    "additionalProperties": false
  })");
  return s;
}

// Formats: what the compiler writes for each (a pattern of the whole string, the schema's own
// pattern first where both are given), against the formats as read here; unknown ones are free.
TEST(JsonSchema, FormatsAreWrittenAsCheckersReadThem) {
  const Json& s = formats();
  const std::string base = R"({"d":"2024-02-28","dt":"1999-12-31T23:59:59.5+01:00","u":"123e4567-e89b-12d3-a456-426614174000","ip":"10.0.255.1","e":"ann.lee@mail.example.org")";
  const std::vector<std::string> texts = {
      base + "}",
      base + R"(,"t":"07:30:00Z","h":"any thing","p":"xyz"})",
      R"({"d":"2023-02-30","dt":"1999-12-31T23:59:59Z","u":"123e4567-e89b-12d3-a456-426614174000","ip":"1.2.3.4","e":"a@b.co"})",
      R"({"d":"2023-04-31","dt":"1999-12-31T23:59:59Z","u":"123e4567-e89b-12d3-a456-426614174000","ip":"1.2.3.4","e":"a@b.co"})",
      base + R"(,"t":"24:00:00Z"})",
      base + R"(,"t":"07:30:00"})",
      R"({"d":"2024-01-01","dt":"1999-12-31 23:59:59Z","u":"123e4567-e89b-12d3-a456-426614174000","ip":"1.2.3.4","e":"a@b.co"})",
      R"({"d":"2024-01-01","dt":"1999-12-31T23:59:59Z","u":"123e4567e89b12d3a456426614174000","ip":"1.2.3.4","e":"a@b.co"})",
      R"({"d":"2024-01-01","dt":"1999-12-31T23:59:59Z","u":"123e4567-e89b-12d3-a456-426614174000","ip":"1.2.3.256","e":"a@b.co"})",
      R"({"d":"2024-01-01","dt":"1999-12-31T23:59:59Z","u":"123e4567-e89b-12d3-a456-426614174000","ip":"1.2.3.4","e":"a.b.co"})",
  };
  EXPECT_EQ(expect_the_validators(s, texts), 2);
  EXPECT_FALSE(accepts(s, base + R"(,"p":"2024-01-01"})"));  // the pattern, not the format
}

TEST(JsonSchema, WalksThroughFormatsEndInValidValues) { EXPECT_GT(walks_that_end(formats(), 29, 30), 20); }

TEST(JsonSchema, WalksThroughPatternsEndInValidValues) { EXPECT_GT(walks_that_end(patterned(), 5, 30), 20); }

}  // namespace
}  // namespace dsi::server
