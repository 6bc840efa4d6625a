// Forced tool calls written whole (server/tool_call_prefix.h). The recognizer takes calls in the
// three formats that ToolCallParser (an independent reading, tool_calls.h) reads back as the same
// calls, refuses a bad call at its first bad byte (an unknown function, a key the schema does not
// declare, a value of the wrong type, a missing required key, a second call where one is asked,
// prose), and the token masks, over a vocabulary where the markers are special tokens, equal each
// token tried alone: a model can write a good call token by token, and no other special token.
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "server/constraints.h"
#include "server/tool_call_prefix.h"
#include "server/tool_calls.h"
#include "test_constraints_util.h"

namespace dsi::server {
namespace {

using Json = nlohmann::ordered_json;
using test::allowed;
using test::each_token;
using test::kjv_tokenizer;
using test::marker_tokenizer;

const Json& tools() {
  static const Json t = Json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
      "properties": {"city": {"type": "string", "maxLength": 40}, "days": {"type": "integer", "minimum": 1},
                     "units": {"enum": ["c", "f"]}, "note": {"type": "string"}},
      "required": ["city"], "additionalProperties": false}}},
    {"type": "function", "function": {"name": "get", "parameters": {"type": "object",
      "properties": {"q": {"type": "string", "pattern": "^[a-z]+$"}, "tags": {"type": "array", "items": {"type": "string"}},
                     "opts": {"type": "object", "properties": {"deep": {"type": "boolean"}}}}}}},
    {"type": "function", "function": {"name": "now"}}])");
  return t;
}

ToolCallPrefix start(ToolFormat format, const std::string& only = "", bool many = true) {
  return ToolCallPrefix(ToolGrammar::make(format, tools(), only, many));
}

// The index of the first byte refused (text.size(): none).
size_t refused_at(ToolCallPrefix p, std::string_view text) {
  for (size_t i = 0; i < text.size(); ++i)
    if (!p.push(static_cast<unsigned char>(text[i]))) return i;
  return text.size();
}

struct Whole {
  ToolFormat format;
  std::string text;
  std::vector<std::pair<std::string, Json>> calls;  // name, arguments
};

TEST(ToolCallPrefix, WholeCallsAreReadBackAsWritten) {
  const std::vector<Whole> cases = {
      {ToolFormat::kGlm,
       "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris, \"la ville\" \\ x</b <light></arg_value>\n"
       "<arg_key>days</arg_key>\n<arg_value> 3 </arg_value>\n</tool_call>",
       {{"get_weather", Json({{"city", "Paris, \"la ville\" \\ x</b <light>"}, {"days", 3}})}}},
      {ToolFormat::kGlm,
       "<tool_call>get\n<arg_key>q</arg_key>\n<arg_value>abc</arg_value>\n<arg_key>tags</arg_key>\n"
       "<arg_value>[\"a\", \"b<c\"]</arg_value>\n</tool_call>\n<tool_call>now</tool_call>\n",
       {{"get", Json({{"q", "abc"}, {"tags", {"a", "b<c"}}})}, {"now", Json::object()}}},
      {ToolFormat::kGlm, "<tool_call>get_weather<arg_key>city</arg_key><arg_value>line 1\nline\t2</arg_value></tool_call>",
       {{"get_weather", Json({{"city", "line 1\nline\t2"}})}}},
      {ToolFormat::kDsml,
       "<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"
       "<｜DSML｜parameter name=\"city\" string=\"true\">Rome \"</｜DSML｜parameter>\n"
       "<｜DSML｜parameter name=\"units\" string=\"false\">\"c\"</｜DSML｜parameter>\n</｜DSML｜invoke>\n"
       "<｜DSML｜invoke name=\"now\">\n</｜DSML｜invoke>\n</｜DSML｜function_calls>",
       {{"get_weather", Json({{"city", "Rome \""}, {"units", "c"}})}, {"now", Json::object()}}},
      {ToolFormat::kDeepSeekV3,
       "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Oslo\", \"days\": 14}"
       "<｜tool▁call▁end｜><｜tool▁call▁begin｜>get<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
       {{"get_weather", Json({{"city", "Oslo"}, {"days", 14}})}, {"get", Json::object()}}},
  };
  for (const Whole& c : cases) {
    SCOPED_TRACE(c.text);
    ToolCallPrefix p = start(c.format);
    ASSERT_EQ(refused_at(p, c.text), c.text.size());
    ASSERT_TRUE(p.push(c.text));
    EXPECT_TRUE(p.complete());
    const ToolCallParser::Result r = ToolCallParser::parse(c.format, tools(), c.text);
    EXPECT_EQ(r.content, "");
    ASSERT_EQ(r.calls.size(), c.calls.size());
    for (size_t i = 0; i < r.calls.size(); ++i) {
      EXPECT_EQ(r.calls[i].name, c.calls[i].first);
      EXPECT_EQ(Json::parse(r.calls[i].arguments), c.calls[i].second);
    }
    // Not whole before its last marker.
    for (size_t cut : {size_t(1), size_t(5)}) {
      ToolCallPrefix q = start(c.format);
      ASSERT_TRUE(q.push(std::string_view(c.text).substr(0, c.text.size() - cut)));
      EXPECT_FALSE(q.complete() && c.format != ToolFormat::kGlm) << cut;
    }
  }
}

