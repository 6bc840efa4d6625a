// The server's task layer: request JSON -> validated request, every bad input -> the OpenAI error
// with the right status, type, param and code; the model-dependent checks (model name, lengths,
// vocabulary, defaults).
#include <gtest/gtest.h>

#include <variant>

#include "server/task.h"

namespace dsi::server {
namespace {

ParsedRequest ok_completion(const std::string& body) {
  ParseResult r = parse_completion_request(body);
  if (auto* e = std::get_if<ApiError>(&r)) ADD_FAILURE() << body << " -> " << e->message;
  return std::holds_alternative<ParsedRequest>(r) ? std::get<ParsedRequest>(r) : ParsedRequest{};
}

ParsedRequest ok_chat(const std::string& body) {
  ParseResult r = parse_chat_request(body);
  if (auto* e = std::get_if<ApiError>(&r)) ADD_FAILURE() << body << " -> " << e->message;
  return std::holds_alternative<ParsedRequest>(r) ? std::get<ParsedRequest>(r) : ParsedRequest{};
}

// Expects an error with this status and param, whose message contains `needle`.
void expect_error(const ParseResult& r, int status, const std::string& param, const std::string& needle,
                  const std::string& code = "") {
  ASSERT_TRUE(std::holds_alternative<ApiError>(r)) << "accepted a bad request (" << param << ")";
  const ApiError& e = std::get<ApiError>(r);
  EXPECT_EQ(e.status, status) << e.message;
  EXPECT_EQ(e.param, param) << e.message;
  EXPECT_NE(e.message.find(needle), std::string::npos) << e.message;
  EXPECT_EQ(e.message.find('\n'), std::string::npos) << e.message;
  if (!code.empty()) {
    EXPECT_EQ(e.code, code);
  }
  EXPECT_EQ(e.type, "invalid_request_error");
}

TEST(ServerTask, CompletionDefaultsAndFields) {
  ParsedRequest r = ok_completion(R"({"model": "kjv-dsa", "prompt": "In the beginning"})");
  EXPECT_EQ(r.endpoint, Endpoint::kCompletions);
  EXPECT_EQ(r.model, "kjv-dsa");
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_EQ(r.prompts[0].text, "In the beginning");
  EXPECT_FALSE(r.prompts[0].is_ids);
  EXPECT_FALSE(r.max_tokens.has_value());
  EXPECT_FLOAT_EQ(r.temperature, 1.0f);
  EXPECT_FLOAT_EQ(r.top_p, 1.0f);
  EXPECT_EQ(r.top_k, 0);
  EXPECT_FLOAT_EQ(r.min_p, 0.0f);
  EXPECT_FALSE(r.seed.has_value());
  EXPECT_FALSE(r.stream);
  EXPECT_EQ(r.logprobs, -1);

  r = ok_completion(R"({"prompt": [1, 2, 3], "max_tokens": 5, "temperature": 0, "top_p": 0.5,
    "seed": 7, "stop": ["a", "bc"], "stop_token_ids": [9], "stream": true,
    "stream_options": {"include_usage": true}, "logprobs": 3, "n": 1, "best_of": 1,
    "presence_penalty": 0, "frequency_penalty": 0.0, "logit_bias": {}, "user": "u",
    "ignore_eos": true, "top_k": 20, "min_p": 0.05})");
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_TRUE(r.prompts[0].is_ids);
  EXPECT_EQ(r.prompts[0].ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(r.max_tokens, 5);
  EXPECT_FLOAT_EQ(r.temperature, 0.0f);
  EXPECT_FLOAT_EQ(r.top_p, 0.5f);
  EXPECT_EQ(r.top_k, 20);
  EXPECT_FLOAT_EQ(r.min_p, 0.05f);
  EXPECT_EQ(r.seed, 7u);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"a", "bc"}));
  EXPECT_EQ(r.stop_token_ids, (std::vector<int32_t>{9}));
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_EQ(r.logprobs, 3);
  EXPECT_TRUE(r.ignore_eos);

  EXPECT_EQ(ok_completion(R"({"prompt": ["one"], "stop": "x"})").prompts.at(0).text, "one");
  EXPECT_EQ(ok_completion(R"({"prompt": [[4, 5]]})").prompts.at(0).ids, (std::vector<int32_t>{4, 5}));
  // A batch: texts, id lists, or both, in order.
  r = ok_completion(R"({"prompt": ["one", [4, 5], "three"], "n": 2})");
  ASSERT_EQ(r.prompts.size(), 3u);
  EXPECT_EQ(r.prompts[0].text, "one");
  EXPECT_FALSE(r.prompts[0].is_ids);
  EXPECT_TRUE(r.prompts[1].is_ids);
  EXPECT_EQ(r.prompts[1].ids, (std::vector<int32_t>{4, 5}));
  EXPECT_EQ(r.prompts[2].text, "three");
  EXPECT_EQ(r.n, 2);
  EXPECT_EQ(ok_completion(R"({"prompt": "p", "stop": "x"})").stop, std::vector<std::string>{"x"});
  EXPECT_EQ(ok_completion(R"({"prompt": "p", "max_tokens": 16.0})").max_tokens, 16);
  EXPECT_TRUE(ok_completion(R"({"prompt": "p", "echo": true})").echo);
  EXPECT_EQ(ok_completion(R"({"prompt": "p"})").n, 1);
  EXPECT_EQ(ok_completion(R"({"prompt": "p", "n": 3, "best_of": 3})").n, 3);
  EXPECT_EQ(ok_chat(R"({"messages": [{"role": "user", "content": "x"}], "n": 16})").n, 16);
  // null means "not given", as in the OpenAI API.
  EXPECT_FALSE(ok_completion(R"({"prompt": "p", "max_tokens": null, "stop": null})").max_tokens);
}

