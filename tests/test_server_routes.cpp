// The OpenAI routes over the engine's test double (tests/server/fake_engine.h), called through the
// Router as the transport calls them: every endpoint, JSON and SSE answers, stop strings and ids,
// logprobs, a client that disconnects mid-stream (its request is cancelled), bad input, metrics.
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <thread>
#include <tuple>

#include "fake_engine.h"
#include "test_constraints_util.h"
#include "server/openai_routes.h"
#include "test_util.h"

namespace dsi::server {
namespace {

using Json = nlohmann::json;
using test::FakeEngine;
using test::FakeEngineOptions;

std::string kjv() { return test::source_dir() + "/models/kjv-dsa"; }

const Tokenizer& kjv_tokenizer() {
  static const Tokenizer t = Tokenizer::load(kjv() + "/tokenizer.json");
  return t;
}

FakeEngineOptions kjv_like() {
  FakeEngineOptions o;
  o.model_id = "kjv-dsa";
  o.max_model_len = 256;
  return o;
}

struct Sse {
  std::vector<Json> chunks;
  bool done = false;  // "data: [DONE]" came last
  int comments = 0;
};

// Parses an SSE body: events separated by a blank line, `data:` lines, `:` comments.
Sse parse_sse(const std::string& body) {
  Sse s;
  size_t i = 0;
  while (i < body.size()) {
    size_t j = body.find("\n\n", i);
    EXPECT_NE(j, std::string::npos) << "unterminated event: " << body.substr(i);
    if (j == std::string::npos) break;
    const std::string ev = body.substr(i, j - i);
    i = j + 2;
    EXPECT_FALSE(s.done) << "event after [DONE]: " << ev;
    if (ev.rfind(":", 0) == 0) {
      ++s.comments;
      continue;
    }
    EXPECT_EQ(ev.rfind("data: ", 0), 0u) << ev;
    const std::string data = ev.substr(6);
    if (data == "[DONE]") s.done = true;
    else s.chunks.push_back(Json::parse(data));
  }
  return s;
}

class ServerRoutes : public ::testing::Test {
 protected:
  void start(FakeEngineOptions o = kjv_like(), std::optional<ChatTemplate> chat = ChatTemplate::load(kjv()),
             ServiceOptions so = {}, const Tokenizer& tokenizer = kjv_tokenizer()) {
    api_.reset();
    engine_ = std::make_unique<FakeEngine>(o);
    api_ = std::make_unique<OpenAiService>(*engine_, tokenizer, std::move(chat), so);
  }
  void SetUp() override { start(); }
  void TearDown() override {
    if (engine_) expect_no_leaks();
  }