// Parameters composed as pydantic and OpenAPI write them (allOf of a referenced base and more
// properties; a property by reference): the call takes every member's keys and no other, and a
// string parameter declared anywhere in them is plain text, for the recognizer and the parser alike.
TEST(ToolCallPrefix, ComposedParametersAreHeldAndReadBack) {
  const Json composed = Json::parse(R"([{"type": "function", "function": {"name": "book", "parameters": {
    "$defs": {"Base": {"type": "object", "properties": {"city": {"$ref": "#/$defs/Name"}}, "required": ["city"]},
              "Name": {"type": "string", "minLength": 2}},
    "allOf": [{"$ref": "#/$defs/Base"}, {"properties": {"nights": {"type": "integer", "minimum": 1}}}]}}}])");
  const auto grammar = ToolGrammar::make(ToolFormat::kGlm, composed, "", true);
  const std::string call = "<tool_call>book<arg_key>city</arg_key><arg_value>Rome</arg_value>"
                           "<arg_key>nights</arg_key><arg_value>3</arg_value></tool_call>";
  ToolCallPrefix p(grammar);
  ASSERT_EQ(refused_at(p, call), call.size());
  ASSERT_TRUE(p.push(call));
  EXPECT_TRUE(p.complete());
  const ToolCallParser::Result r = ToolCallParser::parse(ToolFormat::kGlm, composed, call);
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(Json::parse(r.calls[0].arguments), Json({{"city", "Rome"}, {"nights", 3}}));
  const std::string open = "<tool_call>book<arg_key>city</arg_key><arg_value>Rome</arg_value><arg_key>";
  EXPECT_EQ(refused_at(ToolCallPrefix(grammar), open + "x"), open.size());  // no such key in any member
  const std::string nights = open + "nights</arg_key><arg_value>";
  EXPECT_EQ(refused_at(ToolCallPrefix(grammar), nights + "0"), nights.size());  // the member's minimum
  const std::string city = "<tool_call>book<arg_key>city</arg_key><arg_value>R</arg_value>";
  EXPECT_EQ(refused_at(ToolCallPrefix(grammar), city), city.size() - 1);  // minLength: the value cannot close
  const std::string none = "<tool_call>book</tool_call>";
  EXPECT_EQ(refused_at(ToolCallPrefix(grammar), none), std::string("<tool_call>book<").size());  // city is required
  // A member that says other keys are welcome keeps them so after the merge.
  Json welcoming = composed;
  welcoming[0]["function"]["parameters"]["allOf"][1]["additionalProperties"] = true;
  const std::string extra = "<tool_call>book<arg_key>city</arg_key><arg_value>Rome</arg_value><arg_key>x</arg_key>"
                            "<arg_value>1</arg_value></tool_call>";
  ToolCallPrefix q(ToolGrammar::make(ToolFormat::kGlm, welcoming, "", true));
  EXPECT_EQ(refused_at(q, extra), extra.size());
}