TEST(ServerTask, ChatFields) {
  ParsedRequest r = ok_chat(R"({"model": "m", "messages": [
      {"role": "system", "content": "be brief"},
      {"role": "user", "content": [{"type": "text", "text": "Hello, "}, {"type": "text", "text": "world"}]},
      {"role": "assistant", "content": null, "tool_calls": []}],
    "tools": [{"type": "function", "function": {"name": "f"}}],
    "chat_template_kwargs": {"enable_thinking": false},
    "max_tokens": 3, "max_completion_tokens": 9, "logprobs": true, "top_logprobs": 2})");
  EXPECT_EQ(r.endpoint, Endpoint::kChat);
  ASSERT_EQ(r.messages.size(), 3u);
  EXPECT_EQ(r.messages[1]["content"], "Hello, world");  // text parts are joined
  EXPECT_EQ(r.tools.size(), 1u);
  EXPECT_EQ(r.chat_template_kwargs["enable_thinking"], false);
  EXPECT_EQ(r.max_tokens, 9);  // max_completion_tokens wins
  EXPECT_EQ(r.logprobs, 2);
  EXPECT_EQ(ok_chat(R"({"messages": [{"role": "user", "content": "x"}], "logprobs": true})").logprobs, 0);
  EXPECT_EQ(ok_chat(R"({"messages": [{"role": "user", "content": "x"}], "logprobs": false})").logprobs, -1);
  // Key order reaches the template as the request has it.
  r = ok_chat(R"({"messages": [{"role": "user", "content": "x", "b": 1, "a": 2}]})");
  EXPECT_EQ(r.messages[0].begin().key(), "role");
  EXPECT_EQ(std::prev(r.messages[0].end()).key(), "a");
}

// tool_choice: auto, none, required, or a named function of the request's tools.
TEST(ServerTask, ToolChoice) {
  const std::string base = R"({"messages": [{"role": "user", "content": "x"}],
      "tools": [{"type": "function", "function": {"name": "get_weather"}}], "tool_choice": )";
  EXPECT_EQ(ok_chat(base + R"("required"})").tool_choice, "required");
  EXPECT_EQ(ok_chat(base + R"("none"})").tool_choice, "none");
  ParsedRequest r = ok_chat(base + R"({"type": "function", "function": {"name": "get_weather"}}})");
  EXPECT_EQ(r.tool_choice, "function");
  EXPECT_EQ(r.tool_name, "get_weather");
  expect_error(parse_chat_request(base + R"({"type": "function", "function": {"name": "search"}}})"), 400,
               "tool_choice", "'search', which is not in 'tools'");
  expect_error(parse_chat_request(base + R"("always"})"), 400, "tool_choice", "must be");
  expect_error(parse_chat_request(base + R"({"type": "function"}})"), 400, "tool_choice", "must be");
  expect_error(parse_chat_request(R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"})"),
               400, "tool_choice", "needs 'tools'");
  expect_error(parse_chat_request(base + R"("required", "response_format": {"type": "json_object"}})"), 400,
               "tool_choice", "not supported", "unsupported");
}

