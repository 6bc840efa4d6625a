// dsi::Tokenizer: loading tokenizer.json and the encode/decode pipelines; see tokenizer.h.
// Each stage names the HF tokenizers source it mirrors (tokenizers/src/...).
#include "text/tokenizer.h"

#include <algorithm>
#include <limits>
#include <array>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "dsinfer/error.h"
#include "text/bpe.h"
#include "text/regex.h"
#include "text/unicode_nfc.h"
#include "text/utf8.h"

namespace dsi {

using json = nlohmann::json;

namespace {

// pre_tokenizers/byte_level.rs: the regex ByteLevel splits with when use_regex is set (GPT-2's).
constexpr std::string_view kByteLevelPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// added_vocabulary.rs decides single_word with the Rust regex crate's \w.
constexpr std::string_view kWordCharPattern = R"([\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\x{200C}\x{200D}])";

// GPT-2's bytes_to_unicode: printable bytes map to themselves, the others to U+0100 upwards.
std::array<char32_t, 256> byte_to_char() {
  std::array<char32_t, 256> m{};
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    m[size_t(b)] = printable ? char32_t(b) : next++;
  }
  return m;
}

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

Behavior parse_behavior(const json& j, const std::string& where) {
  static const std::pair<const char*, Behavior> kNames[] = {
      {"Removed", Behavior::kRemoved},
      {"Isolated", Behavior::kIsolated},
      {"MergedWithPrevious", Behavior::kMergedWithPrevious},
      {"MergedWithNext", Behavior::kMergedWithNext},
      {"Contiguous", Behavior::kContiguous}};
  if (j.is_string())
    for (const auto& [name, b] : kNames)
      if (j.get<std::string>() == name) return b;
  fail("{}: behavior {} is not one of Removed, Isolated, MergedWithPrevious, MergedWithNext, "
       "Contiguous", where, j.dump());
}

struct PreStep {
  enum class Kind { kSplit, kByteLevel } kind = Kind::kSplit;
  std::optional<Regex> regex;  // Split's pattern; ByteLevel's GPT-2 regex when use_regex
  Behavior behavior = Behavior::kIsolated;
  bool invert = false;
  bool add_prefix_space = false;
};

struct AddedToken {
  std::string content;
  int32_t id;
  bool special, normalized, lstrip, rstrip, single_word;
};

// A piece of the input: text still to tokenize (id < 0) or an added token's id.
struct Piece {
  std::string text;
  int32_t id = -1;
};

const json* field(const json& j, const char* key) {
  return j.contains(key) && !j.at(key).is_null() ? &j.at(key) : nullptr;
}

bool bool_field(const json& j, const char* key, bool def, const std::string& where) {
  const json* f = field(j, key);
  if (!f) return def;
  DSI_CHECK(f->is_boolean(), "{}.{} must be true or false, got {}", where, key, f->dump());
  return f->get<bool>();
}

std::string type_of(const json& j, const std::string& where) {
  DSI_CHECK(j.is_object(), "{}: expected an object, got {}", where, j.dump().substr(0, 80));
  const json* t = field(j, "type");
  DSI_CHECK(t && t->is_string(), "{}: missing \"type\"", where);
  return t->get<std::string>();
}

// The error for a component type this tokenizer does not implement; the type is quoted escaped, so
// the message stays one line whatever the file holds.
[[noreturn]] void unsupported_type(const std::string& where, const std::string& type, const char* supported) {
  fail("{}: type '{}' is not supported (only {})", where, utf8::shown(type), supported);
}

}  // namespace