  HttpResponse call(const std::string& method, const std::string& path, const std::string& body = "") {
    return api_->router().dispatch(HttpRequest{method, path, body});
  }
  Json post_json(const std::string& path, const Json& body, int status = 200) {
    HttpResponse r = call("POST", path, body.dump());
    EXPECT_EQ(r.status, status) << r.body;
    EXPECT_FALSE(r.stream);
    return Json::parse(r.body);
  }
  // Runs a streamed answer to its end (or until the writer has taken `max_writes` pieces and then
  // reports a disconnect), as the transport does.
  std::string drain(HttpResponse& r, int max_writes = -1) {
    EXPECT_TRUE(bool(r.stream));
    EXPECT_EQ(r.content_type, "text/event-stream");
    std::string body;
    int writes = 0;
    const ChunkWriter w = [&](std::string_view s) {
      if (max_writes >= 0 && writes >= max_writes) return false;
      ++writes;
      body.append(s);
      return true;
    };
    for (int guard = 0; guard < 100000 && r.stream(w);) ++guard;
    if (r.on_close) r.on_close();
    return body;
  }
  Sse stream(const std::string& path, Json body) {
    body["stream"] = true;
    HttpResponse r = call("POST", path, body.dump());
    EXPECT_EQ(r.status, 200) << r.body;
    return parse_sse(drain(r));
  }
  void expect_error(const HttpResponse& r, int status, const std::string& needle, const std::string& param = "") {
    EXPECT_EQ(r.status, status) << r.body;
    const Json j = Json::parse(r.body);
    ASSERT_TRUE(j.contains("error")) << r.body;
    const Json& e = j["error"];
    EXPECT_TRUE(e["message"].is_string());
    EXPECT_TRUE(e["type"].is_string());
    EXPECT_TRUE(e.contains("param") && e.contains("code"));
    EXPECT_NE(e["message"].get<std::string>().find(needle), std::string::npos) << r.body;
    if (!param.empty()) {
      EXPECT_EQ(e["param"], param);
    }
  }
  // The engine's running / waiting queues and pages drain once every request has ended.
  void expect_no_leaks() {
    EngineMetrics m;
    for (int i = 0; i < 400; ++i) {
      m = engine_->metrics();
      if (m.running == 0 && m.waiting == 0 && m.kv_pages_used == 0) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    EXPECT_EQ(m.running, 0);
    EXPECT_EQ(m.waiting, 0);
    EXPECT_EQ(m.kv_pages_used, 0);
    EXPECT_EQ(api_->metrics().in_flight.load(), 0);
  }
  // The fake engine's greedy tokens for a prompt.
  std::vector<int32_t> expected(const std::vector<int32_t>& prompt, int n) {
    EngineRequest r;
    r.prompt = prompt;
    std::vector<int32_t> ids;
    for (int i = 0; i < n; ++i) ids.push_back(FakeEngine::token_at(kjv_like(), r, size_t(i)));
    return ids;
  }

  std::unique_ptr<FakeEngine> engine_;
  std::unique_ptr<OpenAiService> api_;
};

TEST_F(ServerRoutes, HealthModelsAndRouting) {
  HttpResponse h = call("GET", "/health");
  EXPECT_EQ(h.status, 200);
  const Json models = Json::parse(call("GET", "/v1/models").body);
  EXPECT_EQ(models["object"], "list");
  ASSERT_EQ(models["data"].size(), 1u);
  EXPECT_EQ(models["data"][0]["id"], "kjv-dsa");
  EXPECT_EQ(models["data"][0]["object"], "model");
  EXPECT_EQ(models["data"][0]["max_model_len"], 256);
  expect_error(call("GET", "/v1/nothing"), 404, "no route");
  expect_error(call("POST", "/v1/models"), 405, "not allowed");
  expect_error(call("GET", "/v1/completions"), 405, "not allowed");
  expect_error(call("DELETE", "/v1/chat/completions"), 405, "not allowed");
  EXPECT_EQ(call("HEAD", "/health").status, 200);
}

TEST_F(ServerRoutes, FailedEngineIsAServerError) {
  FakeEngineOptions o = kjv_like();
  o.failure = "rank 1: all_reduce timed out";
  start(o);
  const HttpResponse h = call("GET", "/health");
  EXPECT_EQ(h.status, 503);
  EXPECT_NE(h.body.find("all_reduce timed out"), std::string::npos);
  const Json e = post_json("/v1/completions", Json{{"model", "kjv-dsa"}, {"prompt", "And God said"}}, 503);
  EXPECT_EQ(e["error"]["type"], "server_error");
  EXPECT_NE(e["error"]["message"].get<std::string>().find("the engine has failed"), std::string::npos);
}

TEST_F(ServerRoutes, CompletionGreedyText) {
  const std::string prompt = "In the beginning God created";
  const std::vector<int32_t> ids = kjv_tokenizer().encode(prompt, true);
  const Json r = post_json("/v1/completions", {{"model", "kjv-dsa"}, {"prompt", prompt}, {"max_tokens", 12},
                                               {"temperature", 0}});
  EXPECT_EQ(r["object"], "text_completion");
  EXPECT_EQ(r["model"], "kjv-dsa");
  EXPECT_EQ(r["id"].get<std::string>().rfind("cmpl-", 0), 0u);
  ASSERT_EQ(r["choices"].size(), 1u);
  EXPECT_EQ(r["choices"][0]["index"], 0);
  EXPECT_EQ(r["choices"][0]["text"], kjv_tokenizer().decode(expected(ids, 12), true));
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(r["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(r["usage"]["prompt_tokens"], ids.size());
  EXPECT_EQ(r["usage"]["completion_tokens"], 12);
  EXPECT_EQ(r["usage"]["total_tokens"], ids.size() + 12);
  // Token-id prompts and echo.
  const Json e = post_json("/v1/completions", {{"prompt", ids}, {"max_tokens", 4}, {"echo", true}, {"temperature", 0}});
  EXPECT_EQ(e["choices"][0]["text"], kjv_tokenizer().decode(ids, true) + kjv_tokenizer().decode(expected(ids, 4), true));
}

TEST_F(ServerRoutes, StreamEqualsNonStream) {
  for (int per_step : {1, 3}) {
    FakeEngineOptions o = kjv_like();
    o.tokens_per_step = per_step;
    start(o);
    const Json body = {{"prompt", "And the earth was without form"}, {"max_tokens", 20}, {"temperature", 0}};
    const Json full = post_json("/v1/completions", body);
    Json sbody = body;
    sbody["stream_options"] = {{"include_usage", true}};
    const Sse s = stream("/v1/completions", sbody);
    ASSERT_TRUE(s.done);
    ASSERT_GE(s.chunks.size(), 3u);
    std::string text;
    for (size_t i = 0; i + 1 < s.chunks.size(); ++i) {
      const Json& c = s.chunks[i];
      EXPECT_EQ(c["object"], "text_completion");
      EXPECT_EQ(c["id"], s.chunks[0]["id"]);
      EXPECT_TRUE(c.contains("usage") && c["usage"].is_null());
      text += c["choices"][0]["text"].get<std::string>();
      const bool last = i + 2 == s.chunks.size();
      EXPECT_EQ(c["choices"][0]["finish_reason"].is_null(), !last);
      if (last) {
        EXPECT_EQ(c["choices"][0]["finish_reason"], "length");
      }
    }
    EXPECT_EQ(text, full["choices"][0]["text"]);
    const Json& u = s.chunks.back();  // the usage chunk: no choices
    EXPECT_TRUE(u["choices"].empty());
    EXPECT_EQ(u["usage"], full["usage"]);
    // Without include_usage: no usage anywhere.
    const Sse plain = stream("/v1/completions", body);
    for (const Json& c : plain.chunks) EXPECT_FALSE(c.contains("usage"));
  }
}

TEST_F(ServerRoutes, StopStrings) {
  const Json base = {{"prompt", "Let there be light"}, {"max_tokens", 40}, {"temperature", 0}};
  const std::string full = post_json("/v1/completions", base)["choices"][0]["text"];
  ASSERT_GT(full.size(), 30u);
  // Four printable ASCII bytes from the middle of the output (random ids can decode to U+FFFD).
  size_t at = 15;
  while (at + 4 < full.size() &&
         !std::all_of(full.begin() + long(at), full.begin() + long(at) + 4, [](char c) { return c > 32 && c < 127; }))
    ++at;
  ASSERT_LT(at + 4, full.size());
  const std::string stop = full.substr(at, 4);
  const std::string want = full.substr(0, full.find(stop));
  Json b = base;
  b["stop"] = {stop, "\x01never"};
  const Json r = post_json("/v1/completions", b);
  EXPECT_EQ(r["choices"][0]["text"], want);
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
  EXPECT_LT(r["usage"]["completion_tokens"].get<int>(), 40);
  for (int per_step : {1, 4}) {
    FakeEngineOptions o = kjv_like();
    o.tokens_per_step = per_step;
    start(o);
    const Sse s = stream("/v1/completions", b);
    std::string text;
    for (const Json& c : s.chunks) text += c["choices"][0]["text"].get<std::string>();
    EXPECT_EQ(text, want);
    EXPECT_EQ(s.chunks.back()["choices"][0]["finish_reason"], "stop");
    expect_no_leaks();  // the engine's request was cancelled
  }
}

TEST_F(ServerRoutes, StopTokenIds) {
  const std::vector<int32_t> ids = kjv_tokenizer().encode("Let there be light", true);
  const std::vector<int32_t> want = expected(ids, 30);
  const Json r = post_json("/v1/completions", {{"prompt", ids}, {"max_tokens", 30}, {"stop_token_ids", {want[5]}}, {"temperature", 0}});
  // The first occurrence of the id ends generation, its text included.
  const size_t at = size_t(std::find(want.begin(), want.end(), want[5]) - want.begin());
  EXPECT_EQ(r["choices"][0]["text"],
            kjv_tokenizer().decode(std::vector<int32_t>(want.begin(), want.begin() + long(at) + 1), true));
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(r["usage"]["completion_tokens"], at + 1);
}

TEST_F(ServerRoutes, CompletionLogprobs) {
  const std::vector<int32_t> ids = {10, 20, 30};
  const Json r = post_json("/v1/completions", {{"prompt", ids}, {"max_tokens", 6}, {"logprobs", 2}, {"temperature", 0}});
  const Json& lp = r["choices"][0]["logprobs"];
  const std::vector<int32_t> want = expected(ids, 6);
  ASSERT_EQ(lp["tokens"].size(), 6u);
  ASSERT_EQ(lp["token_logprobs"].size(), 6u);
  ASSERT_EQ(lp["top_logprobs"].size(), 6u);
  ASSERT_EQ(lp["text_offset"].size(), 6u);
  std::string joined;
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(lp["tokens"][i], kjv_tokenizer().decode({want[i]}));
    EXPECT_NEAR(lp["token_logprobs"][i].get<double>(), -0.25 - 0.01 * (want[i] % 50), 1e-6);
    EXPECT_EQ(lp["text_offset"][i], joined.size());
    EXPECT_LE(lp["top_logprobs"][i].size(), 2u);
    EXPECT_TRUE(lp["top_logprobs"][i].contains(lp["tokens"][i].get<std::string>()));
    joined += lp["tokens"][i].get<std::string>();
  }
  EXPECT_EQ(joined, r["choices"][0]["text"]);
  // Streamed: the same records spread over the chunks.
  const Sse s = stream("/v1/completions", {{"prompt", ids}, {"max_tokens", 6}, {"logprobs", 2}, {"temperature", 0}});
  std::vector<std::string> toks;
  for (const Json& c : s.chunks)
    if (!c["choices"][0]["logprobs"].is_null())
      for (const Json& t : c["choices"][0]["logprobs"]["tokens"]) toks.push_back(t);
  EXPECT_EQ(Json(toks), lp["tokens"]);
}

TEST_F(ServerRoutes, Chat) {
  const Json messages = Json::array({{{"role", "system"}, {"content", "Answer in the words of the KJV."}},
                                     {{"role", "user"}, {"content", "Who made the light?"}}});
  const std::string rendered = ChatTemplate::load(kjv()).render(messages, nullptr, true);
  EXPECT_EQ(rendered.rfind("[gMASK]<sop><|system|>\n", 0), 0u) << rendered;
  const std::vector<int32_t> ids = kjv_tokenizer().encode(rendered, false);
  const Json r = post_json("/v1/chat/completions", {{"messages", messages}, {"max_completion_tokens", 8},
                                                    {"temperature", 0}});
  EXPECT_EQ(r["object"], "chat.completion");
  EXPECT_EQ(r["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
  EXPECT_EQ(r["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(r["choices"][0]["message"]["content"], kjv_tokenizer().decode(expected(ids, 8), true));
  EXPECT_EQ(r["usage"]["prompt_tokens"], ids.size());  // the template's specials, not added twice
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
  // Default max tokens for chat: the rest of the context.
  const Json d = post_json("/v1/chat/completions", {{"messages", messages}});
  EXPECT_EQ(d["usage"]["completion_tokens"], 256 - ids.size());

  const Sse s = stream("/v1/chat/completions", {{"messages", messages}, {"max_tokens", 8}, {"temperature", 0}});
  ASSERT_TRUE(s.done);
  EXPECT_EQ(s.chunks[0]["choices"][0]["delta"]["role"], "assistant");
  std::string text;
  for (const Json& c : s.chunks) {
    EXPECT_EQ(c["object"], "chat.completion.chunk");
    if (c["choices"][0]["delta"].contains("content")) text += c["choices"][0]["delta"]["content"].get<std::string>();
  }
  EXPECT_EQ(text, r["choices"][0]["message"]["content"]);
  EXPECT_EQ(s.chunks.back()["choices"][0]["finish_reason"], "length");

  const Json lp = post_json("/v1/chat/completions", {{"messages", messages}, {"max_tokens", 3}, {"logprobs", true},
                                                     {"top_logprobs", 2}});
  const Json& content = lp["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 3u);
  for (const Json& t : content) {
    EXPECT_TRUE(t["token"].is_string());
    EXPECT_TRUE(t["logprob"].is_number());
    EXPECT_EQ(t["bytes"].size(), t["token"].get<std::string>().size());
    EXPECT_EQ(t["top_logprobs"].size(), 2u);
  }
}

// A reasoning model's answer: its <think> block as reasoning_content (JSON and streamed), the rest
// as content; thinking turned off by the template's switch, or the parser off: all content.
TEST_F(ServerRoutes, ChatReasoningContent) {
  const ChatTemplate thinking(
      "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}<|assistant|>"
      "{% if enable_thinking is defined and not enable_thinking %}<think></think>{% else %}<think>{% endif %}",
      {});
  const std::string thought = "The light was made on the first day.";
  const std::string said = "\nGod made the light.";
  const std::string answer = thought + "</think>" + said;
  FakeEngineOptions o = kjv_like();
  o.script = kjv_tokenizer().encode(answer, false);
  const int n = int(o.script.size());
  const Json messages = Json::array({{{"role", "user"}, {"content", "Who made the light?"}}});
  const Json body = {{"messages", messages}, {"max_tokens", n}, {"temperature", 0}};

  start(o, thinking);
  Json r = post_json("/v1/chat/completions", body);
  EXPECT_EQ(r["choices"][0]["message"]["reasoning_content"], thought);
  EXPECT_EQ(r["choices"][0]["message"]["content"], said);
  const Sse s = stream("/v1/chat/completions", body);
  ASSERT_TRUE(s.done);
  std::string reasoning, content;
  for (const Json& c : s.chunks) {
    const Json& d = c["choices"][0]["delta"];
    if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
    if (d.contains("content")) content += d["content"].get<std::string>();
  }
  EXPECT_EQ(reasoning, thought);
  EXPECT_EQ(content, said);
  EXPECT_GT(std::count_if(s.chunks.begin(), s.chunks.end(),
                          [](const Json& c) { return c["choices"][0]["delta"].contains("reasoning_content"); }),
            1) << "the reasoning streams as it comes";

  Json off = body;
  off["chat_template_kwargs"] = {{"enable_thinking", false}};
  r = post_json("/v1/chat/completions", off);  // the prompt closed the block: all of it is content
  EXPECT_TRUE(r["choices"][0]["message"]["reasoning_content"].is_null());
  EXPECT_EQ(r["choices"][0]["message"]["content"], answer);

  ServiceOptions none;
  none.reasoning_parser = "none";
  start(o, thinking, none);
  r = post_json("/v1/chat/completions", body);
  EXPECT_FALSE(r["choices"][0]["message"].contains("reasoning_content"));
  EXPECT_EQ(r["choices"][0]["message"]["content"], answer);
  // The bundled model's template has no think block: no parser by default.
  start(o);
  r = post_json("/v1/chat/completions", body);
  EXPECT_FALSE(r["choices"][0]["message"].contains("reasoning_content"));
  ServiceOptions bad;
  bad.reasoning_parser = "r1";
  EXPECT_THROW(start(o, thinking, bad), Error);
  start(o);
}

// Tool calls in a chat answer (GLM's format, picked from the template's markers): message.tool_calls
// with typed arguments, the text before them as content, finish_reason "tool_calls"; streamed as
// content deltas, then a delta for each call (its index in the answer) as soon as it closes, before
// the next call is written. Without tools, or with tool_choice "none", the text stays content;
// tool_choice values that would force calls are refused.
TEST_F(ServerRoutes, ChatToolCalls) {
  const ChatTemplate glm_like(
      "{% if tools %}Call tools as <tool_call>name<arg_key>k</arg_key><arg_value>v</arg_value></tool_call>{% endif %}"
      "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}<|assistant|>",
      {});
  const std::string said = "Let me check.";
  const std::string written = "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value>"
                           "<arg_key>days</arg_key><arg_value>3</arg_value></tool_call>";
  const std::string second = "\n<tool_call>get_weather<arg_key>city</arg_key><arg_value>Rome, the eternal city of "
                             "seven hills</arg_value></tool_call>";
  FakeEngineOptions o = kjv_like();
  o.step_time = std::chrono::milliseconds(2);
  o.max_model_len = 1024;
  o.script = kjv_tokenizer().encode(said + written + second, false);
  o.script.push_back(o.eos);
  const Json tools = Json::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}])");
  const Json body = {{"messages", Json::array({{{"role", "user"}, {"content", "Weather in Paris?"}}})},
                     {"tools", tools}, {"max_tokens", 400}, {"temperature", 0}};
  start(o, glm_like);

  Json r = post_json("/v1/chat/completions", body);
  const Json& m = r["choices"][0]["message"];
  EXPECT_EQ(m["content"], said);
  ASSERT_EQ(m["tool_calls"].size(), 2u) << r.dump();
  EXPECT_EQ(m["tool_calls"][0]["type"], "function");
  EXPECT_EQ(m["tool_calls"][0]["id"].get<std::string>().rfind("call_", 0), 0u);
  EXPECT_EQ(m["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(Json::parse(m["tool_calls"][0]["function"]["arguments"].get<std::string>()),
            Json({{"city", "Paris"}, {"days", 3}}));
  EXPECT_EQ(Json::parse(m["tool_calls"][1]["function"]["arguments"].get<std::string>()),
            Json({{"city", "Rome, the eternal city of seven hills"}}));
  EXPECT_EQ(r["choices"][0]["finish_reason"], "tool_calls");

  const Sse s = stream("/v1/chat/completions", body);
  ASSERT_TRUE(s.done);
  std::string content;
  std::vector<Json> calls;
  std::vector<size_t> at;  // the chunks that carried them
  for (size_t i = 0; i < s.chunks.size(); ++i) {
    const Json& d = s.chunks[i]["choices"][0]["delta"];
    if (d.contains("content")) content += d["content"].get<std::string>();
    if (d.contains("tool_calls"))
      for (const Json& c : d["tool_calls"]) calls.push_back(c), at.push_back(i);
  }
  EXPECT_EQ(content, said);
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0]["index"], 0);
  EXPECT_EQ(calls[1]["index"], 1);
  EXPECT_EQ(calls[0]["function"]["name"], "get_weather");
  EXPECT_EQ(Json::parse(calls[1]["function"]["arguments"].get<std::string>()),
            Json({{"city", "Rome, the eternal city of seven hills"}}));
  EXPECT_LT(at[0], at[1]) << "the first call waited for the second";
  EXPECT_EQ(s.chunks.back()["choices"][0]["finish_reason"], "tool_calls");

  Json no_tools = body;
  no_tools.erase("tools");
  r = post_json("/v1/chat/completions", no_tools);
  EXPECT_EQ(r["choices"][0]["message"]["content"], said + written + second);
  EXPECT_FALSE(r["choices"][0]["message"].contains("tool_calls"));
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
  Json none = body;
  none["tool_choice"] = "none";
  r = post_json("/v1/chat/completions", none);
  EXPECT_EQ(r["choices"][0]["message"]["content"], said + written + second);
}

// tool_choice "required" or a named function: the answer is a call written whole (the test double
// takes its script's token wherever the constraint allows it, else the lowest id allowed), so a
// model that writes a good call has it read back, and one that would write prose is held to a call
// of the function with arguments its schema accepts; with tool_choice "auto" only a strict
// function's call, once opened, and with parallel_tool_calls false one call. A model whose
// template has no call format cannot be forced, nor a tool whose parameters the schema compiler
// refuses (400).
TEST_F(ServerRoutes, ForcedToolCalls) {
  const ChatTemplate glm_like(
      "{% if tools %}Call tools as <tool_call>name<arg_key>k</arg_key><arg_value>v</arg_value></tool_call>{% endif %}"
      "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}<|assistant|>",
      {});
  const Json tools = Json::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                     "additionalProperties": false}}},
      {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}])");
  const Json messages = Json::array({{{"role", "user"}, {"content", "Weather in Paris?"}}});
  const Json named = {{"type", "function"}, {"function", {{"name", "get_weather"}}}};
  struct Case {
    Json choice;
    std::string script;
    Json arguments;
  };
  for (const Case& c :
       {Case{"required", "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>",
             Json({{"city", "Paris"}})},
        Case{named, "<tool_call>get_weather\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>",
             Json({{"days", 3}})},
        // Prose, or a word for the integer: held to what the schema accepts.
        Case{named, "No need.", Json::object()},
        Case{named, "<tool_call>get_weather<arg_key>days</arg_key><arg_value>three</arg_value></tool_call>",
             Json::object()}}) {
    SCOPED_TRACE(c.script);
    FakeEngineOptions o = kjv_like();
    o.script = kjv_tokenizer().encode(c.script, false);
    o.script.push_back(o.eos);
    o.natural_first = true;
    start(o, glm_like);
    const Json r = post_json("/v1/chat/completions", {{"messages", messages}, {"tools", tools}, {"tool_choice", c.choice},
                                                      {"max_tokens", 150}});
    const Json& m = r["choices"][0]["message"];
    ASSERT_EQ(m["tool_calls"].size(), 1u) << r.dump();
    EXPECT_EQ(m["tool_calls"][0]["function"]["name"], "get_weather");
    const Json args = Json::parse(m["tool_calls"][0]["function"]["arguments"].get<std::string>());
    if (c.arguments.empty()) {  // whatever the lowest ids spell is the schema's: declared keys, days an integer
      for (const auto& [key, value] : args.items()) {
        EXPECT_TRUE(key == "city" || key == "days") << args.dump();
        if (key == "days") {
          EXPECT_TRUE(value.is_number_integer()) << args.dump();
        }
      }
    } else {
      EXPECT_EQ(args, c.arguments);
    }
    EXPECT_TRUE(m["content"].is_null()) << r.dump();
    EXPECT_EQ(r["choices"][0]["finish_reason"], "tool_calls");
  }
  // tool_choice "auto": a strict function's call is held to its schema once it opens (days: an
  // integer); without "strict" the model's text is read as written (a string).
  for (const bool strict : {true, false}) {
    Json t = tools;
    if (strict) t[0]["function"]["strict"] = true;
    FakeEngineOptions o = kjv_like();
    o.script = kjv_tokenizer().encode(
        "Checking.<tool_call>get_weather<arg_key>days</arg_key><arg_value>three</arg_value></tool_call>", false);
    o.script.push_back(o.eos);
    o.natural_first = true;
    start(o, glm_like);
    const Json r = post_json("/v1/chat/completions", {{"messages", messages}, {"tools", t}, {"max_tokens", 150}});
    const Json& m = r["choices"][0]["message"];
    // (Strict: the test double goes on with its script after the call, as free text.)
    ASSERT_TRUE(m["content"].is_string()) << r.dump();
    EXPECT_EQ(m["content"].get<std::string>().substr(0, 9), "Checking.") << r.dump();
    ASSERT_EQ(m["tool_calls"].size(), 1u) << r.dump();
    const Json args = Json::parse(m["tool_calls"][0]["function"]["arguments"].get<std::string>());
    if (strict) {
      EXPECT_TRUE(args["days"].is_number_integer()) << args.dump();
    } else {
      EXPECT_EQ(args, Json({{"days", "three"}}));
    }
  }
  // tool_choice "auto" with parallel_tool_calls false, no function strict: a model that writes two
  // calls has the first read back and the answer ends there; by default both. Tools that cannot be
  // held (a name with a space) are no reason to refuse it: its calls are then read as written.
  {
    FakeEngineOptions o = kjv_like();
    o.script = kjv_tokenizer().encode(
        "Checking.<tool_call>get_weather<arg_key>days</arg_key><arg_value>three</arg_value></tool_call>"
        "<tool_call>get_time</tool_call>",
        false);
    o.script.push_back(o.eos);
    o.natural_first = true;
    Json spaced = tools;
    spaced.push_back(Json::parse(R"({"type": "function", "function": {"name": "a b"}})"));
    for (const auto& [parallel, t, n] : std::vector<std::tuple<Json, Json, size_t>>{
             {Json(), tools, 2}, {true, tools, 2}, {false, tools, 1}, {false, spaced, 2}}) {
      SCOPED_TRACE(parallel.dump() + " " + std::to_string(t.size()));
      start(o, glm_like);
      Json body = {{"messages", messages}, {"tools", t}, {"tool_choice", "auto"}, {"max_tokens", 150}};
      if (!parallel.is_null()) body["parallel_tool_calls"] = parallel;
      const Json r = post_json("/v1/chat/completions", body);
      const Json& m = r["choices"][0]["message"];
      ASSERT_EQ(m["tool_calls"].size(), n) << r.dump();
      EXPECT_EQ(m["tool_calls"][0]["function"]["name"], "get_weather");
      EXPECT_EQ(Json::parse(m["tool_calls"][0]["function"]["arguments"].get<std::string>()), Json({{"days", "three"}}));
      if (n == 2) {
        EXPECT_EQ(m["tool_calls"][1]["function"]["name"], "get_time");
      }
      ASSERT_TRUE(m["content"].is_string()) << r.dump();
      EXPECT_EQ(m["content"].get<std::string>().substr(0, 9), "Checking.") << r.dump();
      EXPECT_EQ(r["choices"][0]["finish_reason"], "tool_calls");
    }
  }
  // Markers that are special tokens (as in GLM's vocabulary) stay in the text that the call parser
  // reads, though special tokens are skipped.
  {
    const Tokenizer& tok = test::marker_tokenizer();
    FakeEngineOptions o = kjv_like();
    o.vocab_size = tok.vocab_size();
    o.script = tok.encode("<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>", false);
    ASSERT_TRUE(tok.is_special(o.script.at(o.script.size() - 1)));
    o.script.push_back(o.eos);
    o.natural_first = true;
    start(o, glm_like, {}, tok);
    for (const Json& choice : {Json("auto"), Json("required")}) {
      const Json r = post_json("/v1/chat/completions", {{"messages", messages}, {"tools", tools}, {"tool_choice", choice},
                                                        {"max_tokens", 150}});
      const Json& m = r["choices"][0]["message"];
      ASSERT_EQ(m["tool_calls"].size(), 1u) << r.dump();
      EXPECT_EQ(Json::parse(m["tool_calls"][0]["function"]["arguments"].get<std::string>()), Json({{"city", "Paris"}}));
    }
  }
  start(kjv_like(), glm_like);
  Json bad_tools = tools;
  bad_tools[1]["function"]["parameters"] = Json::parse(R"({"type": "object", "not": {"minProperties": 1}})");
  expect_error(call("POST", "/v1/chat/completions",
                    Json({{"messages", messages}, {"tools", bad_tools}, {"tool_choice", "required"}}).dump()),
               400, "get_time", "tools");
  // A named function whose parameters compile is forced even beside a tool that does not.
  FakeEngineOptions o = kjv_like();
  o.script = kjv_tokenizer().encode("<tool_call>get_weather</tool_call>", false);
  o.script.push_back(o.eos);
  o.natural_first = true;
  start(o, glm_like);
  const Json r = post_json("/v1/chat/completions", {{"messages", messages}, {"tools", bad_tools}, {"tool_choice", named},
                                                    {"max_tokens", 150}});
  ASSERT_EQ(r["choices"][0]["message"]["tool_calls"].size(), 1u) << r.dump();
  start(kjv_like());  // the bundled model's template: no call format
  expect_error(call("POST", "/v1/chat/completions",
                    Json({{"messages", messages}, {"tools", tools}, {"tool_choice", "required"}}).dump()),
               400, "no tool calls", "tool_choice");
}