TEST(ServerTask, MalformedJson) {
  for (const char* body : {"", "{", "{\"prompt\": }", "not json", "{\"prompt\": \"x\"} trailing",
                           "\xff\xfe", "[1, 2"}) {
    expect_error(parse_completion_request(body), 400, "", "not valid JSON");
    expect_error(parse_chat_request(body), 400, "", "not valid JSON");
  }
  expect_error(parse_completion_request("[1, 2]"), 400, "", "must be a JSON object");
  expect_error(parse_chat_request("\"x\""), 400, "", "must be a JSON object");
  expect_error(parse_chat_request("null"), 400, "", "must be a JSON object");
}

TEST(ServerTask, WrongTypes) {
  const std::string m = R"("messages": [{"role": "user", "content": "x"}])";
  auto chat = [&](const std::string& extra) { return parse_chat_request("{" + m + ", " + extra + "}"); };
  auto cmpl = [&](const std::string& extra) {
    return parse_completion_request(R"({"prompt": "x", )" + extra + "}");
  };
  expect_error(cmpl(R"("model": 3)"), 400, "model", "must be a string");
  expect_error(cmpl(R"("max_tokens": "16")"), 400, "max_tokens", "must be an integer");
  expect_error(cmpl(R"("max_tokens": 1.5)"), 400, "max_tokens", "must be an integer");
  expect_error(cmpl(R"("temperature": "hot")"), 400, "temperature", "must be a number");
  expect_error(cmpl(R"("top_p": [1])"), 400, "top_p", "must be a number");
  expect_error(cmpl(R"("seed": "s")"), 400, "seed", "must be an integer");
  expect_error(cmpl(R"("stream": "yes")"), 400, "stream", "must be a boolean");
  expect_error(cmpl(R"("stream": true, "stream_options": 1)"), 400, "stream_options", "must be an object");
  expect_error(cmpl(R"("stream": true, "stream_options": {"include_usage": 1})"), 400, "include_usage",
               "must be a boolean");
  expect_error(cmpl(R"("stop": 5)"), 400, "stop", "string or an array of strings");
  expect_error(cmpl(R"("stop": ["a", 1])"), 400, "stop", "string or an array of strings");
  expect_error(cmpl(R"("stop_token_ids": 5)"), 400, "stop_token_ids", "array of token ids");
  expect_error(cmpl(R"("stop_token_ids": [-1])"), 400, "stop_token_ids", "not a token id");
  expect_error(cmpl(R"("logprobs": true)"), 400, "logprobs", "must be an integer");
  expect_error(cmpl(R"("echo": 1)"), 400, "echo", "must be a boolean");
  expect_error(parse_completion_request(R"({"prompt": 5})"), 400, "prompt", "string or an array of token ids");
  expect_error(parse_completion_request(R"({"prompt": {"a": 1}})"), 400, "prompt", "string or an array");
  expect_error(parse_completion_request(R"({"prompt": [1, "a"]})"), 400, "prompt", "must be an integer");
  expect_error(parse_completion_request(R"({"prompt": [1, -2]})"), 400, "prompt", "not a token id");
  expect_error(parse_completion_request(R"({"prompt": [1, 3000000000]})"), 400, "prompt", "not a token id");
  expect_error(parse_chat_request(R"({"messages": "hi"})"), 400, "messages", "must be an array");
  expect_error(parse_chat_request(R"({"messages": [1]})"), 400, "messages", "must be an object");
  expect_error(parse_chat_request(R"({"messages": [{"content": "x"}]})"), 400, "messages", "needs a string 'role'");
  expect_error(parse_chat_request(R"({"messages": [{"role": 1, "content": "x"}]})"), 400, "messages", "'role'");
  expect_error(parse_chat_request(R"({"messages": [{"role": "user"}]})"), 400, "messages", "needs a 'content'");
  expect_error(parse_chat_request(R"({"messages": [{"role": "user", "content": 5}]})"), 400, "messages",
               "string or an array of parts");
  expect_error(chat(R"("tools": {})"), 400, "tools", "must be an array");
  expect_error(chat(R"("chat_template_kwargs": [])"), 400, "chat_template_kwargs", "must be an object");
  expect_error(chat(R"("logprobs": 1)"), 400, "logprobs", "must be a boolean");
  expect_error(chat(R"("max_completion_tokens": "a")"), 400, "max_completion_tokens", "must be an integer");
}