struct Tokenizer::Impl {
  std::string where;
  BpeModel bpe;
  bool nfc = false;
  std::vector<PreStep> pre;
  std::vector<AddedToken> added;
  std::unordered_map<int32_t, size_t> added_by_id;
  TokenMap added_by_content;
  // Added tokens by their first byte, longest first: raw (matched before normalization) and
  // normalized (matched in the normalized pieces, by their normalized content).
  std::array<std::vector<std::pair<std::string, size_t>>, 256> raw_first, norm_first;
  bool has_raw = false, has_norm = false;
  std::optional<Regex> word_char;  // for single_word tokens
  std::vector<int32_t> prefix, suffix;  // what the post-processor adds around one sequence
  bool byte_level_decoder = false;      // else decoder null: tokens joined by spaces
  // Per id: the bytes decode produces for it, whether it names a token, whether it is special.
  std::vector<std::string> id_bytes;
  std::vector<char> id_known, id_special;
  std::array<std::string, 256> byte_chars;  // byte -> its byte-level character (UTF-8)
  mutable std::once_flag byte_order_once;      // byte_order(), made on first use
  mutable ByteOrder byte_order;
  mutable std::mutex splits_mu;  // byte_split(): by name, made on first use
  mutable std::map<std::string, std::unique_ptr<ByteSplit>> splits;

  void parse(const json& j, BpeTables tables);
  void parse_normalizer(const json& j, const std::string& w);
  void parse_pre_tokenizer(const json& j, const std::string& w);
  void parse_post_processor(const json& j, const std::string& w, std::vector<int32_t>& pre,
                            std::vector<int32_t>& post);
  void parse_added_tokens(const json& j, const std::string& w);
  void build_decode_table();

  std::vector<Piece> split_added(std::string text, bool normalized) const;
  void pre_tokenize(std::vector<std::string>& pieces) const;
  void encode_into(std::string_view text, std::vector<int32_t>& ids) const;
  bool word_char_at_end(std::string_view s) const;
  bool word_char_at_start(std::string_view s) const;
};

// ---------------------------------------------------------------- loading

void Tokenizer::Impl::parse(const json& j, BpeTables tables) {
  DSI_CHECK(j.is_object(), "{}: expected a JSON object at the top level", where);
  for (const char* key : {"truncation", "padding"})
    if (field(j, key))
      fail("{}: \"{}\" is set ({}); only null is supported", where, key,
           j.at(key).dump().substr(0, 80));

  const json* model = field(j, "model");
  DSI_CHECK(model && model->is_object(), "{}: missing \"model\"", where);
  const json* mtype = field(*model, "type");
  if (mtype) {
    DSI_CHECK(mtype->is_string(), "{}: model.type must be a string", where);
    if (mtype->get<std::string>() != "BPE")
      fail("{}: model.type '{}' is not supported (only BPE)", where, utf8::shown(mtype->get<std::string>()));
  } else {
    DSI_CHECK(model->contains("merges"), "{}: model has no \"type\" and is not BPE (no merges); "
              "only BPE is supported", where);
  }
  bpe.load(*model, std::move(tables), where + ": model");

  if (const json* n = field(j, "normalizer")) parse_normalizer(*n, where + ": normalizer");
  if (const json* p = field(j, "pre_tokenizer")) parse_pre_tokenizer(*p, where + ": pre_tokenizer");
  if (const json* p = field(j, "post_processor"))
    parse_post_processor(*p, where + ": post_processor", prefix, suffix);
  if (const json* d = field(j, "decoder")) {
    const std::string w = where + ": decoder";
    const std::string t = type_of(*d, w);
    if (t == "ByteLevel") {
      byte_level_decoder = true;
    } else if (t == "Sequence" && field(*d, "decoders") && d->at("decoders").size() == 1 &&
               type_of(d->at("decoders")[0], w + ".decoders[0]") == "ByteLevel") {
      byte_level_decoder = true;
    } else {
      unsupported_type(w, t, "ByteLevel or null");
    }
  }
  if (const json* a = field(j, "added_tokens")) parse_added_tokens(*a, where + ": added_tokens");
  build_decode_table();
  for (const auto* list : {&prefix, &suffix})
    for (int32_t id : *list)
      DSI_CHECK(id >= 0 && size_t(id) < id_bytes.size(), "{}: post_processor: token id {} is "
                "outside the vocabulary [0, {})", where, id, id_bytes.size());
}

void Tokenizer::Impl::parse_normalizer(const json& j, const std::string& w) {
  const std::string t = type_of(j, w);
  if (t == "NFC") {
    nfc = true;
  } else if (t == "Sequence" && field(j, "normalizers") && j.at("normalizers").is_array()) {
    const json& list = j.at("normalizers");
    for (size_t i = 0; i < list.size(); ++i) parse_normalizer(list[i], fmt::format("{}.normalizers[{}]", w, i));
  } else {
    unsupported_type(w, t, "null or NFC");
  }
}

