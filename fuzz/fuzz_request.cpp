// Fuzzes the server's request-body parsers (src/server/task.h): parse_completion_request and
// parse_chat_request take any bytes and return a ParsedRequest or an ApiError, never throw; an
// accepted request then goes through make_engine_request against a small model's limits, whose
// result must respect them. The first input byte picks the endpoint and the limits; with bit 2 or
// 3 set, the /tokenize or /detokenize parser instead.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <variant>

#include "fuzz_util.h"
#include "server/task.h"

using dsi::server::ApiError;
using dsi::server::ParsedRequest;

namespace {

void check_error(const ApiError& e) {
  DSI_FUZZ_ASSERT(e.status >= 400 && e.status < 600);
  DSI_FUZZ_ASSERT(!e.message.empty());
  DSI_FUZZ_ASSERT(e.message.find('\n') == std::string::npos);
  // The 4xx body must serialise as the routes do it (invalid UTF-8 from the body replaced).
  (void)dsi::server::error_json(e).dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  const std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
  if (mode & 12) {
    dsi::fuzz::expect_only_dsi_errors("tokenize parser", [&] {
      if (mode & 4) {
        const auto r = dsi::server::parse_tokenize_request(body);
        if (const auto* e = std::get_if<ApiError>(&r)) return check_error(*e);
        const auto& t = std::get<dsi::server::TokenizeRequest>(r);
        DSI_FUZZ_ASSERT(!t.chat || (t.messages.is_array() && !t.messages.empty()));
        DSI_FUZZ_ASSERT(t.chat || t.messages.empty());
      } else {
        const auto r = dsi::server::parse_detokenize_request(body);
        if (const auto* e = std::get_if<ApiError>(&r)) return check_error(*e);
        for (int32_t id : std::get<dsi::server::DetokenizeRequest>(r).tokens) DSI_FUZZ_ASSERT(id >= 0);
      }
    });
    return 0;
  }
  dsi::fuzz::expect_only_dsi_errors("request parser", [&] {
    const bool chat = mode & 1;
    const dsi::server::ParseResult parsed =
        chat ? dsi::server::parse_chat_request(body) : dsi::server::parse_completion_request(body);
    if (const auto* e = std::get_if<ApiError>(&parsed)) return check_error(*e);
    const ParsedRequest& r = std::get<ParsedRequest>(parsed);
    DSI_FUZZ_ASSERT(r.endpoint == (chat ? dsi::server::Endpoint::kChat : dsi::server::Endpoint::kCompletions));
    DSI_FUZZ_ASSERT(std::isfinite(r.temperature) && r.temperature >= 0.0f && r.temperature <= 2.0f);
    DSI_FUZZ_ASSERT(r.top_p > 0.0f && r.top_p <= 1.0f);
    DSI_FUZZ_ASSERT(r.logprobs >= -1 && r.logprobs <= 20);

    // The prompt the server would tokenize: the ids as given, else a stand-in of the text's length.
    const dsi::server::ModelLimits limits{"kjv-dsa", (mode & 2) ? 64 : 4096, 4096};
    DSI_FUZZ_ASSERT(chat ? r.prompts.empty()
                         : !r.prompts.empty() && r.prompts.size() <= size_t(dsi::server::kMaxBatchPrompts));
    std::vector<int32_t> prompt;  // (a chat request's is rendered later: none here)
    if (!r.prompts.empty()) {
      const dsi::server::CompletionPrompt& first = r.prompts.front();
      prompt = first.is_ids ? first.ids : std::vector<int32_t>(std::min<size_t>(first.text.size(), 100), 7);
    }
    const auto made = dsi::server::make_engine_request(r, prompt, limits, /*default_seed=*/1);
    if (const auto* e = std::get_if<ApiError>(&made)) return check_error(*e);
    const dsi::EngineRequest& er = std::get<dsi::EngineRequest>(made);
    DSI_FUZZ_ASSERT(!er.prompt.empty());
    for (int32_t id : er.prompt) DSI_FUZZ_ASSERT(id >= 0 && id < limits.vocab_size);
    DSI_FUZZ_ASSERT(er.max_new_tokens >= 0);
    DSI_FUZZ_ASSERT(int64_t(er.prompt.size()) + er.max_new_tokens <= limits.max_model_len);
  });
  return 0;
}
