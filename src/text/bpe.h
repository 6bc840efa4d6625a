// The BPE model of a tokenizer.json ("model": {"type": "BPE", ...}), mirroring HF tokenizers'
// models/bpe: the vocabulary, merges ranked by position, and Word::merge_all (repeatedly merge the
// lowest-rank adjacent pair, leftmost first) with a cache of results per pre-token.
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

namespace dsi {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using TokenMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

// model.vocab and model.merges, taken out of the JSON while it is parsed: a DOM of 150K-entry
// objects (a std::map per object) would dominate the load time.
struct BpeTables {
  bool has_vocab = false, has_merges = false;  // seen as an object / an array
  std::vector<std::pair<std::string, nlohmann::json>> vocab;  // in file order
  std::vector<nlohmann::json> merges;                         // "a b" or ["a", "b"] each
};

class BpeModel {
 public:
  // `model` is the JSON "model" object (vocab and merges in `tables`); `where` names the source
  // ("tokenizer.json: model") in errors.
  void load(const nlohmann::json& model, BpeTables tables, const std::string& where);

  // Appends the ids of one pre-token (a non-empty string in the model's alphabet).
  void tokenize(std::string_view word, std::vector<int32_t>& out) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  const std::string* id_to_token(int32_t id) const;  // null when no token has this id
  int32_t max_id() const { return int32_t(id_to_token_.size()) - 1; }
  size_t vocab_count() const { return vocab_.size(); }  // HF's Model::get_vocab_size

 private:
  std::vector<int32_t> merge_word(std::string_view word) const;

  TokenMap vocab_;
  std::vector<std::string> id_to_token_;
  std::vector<char> has_id_;
  struct Merge {
    uint32_t rank;
    int32_t new_id;
  };
  std::unordered_map<uint64_t, Merge> merges_;  // (left id << 32 | right id) -> rank, merged id
  std::optional<int32_t> unk_id_;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;

  // Results per pre-token; bounded, cleared when full. Guarded: one tokenizer serves many threads.
  static constexpr size_t kCacheEntries = 1 << 16;
  static constexpr size_t kCacheMaxWord = 256;  // bytes; longer words are not cached (as HF)
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache_;
};

}  // namespace dsi