void Tokenizer::Impl::parse_pre_tokenizer(const json& j, const std::string& w) {
  const std::string t = type_of(j, w);
  if (t == "Sequence") {
    const json* list = field(j, "pretokenizers");
    DSI_CHECK(list && list->is_array(), "{}: Sequence without a \"pretokenizers\" array", w);
    for (size_t i = 0; i < list->size(); ++i)
      parse_pre_tokenizer((*list)[i], fmt::format("{}.pretokenizers[{}]", w, i));
  } else if (t == "ByteLevel") {
    PreStep s;
    s.kind = PreStep::Kind::kByteLevel;
    s.add_prefix_space = bool_field(j, "add_prefix_space", true, w);
    if (bool_field(j, "use_regex", true, w)) s.regex = Regex::pattern(kByteLevelPattern, w);
    pre.push_back(std::move(s));
  } else if (t == "Split") {
    PreStep s;
    s.kind = PreStep::Kind::kSplit;
    const json* p = field(j, "pattern");
    DSI_CHECK(p && p->is_object() && p->size() == 1, "{}.pattern: expected {{\"Regex\": ...}} or "
              "{{\"String\": ...}}", w);
    if (const json* re = field(*p, "Regex"); re && re->is_string())
      s.regex = Regex::pattern(re->get<std::string>(), w + ".pattern.Regex");
    else if (const json* str = field(*p, "String"); str && str->is_string())
      s.regex = Regex::literal(str->get<std::string>(), w + ".pattern.String");
    else
      fail("{}.pattern: expected {{\"Regex\": ...}} or {{\"String\": ...}}, got {}", w, p->dump());
    DSI_CHECK(field(j, "behavior"), "{}: missing \"behavior\"", w);
    s.behavior = parse_behavior(j.at("behavior"), w + ".behavior");
    s.invert = bool_field(j, "invert", false, w);
    pre.push_back(std::move(s));
  } else {
    unsupported_type(w, t, "Sequence, Split, ByteLevel or null");
  }
}

void Tokenizer::Impl::parse_post_processor(const json& j, const std::string& w,
                                           std::vector<int32_t>& before,
                                           std::vector<int32_t>& after) {
  const std::string t = type_of(j, w);
  if (t == "ByteLevel") return;  // trims offsets only; ids are unchanged
  if (t == "Sequence") {
    const json* list = field(j, "processors");
    DSI_CHECK(list && list->is_array(), "{}: Sequence without a \"processors\" array", w);
    for (size_t i = 0; i < list->size(); ++i) {  // each wraps what the previous ones made
      std::vector<int32_t> b, a;
      parse_post_processor((*list)[i], fmt::format("{}.processors[{}]", w, i), b, a);
      before.insert(before.begin(), b.begin(), b.end());
      after.insert(after.end(), a.begin(), a.end());
    }
    return;
  }
  if (t == "BertProcessing" || t == "RobertaProcessing") {
    const auto id_of = [&](const char* key) {
      const json* f = field(j, key);
      DSI_CHECK(f && f->is_array() && f->size() == 2 && (*f)[1].is_number_integer(),
                "{}.{}: expected [token, id]", w, key);
      return (*f)[1].get<int32_t>();
    };
    before.push_back(id_of("cls"));
    after.push_back(id_of("sep"));
    return;
  }
  if (t != "TemplateProcessing")
    unsupported_type(w, t, "TemplateProcessing, ByteLevel, Sequence, BertProcessing, RobertaProcessing "
                           "or null");
  const json* single = field(j, "single");
  const json* specials = field(j, "special_tokens");
  DSI_CHECK(single && single->is_array(), "{}.single: missing or not an array", w);
  bool seen_sequence = false;
  for (size_t i = 0; i < single->size(); ++i) {
    const json& item = (*single)[i];
    const std::string wi = fmt::format("{}.single[{}]", w, i);
    if (const json* seq = field(item, "Sequence")) {
      DSI_CHECK(!seen_sequence && seq->value("id", "") == "A",
                "{}: the single-sequence template must hold Sequence A once, got {}", wi, item.dump());
      seen_sequence = true;
    } else if (const json* sp = field(item, "SpecialToken")) {
      const std::string name = sp->value("id", "");
      DSI_CHECK(specials && specials->contains(name), "{}: special token '{}' is not in "
                "special_tokens", wi, utf8::shown(name));
      const json* ids = field(specials->at(name), "ids");
      DSI_CHECK(ids && ids->is_array(), "{}: special token '{}' has no \"ids\" array", wi, utf8::shown(name));
      for (const json& id : *ids) {
        DSI_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0 &&
                      id.get<int64_t>() <= std::numeric_limits<int32_t>::max(),
                  "{}: special token '{}' has id {}, not a token id", wi, utf8::shown(name), id.dump());
        (seen_sequence ? after : before).push_back(id.get<int32_t>());
      }
    } else {
      fail("{}: expected Sequence or SpecialToken, got {}", wi, item.dump());
    }
  }
  DSI_CHECK(seen_sequence, "{}.single: no Sequence A", w);
}