// /tokenize gives the ids the completions endpoints would run (prompt: with the post-processor's
// specials; messages: the chat template's text), /detokenize their text back; bad input is a 400.
TEST_F(ServerRoutes, TokenizeAndDetokenize) {
  const std::string text = "And God said, Let there be light: and there was light.";
  Json r = post_json("/tokenize", {{"prompt", text}});
  const std::vector<int32_t> ids = kjv_tokenizer().encode(text, true);
  EXPECT_EQ(r["tokens"], Json(ids));
  EXPECT_EQ(r["count"], ids.size());
  EXPECT_EQ(r["max_model_len"], 256);
  EXPECT_EQ(post_json("/tokenize", {{"prompt", text}, {"add_special_tokens", false}})["tokens"],
            Json(kjv_tokenizer().encode(text, false)));
  const Json messages = Json::array({{{"role", "user"}, {"content", "Who made the light?"}}});
  const std::string rendered = ChatTemplate::load(kjv()).render(messages, nullptr, true);
  r = post_json("/tokenize", {{"messages", messages}});
  EXPECT_EQ(r["tokens"], Json(kjv_tokenizer().encode(rendered, false)));
  // The same count as a chat completion's usage.
  const Json c = post_json("/v1/chat/completions", {{"messages", messages}, {"max_tokens", 1}});
  EXPECT_EQ(c["usage"]["prompt_tokens"], r["count"]);

  r = post_json("/detokenize", {{"tokens", ids}});
  EXPECT_EQ(r["prompt"], kjv_tokenizer().decode(ids, false));
  expect_error(call("POST", "/detokenize", Json{{"tokens", {1, 999999}}}.dump()), 400, "999999", "tokens");
  expect_error(call("POST", "/tokenize", "{}"), 400, "either", "prompt");
  expect_error(call("POST", "/tokenize", Json{{"prompt", "x"}, {"model", "other"}}.dump()), 404, "other");
}

