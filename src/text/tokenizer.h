// dsi::Tokenizer: a Hugging Face tokenizer.json (byte-level BPE, as the DSA models ship) with the
// HF `tokenizers` library's semantics, which the tests check it against id for id. The pipeline
// mirrors tokenizers' TokenizerImpl::encode: split on added tokens, normalize, pre-tokenize (Split
// regexes, ByteLevel), BPE each piece, post-process; decode runs the ByteLevel decoder.
//
// Input text that is not valid UTF-8 is first made valid the way Python's
// bytes.decode('utf-8', 'replace') does (each maximal ill-formed subpart becomes one U+FFFD), so
// encode(bytes) == HF encode(bytes.decode('utf-8', 'replace')). Unsupported tokenizer.json
// features are refused at load with a one-line dsi::Error naming the field.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "text/utf8.h"

namespace dsi {

class Tokenizer {
 public:
  struct Impl;

  // Reads a tokenizer.json; `where` (default: the path) names the source in error messages.
  static Tokenizer load(const std::string& path);
  static Tokenizer from_json_text(std::string_view json_text, const std::string& where);

  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = false) const;
  // Ids that name no token are skipped, as HF does.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens = false) const;

  // The pre-tokens the model would see for `text` (normalized, pre-tokenized; added tokens not
  // split out): HF's pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(text)). For tests.
  std::vector<std::string> pre_tokenize(std::string_view text) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;  // added tokens first
  std::optional<std::string> id_to_token(int32_t id) const;
  bool is_special(int32_t id) const;  // an added token marked "special"
  int32_t vocab_size() const;         // 1 + the largest id of the model or the added tokens
  // The bytes a token adds to decoded text (null for an id that names no token); without a
  // ByteLevel decoder every token after the first is preceded by a space (spaced_tokens()).
  const std::string* token_bytes(int32_t id) const;
  bool spaced_tokens() const;
  // The ids with bytes, special tokens left out, in the byte order of their bytes; shared[k]: the
  // bytes ids[k] shares with ids[k - 1]; longest: the most bytes a token has; specials: the special
  // tokens with bytes, by id. Walks of the vocabulary as a trie take it (constrained decoding).
  // Made on first use, once.
  struct ByteOrder {
    std::vector<int32_t> ids;
    std::vector<uint32_t> shared;
    size_t longest = 0;
    std::vector<int32_t> specials;
  };
  const ByteOrder& byte_order() const;
  // byte_order()'s ids split by a property of their bytes, made on first use, once per name (the
  // name stands for the property: the same name, the same test): `with` the ids that have it, as
  // bits (word id / 64, bit id % 64); `rest` the others, in byte order, rest.shared[k] counted
  // against rest.ids[k - 1]. A walk can take the ids with the property all at once and walk the rest.
  struct ByteSplit {
    std::vector<uint64_t> with;
    ByteOrder rest;
  };
  const ByteSplit& byte_split(const std::string& name, const std::function<bool(std::string_view)>& has) const;

  // Incremental detokenizer: push() returns the text the ids so far settle, never an incomplete
  // UTF-8 sequence (bytes that may still complete are held back); flush() ends the stream. The
  // concatenated output equals decode(all ids, skip_special_tokens).
  class StreamDecoder {
   public:
    // keep: write the token even if it is a special token this decoder skips.
    std::string push(int32_t id, bool keep = false);
    std::string flush();

   private:
    friend class Tokenizer;
    StreamDecoder(std::shared_ptr<const Impl> impl, bool skip_special_tokens);
    std::shared_ptr<const Impl> impl_;
    bool skip_special_;
    bool first_ = true;         // no token emitted yet (the decoder-less join puts spaces between)
    utf8::LossyStream bytes_;  // holds an incomplete UTF-8 sequence back
  };
  StreamDecoder stream_decoder(bool skip_special_tokens = false) const;

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;  // immutable after load (plus a locked BPE cache): copies share it
};

}  // namespace dsi