void Tokenizer::Impl::parse_added_tokens(const json& j, const std::string& w) {
  DSI_CHECK(j.is_array(), "{}: expected an array", w);
  int32_t max_added = -1;  // the largest id given to an added token so far
  for (size_t i = 0; i < j.size(); ++i) {
    const json& t = j[i];
    const std::string wi = fmt::format("{}[{}]", w, i);
    DSI_CHECK(t.is_object() && field(t, "content") && t.at("content").is_string() &&
                  field(t, "id") && t.at("id").is_number_integer() && t.at("id").get<int64_t>() >= 0,
              "{}: expected {{\"id\": n, \"content\": \"...\", ...}}, got {}", wi,
              t.dump().substr(0, 80));
    AddedToken a{t.at("content").get<std::string>(), t.at("id").get<int32_t>(),
                 bool_field(t, "special", false, wi),
                 bool_field(t, "normalized", !bool_field(t, "special", false, wi), wi),
                 bool_field(t, "lstrip", false, wi), bool_field(t, "rstrip", false, wi),
                 bool_field(t, "single_word", false, wi)};
    DSI_CHECK(utf8::is_valid(a.content), "{}: content is not valid UTF-8", wi);
    // HF ignores empty added tokens and repeated contents.
    if (a.content.empty() || added_by_content.count(a.content)) continue;
    // HF does not take the id from the file: a token of the model's vocab keeps its id, any other
    // gets the next free one (added_vocabulary.rs add_tokens). For a consistent file (every
    // tokenizer HF saved) that is the file's id.
    if (const auto model_id = bpe.token_to_id(a.content)) {
      a.id = *model_id;
    } else {
      const int32_t n = int32_t(bpe.vocab_count());
      a.id = max_added < 0 ? n : (max_added >= n || n == 0) ? max_added + 1 : n;
    }
    max_added = std::max(max_added, a.id);
    added_by_id[a.id] = added.size();
    added_by_content[a.content] = a.id;
    added.push_back(std::move(a));
  }
  for (size_t k = 0; k < added.size(); ++k) {
    const AddedToken& a = added[k];
    // Tokens with normalized=false are matched in the raw text, the others by their normalized
    // content in the normalized text (added_vocabulary.rs refresh_added_tokens).
    const bool norm = a.normalized;
    const std::string content = norm && nfc ? dsi::nfc(a.content) : a.content;
    if (content.empty()) continue;
    (norm ? norm_first : raw_first)[static_cast<unsigned char>(content[0])].emplace_back(content, k);
    (norm ? has_norm : has_raw) = true;
    if (a.single_word && !word_char) word_char = Regex::pattern(kWordCharPattern, w);
  }
  for (auto* table : {&raw_first, &norm_first})
    for (auto& list : *table)
      std::stable_sort(list.begin(), list.end(),
                       [](const auto& x, const auto& y) { return x.first.size() > y.first.size(); });
}