TEST_F(ServerRoutes, ClientDisconnectCancelsTheRequest) {
  FakeEngineOptions o = kjv_like();
  o.step_time = std::chrono::microseconds(3000);
  start(o);
  for (const char* path : {"/v1/completions", "/v1/chat/completions"}) {
    Json body = {{"max_tokens", 200}, {"stream", true}, {"ignore_eos", true}};
    if (std::string(path) == "/v1/completions") body["prompt"] = "Blessed are the meek";
    else body["messages"] = Json::array({{{"role", "user"}, {"content", "hi"}}});
    {
      HttpResponse r = call("POST", path, body.dump());
      const std::string got = drain(r, 3);  // three pieces, then the client is gone
      EXPECT_FALSE(got.empty());
    }
    expect_no_leaks();
  }
  EXPECT_EQ(api_->metrics().requests_by_reason[2].load(), 2);  // "abort"
  const std::string page = call("GET", "/metrics").body;
  EXPECT_NE(page.find("dsinfer:request_success_total{model_name=\"kjv-dsa\",finished_reason=\"abort\"} 2"),
            std::string::npos) << page;
}

TEST_F(ServerRoutes, ShutdownEndsStreams) {
  HttpResponse r = call("POST", "/v1/completions",
                        Json({{"prompt", "x y z"}, {"max_tokens", 200}, {"stream", true}}).dump());
  api_->shutdown();
  const Sse s = parse_sse(drain(r));
  EXPECT_TRUE(s.done);
  EXPECT_EQ(s.chunks.back()["choices"][0]["finish_reason"], "abort");
}

