// JSON mode; see constraints.h.
#include "server/constraints.h"

#include <algorithm>
#include <cmath>

#include "text/utf8.h"

namespace dsi::server {

bool JsonPrefix::push(unsigned char c) {
  const JsonPrefix saved = *this;
  if (step(c)) return true;
  *this = saved;
  return false;
}

bool JsonPrefix::push(std::string_view bytes) {
  const JsonPrefix saved = *this;
  if (advance(bytes)) return true;
  *this = saved;
  return false;
}

bool JsonPrefix::advance(std::string_view bytes) {
  for (char c : bytes)
    if (!step(static_cast<unsigned char>(c))) return false;
  return true;
}

std::string JsonPrefix::signature(size_t max_bytes) const {
  std::string k;
  auto put = [&k](uint32_t v) { k.append(reinterpret_cast<const char*>(&v), sizeof(v)); };
  const char lit = lit_ == nullptr ? '\0' : lit_[0];
  for (uint8_t b : {uint8_t(mode_), uint8_t(key_), uint8_t(lit), lit_at_, space_run_}) k += char(b);
  if (mode_ == Mode::kString) str_.key(k);  // the scans' states matter only inside them
  if (mode_ == Mode::kNumber) k += char(num_.at);
  // A text of max_bytes bytes closes at most that many containers and opens at most that many: the
  // depth matters where it could reach 0 or pass kMaxDepth, else only the containers it can close.
  const size_t depth = stack_.size();
  const bool exact = depth <= max_bytes || depth + max_bytes >= size_t(kMaxDepth);
  k += exact ? char(depth) : char(-1);
  k.append(stack_, depth - std::min(depth, max_bytes), std::string::npos);
  // Inside a key: its text (which keys it may still end as), and the character under way.
  const bool in_key = mode_ == Mode::kString && key_;
  if (in_key) {
    put(uint32_t(key_text_.size()));
    k += key_text_;
    if (!str_.at_rest()) put(str_.cp), put(str_.hex), put(str_.utf8.cp);
  }
  // The keys written that so short a text could write again: those of the objects it can reach
  // (the containers above), no longer than it (a character of a key takes a byte at least), or in
  // the key under way no longer than its text and the bytes. In their tree's order, which the
  // keys decide, not the order they came in.
  for (const Keys* o = keys_.get(); o != nullptr && o->depth + std::min(depth, max_bytes) > depth; o = o->outer.get()) {
    k += char(depth - o->depth);
    const size_t longest = max_bytes + (in_key && o->depth == depth ? key_text_.size() : 0);
    o->keys.for_each([&](std::string_view key) {
      put(uint32_t(key.size()));
      k += key;
    }, longest);
    put(UINT32_MAX);
  }
  return k;
}

void JsonPrefix::end_value() { mode_ = stack_.empty() ? Mode::kDone : Mode::kAfterValue; }

void JsonPrefix::close() {
  if (keys_ != nullptr && keys_->depth == stack_.size()) keys_ = keys_->outer;  // (only an object has some)
  stack_.pop_back();
  end_value();
}

const KeySet* JsonPrefix::object_keys() const {
  return keys_ != nullptr && keys_->depth == stack_.size() ? &keys_->keys : nullptr;
}

bool JsonPrefix::take_key() {
  const KeySet* keys = object_keys();
  KeySet next = keys != nullptr ? *keys : KeySet();
  if (!next.insert(std::move(key_text_))) return false;
  key_text_.clear();
  keys_ = std::make_shared<const Keys>(Keys{keys != nullptr ? keys_->outer : keys_, std::move(next), uint32_t(stack_.size())});
  return true;
}

bool JsonPrefix::value_start(unsigned char c) {
  if (json_space(c)) return true;
  switch (c) {
    case '{':
    case '[':
      if (int(stack_.size()) >= kMaxDepth) return false;
      stack_.push_back(char(c));
      mode_ = c == '{' ? Mode::kKeyOrEnd : Mode::kValueOrEnd;
      return true;
    case '"':
      mode_ = Mode::kString;
      key_ = false;
      str_ = JsonStringScan();
      return true;
    case 't':
    case 'f':
    case 'n':
      mode_ = Mode::kLiteral;
      lit_ = c == 't' ? "true" : c == 'f' ? "false" : "null";
      lit_at_ = 1;
      return true;
    default:
      if (!JsonNumberScan::starts(c)) return false;
      mode_ = Mode::kNumber;
      num_ = JsonNumberScan(c);
      return true;
  }
}

bool JsonPrefix::step(unsigned char c) {
  const bool in_string = mode_ == Mode::kString;
  if (!in_string && json_space(c) && (mode_ == Mode::kStart || space_run_ >= kMaxSpaceRun)) return false;
  if (!step_json(c)) return false;
  space_run_ = !in_string && json_space(c) ? uint8_t(space_run_ + 1) : uint8_t(0);
  return true;
}

bool JsonPrefix::step_json(unsigned char c) {
  switch (mode_) {
    case Mode::kStart:
      if (json_space(c)) return true;
      if (c != '{') return false;  // the root is an object
      stack_.push_back('{');
      mode_ = Mode::kKeyOrEnd;
      return true;
    case Mode::kValueOrEnd:
      if (c == ']') {  // an empty array
        close();
        return true;
      }
      return value_start(c);
    case Mode::kValue:
      return value_start(c);
    case Mode::kKeyOrEnd:
    case Mode::kKey:
      if (json_space(c)) return true;
      if (c == '"') {
        mode_ = Mode::kString;
        key_ = true;
        str_ = JsonStringScan();
        key_text_.clear();
        return true;
      }
      if (c == '}' && mode_ == Mode::kKeyOrEnd) {
        close();
        return true;
      }
      return false;
    case Mode::kColon:
      if (json_space(c)) return true;
      if (c != ':') return false;
      mode_ = Mode::kValue;
      return true;
    case Mode::kAfterValue:
      if (json_space(c)) return true;
      if (c == ',') {
        mode_ = stack_.back() == '{' ? Mode::kKey : Mode::kValue;
        return true;
      }
      if (c == (stack_.back() == '{' ? '}' : ']')) {
        close();
        return true;
      }
      return false;
    case Mode::kString:
      switch (str_.step(c)) {
        case JsonStringScan::Step::kReject:
          return false;
        case JsonStringScan::Step::kMore:
          if (key_ && str_.char_ended()) utf8::append(key_text_, str_.code_point());
          return true;
        case JsonStringScan::Step::kClosed:
          // A key its object has already: refused at its closing quote, so a key that only
          // begins as one ("ab" after "a") can still be written; any key can go on to a new one.
          if (!key_) end_value();
          else if (take_key()) mode_ = Mode::kColon;
          else return false;
          return true;
      }
      return false;
    case Mode::kNumber:
      switch (num_.step(c)) {
        case JsonNumberScan::Step::kReject:
          return false;
        case JsonNumberScan::Step::kMore:
          return true;
        case JsonNumberScan::Step::kEnded:
          end_value();  // a number is only inside a container: c must follow it there
          return step_json(c);
      }
      return false;
    case Mode::kLiteral:
      if (c != static_cast<unsigned char>(lit_[lit_at_])) return false;
      if (lit_[++lit_at_] == '\0') end_value();
      return true;
    case Mode::kDone:
      return false;  // nothing after the object (its end of sequence comes next)
  }
  return false;
}

AnswerConstraint::AnswerConstraint(const Tokenizer& tokenizer, std::vector<int32_t> eos, int32_t think_open,
                                   int32_t think_close, bool in_reasoning)
    : tokenizer_(tokenizer),
      eos_(std::move(eos)),
      think_open_(think_open),
      think_close_(think_close),
      reasoning_(in_reasoning && think_close >= 0) {}

bool AnswerConstraint::is_eos(int32_t id) const { return std::find(eos_.begin(), eos_.end(), id) != eos_.end(); }

void AnswerConstraint::fill(Bits& bits, int64_t vocab) const {
  bits.assign(size_t((vocab + 63) / 64), 0);
  for (int64_t id = 0; id < vocab; ++id)
    if (fits(int32_t(id))) bits[size_t(id / 64)] |= uint64_t(1) << (id % 64);
}

const AnswerConstraint::Bits& AnswerConstraint::fitting(int64_t vocab) {
  fill(bits_, vocab);
  return bits_;
}

void AnswerConstraint::mask(float* logits, int64_t vocab) {
  if (reasoning_) return;
  const Bits& bits = fitting(vocab);
  // The answer may open its think block: that token keeps its logit.
  const bool opens_think = first_ && think_close_ >= 0 && think_open_ >= 0 && think_open_ < vocab;
  const float think_logit = opens_think ? logits[think_open_] : 0.0f;
  bool any = opens_think;
  for (int64_t w = 0; w * 64 < vocab; ++w) {  // a word of 64 ids at a time: most are all in or all out
    const int64_t end = std::min<int64_t>(vocab, (w + 1) * 64);
    const uint64_t word = bits[size_t(w)];
    if (word == ~uint64_t(0) && end - w * 64 == 64) {
      any = true;
    } else if (word == 0) {
      std::fill(logits + w * 64, logits + end, -INFINITY);
    } else {
      any = true;
      uint64_t out = ~word;  // the ids left out, one bit each (none past vocab: end - 64 w of them)
      if (end - w * 64 < 64) out &= (uint64_t(1) << (end - w * 64)) - 1;
      for (; out != 0; out &= out - 1) logits[w * 64 + __builtin_ctzll(out)] = -INFINITY;
    }
  }
  if (opens_think) logits[think_open_] = think_logit;
  // Nothing fits (a vocabulary without the bytes the answer needs): the first end of sequence.
  if (!any && !eos_.empty() && eos_[0] >= 0 && eos_[0] < vocab) logits[eos_[0]] = 0.0f;
}

void AnswerConstraint::accept(int32_t token) {
  const bool was_first = first_;
  first_ = false;
  if (reasoning_) {
    if (token == think_close_) reasoning_ = false;  // the answer proper starts
    return;
  }
  if (was_first && token == think_open_ && think_close_ >= 0) {
    reasoning_ = true;
    return;
  }
  take(token);
}

namespace {
// Recognizers that take some special tokens (as their bytes) say which: takes_special(bytes).
template <class Recognizer>
constexpr bool has_specials() {
  return requires(const Recognizer& r) { r.takes_special(std::string_view()); };
}
template <class Recognizer>
bool takes_special(const Recognizer& r, const std::string* bytes) {
  if constexpr (has_specials<Recognizer>()) return bytes != nullptr && r.takes_special(*bytes);
  return false;
}
// A recognizer free() now (tool calls in auto mode, outside a call).
template <class Recognizer>
bool is_free(const Recognizer& r) {
  if constexpr (requires { r.free(); }) return r.free();
  return false;
}
// The tokens that fit the state whatever came before them, as a split of the vocabulary: plain
// JSON string text in a free string (takes_string_text), plain text in a call's free string value
// (a recognizer's takes_raw_text), text that cannot complete a call's opening marker outside a call
// (free_call_text); null where every token is walked.
template <class Recognizer>
const Tokenizer::ByteSplit* plain_tokens(const Recognizer& state, const Tokenizer& tokenizer) {
  if (state.takes_string_text()) return &tokenizer.byte_split("json string text", json_string_text);
  if constexpr (requires { state.takes_raw_text(); })
    if (state.takes_raw_text()) return &tokenizer.byte_split("tool call raw text", raw_call_text);
  if (is_free(state)) return &tokenizer.byte_split("text before a tool call", free_call_text);
  return nullptr;
}
}  // namespace

template <class Recognizer>
bool TextConstraint<Recognizer>::fits(int32_t id) const {
  if (is_eos(id)) return json_.complete();
  const std::string* bytes = tokenizer_.token_bytes(id);
  if (tokenizer_.is_special(id) && !takes_special(json_, bytes)) return is_free(json_);
  if (bytes == nullptr || bytes->empty()) return false;
  Recognizer next = json_;  // (the masks walk the vocabulary in fitting(), not token by token)
  if (tokenizer_.spaced_tokens() && wrote_ && !next.advance(" ")) return false;
  return next.advance(*bytes);
}

template <class Recognizer>
const AnswerConstraint::Bits& TextConstraint<Recognizer>::fitting(int64_t vocab) {
  const Tokenizer::ByteOrder& order = tokenizer_.byte_order();
  // A spaced tokenizer's space before the token counts as one more byte.
  std::string key = json_.signature(order.longest + 1);
  key += char(wrote_);
  key.append(reinterpret_cast<const char*>(&vocab), sizeof(vocab));
  Masks& masks = *masks_;
  for (size_t i = 0; i < masks.size(); ++i)
    if (masks[i].first == key) {
      std::rotate(masks.begin() + i, masks.begin() + i + 1, masks.end());  // the most recent last
      return masks.back().second;
    }
  if (masks.size() >= kCachedMasks) masks.erase(masks.begin());
  masks.emplace_back(std::move(key), Bits());
  // What fits (as fits() says): the end of sequence once the text is whole; no special token;
  // a token whose bytes continue the text. The tokens go in byte order, each starting from the
  // states of the prefix it shares with the one before (a walk of the vocabulary's trie), and a
  // prefix that does not fit rules out every token after it that shares it: a state pushed once per
  // prefix, not once per token and byte.
  Bits& bits = masks.back().second;
  bits.assign(size_t((vocab + 63) / 64), 0);
  auto set = [&bits](int32_t id) { bits[size_t(id / 64)] |= uint64_t(1) << (id % 64); };
  if (states_.empty()) states_.assign(order.longest + 1, json_);
  states_[0] = json_;
  if (tokenizer_.spaced_tokens() && wrote_ && !states_[0].push(static_cast<unsigned char>(' '))) return bits;
  // Inside a free string most tokens are plain text, which fits whatever came before: those are
  // taken at once (a table made once per tokenizer) and only the others are walked. Outside
  // strings, or where the string is limited, every token is walked.
  const Tokenizer::ByteOrder* walk = &order;
  if (const Tokenizer::ByteSplit* split = plain_tokens(states_[0], tokenizer_)) {
    for (size_t w = 0; w < bits.size() && w < split->with.size(); ++w) bits[w] = split->with[w];
    if (vocab % 64 != 0) bits.back() &= (uint64_t(1) << (vocab % 64)) - 1;  // no id at or past vocab
    walk = &split->rest;
  }
  for (int32_t id : eos_)  // the end comes only once the text is whole
    if (id >= 0 && id < vocab) {
      if (json_.complete()) set(id);
      else bits[size_t(id / 64)] &= ~(uint64_t(1) << (id % 64));
    }
  size_t valid = 0;          // states_[0..valid]: the last tried token's prefixes, all fitting
  size_t dead = SIZE_MAX;    // that token's prefix of this length does not fit
  size_t common = SIZE_MAX;  // the bytes each token since then shares with it
  for (size_t k = 0; k < walk->ids.size(); ++k) {
    common = std::min<size_t>(common, walk->shared[k]);
    const int32_t id = walk->ids[k];
    if (dead <= common || is_eos(id)) continue;  // it starts with that prefix; or the end comes only whole
    const std::string& b = *tokenizer_.token_bytes(id);
    size_t depth = std::min(valid, common);
    dead = SIZE_MAX;
    common = SIZE_MAX;
    for (; depth < b.size(); ++depth) {
      states_[depth + 1] = states_[depth];  // a scratch copy: a byte that does not fit leaves it dead
      if (!states_[depth + 1].advance(std::string_view(&b[depth], 1))) {
        dead = depth + 1;
        break;
      }
    }
    valid = depth;
    if (dead == SIZE_MAX && id < vocab) set(id);
  }
  if constexpr (has_specials<Recognizer>())  // the special tokens, each alone (a few)
    for (int32_t id : order.specials)
      if (id < vocab && !is_eos(id) && fits(id)) set(id);
  return bits;
}

template <class Recognizer>
std::unique_ptr<TokenConstraint> TextConstraint<Recognizer>::clone() const {
  auto c = std::make_unique<TextConstraint>(*this);
  c->states_.clear();  // scratch
  return c;
}

template <class Recognizer>
void TextConstraint<Recognizer>::take(int32_t id) {
  const std::string* bytes = tokenizer_.token_bytes(id);
  if (is_eos(id) || (tokenizer_.is_special(id) && !takes_special(json_, bytes))) return;
  if (bytes == nullptr) return;
  if (tokenizer_.spaced_tokens() && wrote_) json_.push(' ');
  json_.push(*bytes);  // (a token the mask allowed always fits)
  wrote_ = true;
}

template class TextConstraint<JsonPrefix>;
template class TextConstraint<SchemaPrefix>;
template class TextConstraint<TextPattern>;
template class TextConstraint<ToolCallPrefix>;

bool TextPattern::push(unsigned char c) {
  Utf8Scan u = utf8_;
  switch (u.step(c)) {
    case Utf8Scan::Step::kReject:
      return false;
    case Utf8Scan::Step::kChar: {
      const int32_t next = pattern_->step(state_, u.cp);
      if (next == JsonPattern::kDead) return false;
      state_ = next;
      break;
    }
    case Utf8Scan::Step::kMore: {
      const auto [lo, hi] = u.pending();
      if (pattern_->reach_through(state_, lo, hi).min < 0) return false;
      break;
    }
  }
  utf8_ = u;
  return true;
}

bool TextPattern::push(std::string_view bytes) {
  TextPattern next = *this;
  if (!next.advance(bytes)) return false;
  *this = std::move(next);
  return true;
}

bool TextPattern::advance(std::string_view bytes) {
  for (char c : bytes)
    if (!push(static_cast<unsigned char>(c))) return false;
  return true;
}

std::string TextPattern::signature(size_t) const {
  std::string k(reinterpret_cast<const char*>(&state_), sizeof(state_));
  if (!utf8_.at_rest()) {  // a character half-way: its bytes so far
    k += char(utf8_.left);
    k += char(utf8_.lead);
    k.append(reinterpret_cast<const char*>(&utf8_.cp), sizeof(utf8_.cp));
  }
  return k;
}

}  // namespace dsi::server
