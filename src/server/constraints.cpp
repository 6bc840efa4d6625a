// JSON mode; see constraints.h.
#include "server/constraints.h"

#include <algorithm>
#include <cmath>

namespace dsi::server {

namespace {
bool is_space(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_digit(unsigned char c) { return c >= '0' && c <= '9'; }
bool is_hex(unsigned char c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }
}  // namespace

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
  const char lit = lit_ == nullptr ? '\0' : lit_[0];
  for (uint8_t b : {uint8_t(mode_), uint8_t(num_), uint8_t(key_), hex_left_, uint8_t(first_d_), uint8_t(high_),
                    uint8_t(want_low_), utf8_left_, utf8_lead_, uint8_t(lit), lit_at_, space_run_})
    k += char(b);
  // A text of max_bytes bytes closes at most that many containers and opens at most that many: the
  // depth matters where it could reach 0 or pass kMaxDepth, else only the containers it can close.
  const size_t depth = stack_.size();
  const bool exact = depth <= max_bytes || depth + max_bytes >= size_t(kMaxDepth);
  k += exact ? char(depth) : char(-1);
  k.append(stack_, depth - std::min(depth, max_bytes), std::string::npos);
  return k;
}

void JsonPrefix::end_value() { mode_ = stack_.empty() ? Mode::kDone : Mode::kAfterValue; }

bool JsonPrefix::value_start(unsigned char c) {
  if (is_space(c)) return true;
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
      return true;
    case '-':
      mode_ = Mode::kNumber;
      num_ = Num::kMinus;
      return true;
    case 't':
    case 'f':
    case 'n':
      mode_ = Mode::kLiteral;
      lit_ = c == 't' ? "true" : c == 'f' ? "false" : "null";
      lit_at_ = 1;
      return true;
    default:
      if (!is_digit(c)) return false;
      mode_ = Mode::kNumber;
      num_ = c == '0' ? Num::kZero : Num::kInt;
      return true;
  }
}

bool JsonPrefix::step(unsigned char c) {
  const bool in_string = mode_ == Mode::kString || mode_ == Mode::kEscape;
  if (!in_string && is_space(c) && (mode_ == Mode::kStart || space_run_ >= kMaxSpaceRun)) return false;
  if (!step_json(c)) return false;
  space_run_ = !in_string && is_space(c) ? uint8_t(space_run_ + 1) : uint8_t(0);
  return true;
}