TEST_F(ServerRoutes, BadInput) {
  expect_error(call("POST", "/v1/completions", "{not json"), 400, "not valid JSON");
  expect_error(call("POST", "/v1/chat/completions", ""), 400, "not valid JSON");
  expect_error(call("POST", "/v1/completions", R"({"prompt": "x", "n": 20})"), 400, "[1, 16]", "n");
  expect_error(call("POST", "/v1/completions", R"({"prompt": "x", "max_tokens": -3})"), 400, "at least 1", "max_tokens");
  expect_error(call("POST", "/v1/completions", R"({"prompt": "x", "max_tokens": 100000})"), 400,
               "maximum context length is 256", "max_tokens");
  expect_error(call("POST", "/v1/completions", R"({"prompt": "x", "model": "gpt-5"})"), 404, "gpt-5", "model");
  expect_error(call("POST", "/v1/chat/completions", R"({"messages": []})"), 400, "empty", "messages");
  expect_error(call("POST", "/v1/chat/completions", R"({"messages": [{"role": "user", "content": 3}]})"), 400,
               "content", "messages");
  // The template refuses a role it does not know: 400 with the template's message.
  expect_error(call("POST", "/v1/chat/completions", R"({"messages": [{"role": "tool", "content": "x"}]})"), 400,
               "unsupported role: tool", "messages");
  // A prompt past max_model_len names both lengths.
  std::string long_prompt;
  for (int i = 0; i < 300; ++i) long_prompt += " light";
  const HttpResponse lr = call("POST", "/v1/completions", Json({{"prompt", long_prompt}}).dump());
  expect_error(lr, 400, "maximum context length is 256 tokens", "prompt");
  EXPECT_NE(lr.body.find("prompt has 30"), std::string::npos) << lr.body;
  // Token ids outside the vocabulary.
  expect_error(call("POST", "/v1/completions", R"({"prompt": [1, 99999]})"), 400, "outside the vocabulary", "prompt");
  EXPECT_EQ(engine_->submitted(), 0u);  // none of them reached the engine
  EXPECT_GE(api_->metrics().rejected.load(), 11);
}