void Tokenizer::Impl::build_decode_table() {
  const auto b2c = byte_to_char();
  std::unordered_map<char32_t, unsigned char> c2b;
  for (size_t b = 0; b < 256; ++b) {
    c2b[b2c[b]] = static_cast<unsigned char>(b);
    byte_chars[b].clear();
    utf8::append(byte_chars[b], b2c[b]);
  }
  int32_t n = bpe.max_id() + 1;
  for (const AddedToken& a : added) n = std::max(n, a.id + 1);
  id_bytes.assign(size_t(n), {});
  id_known.assign(size_t(n), 0);
  id_special.assign(size_t(n), 0);
  std::unordered_map<std::string, bool> special_content;
  for (const AddedToken& a : added)
    if (a.special) special_content[a.content] = true;
  for (int32_t id = 0; id < n; ++id) {
    const std::string* tok = nullptr;
    if (const auto it = added_by_id.find(id); it != added_by_id.end())
      tok = &added[it->second].content;
    else
      tok = bpe.id_to_token(id);
    if (!tok) continue;
    id_known[size_t(id)] = 1;
    id_special[size_t(id)] = special_content.count(*tok) ? 1 : 0;
    if (!byte_level_decoder) {
      id_bytes[size_t(id)] = *tok;
      continue;
    }
    // decoders/byte_level.rs: a token whose characters all come from the byte alphabet gives
    // those bytes; any other token (an added token such as "<|user|>" with a space) its UTF-8.
    std::string bytes;
    bool all_mapped = true;
    for (size_t i = 0; i < tok->size() && all_mapped;) {
      const auto it = c2b.find(utf8::decode(*tok, i));
      if (it == c2b.end())
        all_mapped = false;
      else
        bytes += char(it->second);
    }
    id_bytes[size_t(id)] = all_mapped ? bytes : *tok;
  }
}

// ---------------------------------------------------------------- encoding

bool Tokenizer::Impl::word_char_at_end(std::string_view s) const {
  if (s.empty()) return false;
  size_t i = s.size() - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  return word_char->search(s.substr(i));
}

bool Tokenizer::Impl::word_char_at_start(std::string_view s) const {
  if (s.empty()) return false;
  return word_char->search(s.substr(0, utf8::seq_len(static_cast<unsigned char>(s[0]))));
}

// added_vocabulary.rs find_matches: leftmost-longest matches (Aho-Corasick semantics, the scan
// resuming after each match), single_word filtering, then lstrip/rstrip widening the match over
// whitespace.
std::vector<Piece> Tokenizer::Impl::split_added(std::string text, bool normalized) const {
  const auto& first = normalized ? norm_first : raw_first;
  if (!(normalized ? has_norm : has_raw)) return {Piece{std::move(text)}};
  std::vector<Piece> out;
  const std::string_view s = text;
  size_t start_offset = 0, pos = 0;
  while (pos < s.size()) {
    size_t start = 0, len = 0, index = 0;
    bool found = false;
    for (size_t i = pos; i < s.size() && !found; ++i)
      for (const auto& [content, k] : first[static_cast<unsigned char>(s[i])])
        if (s.compare(i, content.size(), content) == 0) {
          start = i, len = content.size(), index = k, found = true;
          break;
        }
    if (!found) break;
    size_t stop = start + len;
    pos = stop;
    const AddedToken& a = added[index];
    if (a.single_word) {
      const bool start_space = start == 0 || !word_char_at_end(s.substr(0, start));
      const bool stop_space = stop == s.size() || !word_char_at_start(s.substr(stop));
      if (!start_space || !stop_space) continue;
    }
    if (a.lstrip) {  // back over whitespace, not past the previous piece
      size_t b = start, keep = 0;
      while (b > 0) {
        size_t c = b - 1;
        while (c > 0 && (static_cast<unsigned char>(s[c]) & 0xC0) == 0x80) --c;
        size_t i = c;
        if (!utf8::is_whitespace(utf8::decode(s, i))) {
          keep = b;
          break;
        }
        b = c;
      }
      start = std::max(keep, start_offset);
    }
    if (a.rstrip) {
      size_t e = stop;
      while (e < s.size()) {
        size_t i = e;
        if (!utf8::is_whitespace(utf8::decode(s, i))) break;
        e = i;
      }
      stop = e;
    }
    if (start > start_offset) out.push_back(Piece{std::string(s.substr(start_offset, start - start_offset))});
    out.push_back(Piece{std::string(s.substr(start, stop - start)), a.id});
    start_offset = stop;
  }
  if (start_offset < s.size()) out.push_back(Piece{std::string(s.substr(start_offset))});
  return out;
}