TEST(ServerTask, MissingAndEmpty) {
  expect_error(parse_completion_request("{}"), 400, "prompt", "is required");
  expect_error(parse_completion_request(R"({"prompt": ""})"), 400, "prompt", "is empty");
  expect_error(parse_completion_request(R"({"prompt": []})"), 400, "prompt", "is empty");
  expect_error(parse_completion_request(R"({"prompt": null})"), 400, "prompt", "is required");
  expect_error(parse_chat_request("{}"), 400, "messages", "is required");
  expect_error(parse_chat_request(R"({"messages": []})"), 400, "messages", "is empty");
  expect_error(parse_completion_request(R"({"prompt": "x", "stop": [""]})"), 400, "stop", "must not be empty");
}

TEST(ServerTask, OutOfRange) {
  auto cmpl = [&](const std::string& extra) {
    return parse_completion_request(R"({"prompt": "x", )" + extra + "}");
  };
  expect_error(cmpl(R"("max_tokens": -1)"), 400, "max_tokens", "at least 1");
  expect_error(cmpl(R"("max_tokens": 0)"), 400, "max_tokens", "at least 1");
  expect_error(cmpl(R"("max_tokens": 99999999999)"), 400, "max_tokens", "too large");
  expect_error(cmpl(R"("max_tokens": 1e300)"), 400, "max_tokens", "must be an integer");
  expect_error(cmpl(R"("max_tokens": 18446744073709551615)"), 400, "max_tokens", "out of range");
  expect_error(cmpl(R"("temperature": -0.1)"), 400, "temperature", "[0, 2]");
  expect_error(cmpl(R"("temperature": 2.5)"), 400, "temperature", "[0, 2]");
  expect_error(cmpl(R"("top_p": 0)"), 400, "top_p", "(0, 1]");
  expect_error(cmpl(R"("top_p": 1.01)"), 400, "top_p", "(0, 1]");
  expect_error(cmpl(R"("top_k": -2)"), 400, "top_k", "-1, 0 or positive");
  expect_error(cmpl(R"("top_k": 1.5)"), 400, "top_k", "must be an integer");
  expect_error(cmpl(R"("min_p": 1.5)"), 400, "min_p", "[0, 1]");
  expect_error(cmpl(R"("min_p": -0.1)"), 400, "min_p", "[0, 1]");
  expect_error(cmpl(R"("logit_bias": {"x": 1})"), 400, "logit_bias", "token ids");
  expect_error(cmpl(R"("logit_bias": {"-3": 1})"), 400, "logit_bias", "token ids");
  expect_error(cmpl(R"("logit_bias": {"5": 101})"), 400, "logit_bias", "[-100, 100]");
  expect_error(cmpl(R"("logit_bias": {"5": "a"})"), 400, "logit_bias", "number");
  expect_error(cmpl(R"("logprobs": 21)"), 400, "logprobs", "[0, 20]");
  expect_error(cmpl(R"("logprobs": -1)"), 400, "logprobs", "[0, 20]");
  expect_error(cmpl(R"("n": 0)"), 400, "n", "[1, 16]");
  expect_error(cmpl(R"("n": 17)"), 400, "n", "[1, 16]");
  expect_error(cmpl(R"("presence_penalty": 3)"), 400, "presence_penalty", "[-2, 2]");
  expect_error(cmpl(R"("frequency_penalty": -2.5)"), 400, "frequency_penalty", "[-2, 2]");
  expect_error(cmpl(R"("repetition_penalty": 0)"), 400, "repetition_penalty", "(0, 10]");
  expect_error(cmpl(R"("repetition_penalty": "a")"), 400, "repetition_penalty", "must be a number");
  expect_error(cmpl(R"("stop": ["a","b","c","d","e","f","g","h","i","j","k","l","m","n","o","p","q"])"),
               400, "stop", "at most 16");
  const std::string m = R"({"messages": [{"role": "user", "content": "x"}], )";
  expect_error(parse_chat_request(m + R"("top_logprobs": 21, "logprobs": true})"), 400, "top_logprobs", "[0, 20]");
  expect_error(parse_chat_request(m + R"("top_logprobs": 2})"), 400, "top_logprobs", "needs 'logprobs'");
  expect_error(parse_chat_request(m + R"("max_completion_tokens": -5})"), 400, "max_completion_tokens", "at least 1");
}