struct Bad {
  ToolFormat format;
  std::string good, bad;  // good is taken whole, bad's first byte is refused
  std::string only = "";
  bool many = true;
};

TEST(ToolCallPrefix, BadCallsAreRefusedAtTheirFirstBadByte) {
  const std::string glm_city = "<tool_call>get_weather<arg_key>city</arg_key><arg_value>P</arg_value>";
  const std::string dsml_call = "<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"get_weather\">\n";
  const std::string v3_call = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>";
  const std::vector<Bad> cases = {
      {ToolFormat::kGlm, "", "Sure, let me look."},                                        // prose
      {ToolFormat::kGlm, "<tool_call>get_we", "ther"},                                     // no such function
      {ToolFormat::kGlm, "<tool_call>", "get_weather", "now"},                           // not the one named
      {ToolFormat::kGlm, "<tool_call>get_weather<arg_key>", "town"},                       // undeclared key
      {ToolFormat::kGlm, "<tool_call>get_weather<arg_key>days</arg_key><arg_value>", "\"3\""},  // a string for an integer
      {ToolFormat::kGlm, "<tool_call>get_weather<arg_key>days</arg_key><arg_value>", "x"},      // not JSON
      {ToolFormat::kGlm, "<tool_call>get_weather<arg_key>days</arg_key><arg_value>", "</arg_value>"},  // no value
      {ToolFormat::kGlm, "<tool_call>get_weather<arg_key>days</arg_key><arg_value>", "[1]"},       // nor an array
      {ToolFormat::kGlm, "<tool_call>get_weather<arg_key>days</arg_key><arg_value>2</arg_value><", "/tool_call>"},  // city missing
      {ToolFormat::kGlm, glm_city + "<arg_key>", "city"},                                  // a key twice
      {ToolFormat::kGlm, "<tool_call>get_weather<arg_key>city</arg_key><arg_value>" + std::string(40, 'a'), "a"},  // maxLength
      {ToolFormat::kGlm, "<tool_call>get<arg_key>q</arg_key><arg_value>ab", "C"},              // the pattern
      {ToolFormat::kGlm, "<tool_call>get<arg_key>q</arg_key><arg_value>", "</arg_value>"},     // the pattern: not empty
      {ToolFormat::kGlm, glm_city + "</tool_call>", "<tool_call>", "get_weather", false},  // one call asked
      {ToolFormat::kGlm, glm_city + "</tool_call>", "x"},                                  // prose after the call
      {ToolFormat::kGlm, "<tool_call>get_weather\n\n\n\n", "\n"},                          // whitespace runs are short
      {ToolFormat::kDsml, dsml_call + "<｜DSML｜parameter name=\"days\" string=\"", "true"},  // days is JSON
      {ToolFormat::kDsml, dsml_call + "<｜DSML｜parameter name=\"city\" string=\"", "false"},  // city is text
      {ToolFormat::kDsml, dsml_call + "<｜DSML｜parameter name=\"city\" string=\"true\">Rome</｜DSML｜parameter>\n</｜DSML｜invoke>\n<",
       "｜DSML｜invoke", "get_weather", false},
      {ToolFormat::kDsml, "<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"now\"><｜DSML｜", "invoke"},  // not closed
      // The parser takes the first closing marker as the end wherever it stands: none inside a call.
      {ToolFormat::kGlm, glm_city.substr(0, glm_city.size() - 13) + "a</tool_call", ">"},
      {ToolFormat::kGlm, "<tool_call>now<arg_key>a</tool_call", ">"},
      {ToolFormat::kGlm, "<tool_call>get<arg_key>tags</arg_key><arg_value>[\"</arg_value", ">"},
      {ToolFormat::kGlm, "<tool_call>get<arg_key>tags</arg_key><arg_value>[\"</tool_call", ">"},
      {ToolFormat::kDsml, dsml_call + "<｜DSML｜parameter name=\"note\" string=\"true\">x</｜DSML｜invoke", ">"},
      {ToolFormat::kDeepSeekV3, v3_call + "{\"city\": \"<｜tool▁call▁end｜", ">"},
      {ToolFormat::kDeepSeekV3, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>now<｜tool▁sep｜>{\"<｜tool▁call▁end｜", ">"},
      // Declared properties and nothing else said: no other keys, also in nested objects.
      {ToolFormat::kGlm, "<tool_call>get<arg_key>", "x"},
      {ToolFormat::kDeepSeekV3, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get<｜tool▁sep｜>{\"opts\": {\"", "x"},
      {ToolFormat::kDeepSeekV3, v3_call + "{\"city\": \"Oslo\"", "<"},                     // the object is not closed
      {ToolFormat::kDeepSeekV3, v3_call + "{\"city\": \"Oslo\"}<｜tool▁call", "s▁end｜>"},  // the call closes first
      {ToolFormat::kDeepSeekV3, v3_call, "[]"},                                            // arguments are an object
      {ToolFormat::kDeepSeekV3, v3_call + "{\"days\": 3", "}"},                             // city missing
  };
  for (const Bad& c : cases) {
    SCOPED_TRACE(c.good + " | " + c.bad);
    const ToolCallPrefix p = start(c.format, c.only, c.many);
    EXPECT_EQ(refused_at(p, c.good), c.good.size());
    EXPECT_EQ(refused_at(p, c.good + c.bad), c.good.size());
  }
  // One call asked: whole once it closes.
  ToolCallPrefix one = start(ToolFormat::kGlm, "get_weather", false);
  ASSERT_TRUE(one.push(glm_city + "</tool_call>\n"));
  EXPECT_TRUE(one.complete());
}

TEST(ToolCallPrefix, ToolsThatCannotBeForced) {
  EXPECT_THROW(ToolGrammar::make(ToolFormat::kGlm, tools(), "missing", true), Error);
  const Json odd = Json::parse(R"([{"type": "function", "function": {"name": "f",
      "parameters": {"type": "object", "not": {"minProperties": 1}}}}])");
  try {
    ToolGrammar::make(ToolFormat::kGlm, odd, "", true);
    ADD_FAILURE() << "a schema with `not` was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tool 'f'"), std::string::npos) << e.what();
  }
  const Json spaced = Json::parse(R"([{"type": "function", "function": {"name": "a b"}}])");
  EXPECT_THROW(ToolGrammar::make(ToolFormat::kGlm, spaced, "", true), Error);
}