namespace {

// normalizer.rs NormalizedString::split: the pattern's matches and the gaps between them, then the
// behavior decides which to keep and what to merge. Returns [begin, end) ranges to keep.
std::vector<std::pair<size_t, size_t>> split_ranges(const Regex& re, std::string_view s,
                                                    Behavior behavior, bool invert) {
  struct Part {
    size_t b, e;
    bool match;
  };
  std::vector<Part> parts;
  size_t prev = 0;
  for (const auto& [b, e] : re.find_all(s)) {
    if (prev != b) parts.push_back({prev, b, invert});
    parts.push_back({b, e, !invert});
    prev = e;
  }
  if (prev != s.size()) parts.push_back({prev, s.size(), invert});

  std::vector<std::pair<size_t, size_t>> out;  // (begin, end) of the kept pieces
  bool prev_match = false;
  switch (behavior) {
    case Behavior::kIsolated:
      for (const Part& p : parts) out.emplace_back(p.b, p.e);
      break;
    case Behavior::kRemoved:
      for (const Part& p : parts)
        if (!p.match) out.emplace_back(p.b, p.e);
      break;
    case Behavior::kContiguous:
      for (const Part& p : parts) {
        if (p.match == prev_match && !out.empty())
          out.back().second = p.e;
        else
          out.emplace_back(p.b, p.e);
        prev_match = p.match;
      }
      break;
    case Behavior::kMergedWithPrevious:
      for (const Part& p : parts) {
        if (p.match && !prev_match && !out.empty())
          out.back().second = p.e;
        else
          out.emplace_back(p.b, p.e);
        prev_match = p.match;
      }
      break;
    case Behavior::kMergedWithNext:
      for (size_t k = parts.size(); k-- > 0;) {
        const Part& p = parts[k];
        if (p.match && !prev_match && !out.empty())
          out.back().first = p.b;
        else
          out.emplace_back(p.b, p.e);
        prev_match = p.match;
      }
      std::reverse(out.begin(), out.end());
      break;
  }
  return out;
}

}  // namespace

void Tokenizer::Impl::pre_tokenize(std::vector<std::string>& pieces) const {
  std::vector<std::string> next;
  for (const PreStep& step : pre) {
    next.clear();
    for (std::string& piece : pieces) {
      if (step.kind == PreStep::Kind::kSplit) {
        for (const auto& [b, e] : split_ranges(*step.regex, piece, step.behavior, step.invert))
          if (e > b) next.push_back(piece.substr(b, e - b));
        continue;
      }
      // pre_tokenizers/byte_level.rs: prefix space, GPT-2 split, then bytes to characters.
      if (step.add_prefix_space && piece.rfind(' ', 0) != 0) piece.insert(0, 1, ' ');
      std::vector<std::pair<size_t, size_t>> ranges;
      if (step.regex)
        ranges = split_ranges(*step.regex, piece, Behavior::kIsolated, false);
      else
        ranges.emplace_back(0, piece.size());
      for (const auto& [b, e] : ranges) {
        if (e == b) continue;
        std::string mapped;
        mapped.reserve(2 * (e - b));
        for (size_t i = b; i < e; ++i) mapped += byte_chars[static_cast<unsigned char>(piece[i])];
        next.push_back(std::move(mapped));
      }
    }
    pieces.swap(next);
  }
}

void Tokenizer::Impl::encode_into(std::string_view text, std::vector<int32_t>& ids) const {
  // tokenizer/mod.rs encode_single_sequence: added tokens out of the raw text, normalize the rest,
  // added tokens out of the normalized pieces, pre-tokenize, then the model on each pre-token.
  std::vector<std::string> words;
  for (Piece& raw : split_added(utf8::to_valid(text), false)) {
    if (raw.id >= 0) {
      ids.push_back(raw.id);
      continue;
    }
    std::string normalized = nfc ? dsi::nfc(raw.text) : std::move(raw.text);
    for (Piece& piece : split_added(std::move(normalized), true)) {
      if (piece.id >= 0) {
        ids.push_back(piece.id);
        continue;
      }
      if (piece.text.empty()) continue;
      words.clear();
      words.push_back(std::move(piece.text));
      pre_tokenize(words);
      for (const std::string& w : words) bpe.tokenize(w, ids);
    }
  }
}