TEST(ServerTask, UnsupportedFeatures) {
  auto cmpl = [&](const std::string& extra) {
    return parse_completion_request(R"({"prompt": "x", )" + extra + "}");
  };
  expect_error(cmpl(R"("best_of": 3)"), 400, "best_of", "not supported", "unsupported");
  expect_error(cmpl(R"("n": 2, "best_of": 3)"), 400, "best_of", "not supported", "unsupported");
  expect_error(cmpl(R"("suffix": "end")"), 400, "suffix", "not supported", "unsupported");
  {  // a scored prompt in a stream: its echo chunk carries the prompt's logprobs
    const auto scored = cmpl(R"("echo": true, "logprobs": 1, "stream": true)");
    ASSERT_TRUE(std::holds_alternative<ParsedRequest>(scored));
    EXPECT_TRUE(std::get<ParsedRequest>(scored).echo && std::get<ParsedRequest>(scored).stream);
  }
  expect_error(cmpl(R"("stream_options": {"include_usage": true})"), 400, "stream_options", "only allowed when");
  std::string many = R"({"prompt": [)";
  for (int i = 0; i <= kMaxBatchPrompts; ++i) many += i ? R"(, "p")" : R"("p")";
  expect_error(parse_completion_request(many + "]}"), 400, "prompt", "at most 64");
  expect_error(parse_completion_request(R"({"prompt": ["a", ""]})"), 400, "prompt", "'prompt[1]' is empty");
  expect_error(parse_completion_request(R"({"prompt": ["a", 3]})"), 400, "prompt", "'prompt[1]' must be");
  expect_error(parse_completion_request(R"({"prompt": [[1], [-2]]})"), 400, "prompt", "not a token id");
  expect_error(parse_chat_request(R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})"),
               400, "messages", "not supported", "unsupported");
  expect_error(parse_chat_request(R"({"messages": [{"role": "user", "content": "x"}],
      "response_format": {"type": "grammar"}})"), 400, "response_format", "not supported", "unsupported");
  // Structured outputs: the schema is compiled with the request; what it cannot enforce is a 400.
  expect_error(parse_chat_request(R"({"messages": [{"role": "user", "content": "x"}],
      "response_format": {"type": "json_schema"}})"), 400, "response_format", "needs a 'json_schema' object");
  expect_error(parse_chat_request(R"({"messages": [{"role": "user", "content": "x"}],
      "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "string",
      "pattern": "(a)\\1"}}}})"), 400, "response_format", "#/pattern: the pattern's back-reference");
  expect_error(parse_completion_request(R"({"prompt": "x", "response_format": {"type": "json_schema",
      "json_schema": {"schema": {"type": "object", "required": ["a"], "additionalProperties": false}}}})"), 400,
               "response_format", "#/required: \"a\" is required, but the object may not have it");
  const ParsedRequest schema = ok_chat(R"({"messages": [{"role": "user", "content": "x"}],
      "response_format": {"type": "json_schema", "json_schema": {"name": "a", "strict": true,
      "schema": {"type": "object", "properties": {"b": {"type": "integer"}}, "required": ["b"]}}}})");
  ASSERT_TRUE(schema.json_schema);
  EXPECT_FALSE(schema.json_object);
  EXPECT_EQ(schema.json_schema->root()->names, std::vector<std::string>{"b"});
  EXPECT_TRUE(ok_completion(R"({"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {"name": "any"}}})")
                  .json_schema);  // no schema: any JSON value
  expect_error(parse_chat_request(R"({"messages": [{"role": "user", "content": "x"}], "response_format": "json"})"),
               400, "response_format", "must be an object");
  EXPECT_TRUE(ok_chat(R"({"messages": [{"role": "user", "content": "x"}],
      "response_format": {"type": "json_object"}})").json_object);
  EXPECT_FALSE(ok_chat(R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "text"}})").json_object);
  EXPECT_TRUE(ok_completion(R"({"prompt": "x", "response_format": {"type": "json_object"}})").json_object);
}

