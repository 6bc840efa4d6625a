// BPE model: loading and merging; see bpe.h. Mirrors tokenizers/src/models/bpe/{model,word}.rs.
#include "text/bpe.h"

#include <queue>

#include <nlohmann/json.hpp>

#include "dsinfer/error.h"
#include "text/utf8.h"

namespace dsi {

using json = nlohmann::json;

namespace {

uint64_t pair_key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }

bool is_null_or(const json& j, const char* key) { return !j.contains(key) || j.at(key).is_null(); }

}  // namespace

void BpeModel::load(const json& m, BpeTables tables, const std::string& where) {
  const auto str_field_null = [&](const char* key) {
    if (!is_null_or(m, key) && !(m.at(key).is_string() && m.at(key).get<std::string>().empty()))
      fail("{}.{} = {} is not supported (only null)", where, key, m.at(key).dump());
  };
  str_field_null("continuing_subword_prefix");
  str_field_null("end_of_word_suffix");
  if (!is_null_or(m, "dropout") && !(m.at("dropout").is_number() && m.at("dropout") == 0))
    fail("{}.dropout = {} is not supported (only null: dropout makes encoding random)", where,
         m.at("dropout").dump());
  if (!is_null_or(m, "byte_fallback") && m.at("byte_fallback") != false)
    fail("{}.byte_fallback = {} is not supported (only false)", where, m.at("byte_fallback").dump());
  const auto flag = [&](const char* key) {
    if (is_null_or(m, key)) return false;
    DSI_CHECK(m.at(key).is_boolean(), "{}.{} must be true or false, got {}", where, key,
              m.at(key).dump());
    return m.at(key).get<bool>();
  };
  fuse_unk_ = flag("fuse_unk");
  ignore_merges_ = flag("ignore_merges");

  DSI_CHECK(tables.has_vocab, "{}.vocab: missing or not an object", where);
  vocab_.reserve(tables.vocab.size());
  // Tables are indexed by id: ids far past the number of entries (a vocabulary of a few tokens with
  // an id of 2e9) would allocate gigabytes, so they are refused.
  const int64_t id_limit = 2 * int64_t(tables.vocab.size()) + 1024;
  for (auto& [token, id] : tables.vocab) {
    DSI_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0,
              "{}.vocab: token '{}' has id {}, expected a non-negative integer", where, utf8::shown(token),
              id.dump());
    DSI_CHECK(id.get<int64_t>() < id_limit,
              "{}.vocab: token '{}' has id {}, far past the vocabulary's {} entries", where,
              utf8::shown(token), id.dump(), tables.vocab.size());
    const int32_t i = id.get<int32_t>();
    if (size_t(i) >= id_to_token_.size()) {
      id_to_token_.resize(size_t(i) + 1);
      has_id_.resize(size_t(i) + 1, 0);
    }
    id_to_token_[size_t(i)] = token;
    has_id_[size_t(i)] = 1;
    vocab_[std::move(token)] = i;
  }

  if (!is_null_or(m, "unk_token")) {
    const std::string unk = m.at("unk_token").get<std::string>();
    const auto it = vocab_.find(unk);
    DSI_CHECK(it != vocab_.end(), "{}.unk_token '{}' is not in the vocab", where, utf8::shown(unk));
    unk_id_ = it->second;
  }

  DSI_CHECK(tables.has_merges, "{}.merges: missing or not an array", where);
  const std::vector<json>& merges = tables.merges;
  merges_.reserve(merges.size());
  const auto id_of = [&](const std::string& t, size_t index) {
    const auto it = vocab_.find(t);
    DSI_CHECK(it != vocab_.end(), "{}.merges[{}]: token '{}' is not in the vocab", where, index,
              utf8::shown(t));
    return it->second;
  };
  uint32_t rank = 0;
  std::string a, b, ab;
  for (size_t k = 0; k < merges.size(); ++k) {
    const json& e = merges[k];
    if (e.is_string()) {  // the older form "a b"; "#version" lines are skipped, as HF does
      const std::string& line = e.get_ref<const std::string&>();
      if (line.rfind("#version", 0) == 0) continue;
      const size_t sp = line.find(' ');
      DSI_CHECK(sp != std::string::npos && line.find(' ', sp + 1) == std::string::npos,
                "{}.merges[{}] = '{}': expected two tokens separated by one space", where, k,
                utf8::shown(line));
      a.assign(line, 0, sp);
      b.assign(line, sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      a = e[0].get_ref<const std::string&>();
      b = e[1].get_ref<const std::string&>();
    } else {
      fail("{}.merges[{}] = {}: expected \"a b\" or [\"a\", \"b\"]", where, k, e.dump());
    }
    ab.assign(a).append(b);
    const int32_t ia = id_of(a, k), ib = id_of(b, k), merged = id_of(ab, k);
    merges_[pair_key(ia, ib)] = Merge{rank++, merged};  // a repeated pair keeps its last rank (HF)
  }
}