// tool_choice "auto" with strict functions: text is free until a call opens, the call is held
// (a strict function's arguments to its schema, another's to any object), then text is free again.
TEST(ToolCallPrefix, OptionalCallsAreHeldOnceOpened) {
  Json strict = tools();
  strict[0]["function"]["strict"] = true;
  const auto g = ToolGrammar::make(ToolFormat::kGlm, strict, "", true, /*optional=*/true);
  const std::string before = "Let me look <that> up: ", call = "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Oslo</arg_value></tool_call>",
                    after = " Done. <tool_call>get<arg_key>q</arg_key><arg_value>NOT lower case</arg_value></tool_call>";
  ToolCallPrefix p(g);
  EXPECT_TRUE(p.free());
  EXPECT_TRUE(p.complete());
  ASSERT_EQ(refused_at(p, before + call + after), before.size() + call.size() + after.size());
  ASSERT_TRUE(p.push(before + "<tool_call>get_weather"));
  EXPECT_FALSE(p.free());
  EXPECT_FALSE(p.complete());
  // Inside the strict call: its schema.
  EXPECT_EQ(refused_at(p, "<arg_key>town"), std::string("<arg_key>").size());
  EXPECT_EQ(refused_at(p, "</tool_call>"), 1u) << "city is required";
  ASSERT_TRUE(p.push(call.substr(std::string("<tool_call>get_weather").size())));
  EXPECT_TRUE(p.free());
  EXPECT_TRUE(p.complete());
  // The text after it reads back as content, the calls as calls.
  const ToolCallParser::Result r = ToolCallParser::parse(ToolFormat::kGlm, strict, before + call + after);
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(Json::parse(r.calls[1].arguments), Json({{"q", "NOT lower case"}}));  // not strict: not held
  // DeepSeek-V3.1's format: free again after the block closes.
  const auto v3 = ToolGrammar::make(ToolFormat::kDeepSeekV3, strict, "", true, true);
  ToolCallPrefix q(v3);
  const std::string block = "Sure.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Rome\"}"
                            "<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
  ASSERT_TRUE(q.push(block.substr(0, block.size() - 40)));
  EXPECT_FALSE(q.complete());
  ASSERT_TRUE(q.push(block.substr(block.size() - 40) + " More text."));
  EXPECT_TRUE(q.free());
  EXPECT_TRUE(ToolGrammar::any_strict(strict));
  EXPECT_FALSE(ToolGrammar::any_strict(tools()));
  // A function not strict takes any value as text (dsml: marked either way), as the parser reads
  // it; the strict one still wants JSON for its integer.
  const std::string loose = "<tool_call>get<arg_key>tags</arg_key><arg_value>a, b</arg_value></tool_call>";
  ToolCallPrefix l(g);
  ASSERT_EQ(refused_at(l, loose), loose.size());
  EXPECT_EQ(refused_at(l, "<tool_call>get_weather<arg_key>days</arg_key><arg_value>a"),
            std::string("<tool_call>get_weather<arg_key>days</arg_key><arg_value>").size());
  EXPECT_EQ(Json::parse(ToolCallParser::parse(ToolFormat::kGlm, strict, loose).calls.at(0).arguments),
            Json({{"tags", "a, b"}}));
  const auto dsml = ToolGrammar::make(ToolFormat::kDsml, strict, "", true, true);
  for (const char* marked : {"true", "false"}) {
    const std::string block = std::string("<｜DSML｜function_calls><｜DSML｜invoke name=\"get\">") +
                              "<｜DSML｜parameter name=\"tags\" string=\"" + marked +
                              "\">a, b</｜DSML｜parameter></｜DSML｜invoke></｜DSML｜function_calls>";
    EXPECT_EQ(refused_at(ToolCallPrefix(dsml), block), block.size()) << marked;
    EXPECT_EQ(Json::parse(ToolCallParser::parse(ToolFormat::kDsml, strict, block).calls.at(0).arguments),
              Json({{"tags", "a, b"}}));
  }
}