// vLLM's structured outputs (and its older guided_* fields): one at a time, compiled with the
// request; what cannot be enforced is a 400, never ignored.
TEST(ServerTask, StructuredOutputs) {
  const ParsedRequest regex = ok_completion(R"x({"prompt": "x", "structured_outputs": {"regex": "(yes|no)[.!]"}})x");
  ASSERT_TRUE(regex.text_pattern);
  EXPECT_TRUE(regex.text_pattern->matches(U"yes!"));
  EXPECT_FALSE(regex.text_pattern->matches(U"yes!!"));  // the whole answer
  EXPECT_FALSE(regex.text_pattern->matches(U"a yes!"));
  const ParsedRequest choice = ok_chat(R"({"messages": [{"role": "user", "content": "x"}],
      "structured_outputs": {"choice": ["Genesis", "Exodus", "a.b*"], "disable_fallback": true}})");
  ASSERT_TRUE(choice.text_pattern);
  EXPECT_TRUE(choice.text_pattern->matches(U"a.b*"));
  EXPECT_FALSE(choice.text_pattern->matches(U"axb"));
  EXPECT_FALSE(choice.text_pattern->matches(U"Gen"));
  EXPECT_TRUE(ok_completion(R"({"prompt": "x", "guided_choice": ["a", "b"]})").text_pattern->matches(U"b"));
  EXPECT_TRUE(ok_completion(R"({"prompt": "x", "guided_regex": "\\d+"})").text_pattern->matches(U"42"));
  EXPECT_TRUE(ok_completion(R"({"prompt": "x", "structured_outputs": {"json": {"type": "integer"}}})").json_schema);
  EXPECT_TRUE(ok_completion(R"({"prompt": "x", "guided_json": "{\"type\": \"string\"}"})").json_schema);
  EXPECT_TRUE(ok_completion(R"({"prompt": "x", "structured_outputs": {"json_object": true}})").json_object);
  const ParsedRequest none = ok_completion(R"({"prompt": "x", "structured_outputs": {"regex": null, "json_object": false}})");
  EXPECT_FALSE(none.text_pattern || none.json_schema || none.json_object);

  expect_error(parse_completion_request(R"x({"prompt": "x", "structured_outputs": {"regex": "(?=a)"}})x"), 400,
               "structured_outputs", "'structured_outputs.regex': the pattern's '(?' (lookaround");
  expect_error(parse_completion_request(R"({"prompt": "x", "guided_regex": "a\\1"})"), 400, "guided_regex",
               "back-reference");
  expect_error(parse_completion_request(R"({"prompt": "x", "structured_outputs": {"regex": "a", "choice": ["b"]}})"),
               400, "structured_outputs", "one structured output at a time");
  expect_error(parse_completion_request(R"({"prompt": "x", "guided_regex": "a", "response_format": {"type": "json_object"}})"),
               400, "guided_regex", "beside a JSON 'response_format'");
  expect_error(parse_completion_request(R"({"prompt": "x", "structured_outputs": {"choice": []}})"), 400,
               "structured_outputs", "non-empty array of strings");
  expect_error(parse_completion_request(R"({"prompt": "x", "guided_choice": ["a", 1]})"), 400, "guided_choice",
               "non-empty array of strings");
  expect_error(parse_completion_request(R"({"prompt": "x", "structured_outputs": {"json": {"type": "integer", "not": {"minimum": 1}}}})"),
               400, "structured_outputs", "'structured_outputs.json' #/not: 'minimum' in it");
  expect_error(parse_completion_request(R"({"prompt": "x", "guided_json": "{"})"), 400, "guided_json", "not valid JSON");
  expect_error(parse_completion_request(R"({"prompt": "x", "structured_outputs": {"grammar": "root ::= \"a\""}})"), 400,
               "structured_outputs", "'structured_outputs.grammar' is not supported", "unsupported");
  expect_error(parse_completion_request(R"({"prompt": "x", "structured_outputs": {"whitespace_pattern": " "}})"), 400,
               "structured_outputs", "not supported", "unsupported");
  expect_error(parse_completion_request(R"({"prompt": "x", "guided_grammar": "root ::= \"a\""})"), 400,
               "guided_grammar", "not supported", "unsupported");
  expect_error(parse_completion_request(R"({"prompt": "x", "structured_outputs": "regex"})"), 400,
               "structured_outputs", "must be an object");
  expect_error(parse_chat_request(R"({"messages": [{"role": "user", "content": "x"}], "guided_choice": ["a"],
      "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}], "tool_choice": "required"})"),
               400, "tool_choice", "together with a structured output");
}

const ModelLimits kLimits{"kjv-dsa", 100, 4096};

EngineRequest ok_engine(const ParsedRequest& r, std::vector<int32_t> prompt) {
  auto m = make_engine_request(r, std::move(prompt), kLimits, 42);
  if (auto* e = std::get_if<ApiError>(&m)) ADD_FAILURE() << e->message;
  return std::holds_alternative<EngineRequest>(m) ? std::get<EngineRequest>(m) : EngineRequest{};
}

