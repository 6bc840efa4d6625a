// Tool calls read back from chat answers (server/tool_calls.h) in GLM's and DeepSeek-V3.2's (DSML)
// formats, as their chat templates write them: names, typed arguments (the model's string marks,
// the tools' schemas, JSON, text that is not JSON), several calls, text around them, whatever
// pieces the answer arrives in, each call as soon as it closes; calls cut short or malformed stay
// content.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "dsinfer/error.h"
#include "server/reasoning.h"
#include "server/tool_calls.h"
#include "test_util.h"

namespace dsi::server {
namespace {

using Json = nlohmann::ordered_json;

const Json kTools = Json::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "zip": {"type": "string"},
                   "units": {"type": ["string", "null"]}}}}},
  {"type": "function", "function": {"name": "search", "parameters": {"type": "object",
    "properties": {"query": {"type": "string"}, "filters": {"type": "object"}}}}}])");

// Every way of cutting the text into two pieces, and one byte at a time: the same result.
void expect_calls(ToolFormat f, const std::string& text, const std::string& content,
                  const std::vector<std::pair<std::string, Json>>& calls) {
  SCOPED_TRACE(text);
  std::vector<std::vector<std::string>> ways = {{text}};
  for (size_t cut = 0; cut <= text.size(); cut += 3) ways.push_back({text.substr(0, cut), text.substr(cut)});
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  ways.push_back(bytes);
  for (const auto& pieces : ways) {
    ToolCallParser p(f, kTools);
    std::string got;
    ToolCallParser::Result r;
    for (const std::string& piece : pieces) {
      ToolCallParser::Result part = p.push(piece);
      got += part.content;
      for (ToolCall& c : part.calls) r.calls.push_back(std::move(c));
    }
    ToolCallParser::Result end = p.finish();
    got += end.content;
    for (ToolCall& c : end.calls) r.calls.push_back(std::move(c));
    EXPECT_EQ(got, content) << pieces.size() << " pieces";
    ASSERT_EQ(r.calls.size(), calls.size()) << pieces.size() << " pieces";
    for (size_t i = 0; i < calls.size(); ++i) {
      EXPECT_EQ(r.calls[i].name, calls[i].first);
      EXPECT_EQ(Json::parse(r.calls[i].arguments), calls[i].second) << r.calls[i].arguments;
    }
  }
}

TEST(ToolCalls, Glm) {
  const ToolFormat g = ToolFormat::kGlm;
  expect_calls(g,
               "Let me check.<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value>"
               "<arg_key>days</arg_key><arg_value>3</arg_value><arg_key>zip</arg_key><arg_value>75001</arg_value>"
               "</tool_call>",
               "Let me check.", {{"get_weather", {{"city", "Paris"}, {"days", 3}, {"zip", "75001"}}}});
  // GLM-4.5's newlines, two calls, JSON values (tojson'd by the template), a tool not in the list.
  expect_calls(g,
               "<tool_call>search\n<arg_key>query</arg_key>\n<arg_value>light and \"darkness\"</arg_value>\n"
               "<arg_key>filters</arg_key>\n<arg_value>{\"book\": [\"Genesis\"], \"max\": 2}</arg_value>\n</tool_call>\n"
               "<tool_call>unknown_tool<arg_key>n</arg_key><arg_value>1.5</arg_value><arg_key>s</arg_key>"
               "<arg_value>not json</arg_value></tool_call>",
               "",
               {{"search", {{"query", "light and \"darkness\""}, {"filters", {{"book", {"Genesis"}}, {"max", 2}}}}},
                {"unknown_tool", {{"n", 1.5}, {"s", "not json"}}}});
  expect_calls(g, "<tool_call>get_weather</tool_call>", "", {{"get_weather", Json::object()}});
  expect_calls(g, "<tool_call>get_weather<arg_key>units</arg_key><arg_value>null</arg_value></tool_call>", "",
               {{"get_weather", {{"units", "null"}}}});
  // No call, a call cut short (max_tokens), a malformed one after a good one, a marker's prefix.
  expect_calls(g, "Plain answer <tool_", "Plain answer <tool_", {});
  expect_calls(g, "A<tool_call>get_weather<arg_key>city</arg_key><arg_val",
               "A<tool_call>get_weather<arg_key>city</arg_key><arg_val", {});
  expect_calls(g, "<tool_call>search<arg_key>query</arg_key><arg_value>x</arg_value></tool_call> then <tool_call><junk></tool_call>",
               " then <tool_call><junk></tool_call>", {{"search", {{"query", "x"}}}});
}

