// What the constraint tests share: the bundled tokenizer, the ids a constraint's mask leaves, and
// the same worked out token by token from a recognizer's state (the plain reading the masks' trie
// walk must equal).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "test_util.h"
#include "text/tokenizer.h"

namespace dsi::test {

// The bundled model's tokenizer (4,090 byte-level BPE tokens).
inline const Tokenizer& kjv_tokenizer() {
  static const Tokenizer t = Tokenizer::load(source_dir() + "/models/kjv-dsa/tokenizer.json");
  return t;
}

// The bundled model's tokenizer.json with these tokens added after its own (special or not).
inline nlohmann::json with_added_tokens(const std::vector<std::string_view>& tokens, bool special,
                                        nlohmann::json j = nullptr) {
  if (j.is_null()) {
    std::ifstream in(source_dir() + "/models/kjv-dsa/tokenizer.json");
    j = nlohmann::json::parse(in);
  }
  int id = 0;
  for (const auto& a : j["added_tokens"]) id = std::max(id, a["id"].get<int>() + 1);
  for (std::string_view m : tokens)
    j["added_tokens"].push_back({{"id", id++}, {"content", std::string(m)}, {"single_word", false}, {"lstrip", false},
                                 {"rstrip", false}, {"normalized", false}, {"special", special}});
  return j;
}
inline const std::vector<std::string_view> kMarkerTokens = {
    "<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>",
    "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>",
    "<｜tool▁call▁end｜>", "<|observation|>"};
// The bundled vocabulary with the tool call formats' markers (GLM's, DeepSeek-V3.1's) as special
// tokens after its own, and one more special token that is no marker, <|observation|>.
inline const Tokenizer& marker_tokenizer() {
  static const Tokenizer t = Tokenizer::from_json_text(with_added_tokens(kMarkerTokens, true).dump(), "markers");
  return t;
}

// The tokens the mask allows.
template <class Constraint>
std::vector<int32_t> allowed(Constraint& c, int64_t vocab) {
  std::vector<float> logits(size_t(vocab), 0.0f);
  c.mask(logits.data(), vocab);
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < vocab; ++i)
    if (logits[size_t(i)] == 0.0f) ids.push_back(int32_t(i));
  return ids;
}

// The id of the token whose bytes are the one byte b (a byte-level vocabulary has all 256).
inline int32_t byte_token(const Tokenizer& tok, unsigned char b) {
  for (int32_t id = 0; id < tok.vocab_size(); ++id) {
    const std::string* t = tok.token_bytes(id);
    if (t != nullptr && t->size() == 1 && static_cast<unsigned char>((*t)[0]) == b && !tok.is_special(id)) return id;
  }
  ADD_FAILURE() << "no token of the byte " << int(b);
  return -1;
}

// Each token tried alone from the state (a byte-level tokenizer): eos once the text is whole;
// no special token (but those the recognizer's takes_special names, if it has one, and any while
// it is free(), which leaves its text alone); a token whose bytes the state takes.
template <class Recognizer>
std::vector<int32_t> each_token(const Recognizer& state, const Tokenizer& tok, int64_t vocab, int32_t eos) {
  std::vector<int32_t> ids;
  for (int32_t id = 0; id < vocab; ++id) {
    if (id == eos) {
      if (state.complete()) ids.push_back(id);
      continue;
    }
    const std::string* b = tok.token_bytes(id);
    if (b == nullptr || b->empty()) continue;
    if (tok.is_special(id)) {
      if constexpr (requires { state.takes_special(*b); }) {
        if (!state.takes_special(*b)) {
          if constexpr (requires { state.free(); })
            if (state.free()) ids.push_back(id);
          continue;
        }
      } else {
        continue;
      }
    }
    Recognizer next = state;
    if (next.push(*b)) ids.push_back(id);
  }
  return ids;
}

// The constraint's mask, non-empty and equal to each token tried alone from its state.
template <class Constraint>
void expect_mask_is_each_token(Constraint& c, const Tokenizer& tok, int64_t vocab, int32_t eos, const std::string& what) {
  const std::vector<int32_t> ok = allowed(c, vocab);
  EXPECT_EQ(ok, each_token(c.state(), tok, vocab, eos)) << what;
  EXPECT_FALSE(ok.empty()) << what;
}

}  // namespace dsi::test