TEST_F(ServerRoutes, ConcurrentStreamsMatchSequential) {
  FakeEngineOptions o = kjv_like();
  o.max_num_seqs = 4;  // most requests wait in the engine's queue at first
  start(o);
  const int n = 16;
  std::vector<Json> bodies;
  for (int i = 0; i < n; ++i)
    bodies.push_back({{"prompt", "Verse " + std::to_string(i)}, {"max_tokens", 10 + i}, {"temperature", 0}});
  std::vector<std::string> sequential;
  for (const Json& b : bodies) sequential.push_back(post_json("/v1/completions", b)["choices"][0]["text"]);
  std::vector<std::string> concurrent(n);
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i)
    threads.emplace_back([&, i] {
      Json b = bodies[size_t(i)];
      b["stream"] = true;
      HttpResponse r = call("POST", "/v1/completions", b.dump());
      std::string body;
      const ChunkWriter w = [&](std::string_view s) { body.append(s); return true; };
      while (r.stream(w)) {
      }
      r.on_close();
      for (const Json& c : parse_sse(body).chunks) concurrent[size_t(i)] += c["choices"][0]["text"].get<std::string>();
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(concurrent, sequential);
}

TEST_F(ServerRoutes, MetricsPage) {
  FakeEngineOptions o = kjv_like();
  o.tokens_per_step = 3;
  start(o);
  post_json("/v1/completions", {{"prompt", "x"}, {"max_tokens", 9}});
  const HttpResponse r = call("GET", "/metrics");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.content_type.rfind("text/plain", 0), 0u);
  for (const char* needle :
       {"dsinfer:num_requests_running{model_name=\"kjv-dsa\"} 0", "dsinfer:num_requests_waiting{",
        "dsinfer:kv_cache_pages_used{", "dsinfer:kv_cache_pages_total{model_name=\"kjv-dsa\"} 4096",
        "dsinfer:kv_cache_usage_perc{", "dsinfer:request_success_total{model_name=\"kjv-dsa\",finished_reason=\"length\"} 1",
        "dsinfer:prompt_tokens_total{", "dsinfer:generation_tokens_total{model_name=\"kjv-dsa\"} 9",
        "dsinfer:generation_tokens_per_second{", "# TYPE dsinfer:time_to_first_token_seconds histogram",
        "dsinfer:time_to_first_token_seconds_count{model_name=\"kjv-dsa\"} 1",
        "dsinfer:inter_token_latency_seconds_bucket{model_name=\"kjv-dsa\",le=\"+Inf\"} 6",
        "dsinfer:e2e_request_latency_seconds_count{", "dsinfer:spec_decode_num_drafts_total{model_name=\"kjv-dsa\"} 3",
        "dsinfer:spec_decode_num_draft_tokens_total{model_name=\"kjv-dsa\"} 6",
        "dsinfer:spec_decode_num_accepted_tokens_total{model_name=\"kjv-dsa\"} 6",
        "dsinfer:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"kjv-dsa\",position=\"0\"} 3",
        "dsinfer:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"kjv-dsa\",position=\"1\"} 3"})
    EXPECT_NE(r.body.find(needle), std::string::npos) << needle << "\n" << r.body;
  // Every sample line is `name{labels} value` or `name value`, after HELP / TYPE lines.
  std::istringstream lines(r.body);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("# ", 0) == 0) continue;
    EXPECT_EQ(line.rfind("dsinfer:", 0), 0u) << line;
    const size_t sp = line.rfind(' ');
    ASSERT_NE(sp, std::string::npos) << line;
    EXPECT_NO_THROW((void)std::stod(line.substr(sp + 1))) << line;
  }
}

}  // namespace
}  // namespace dsi::server
