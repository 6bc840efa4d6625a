// ChatTemplate: loading a model's chat template and special tokens as transformers does, and the
// variables apply_chat_template passes to it.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "dsinfer/error.h"
#include "test_util.h"
#include "text/chat_template.h"

namespace dsi::test {
namespace {

using Json = nlohmann::ordered_json;

void write(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
}

TEST(JinjaChatTemplate, LoadsTheCommittedModel) {
  const std::string dir = source_dir() + "/models/kjv-dsa";
  const ChatTemplate t = ChatTemplate::load(dir);
  std::ifstream f(dir + "/chat_template.jinja", std::ios::binary);
  const std::string file((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_EQ(t.source(), file);
  EXPECT_EQ(t.eos_token(), "<|endoftext|>");
  EXPECT_EQ(t.bos_token(), "");  // its tokenizer_config.json sets none
  const Json msgs = Json::parse(R"([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}])");
  EXPECT_EQ(t.render(msgs, nullptr, true), "[gMASK]<sop><|system|>\nBe brief.<|user|>\nHello<|assistant|>\n");
  EXPECT_EQ(t.render(msgs, nullptr, false), "[gMASK]<sop><|system|>\nBe brief.<|user|>\nHello");
  // The template's raise_exception reaches the caller as a one-line dsi::Error with its message.
  const Json tool_msg = Json::parse(R"([{"role": "tool", "content": "x"}])");
  try {
    t.render(tool_msg);
    ADD_FAILURE() << "no error for a tool message";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "unsupported role: tool");
  }
}

TEST(JinjaChatTemplate, FileLookupOrderAsTransformers) {
  TempDir dir;
  write(dir.path() + "/tokenizer_config.json",
        R"({"chat_template": "from config", "bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>"})");
  EXPECT_EQ(ChatTemplate::load(dir.path()).render(Json::array()), "from config");
  write(dir.path() + "/chat_template.json", R"({"chat_template": "from chat_template.json"})");
  EXPECT_EQ(ChatTemplate::load(dir.path()).render(Json::array()), "from chat_template.json");
  write(dir.path() + "/chat_template.jinja", "from jinja file {{ bos_token }}{{ eos_token }}\n");
  const ChatTemplate t = ChatTemplate::load(dir.path());
  EXPECT_EQ(t.render(Json::array()), "from jinja file <s></s>");  // one trailing newline dropped, as jinja2
  EXPECT_EQ(t.bos_token(), "<s>");
}

TEST(JinjaChatTemplate, NamedTemplatesUseDefault) {
  TempDir dir;
  write(dir.path() + "/tokenizer_config.json",
        R"({"chat_template": [{"name": "tool_use", "template": "tools"}, {"name": "default", "template": "plain"}]})");
  EXPECT_EQ(ChatTemplate::load(dir.path()).render(Json::array()), "plain");
  write(dir.path() + "/tokenizer_config.json", R"({"chat_template": [{"name": "tool_use", "template": "tools"}]})");
  expect_error([&] { ChatTemplate::load(dir.path()); }, {"tokenizer_config.json", "no template named \"default\"", "tool_use"});
}

TEST(JinjaChatTemplate, LoadErrorsNameTheFile) {
  TempDir dir;
  expect_error([&] { ChatTemplate::load(dir.path()); }, {dir.path(), "no chat template"});
  write(dir.path() + "/chat_template.jinja", "ok\n{% if x %}\n{{ 1 +* 2 }}{% endif %}");
  expect_error([&] { ChatTemplate::load(dir.path()); }, {"chat_template.jinja:3:", "unexpected '*'"});
  write(dir.path() + "/chat_template.jinja", "x");
  write(dir.path() + "/tokenizer_config.json", "{not json");
  expect_error([&] { ChatTemplate::load(dir.path()); }, {"tokenizer_config.json", "invalid JSON"});
}

TEST(JinjaChatTemplate, PassesApplyChatTemplateVariables) {
  const ChatTemplate t(
      "{{ messages|length }}|{{ tools is none }}|{{ documents is none }}|{{ add_generation_prompt }}|"
      "{{ bos_token }}|{{ eos_token is defined }}|{{ enable_thinking }}|{{ tools|tojson if tools else '' }}",
      {{"bos_token", "<B>"}}, "vars");
  const Json msgs = Json::parse(R"([{"role": "user", "content": "hi"}])");
  EXPECT_EQ(t.render(msgs, nullptr, false, Json{{"enable_thinking", true}}), "1|True|True|False|<B>|False|True|");
  // Tool schemas keep their key order through ordered_json (Python keeps the request's order).
  const Json tools = Json::parse(R"([{"type": "function", "function": {"name": "f", "description": "d"}}])");
  EXPECT_EQ(t.render(msgs, tools, true, Json::object()),
            R"(1|False|True|True|<B>|False||[{"type": "function", "function": {"name": "f", "description": "d"}}])");
  expect_error([&] { t.render(msgs, nullptr, true, Json{{"messages", 1}}); }, {"vars", "'messages' is reserved"});
  expect_error([&] { t.render(Json::object()); }, {"messages must be a JSON array"});
  expect_error([&] { t.render(msgs, Json::object()); }, {"tools must be null or a JSON array"});
}

}  // namespace
}  // namespace dsi::test
