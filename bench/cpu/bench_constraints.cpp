// Times the server's token constraints (src/server/constraints.h) on a tokenizer's vocabulary: the
// mask of a state met for the first time (the vocabulary walked as a trie) and of a state met
// again (kept by its signature), for JSON mode and a structured-output schema, inside and outside
// strings (free, and with a pattern), for a forced tool call with that schema's arguments, and for
// free text before an optional one. Prints a table (microseconds, medians of the runs).
//
//   bench_constraints [--tokenizer FILE] [--runs N]   (default: the bundled model's tokenizer)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/constraints.h"

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <class Make>
void row(const char* what, const char* text, const dsi::Tokenizer& tok, int runs, Make make) {
  const int64_t V = tok.vocab_size() + 1;
  const int32_t eos = int32_t(V - 1);
  const std::vector<int32_t> ids = tok.encode(text);
  std::vector<double> first, kept;
  int allowed = 0;
  for (int r = 0; r < runs; ++r) {
    std::unique_ptr<dsi::TokenConstraint> c = make(eos);
    std::vector<float> logits(size_t(V), 0.0f);
    c->mask(logits.data(), V);  // the start's mask (and the tokenizer's byte order, once)
    for (int32_t id : ids) c->accept(id);
    std::fill(logits.begin(), logits.end(), 0.0f);
    const auto t0 = Clock::now();
    c->mask(logits.data(), V);
    const auto t1 = Clock::now();
    c->mask(logits.data(), V);
    const auto t2 = Clock::now();
    first.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    kept.push_back(std::chrono::duration<double, std::micro>(t2 - t1).count());
    allowed = int(std::count(logits.begin(), logits.end(), 0.0f));
  }
  std::printf("%-12s %-34s %9.1f %9.1f %8d\n", what, (std::string("'") + text + "'").c_str(), median(first),
              median(kept), allowed);
}

}  // namespace

int main(int argc, char** argv) {
  std::string path = std::string(DSI_SOURCE_DIR_DEFAULT) + "/models/kjv-dsa/tokenizer.json";
  int runs = 21;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--tokenizer") && i + 1 < argc) path = argv[++i];
    else if (!std::strcmp(argv[i], "--runs") && i + 1 < argc) runs = std::max(1, std::atoi(argv[++i]));
    else {
      std::fprintf(stderr, "usage: bench_constraints [--tokenizer FILE] [--runs N]\n");
      return 2;
    }
  }
  try {
    const dsi::Tokenizer tok = dsi::Tokenizer::load(path);
    const char* schema_text = R"({
      "type": "object",
      "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                     "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}},
                     "boss": {"anyOf": [{"$ref": "#"}, {"type": "null"}]},
                     "email": {"type": "string", "pattern": "^[a-z0-9._]+@[a-z]+\\.[a-z]{2,4}$"}},
      "required": ["name"], "additionalProperties": false})";
    const auto schema = dsi::server::JsonSchema::compile(nlohmann::json::parse(schema_text));
    std::printf("tokenizer %s: %d ids\n", path.c_str(), tok.vocab_size());
    std::printf("%-12s %-34s %9s %9s %8s\n", "constraint", "after", "first us", "kept us", "allowed");
    auto json = [&](int32_t eos) {
      return std::make_unique<dsi::server::JsonConstraint>(tok, std::vector<int32_t>{eos}, -1, -1, false);
    };
    auto structured = [&](int32_t eos) {
      return std::make_unique<dsi::server::SchemaConstraint>(tok, schema, std::vector<int32_t>{eos}, -1, -1, false);
    };
    for (const char* text : {R"({"name": "in the beginning)", R"({"name": "x", "age": 12)", R"({"boss": )",
                             R"({"name": "x", "tags": ["a", )", R"({"email": "john.sm)"}) {
      row("json_object", text, tok, runs, json);
      row("json_schema", text, tok, runs, structured);
    }
    // A forced tool call (GLM's format) of a function with that schema for its parameters.
    const nlohmann::ordered_json tools = nlohmann::ordered_json::array(
        {{{"type", "function"}, {"function", {{"name", "lookup"}, {"parameters", nlohmann::ordered_json::parse(
                                                                              schema_text)}}}}});
    const auto grammar = dsi::server::ToolGrammar::make(dsi::server::ToolFormat::kGlm, tools, "", true);
    auto call = [&](int32_t eos) {
      return std::make_unique<dsi::server::ToolCallConstraint>(tok, grammar, std::vector<int32_t>{eos}, -1, -1, false);
    };
    for (const char* text : {"<tool_call>lookup<arg_key>name</arg_key><arg_value>in the beginning",
                             "<tool_call>lookup<arg_key>name</arg_key><arg_value>x</arg_value><arg_key>a",
                             "<tool_call>lookup<arg_key>age</arg_key><arg_value>12"})
      row("tool_call", text, tok, runs, call);
    // tool_choice "auto" with one call allowed: free text, masked only where a token could open a
    // call (tokens with '>' walked, the rest taken at once).
    const auto optional = dsi::server::ToolGrammar::make(dsi::server::ToolFormat::kGlm, tools, "", false, true);
    auto auto_call = [&](int32_t eos) {
      return std::make_unique<dsi::server::ToolCallConstraint>(tok, optional, std::vector<int32_t>{eos}, -1, -1, false);
    };
    for (const char* text : {"And God said, let there be light", "Let me look that up. <tool"})
      row("auto_call", text, tok, runs, auto_call);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_constraints: %s\n", e.what());
    return 1;
  }
  return 0;
}