// ---------------------------------------------------------------- public API

Tokenizer Tokenizer::from_json_text(std::string_view json_text, const std::string& where) {
  // model.vocab's entries and model.merges' elements go straight into `tables` instead of the DOM
  // (depths: 1 = the top object's keys, 2 = model's, 3 = inside model.vocab / model.merges).
  BpeTables tables;
  std::vector<std::string> keys;  // the last key seen at each depth
  std::string vocab_key;
  bool in_vocab = false, in_merges = false;
  const auto under_model = [&](const char* key) {
    return keys.size() > 2 && keys[1] == "model" && keys[2] == key;
  };
  const json::parser_callback_t capture = [&](int depth, json::parse_event_t event, json& parsed) {
    using E = json::parse_event_t;
    if (event == E::key) {
      if (in_vocab && depth == 3) {
        vocab_key = std::move(parsed.get_ref<std::string&>());
        return false;  // not into the DOM's map: the value's callback takes the entry
      }
      keys.resize(size_t(depth) + 1);
      keys[size_t(depth)] = parsed.get<std::string>();
      return true;
    }
    if (depth == 2 && event == E::object_start && under_model("vocab")) in_vocab = tables.has_vocab = true;
    if (depth == 2 && event == E::object_end) in_vocab = false;
    if (depth == 2 && event == E::array_start && under_model("merges")) in_merges = tables.has_merges = true;
    if (depth == 2 && event == E::array_end) in_merges = false;
    if (depth != 3) return true;
    if (in_vocab && event == E::value) {
      tables.vocab.emplace_back(std::move(vocab_key), std::move(parsed));
      return false;
    }
    if (in_vocab && (event == E::object_start || event == E::array_start)) {
      tables.vocab.emplace_back(std::move(vocab_key), json::object());  // not an id: refused later
      return false;
    }
    if (in_merges && (event == E::value || event == E::array_end || event == E::object_end)) {
      tables.merges.push_back(std::move(parsed));
      return false;
    }
    return true;
  };
  json j;
  try {
    j = json::parse(json_text, capture);
  } catch (const json::exception& e) {
    fail("{}: not valid JSON: {}", where, e.what());
  }
  auto impl = std::make_shared<Impl>();
  impl->where = where;
  try {
    impl->parse(j, std::move(tables));
  } catch (const json::exception& e) {  // a field of the wrong JSON type that no check named
    fail("{}: malformed tokenizer.json: {}", where, e.what());
  }
  return Tokenizer(std::move(impl));
}

Tokenizer Tokenizer::load(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("cannot open tokenizer file '{}': {}", path, std::strerror(errno));
  std::stringstream ss;
  ss << f.rdbuf();
  return from_json_text(ss.str(), path);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  std::vector<int32_t> ids;
  if (add_special_tokens) ids = impl_->prefix;
  impl_->encode_into(text, ids);
  if (add_special_tokens) ids.insert(ids.end(), impl_->suffix.begin(), impl_->suffix.end());
  return ids;
}

const std::string* Tokenizer::token_bytes(int32_t id) const {
  const Impl& m = *impl_;
  if (id < 0 || size_t(id) >= m.id_known.size() || !m.id_known[size_t(id)]) return nullptr;
  return &m.id_bytes[size_t(id)];
}

bool Tokenizer::spaced_tokens() const { return !impl_->byte_level_decoder; }

const Tokenizer::ByteOrder& Tokenizer::byte_order() const {
  const Impl& m = *impl_;
  std::call_once(m.byte_order_once, [&m] {
    ByteOrder& o = m.byte_order;
    for (size_t id = 0; id < m.id_bytes.size(); ++id) {
      if (!m.id_known[id] || m.id_bytes[id].empty()) continue;
      o.longest = std::max(o.longest, m.id_bytes[id].size());
      (m.id_special[id] ? o.specials : o.ids).push_back(int32_t(id));
    }
    std::sort(o.ids.begin(), o.ids.end(),
              [&m](int32_t a, int32_t b) { return m.id_bytes[size_t(a)] < m.id_bytes[size_t(b)]; });
    o.shared.assign(o.ids.size(), 0);
    for (size_t k = 1; k < o.ids.size(); ++k) {
      const std::string &a = m.id_bytes[size_t(o.ids[k - 1])], &b = m.id_bytes[size_t(o.ids[k])];
      size_t n = 0;
      while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
      o.shared[k] = uint32_t(n);
    }
  });
  return m.byte_order;
}