TEST(ToolCalls, Dsml) {
  const ToolFormat d = ToolFormat::kDsml;
  expect_calls(d,
               "I will look it up.\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"
               "<｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n"
               "<｜DSML｜parameter name=\"days\" string=\"false\">3</｜DSML｜parameter>\n"
               "</｜DSML｜invoke>\n<｜DSML｜invoke name=\"search\">\n"
               "<｜DSML｜parameter name=\"query\" string=\"true\">42</｜DSML｜parameter>\n"
               "<｜DSML｜parameter name=\"filters\" string=\"false\">{\"a\": [1, 2]}</｜DSML｜parameter>\n"
               "</｜DSML｜invoke>\n</｜DSML｜function_calls>",
               "I will look it up.\n\n",
               {{"get_weather", {{"city", "Paris"}, {"days", 3}}}, {"search", {{"query", "42"}, {"filters", {{"a", {1, 2}}}}}}});
  expect_calls(d, "<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"search\">\n</｜DSML｜invoke>\n</｜DSML｜function_calls>", "",
               {{"search", Json::object()}});
  // Cut short; a block whose parameter has no string mark stays content.
  expect_calls(d, "x<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"search\">",
               "x<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"search\">", {});
  const std::string bad = "<｜DSML｜function_calls><｜DSML｜invoke name=\"search\"><｜DSML｜parameter name=\"q\">x"
                          "</｜DSML｜parameter></｜DSML｜invoke></｜DSML｜function_calls>";
  expect_calls(d, bad, bad, {});
}

TEST(ToolCalls, DeepSeekV3) {
  const ToolFormat v3 = ToolFormat::kDeepSeekV3;
  expect_calls(v3,
               "Checking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Paris\", \"days\": 3}"
               "<｜tool▁call▁end｜><｜tool▁call▁begin｜>search<｜tool▁sep｜>```json\n{\"query\": \"x\"}\n```<｜tool▁call▁end｜>"
               "<｜tool▁calls▁end｜>",
               "Checking.", {{"get_weather", {{"city", "Paris"}, {"days", 3}}}, {"search", {{"query", "x"}}}});
  const std::string bad = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>search<｜tool▁sep｜>not json<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
  expect_calls(v3, bad, bad, {});
}