bool JsonPrefix::step_json(unsigned char c) {
  switch (mode_) {
    case Mode::kStart:
      if (is_space(c)) return true;
      if (c != '{') return false;  // the root is an object
      stack_.push_back('{');
      mode_ = Mode::kKeyOrEnd;
      return true;
    case Mode::kValueOrEnd:
      if (c == ']') {  // an empty array
        stack_.pop_back();
        end_value();
        return true;
      }
      return value_start(c);
    case Mode::kValue:
      return value_start(c);
    case Mode::kKeyOrEnd:
    case Mode::kKey:
      if (is_space(c)) return true;
      if (c == '"') {
        mode_ = Mode::kString;
        key_ = true;
        return true;
      }
      if (c == '}' && mode_ == Mode::kKeyOrEnd) {
        stack_.pop_back();
        end_value();
        return true;
      }
      return false;
    case Mode::kColon:
      if (is_space(c)) return true;
      if (c != ':') return false;
      mode_ = Mode::kValue;
      return true;
    case Mode::kAfterValue:
      if (is_space(c)) return true;
      if (c == ',') {
        mode_ = stack_.back() == '{' ? Mode::kKey : Mode::kValue;
        return true;
      }
      if (c == (stack_.back() == '{' ? '}' : ']')) {
        stack_.pop_back();
        end_value();
        return true;
      }
      return false;
    case Mode::kString:
      if (utf8_left_ > 0) {  // a continuation byte, within the lead byte's range (no overlongs, surrogates)
        unsigned char lo = 0x80, hi = 0xBF;
        if (utf8_lead_ == 0xE0) lo = 0xA0;
        if (utf8_lead_ == 0xED) hi = 0x9F;
        if (utf8_lead_ == 0xF0) lo = 0x90;
        if (utf8_lead_ == 0xF4) hi = 0x8F;
        if (c < lo || c > hi) return false;
        utf8_lead_ = 0;  // the range applies to the first continuation byte only
        --utf8_left_;
        return true;
      }
      if (want_low_ && c != '\\') return false;  // a high surrogate's low one must follow
      if (c == '"') {
        if (key_) mode_ = Mode::kColon;
        else end_value();
        return true;
      }
      if (c == '\\') {
        mode_ = Mode::kEscape;
        hex_left_ = 0;
        return true;
      }
      if (c < 0x20) return false;  // control characters must be escaped
      if (c < 0x80) return true;
      if (c >= 0xC2 && c <= 0xDF) utf8_left_ = 1;
      else if (c >= 0xE0 && c <= 0xEF) utf8_left_ = 2;
      else if (c >= 0xF0 && c <= 0xF4) utf8_left_ = 3;
      else return false;
      utf8_lead_ = c;
      return true;
    case Mode::kEscape:
      if (hex_left_ > 0) {  // surrogates only in pairs, high then low (what strict parsers read)
        if (!is_hex(c)) return false;
        const int v = is_digit(c) ? c - '0' : (c | 0x20) - 'a' + 10;
        if (hex_left_ == 4) {
          first_d_ = v == 0xD;
          if (want_low_ && !first_d_) return false;
        } else if (hex_left_ == 3 && first_d_) {
          if (want_low_ ? v < 0xC : v >= 0xC) return false;
          high_ = !want_low_ && v >= 0x8;
        }
        if (--hex_left_ == 0) {
          mode_ = Mode::kString;
          want_low_ = !want_low_ && high_;
          high_ = false;
        }
        return true;
      }
      if (want_low_ && c != 'u') return false;
      if (c == 'u') {
        hex_left_ = 4;
        return true;
      }
      if (std::string_view("\"\\/bfnrt").find(char(c)) == std::string_view::npos) return false;
      mode_ = Mode::kString;
      return true;
    case Mode::kNumber: {
      const bool digit = is_digit(c);
      switch (num_) {
        case Num::kMinus:
          if (!digit) return false;
          num_ = c == '0' ? Num::kZero : Num::kInt;
          return true;
        case Num::kZero:
        case Num::kInt:
          if (digit && num_ == Num::kInt) return true;
          if (c == '.') return num_ = Num::kDot, true;
          if (c == 'e' || c == 'E') return num_ = Num::kExp, true;
          break;  // the number ends here
        case Num::kDot:
          if (!digit) return false;
          num_ = Num::kFrac;
          return true;
        case Num::kFrac:
          if (digit) return true;
          if (c == 'e' || c == 'E') return num_ = Num::kExp, true;
          break;
        case Num::kExp:
          if (c == '+' || c == '-') return num_ = Num::kExpSign, true;
          if (!digit) return false;
          num_ = Num::kExpInt;
          return true;
        case Num::kExpSign:
          if (!digit) return false;
          num_ = Num::kExpInt;
          return true;
        case Num::kExpInt:
          if (digit) return true;
          break;
      }
      end_value();  // a number is only inside a container: c must follow it there
      return step_json(c);
    }
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
  if (reasoning_ || !masking()) return;
  const Bits& bits = fitting(vocab);
  bool any = false;
  for (int64_t id = 0; id < vocab; ++id) {
    const bool opens_think = first_ && id == think_open_ && think_close_ >= 0;  // the answer opens its think block
    if (opens_think || (bits[size_t(id / 64)] >> (id % 64) & 1)) any = true;
    else logits[id] = -INFINITY;
  }
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

bool JsonConstraint::fits(int32_t id) const {
  if (is_eos(id)) return json_.complete();
  if (tokenizer_.is_special(id)) return false;
  const std::string* bytes = tokenizer_.token_bytes(id);
  if (bytes == nullptr || bytes->empty()) return false;
  JsonPrefix next = json_;
  if (tokenizer_.spaced_tokens() && wrote_ && !next.advance(" ")) return false;
  return next.advance(*bytes);
}

const AnswerConstraint::Bits& JsonConstraint::fitting(int64_t vocab) {
  if (max_token_bytes_ == 0) {
    max_token_bytes_ = 1;
    for (int32_t id = 0; id < tokenizer_.vocab_size(); ++id)
      if (const std::string* b = tokenizer_.token_bytes(id)) max_token_bytes_ = std::max(max_token_bytes_, b->size());
  }
  // A spaced tokenizer's space before the token counts as one more byte.
  std::string key = json_.signature(max_token_bytes_ + 1);
  key += char(wrote_);
  key.append(reinterpret_cast<const char*>(&vocab), sizeof(vocab));
  for (size_t i = 0; i < masks_.size(); ++i)
    if (masks_[i].first == key) {
      std::rotate(masks_.begin() + i, masks_.begin() + i + 1, masks_.end());  // the most recent last
      return masks_.back().second;
    }
  if (masks_.size() >= kCachedMasks) masks_.erase(masks_.begin());
  masks_.emplace_back(std::move(key), Bits());
  fill(masks_.back().second, vocab);
  return masks_.back().second;
}

void JsonConstraint::take(int32_t id) {
  if (is_eos(id) || tokenizer_.is_special(id)) return;
  const std::string* bytes = tokenizer_.token_bytes(id);
  if (bytes == nullptr) return;
  if (tokenizer_.spaced_tokens() && wrote_) json_.push(' ');
  json_.push(*bytes);  // (a token the mask allowed always fits)
  wrote_ = true;
}

bool ForcedText::fits(int32_t id) const {
  if (is_eos(id)) return false;
  const std::string* b = tokenizer_.token_bytes(id);
  if (b == nullptr || b->empty()) return false;
  const size_t n = std::min(b->size(), left_.size());
  return b->compare(0, n, left_, 0, n) == 0;  // continues the text, or writes its rest and goes on
}

void ForcedText::take(int32_t id) {
  const std::string* b = tokenizer_.token_bytes(id);
  if (b != nullptr) left_.erase(0, std::min(b->size(), left_.size()));
}

}  // namespace dsi::server