const Tokenizer::ByteSplit& Tokenizer::byte_split(const std::string& name,
                                                 const std::function<bool(std::string_view)>& has) const {
  const Impl& m = *impl_;
  const ByteOrder& order = byte_order();
  std::lock_guard<std::mutex> lock(m.splits_mu);
  std::unique_ptr<ByteSplit>& split = m.splits[name];
  if (split) return *split;
  split = std::make_unique<ByteSplit>();
  split->with.assign((m.id_bytes.size() + 63) / 64, 0);
  ByteOrder& rest = split->rest;
  uint32_t common = 0;  // the bytes shared with the last id kept in rest: the least since it
  for (size_t k = 0; k < order.ids.size(); ++k) {
    const int32_t id = order.ids[k];
    common = std::min(common, order.shared[k]);
    const std::string& bytes = m.id_bytes[size_t(id)];
    if (has(bytes)) {
      split->with[size_t(id) / 64] |= uint64_t(1) << (id % 64);
      continue;
    }
    rest.ids.push_back(id);
    rest.shared.push_back(rest.ids.size() == 1 ? 0 : common);
    rest.longest = std::max(rest.longest, bytes.size());
    common = std::numeric_limits<uint32_t>::max();
  }
  return *split;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  StreamDecoder d = stream_decoder(skip_special_tokens);
  std::string out;
  for (int32_t id : ids) out += d.push(id);
  out += d.flush();
  return out;
}

std::vector<std::string> Tokenizer::pre_tokenize(std::string_view text) const {
  std::string valid = utf8::to_valid(text);
  std::vector<std::string> pieces;
  if (valid.empty()) return pieces;
  pieces.push_back(impl_->nfc ? dsi::nfc(valid) : std::move(valid));
  impl_->pre_tokenize(pieces);
  return pieces;
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  if (const auto it = impl_->added_by_content.find(token); it != impl_->added_by_content.end())
    return it->second;
  return impl_->bpe.token_to_id(token);
}

std::optional<std::string> Tokenizer::id_to_token(int32_t id) const {
  if (const auto it = impl_->added_by_id.find(id); it != impl_->added_by_id.end())
    return impl_->added[it->second].content;
  if (const std::string* t = impl_->bpe.id_to_token(id)) return *t;
  return std::nullopt;
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && size_t(id) < impl_->id_special.size() && impl_->id_special[size_t(id)];
}

int32_t Tokenizer::vocab_size() const { return int32_t(impl_->id_bytes.size()); }

Tokenizer::StreamDecoder Tokenizer::stream_decoder(bool skip_special_tokens) const {
  return StreamDecoder(impl_, skip_special_tokens);
}

Tokenizer::StreamDecoder::StreamDecoder(std::shared_ptr<const Impl> impl, bool skip_special_tokens)
    : impl_(std::move(impl)), skip_special_(skip_special_tokens) {}

std::string Tokenizer::StreamDecoder::push(int32_t id, bool keep) {
  // tokenizer/mod.rs decode: unknown ids are skipped, special ones on request; the ByteLevel
  // decoder concatenates the tokens' bytes and decodes them lossily (String::from_utf8_lossy).
  const Impl& m = *impl_;
  if (id < 0 || size_t(id) >= m.id_known.size() || !m.id_known[size_t(id)]) return {};
  if (skip_special_ && m.id_special[size_t(id)] && !keep) return {};
  std::string out;
  if (!m.byte_level_decoder && !first_) out = bytes_.push(" ");
  first_ = false;
  return out + bytes_.push(m.id_bytes[size_t(id)]);
}

std::string Tokenizer::StreamDecoder::flush() { return bytes_.flush(); }

}  // namespace dsi