std::optional<int32_t> BpeModel::token_to_id(std::string_view token) const {
  const auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::id_to_token(int32_t id) const {
  if (id < 0 || size_t(id) >= id_to_token_.size() || !has_id_[size_t(id)]) return nullptr;
  return &id_to_token_[size_t(id)];
}

std::vector<int32_t> BpeModel::merge_word(std::string_view w) const {
  // The word's symbols as a linked list over the initial characters (HF's Word).
  struct Symbol {
    int32_t id;
    int32_t prev, next;
    bool alive;
  };
  std::vector<Symbol> sym;
  sym.reserve(w.size());
  int32_t pending_unk = -1;  // an unknown run not yet pushed (fuse_unk joins runs); -1: none
  const auto add = [&](int32_t id) {
    const int32_t n = int32_t(sym.size());
    sym.push_back({id, n - 1, -1, true});
    if (n > 0) sym[size_t(n) - 1].next = n;
  };
  for (size_t i = 0; i < w.size();) {
    const size_t len = std::min(utf8::seq_len(static_cast<unsigned char>(w[i])), w.size() - i);
    const auto it = vocab_.find(w.substr(i, len));
    i += len;
    if (it != vocab_.end()) {
      if (pending_unk >= 0) add(pending_unk);
      pending_unk = -1;
      add(it->second);
    } else if (unk_id_) {
      if (pending_unk >= 0 && !fuse_unk_) add(pending_unk);
      pending_unk = *unk_id_;
    }
    // Neither in the vocab nor an unk token: the character is dropped, as HF does.
  }
  if (pending_unk >= 0) add(pending_unk);

  // Min-heap on (rank, position): the lowest-rank pair first, the leftmost among equal ranks.
  struct Cand {
    uint32_t rank;
    int32_t pos;
    int32_t new_id;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<>> queue;
  const auto push_pair = [&](int32_t pos) {
    const int32_t nx = sym[size_t(pos)].next;
    if (nx < 0) return;
    const auto it = merges_.find(pair_key(sym[size_t(pos)].id, sym[size_t(nx)].id));
    if (it != merges_.end()) queue.push({it->second.rank, pos, it->second.new_id});
  };
  for (int32_t p = 0; p + 1 < int32_t(sym.size()); ++p) push_pair(p);
  while (!queue.empty()) {
    const Cand top = queue.top();
    queue.pop();
    Symbol& s = sym[size_t(top.pos)];
    if (!s.alive || s.next < 0) continue;
    // An expired entry: the pair at this position changed since it was queued.
    const auto it = merges_.find(pair_key(s.id, sym[size_t(s.next)].id));
    if (it == merges_.end() || it->second.new_id != top.new_id) continue;
    Symbol& right = sym[size_t(s.next)];
    right.alive = false;
    s.id = top.new_id;
    s.next = right.next;
    if (right.next >= 0) sym[size_t(right.next)].prev = top.pos;
    if (s.prev >= 0) push_pair(s.prev);
    push_pair(top.pos);
  }
  std::vector<int32_t> ids;
  for (const Symbol& s : sym)
    if (s.alive) ids.push_back(s.id);
  return ids;
}

void BpeModel::tokenize(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {  // a word that is a token is that token, whatever the merges would make
    if (const auto it = vocab_.find(word); it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  const bool cacheable = word.size() <= kCacheMaxWord;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (const auto it = cache_.find(word); it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> ids = merge_word(word);
  out.insert(out.end(), ids.begin(), ids.end());
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (cache_.size() >= kCacheEntries) cache_.clear();
    cache_.emplace(std::string(word), std::move(ids));
  }
}

}  // namespace dsi