TEST(ServerTask, EngineRequestDefaults) {
  ParsedRequest c = ok_completion(R"({"prompt": [1, 2, 3], "temperature": 0.5, "top_p": 0.9,
                                      "top_k": -1, "min_p": 0.1, "logit_bias": {"3": -100, "7": 2.5},
                                      "stop_token_ids": [7], "logprobs": 2, "presence_penalty": 0.5,
                                      "frequency_penalty": -1, "repetition_penalty": 1.1})");
  EngineRequest e = ok_engine(c, c.prompts.at(0).ids);
  EXPECT_EQ(e.prompt, c.prompts.at(0).ids);
  EXPECT_EQ(e.max_new_tokens, 16);  // the legacy completions default
  EXPECT_FLOAT_EQ(e.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(e.sampling.top_p, 0.9f);
  EXPECT_EQ(e.sampling.top_k, 0);  // -1: every token
  EXPECT_FLOAT_EQ(e.sampling.min_p, 0.1f);
  EXPECT_EQ(e.sampling.logit_bias, (std::vector<std::pair<int32_t, float>>{{3, -100.0f}, {7, 2.5f}}));
  EXPECT_FLOAT_EQ(e.sampling.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(e.sampling.frequency_penalty, -1.0f);
  EXPECT_FLOAT_EQ(e.sampling.repetition_penalty, 1.1f);
  EXPECT_EQ(e.sampling.seed, 42u);  // no seed: the server's
  EXPECT_EQ(e.stop_token_ids, std::vector<int32_t>{7});
  EXPECT_EQ(e.logprobs, 2);
  EXPECT_EQ(e.prompt_logprobs, -1);  // not echoed
  const ParsedRequest scored = ok_completion(R"({"prompt": [1, 2], "echo": true, "logprobs": 3, "max_tokens": 1})");
  EXPECT_EQ(ok_engine(scored, {1, 2}).prompt_logprobs, 3);  // echo with logprobs scores the prompt
  EXPECT_EQ(ok_engine(ok_completion(R"({"prompt": [1, 2], "echo": true})"), {1, 2}).prompt_logprobs, -1);
  // Near the end of the context the default shrinks to what is left.
  EXPECT_EQ(ok_engine(c, std::vector<int32_t>(90, 1)).max_new_tokens, 10);
  ParsedRequest chat = ok_chat(R"({"messages": [{"role": "user", "content": "x"}], "seed": 5})");
  e = ok_engine(chat, std::vector<int32_t>(30, 1));
  EXPECT_EQ(e.max_new_tokens, 70);  // chat: the rest of the context
  EXPECT_EQ(e.sampling.seed, 5u);
  ParsedRequest exact = ok_completion(R"({"prompt": "x", "max_tokens": 60})");
  EXPECT_EQ(ok_engine(exact, std::vector<int32_t>(40, 1)).max_new_tokens, 60);
}

TEST(ServerTask, EngineRequestErrors) {
  auto check = [](const ParsedRequest& r, std::vector<int32_t> prompt, int status, const std::string& param,
                  const std::vector<std::string>& needles, const std::string& code = "") {
    auto m = make_engine_request(r, std::move(prompt), kLimits, 1);
    ASSERT_TRUE(std::holds_alternative<ApiError>(m));
    const ApiError& e = std::get<ApiError>(m);
    EXPECT_EQ(e.status, status) << e.message;
    EXPECT_EQ(e.param, param) << e.message;
    for (const auto& n : needles) EXPECT_NE(e.message.find(n), std::string::npos) << e.message;
    if (!code.empty()) {
      EXPECT_EQ(e.code, code);
    }
  };
  ParsedRequest c = ok_completion(R"({"prompt": "x", "max_tokens": 30})");
  // Prompt + max_tokens past max_model_len: both lengths named.
  check(c, std::vector<int32_t>(80, 1), 400, "max_tokens", {"100", "110", "80", "30"}, "context_length_exceeded");
  // A prompt that alone fills the context.
  check(c, std::vector<int32_t>(100, 1), 400, "prompt", {"100 tokens", "prompt has 100"}, "context_length_exceeded");
  check(c, std::vector<int32_t>(250, 1), 400, "prompt", {"250"}, "context_length_exceeded");
  ParsedRequest chat = ok_chat(R"({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 99})");
  check(chat, std::vector<int32_t>(5, 1), 400, "max_completion_tokens", {"104", "5", "99"});
  // Huge max_tokens against a small model.
  ParsedRequest huge = ok_completion(R"({"prompt": "x", "max_tokens": 2000000000})");
  check(huge, {1}, 400, "max_tokens", {"2000000001"});
  check(c, {}, 400, "prompt", {"empty"});
  check(c, {1, 4096}, 400, "prompt", {"4096", "outside the vocabulary"});
  ParsedRequest stop = ok_completion(R"({"prompt": "x", "stop_token_ids": [5000]})");
  check(stop, {1}, 400, "stop_token_ids", {"5000"});
  ParsedRequest other = ok_completion(R"({"prompt": "x", "model": "gpt-4"})");
  check(other, {1}, 404, "model", {"gpt-4", "kjv-dsa"}, "model_not_found");
  EXPECT_FALSE(check_model("", kLimits).has_value());
  EXPECT_FALSE(check_model("kjv-dsa", kLimits).has_value());
  ASSERT_TRUE(check_model("a\nb", kLimits).has_value());
  EXPECT_EQ(check_model("a\nb", kLimits)->message.find('\n'), std::string::npos);
}

TEST(ServerTask, ErrorJsonShape) {
  const auto j = error_json(ApiError{400, "bad", "invalid_request_error", "n", "unsupported"});
  EXPECT_EQ(j.dump(), R"({"error":{"message":"bad","type":"invalid_request_error","param":"n","code":"unsupported"}})");
  EXPECT_EQ(error_json(ApiError{500, "x", "internal_error"}).dump(),
            R"({"error":{"message":"x","type":"internal_error","param":null,"code":null}})");
}

// /tokenize and /detokenize bodies: a prompt or messages (exactly one), their defaults, the errors.
TEST(ServerTask, TokenizeAndDetokenize) {
  auto tok = [](const std::string& body) {
    auto r = parse_tokenize_request(body);
    if (auto* e = std::get_if<ApiError>(&r)) ADD_FAILURE() << body << " -> " << e->message;
    return std::holds_alternative<TokenizeRequest>(r) ? std::get<TokenizeRequest>(r) : TokenizeRequest{};
  };
  auto tok_error = [](const std::string& body, const std::string& param, const std::string& needle) {
    auto r = parse_tokenize_request(body);
    ASSERT_TRUE(std::holds_alternative<ApiError>(r)) << body;
    EXPECT_EQ(std::get<ApiError>(r).param, param) << body;
    EXPECT_NE(std::get<ApiError>(r).message.find(needle), std::string::npos) << std::get<ApiError>(r).message;
  };
  TokenizeRequest t = tok(R"({"prompt": "In the beginning", "model": "kjv-dsa"})");
  EXPECT_FALSE(t.chat);
  EXPECT_EQ(t.prompt, "In the beginning");
  EXPECT_EQ(t.model, "kjv-dsa");
  EXPECT_TRUE(t.add_special_tokens);
  t = tok(R"({"prompt": "", "add_special_tokens": false})");
  EXPECT_FALSE(t.add_special_tokens);
  t = tok(R"({"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": false,
              "chat_template_kwargs": {"enable_thinking": false}})");
  EXPECT_TRUE(t.chat);
  EXPECT_FALSE(t.add_special_tokens);  // the template writes the specials
  EXPECT_FALSE(t.add_generation_prompt);
  EXPECT_EQ(t.chat_template_kwargs["enable_thinking"], false);
  tok_error("{}", "prompt", "either");
  tok_error(R"({"prompt": "a", "messages": []})", "prompt", "either");
  tok_error(R"({"prompt": 5})", "prompt", "string");
  tok_error(R"({"messages": []})", "messages", "empty");
  tok_error(R"({"messages": [{"content": "x"}]})", "messages", "role");
  tok_error("[1]", "", "object");

  auto de = parse_detokenize_request(R"({"tokens": [1, 2, 3]})");
  ASSERT_TRUE(std::holds_alternative<DetokenizeRequest>(de));
  EXPECT_EQ(std::get<DetokenizeRequest>(de).tokens, (std::vector<int32_t>{1, 2, 3}));
  for (const char* body : {R"({})", R"({"tokens": "1 2"})", R"({"tokens": [-1]})", R"({"tokens": [1.5]})"}) {
    auto r = parse_detokenize_request(body);
    ASSERT_TRUE(std::holds_alternative<ApiError>(r)) << body;
    EXPECT_EQ(std::get<ApiError>(r).param, "tokens") << body;
  }
}

}  // namespace
}  // namespace dsi::server