// Each call comes out with the piece that closes it, not at the end of the answer; the content
// before it already went out. A DSML / V3 block hands out its calls one by one, and a later call
// that does not parse leaves the earlier ones calls (it and the rest are content).
TEST(ToolCalls, EachCallAsSoonAsItCloses) {
  const std::string call1 = "<tool_call>search<arg_key>query</arg_key><arg_value>a</arg_value></tool_call>";
  ToolCallParser g(ToolFormat::kGlm, kTools);
  ToolCallParser::Result r = g.push("Looking.\n" + call1.substr(0, 30));
  EXPECT_EQ(r.content, "Looking.\n");
  EXPECT_TRUE(r.calls.empty());
  r = g.push(call1.substr(30) + "\n<tool_call>get_weather<arg_key>city");
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "search");
  r = g.push("</arg_key><arg_value>Rome</arg_value></tool_call>\n");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  r = g.finish();
  EXPECT_EQ(r.content, "");  // the blank text after the calls is dropped
  EXPECT_TRUE(r.calls.empty());

  const std::string invoke1 = "<｜DSML｜invoke name=\"search\">\n<｜DSML｜parameter name=\"query\" string=\"true\">x"
                              "</｜DSML｜parameter>\n</｜DSML｜invoke>\n";
  ToolCallParser d(ToolFormat::kDsml, kTools);
  r = d.push("<｜DSML｜function_calls>\n" + invoke1 + "<｜DSML｜invoke name=\"get_we");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "search");
  EXPECT_EQ(r.content, "");
  const std::string bad = "<｜DSML｜invoke name=\"get_weather\"><｜DSML｜parameter name=\"city\">Rome</｜DSML｜parameter>"
                          "</｜DSML｜invoke></｜DSML｜function_calls>";
  r = d.push(bad.substr(std::string("<｜DSML｜invoke name=\"get_we").size()));
  EXPECT_TRUE(r.calls.empty());
  EXPECT_EQ(r.content, "\n" + bad);  // as written from the call on (the blank before it too)
  r = d.push(" and more");
  EXPECT_EQ(r.content, " and more");
  EXPECT_EQ(d.finish().content, "");
  expect_calls(ToolFormat::kDsml, "<｜DSML｜function_calls>\n" + invoke1 + bad, "\n" + bad, {{"search", {{"query", "x"}}}});
  const std::string v3_bad = "<｜tool▁call▁begin｜>x<｜tool▁sep｜>[1]<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
  expect_calls(ToolFormat::kDeepSeekV3,
               "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>search<｜tool▁sep｜>{}<｜tool▁call▁end｜>" + v3_bad, v3_bad,
               {{"search", Json::object()}});
}

// The released models' chat templates (tests/jinja/templates) pick their formats, and all of them
// write think blocks (so the reasoning parser's auto turns on).
TEST(ToolCalls, FormatsOfTheModelsTemplates) {
  const std::pair<const char*, ToolFormat> cases[] = {
      {"glm46", ToolFormat::kGlm}, {"glm47", ToolFormat::kGlm}, {"glm5_flash", ToolFormat::kGlm},
      {"deepseek_v32_dsml_llamacpp", ToolFormat::kDsml}, {"deepseek_v32_exp", ToolFormat::kDeepSeekV3},
      {"deepseek_v32_vllm_tools", ToolFormat::kDeepSeekV3}};
  for (const auto& [name, format] : cases) {
    std::ifstream f(test::source_dir() + "/tests/jinja/templates/" + name + ".jinja");
    ASSERT_TRUE(f.good()) << name;
    std::stringstream ss;
    ss << f.rdbuf();
    EXPECT_EQ(tool_format("auto", ss.str()), format) << name;
    EXPECT_NE(ss.str().find(ReasoningSplitter::kClose), std::string::npos) << name;
  }
}

TEST(ToolCalls, FormatFromTheTemplateOrByName) {
  EXPECT_EQ(tool_format("auto", "{{'<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>'}}"), ToolFormat::kDeepSeekV3);
  EXPECT_EQ(tool_format("deepseek_v3", ""), ToolFormat::kDeepSeekV3);
  EXPECT_EQ(tool_format("auto", "...<tool_call>{function-name}<arg_key>{arg-key-1}</arg_key>..."), ToolFormat::kGlm);
  EXPECT_EQ(tool_format("auto", "{%- set dsml_token = \"｜DSML｜\" -%}"), ToolFormat::kDsml);
  EXPECT_EQ(tool_format("auto", "{{ messages }}"), ToolFormat::kNone);
  EXPECT_EQ(tool_format("dsml", ""), ToolFormat::kDsml);
  EXPECT_EQ(tool_format("none", "<arg_key>"), ToolFormat::kNone);
  EXPECT_THROW(tool_format("hermes", ""), Error);
  // Off: everything is content.
  const ToolCallParser::Result r = ToolCallParser::parse(ToolFormat::kNone, kTools, "<tool_call>search</tool_call>");
  EXPECT_EQ(r.content, "<tool_call>search</tool_call>");
  EXPECT_TRUE(r.calls.empty());
}

}  // namespace
}  // namespace dsi::server