// tool_choice "auto" with parallel_tool_calls false: free text, one call (glm) or one block of
// one call (dsml, v3), then only the end; a second call opened from the text after it is refused.
// Where many calls are allowed, the second goes through.
TEST(ToolCallPrefix, OptionalCallsAreOneWhereOneIsAllowed) {
  struct Case {
    ToolFormat format;
    std::string call, second;  // a whole call (dsml, v3: its block), and another
  };
  for (const Case& c :
       {Case{ToolFormat::kGlm, "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Oslo</arg_value></tool_call>",
             "<tool_call>now</tool_call>"},
        Case{ToolFormat::kDsml,
             "<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"now\">\n</｜DSML｜invoke>\n</｜DSML｜function_calls>",
             "<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"now\">\n</｜DSML｜invoke>\n</｜DSML｜function_calls>"},
        Case{ToolFormat::kDeepSeekV3,
             "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get<｜tool▁sep｜>{\"q\": \"x\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
             "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>now<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"}}) {
    SCOPED_TRACE(c.call);
    const std::string before = "Let me look <that> up: ";
    ToolCallPrefix one(ToolGrammar::make(c.format, tools(), "", /*many=*/false, /*optional=*/true));
    ASSERT_TRUE(one.push(before));
    EXPECT_TRUE(one.free());
    ASSERT_TRUE(one.push(c.call));
    EXPECT_FALSE(one.free());
    EXPECT_TRUE(one.complete());
    // A little whitespace, then nothing: neither text nor a second call.
    EXPECT_EQ(refused_at(one, "\n" + c.second), 1u);
    EXPECT_EQ(refused_at(one, " Done."), 1u);
    ASSERT_TRUE(one.push("\n"));
    EXPECT_TRUE(one.complete());
    const ToolCallParser::Result r = ToolCallParser::parse(c.format, tools(), before + c.call + "\n");
    EXPECT_EQ(r.calls.size(), 1u);
    // Many calls allowed: the text is free after the call, and a second one is taken.
    ToolCallPrefix many(ToolGrammar::make(c.format, tools(), "", /*many=*/true, /*optional=*/true));
    const std::string text = before + c.call + "\n" + c.second;
    EXPECT_EQ(refused_at(many, text), text.size());
    ASSERT_TRUE(many.push(text));
    EXPECT_TRUE(many.free());
    EXPECT_EQ(ToolCallParser::parse(c.format, tools(), text).calls.size(), 2u);
  }
  // Nor a second call inside the block (v3 here, dsml alike).
  ToolCallPrefix v3(ToolGrammar::make(ToolFormat::kDeepSeekV3, tools(), "", false, true));
  const std::string two = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>now<｜tool▁sep｜>{}<｜tool▁call▁end｜>";
  EXPECT_EQ(refused_at(v3, two + "<｜tool▁call▁begin｜>"), two.size() + std::string("<｜tool▁call").size());
}

// A good call, tokenized with its markers as special tokens, goes through the masks token by
// token (each mask is each token tried alone); the end of sequence only at its end; a copy made
// midway goes its own way.
TEST(ToolCallConstraint, MasksLetAGoodCallThroughAndAreEachTokenTried) {
  const Tokenizer& tok = marker_tokenizer();
  const int64_t V = tok.vocab_size() + 1;
  const int32_t eos = int32_t(V - 1), observation = *tok.token_to_id("<|observation|>");
  for (const auto& [format, text] : std::vector<std::pair<ToolFormat, std::string>>{
           {ToolFormat::kGlm, "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>And God said, <let> there be "
                              "light</arg_value>\n<arg_key>days</arg_key>\n<arg_value>7</arg_value>\n<arg_key>note</arg_key>\n"
                              "<arg_value>Free \"text\", a \\ and\n<tags> </ends></arg_value>\n</tool_call>"},
           {ToolFormat::kDeepSeekV3, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get<｜tool▁sep｜>{\"q\": \"light\", "
                                     "\"tags\": [\"day\", \"night\"]}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"}}) {
    SCOPED_TRACE(text);
    const std::vector<int32_t> ids = tok.encode(text, false);
    ASSERT_GE(std::count_if(ids.begin(), ids.end(), [&](int32_t id) { return tok.is_special(id); }), 4);
    ToolCallConstraint c(tok, ToolGrammar::make(format, tools(), "", true), {eos}, -1, -1, false);
    for (size_t i = 0; i < ids.size(); ++i) {
      const std::vector<int32_t> ok = allowed(c, V);
      EXPECT_EQ(ok, each_token(c.state(), tok, V, eos)) << i;
      EXPECT_TRUE(std::binary_search(ok.begin(), ok.end(), ids[i])) << i << ": " << *tok.token_bytes(ids[i]);
      EXPECT_FALSE(std::binary_search(ok.begin(), ok.end(), eos)) << i;
      EXPECT_FALSE(std::binary_search(ok.begin(), ok.end(), observation)) << i;
      if (i == ids.size() / 2) {  // a copy takes a token of its own; the original keeps its mask
        std::unique_ptr<TokenConstraint> copy = c.clone();
        copy->accept(ok.front());
        EXPECT_EQ(allowed(c, V), ok) << "the copy's token reached the original";
      }
      c.accept(ids[i]);
    }
    const std::vector<int32_t> end = allowed(c, V);
    EXPECT_TRUE(std::binary_search(end.begin(), end.end(), eos));
    EXPECT_TRUE(c.state().complete());
  }
  // Optional calls: every token while the text is free, the call's tokens once it opens.
  Json strict = tools();
  strict[0]["function"]["strict"] = true;
  ToolCallConstraint c(tok, ToolGrammar::make(ToolFormat::kGlm, strict, "", true, true), {eos}, -1, -1, false);
  for (int32_t id : tok.encode("And God said", false)) {
    EXPECT_EQ(allowed(c, V).size(), size_t(V));
    c.accept(id);
  }
  c.accept(*tok.token_to_id("<tool_call>"));
  const std::vector<int32_t> ok = allowed(c, V);
  EXPECT_EQ(ok, each_token(c.state(), tok, V, eos));
  EXPECT_LT(ok.size(), 20u);
}

// Free text in auto mode is masked too, where a token could open a call: a plain-text token that
// completes the opening marker and goes on with bytes the call cannot take would open the call
// unheld (the recognizer refuses the token, so it stays outside the call while the parser reads
// one). Such a token is left out; every other token, special ones included, fits.
TEST(ToolCallConstraint, FreeTextOpensNoCallItCannotHold) {
  static const Tokenizer tok = Tokenizer::from_json_text(
      test::with_added_tokens({">{", ">get", "x>y", "_call>"}, false,  // plain text, not special
                              test::with_added_tokens(test::kMarkerTokens, true))
          .dump(),
      "markers, and plain tokens with '>'");
  const int64_t V = tok.vocab_size() + 1;
  const int32_t eos = int32_t(V - 1);
  const int32_t brace = *tok.token_to_id(">{"), name = *tok.token_to_id(">get"), xy = *tok.token_to_id("x>y"),
                call = *tok.token_to_id("_call>"), observation = *tok.token_to_id("<|observation|>");
  ToolCallConstraint c(tok, ToolGrammar::make(ToolFormat::kGlm, tools(), "", true, true), {eos}, -1, -1, false);
  std::vector<int32_t> ok = allowed(c, V);
  EXPECT_EQ(ok, each_token(c.state(), tok, V, eos));
  EXPECT_EQ(ok.size(), size_t(V));  // nothing before it can open a call: every token, the end, specials
  for (int32_t id : tok.encode("Let me look. <tool", false)) c.accept(id);  // plain bytes, no marker yet
  ok = allowed(c, V);
  EXPECT_EQ(ok, each_token(c.state(), tok, V, eos));
  EXPECT_TRUE(std::binary_search(ok.begin(), ok.end(), call));  // "<tool_call>" opens, then nothing more
  EXPECT_TRUE(std::binary_search(ok.begin(), ok.end(), observation));
  for (int32_t id : tok.encode("_call", false)) c.accept(id);
  ASSERT_TRUE(c.state().free());
  ok = allowed(c, V);
  EXPECT_EQ(ok, each_token(c.state(), tok, V, eos));
  EXPECT_FALSE(std::binary_search(ok.begin(), ok.end(), brace)) << "'{' cannot follow the opening";
  EXPECT_TRUE(std::binary_search(ok.begin(), ok.end(), name));  // a function's name begins
  EXPECT_TRUE(std::binary_search(ok.begin(), ok.end(), xy));  // no marker: free text goes on
  EXPECT_EQ(ok.size(), size_t(V) - 1);
  c.accept(name);
  EXPECT_FALSE(c.state().free());  // the call is open and held
  ok = allowed(c, V);
  EXPECT_EQ(ok, each_token(c.state(), tok, V, eos));
  EXPECT_FALSE(std::binary_search(ok.begin(), ok.end(), eos));
}

}  // namespace
}  // namespace dsi::server
