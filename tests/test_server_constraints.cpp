// The server's token constraints (server/constraints.h). JSON mode: the byte recognizer accepts every prefix of a JSON object
// and refuses a bad document at its first bad byte (nlohmann::json, an independent parser, agrees
// on which documents are whole objects); the token mask over the bundled model's vocabulary lets a
// document be written token by token, refuses what cannot continue it, allows the end of sequence
// only once the object is closed, and lets a reasoning model think first.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <initializer_list>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "server/constraints.h"
#include "server/reasoning.h"
#include "test_constraints_util.h"
#include "test_util.h"

namespace dsi::server {
namespace {

// The index of the first byte the recognizer refuses (text.size(): none), and whether the whole
// text is a complete object.
std::pair<size_t, bool> feed(const std::string& text) {
  JsonPrefix j;
  for (size_t i = 0; i < text.size(); ++i)
    if (!j.push(static_cast<unsigned char>(text[i]))) return {i, false};
  return {text.size(), j.complete()};
}

bool is_object(const std::string& text) {
  const auto v = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  return !v.is_discarded() && v.is_object();
}

TEST(JsonMode, RecognizerAcceptsObjects) {
  for (const std::string& doc :
       {std::string("{}"), std::string("{\n}"), std::string(R"({"a": 1})"),
        std::string(R"({"a": [1, -2.5e+3, 0, 0.25, 1E9, true, false, null, "x\u00e9\n\"\\\/", {"b": []}, [[]]], "c": {}})"),
        std::string(R"({"emoji": "\ud83d\ude00", "cjk": "\u4E2D"})"),
        std::string("{\"\xC3\xA9t\xC3\xA9\": \"\xE2\x82\xAC \xF0\x9F\x98\x80\"}"),
        std::string(R"({"n":-0.0e-0,"m":[ 1 , 2 ]})")}) {
    SCOPED_TRACE(doc);
    const auto [at, whole] = feed(doc);
    EXPECT_EQ(at, doc.size());
    EXPECT_TRUE(whole);
    EXPECT_TRUE(is_object(doc));
    JsonPrefix j;
    ASSERT_TRUE(j.push(doc));
    EXPECT_FALSE(j.push(" ")) << "nothing after the object";
    EXPECT_FALSE(j.push("x"));
  }
  // Prefixes are accepted but not complete.
  for (const std::string& prefix : {std::string(R"({"a": [1, {"b": "c)"), std::string("{\"a\": 12")})
    EXPECT_EQ(feed(prefix), std::make_pair(prefix.size(), false)) << prefix;
}

TEST(JsonMode, RecognizerRefusesAtTheFirstBadByte) {
  const std::vector<std::pair<std::string, size_t>> bad = {
      {"[1]", 0},                 // the root is an object
      {"\"s\"", 0},
      {R"({"a" 1})", 5},         // no colon
      {R"({"a": 01})", 7},       // no leading zeros
      {R"({"a": tru})", 9},
      {R"({"a": 1,})", 8},       // no trailing comma
      {R"({"a": [1,]})", 9},
      {R"({"a": [,]})", 7},
      {R"({1: 2})", 1},          // keys are strings
      {R"({"a": "x\q"})", 9},    // no such escape
      {R"({"a": "\u12G4"})", 11},
      {R"({"a": "\udd00"})", 10},         // a low surrogate alone
      {R"({"a": "\ud83d x"})", 13},       // a high one without its low one
      {R"({"a": "\ud83d\u0041"})", 15},
      {"{\"a\": \"x\ny\"}", 8},  // control characters are escaped
      {"{\"a\": \"\xC3\x28\"}", 8},  // a broken UTF-8 sequence
      {"{\"a\": \"\xE0\x80\x80\"}", 8},  // an overlong one
      {"{\"a\": \"\xED\xA0\x80\"}", 8},  // a surrogate
      {R"({"a": -})", 7},
      {R"({"a": 1.})", 8},
      {R"({"a": 1e})", 8},
      {R"({"a": 1}})", 8},       // closed: nothing more
  };
  for (const auto& [doc, at] : bad) {
    SCOPED_TRACE(doc);
    EXPECT_EQ(feed(doc).first, at);
    EXPECT_FALSE(is_object(doc));
  }
  // This recognizer's own limits on JSON's whitespace: none before the object, at most 32 bytes
  // in a row (inside strings, any).
  EXPECT_EQ(feed(" {}").first, 0u);
  EXPECT_EQ(feed("{" + std::string(40, ' ') + "}").first, 33u);
  const std::string spaced_key = "{\"" + std::string(40, ' ') + "\": 1}";
  EXPECT_EQ(feed(spaced_key), std::make_pair(spaced_key.size(), true));
  std::string deep = "{\"a\": ";
  for (int i = 0; i < JsonPrefix::kMaxDepth; ++i) deep += "[";
  EXPECT_EQ(feed(deep).first, deep.size() - 1);  // the 64th level of nesting is refused
}

using test::allowed;
using test::kjv_tokenizer;

// Writes `doc` through the mask: at each step the allowed token whose bytes are the longest prefix
// of what is left (the mask must leave one), then the end of sequence, which only then is allowed.
TEST(JsonMode, TheMaskLetsAnObjectBeWrittenAndEnded) {
  const Tokenizer& tok = kjv_tokenizer();
  const int64_t V = tok.vocab_size() + 1;  // the model's vocabulary has the eos after the tokenizer's
  const int32_t eos = int32_t(V - 1);
  for (const std::string& doc : {std::string(R"({"name": "Moses", "years": [120, 40.5], "led": true, "x": null})"),
                                std::string("{ }"), std::string("{\n  \"a\": [\n    1\n  ]\n}")}) {
    SCOPED_TRACE(doc);
    JsonConstraint c(tok, {eos}, -1, -1, false);
    size_t at = 0;
    std::string written;
    while (at < doc.size()) {
      const std::vector<int32_t> ok = allowed(c, V);
      ASSERT_FALSE(ok.empty());
      EXPECT_EQ(std::count(ok.begin(), ok.end(), eos), 0) << "end of sequence before the object closed";
      int32_t best = -1;
      size_t best_len = 0;
      for (int32_t id : ok) {
        const std::string* b = tok.token_bytes(id);
        ASSERT_NE(b, nullptr);
        ASSERT_FALSE(tok.is_special(id));
        if (b->size() > best_len && doc.compare(at, b->size(), *b) == 0) best = id, best_len = b->size();
      }
      ASSERT_GE(best, 0) << "no allowed token continues at " << at << ": " << doc.substr(at);
      c.accept(best);
      written += *tok.token_bytes(best);
      at += best_len;
    }
    EXPECT_EQ(written, doc);
    EXPECT_TRUE(c.state().complete());
    EXPECT_EQ(allowed(c, V), std::vector<int32_t>{eos});  // only the end now
  }
  // At the start: only what opens an object.
  JsonConstraint c(tok, {eos}, -1, -1, false);
  for (int32_t id : allowed(c, V)) EXPECT_EQ(tok.token_bytes(id)->front(), '{') << *tok.token_bytes(id);
}

// A byte-level BPE tokenizer with these tokens and no merges (ids in order), for masks over a
// vocabulary whose tokens write several JSON parts at once.
Tokenizer tokens_of(std::initializer_list<const char*> tokens, const char* name) {
  nlohmann::json vocab = nlohmann::json::object();
  for (const char* t : tokens) vocab[t] = int(vocab.size());
  const nlohmann::json j = {
      {"version", "1.0"}, {"truncation", nullptr}, {"padding", nullptr}, {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}}},
      {"post_processor", nullptr}, {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}}};
  return Tokenizer::from_json_text(j.dump(), name);
}

// Seeded walks through a constraint's masks that go deep (up to the depth limit) and back out,
// each step's mask checked against that of a new constraint fed the same tokens, which has kept
// nothing. Returns the deepest nesting reached; `checked` counts the steps.
size_t walk_kept_masks(const Tokenizer& tok, uint64_t seed, int walks, int& checked, int32_t eos = -1) {
  const int64_t V = tok.vocab_size() + 1;
  if (eos < 0) eos = int32_t(V - 1);
  std::mt19937_64 rng(seed);
  size_t deepest = 0;
  for (int walk = 0; walk < walks; ++walk) {
    JsonConstraint c(tok, {eos}, -1, -1, false);
    std::vector<int32_t> taken;
    const int turn = 200 + 40 * walk;  // steps spent going in before the walk heads out
    for (int step = 0; step < 640; ++step) {
      const std::vector<int32_t> ok = allowed(c, V);
      JsonConstraint fresh(tok, {eos}, -1, -1, false);
      for (int32_t id : taken) fresh.accept(id);
      EXPECT_EQ(ok, allowed(fresh, V)) << "step " << step << " of walk " << walk;
      EXPECT_EQ(ok, test::each_token(c.state(), tok, V, eos)) << "step " << step << " of walk " << walk;
      if (::testing::Test::HasFailure()) return deepest;
      ++checked;
      if (ok.empty() || (ok.size() == 1 && ok[0] == eos)) break;
      // Going in: mostly tokens that open a container; heading out: ones that close one; else
      // mostly ones that move the structure on.
      std::vector<int32_t> deeper, onward;
      for (int32_t id : ok) {
        if (id == eos) continue;
        const std::string& b = *tok.token_bytes(id);
        JsonPrefix next = c.state();
        EXPECT_TRUE(next.push(b)) << b;
        if (step < turn ? next.depth() > c.state().depth() : next.depth() < c.state().depth()) deeper.push_back(id);
        if (b.find_first_of("\":,") != std::string::npos) onward.push_back(id);
      }
      const std::vector<int32_t>& from = !deeper.empty() && rng() % 8 != 0   ? deeper
                                         : !onward.empty() && rng() % 4 != 0 ? onward
                                                                             : ok;
      const int32_t pick = from[std::uniform_int_distribution<size_t>(0, from.size() - 1)(rng)];
      if (pick == eos) break;
      c.accept(pick);
      taken.push_back(pick);
      deepest = std::max(deepest, c.state().depth());
    }
  }
  return deepest;
}

// The masks a constraint keeps by its state's signature (JsonPrefix::signature) are the masks
// computed afresh: on the bundled vocabulary, and on a small one whose tokens open and close
// several containers at once (what the signature's stack part and depth are for).
TEST(JsonMode, KeptMasksAreTheFreshOnes) {
  int checked = 0;
  EXPECT_GE(walk_kept_masks(kjv_tokenizer(), 11, 6, checked), size_t(JsonPrefix::kMaxDepth) - 4);
  EXPECT_GT(checked, 1000);

  const Tokenizer brackets =
      tokens_of({"{", "[", "]", "}", "\"", "a", ":", ",", "1", "]]", "]}", "}]", "}}", "[[", "[{", "{\"", "\"a\":",
                 "\"a\":[", "\"a\":{", "]]]]", "}}}}", "]}]}", "}]}]", "[[[[", "[{\"a\":[", "1]]", "1}", "\"]}", "true",
                 ",1", "]}]"},
                "brackets");
  checked = 0;
  EXPECT_EQ(walk_kept_masks(brackets, 3, 8, checked), size_t(JsonPrefix::kMaxDepth));
  EXPECT_GT(checked, 1000);
  // An end of sequence that is an ordinary token in the middle of the byte order (a model whose eos
  // is not special): the walk of the vocabulary passes over it.
  checked = 0;
  EXPECT_GE(walk_kept_masks(brackets, 4, 8, checked, *brackets.token_to_id("\"a\":")), size_t(JsonPrefix::kMaxDepth) - 4);
  EXPECT_GT(checked, 1000);
  EXPECT_GT(checked, 1000);
}

// A copy (TokenConstraint::clone, what the engine drafts and verifies with) goes on alone: fed the
// tokens the original takes later, it masks as the original then does, and what it takes leaves
// the original as it was.
TEST(JsonMode, CopiesGoOnAlone) {
  const Tokenizer& tok = kjv_tokenizer();
  const int64_t V = tok.vocab_size() + 1;
  const int32_t eos = int32_t(V - 1);
  const std::vector<int32_t> doc = tok.encode(R"({"name": "Moses", "years": [120, 40.5], "led": true})");
  JsonConstraint c(tok, {eos}, -1, -1, false);
  for (size_t i = 0; i < doc.size(); ++i) {
    const std::vector<int32_t> before = allowed(c, V);
    std::unique_ptr<TokenConstraint> copy = c.clone();
    ASSERT_NE(copy, nullptr);
    std::vector<std::vector<int32_t>> ahead;  // the copy's masks over the next three tokens
    for (size_t j = i; j < std::min(doc.size(), i + 3); ++j) {
      copy->accept(doc[j]);
      ahead.push_back(allowed(*copy, V));
    }
    EXPECT_EQ(allowed(c, V), before) << "the copy's tokens reached the original at " << i;
    JsonConstraint later(tok, {eos}, -1, -1, false);
    for (size_t j = 0; j < std::min(doc.size(), i + 3); ++j) {
      later.accept(doc[j]);
      if (j >= i) {
        EXPECT_EQ(allowed(later, V), ahead[j - i]) << "token " << j << " from a copy made at " << i;
      }
    }
    c.accept(doc[i]);
  }
  EXPECT_TRUE(c.state().complete());
}

// Random walks through the mask (seeded): every walk that ends (end of sequence) wrote one object,
// as nlohmann::json reads it; every step's text is a prefix the recognizer accepts.
// Inside a string the masks take the plain-text tokens at once and walk the others: at rest, in
// the middle of a UTF-8 character, after a backslash, inside a unicode escape and between the halves of
// a surrogate pair, the mask is each token tried alone.
TEST(JsonMode, MasksInsideStringsAreEachTokenTried) {
  const Tokenizer& tok = kjv_tokenizer();
  const int64_t V = tok.vocab_size() + 1;
  const int32_t eos = int32_t(V - 1);
  for (const std::string& text : {std::string("{\"a\": \"x"), std::string("{\"a\": \"\xC3"),
                                  std::string("{\"a\": \"\xE2\x82"), std::string("{\"a\": \"x\\"),
                                  std::string("{\"a\": \"\\u00"), std::string("{\"a\": \"\\uD834"),
                                  std::string("{\"a\": \"\\uD834\\uDD1E"), std::string("{\"k\xC3\xA9y")}) {
    JsonConstraint c(tok, {eos}, -1, -1, false);
    for (unsigned char b : text) c.accept(test::byte_token(tok, b));
    test::expect_mask_is_each_token(c, tok, V, eos, text);
  }
}

TEST(JsonMode, RandomWalksEndInObjects) {
  const Tokenizer& tok = kjv_tokenizer();
  const int64_t V = tok.vocab_size() + 1;
  const int32_t eos = int32_t(V - 1);
  std::mt19937_64 rng(5);
  int ended = 0;
  for (int walk = 0; walk < 40; ++walk) {
    JsonConstraint c(tok, {eos}, -1, -1, false);
    std::string text;
    for (int step = 0; step < 400; ++step) {
      const std::vector<int32_t> ok = allowed(c, V);
      ASSERT_FALSE(ok.empty());
      // After 20 random steps, steer to the end: close the string if inside one, else a bracket,
      // else the end of sequence, when allowed.
      int32_t pick = ok[std::uniform_int_distribution<size_t>(0, ok.size() - 1)(rng)];
      bool in_string = false;
      for (size_t i = 0; i < text.size(); ++i) {
        if (in_string && text[i] == '\\') ++i;
        else if (text[i] == '"') in_string = !in_string;
      }
      const std::vector<std::string> closers =
          in_string ? std::vector<std::string>{"\""} : std::vector<std::string>{"}", "]"};
      int rank = int(closers.size());
      for (int32_t id : ok) {
        if (id == eos) {
          pick = id;
          break;
        }
        for (int k = 0; k < rank && step > 20; ++k)
          if (*tok.token_bytes(id) == closers[size_t(k)]) pick = id, rank = k;
      }
      c.accept(pick);
      if (pick == eos) break;
      text += *tok.token_bytes(pick);
      JsonPrefix check;
      ASSERT_TRUE(check.push(text)) << text;
    }
    if (c.state().complete()) {
      ++ended;
      EXPECT_TRUE(is_object(text)) << text;
    }
  }
  EXPECT_GT(ended, 30);
}

// Each key at most once per object, escapes read: a key its object has already is refused at its
// closing quote (nlohmann::json takes such a document, keeping one value); the same key in another
// object (nested, a sibling, each object of an array) is its own.
TEST(JsonMode, EachKeyOncePerObject) {
  const std::vector<std::pair<std::string, size_t>> repeated = {
      {R"({"a": 1, "a": 2})", 11},
      {R"({"a": 1, "b": 2, "a": 3})", 19},
      {R"({"": 1, "": 2})", 9},
      {R"({"a": 1, "\u0061": 2})", 16},  // escapes read: the same key
      {R"({"\u0061": 1, "a": 2})", 16},
      {R"({"a\"b": 1, "a\u0022b": 2})", 21},
      {"{\"\xC3\xA9\": 1, \"\\u00e9\": 2}", 17},
      {R"({"\ud83d\ude00": 1, "\uD83D\uDE00": 2})", 33},  // a surrogate pair, hex digits of either case
      {"{\"x\\n\": 1, \"x\\u000a\": 2}", 19},
      {R"({"a": {"b": 1, "b": 2}})", 17},  // in a nested object
      {R"({"a": {"b": 1}, "a": 2})", 18},  // after a nested object: the outer one's keys are kept
      {R"({"l": [{"a": 1}, {"a": 2, "a": 3}]})", 28},
      {R"({"a": [{"a": 1}], "a": 2})", 20},
  };
  for (const auto& [doc, at] : repeated) {
    SCOPED_TRACE(doc);
    EXPECT_EQ(feed(doc).first, at);
    EXPECT_EQ(doc[at], '"');
    EXPECT_TRUE(is_object(doc));  // (a parser that keeps one of the values)
    // Refused only there: the key can go on to another one.
    JsonPrefix j;
    ASSERT_TRUE(j.push(doc.substr(0, at)));
    EXPECT_FALSE(j.push('"'));
    for (const char* more : {"x\": 0", "\\u0041\": 0", " \": 0"}) {
      JsonPrefix k = j;
      EXPECT_TRUE(k.push(more)) << more;
    }
  }
  for (const std::string doc :
       {R"({"a": 1, "ab": 2, "abc": 3, "b": 4})", R"({"ab": 1, "a": 2, "": 3, " ": 4, "A": 5, "\u0041b": 6})",
        R"({"a": {"a": 1, "b": {"a": 2, "b": 3}}, "b": {"a": 4}})",  // nested: each object its own
        R"({"a": {"b": 1}, "b": 2, "c": {"a": 3, "b": 4}})",          // a key after an object that had it closed
        R"({"l": [{"a": 1, "b": 2}, {"a": 3, "b": 4}, {"b": 5, "a": 6}, {}], "a": [{"l": 7}]})",
        "{\"\xC3\xA9\": 1, \"e\": 2, \"\\u00e8\": 3}"}) {
    SCOPED_TRACE(doc);
    EXPECT_EQ(feed(doc), std::make_pair(doc.size(), true));
  }
}

// Deep and wide: 64 nested objects each with the key "k", each one's refused again on the way out;
// and an object of 3,000 keys, each refused again and any other one taken.
TEST(JsonMode, KeysOfDeepAndWideObjects) {
  JsonPrefix deep;
  ASSERT_TRUE(deep.push("{"));
  for (int i = 1; i < JsonPrefix::kMaxDepth; ++i) ASSERT_TRUE(deep.push(R"("k": {)")) << i;
  ASSERT_TRUE(deep.push(R"("k": 1)"));
  for (int i = JsonPrefix::kMaxDepth; i > 0; --i) {
    SCOPED_TRACE(i);
    JsonPrefix again = deep;
    EXPECT_FALSE(again.push(R"(, "k")"));
    EXPECT_TRUE(again.push(R"(, "kk": 2)"));
    EXPECT_FALSE(again.push(R"(, "kk")"));
    EXPECT_EQ(again.depth(), size_t(i));
    ASSERT_TRUE(deep.push("}"));
  }
  EXPECT_TRUE(deep.complete());

  JsonPrefix wide;
  ASSERT_TRUE(wide.push("{"));
  for (int i = 0; i < 3000; ++i) ASSERT_TRUE(wide.push((i > 0 ? ",\"" : "\"") + std::to_string(i * 7) + "\": 0")) << i;
  for (int i = 0; i < 3000 * 7; ++i) {
    JsonPrefix next = wide;
    ASSERT_EQ(next.push(",\"" + std::to_string(i) + "\""), i % 7 != 0) << i;
  }
  EXPECT_TRUE(wide.push(R"(,"x": {"0": 1, "7": 2}, "y": 1})"));
  EXPECT_TRUE(wide.complete());
}

// Keys written in ascending order of std::hash (a prompt can ask for any order): a tree ordered
// by that hash alone would be a list of them, each key's lookup a walk of all the others and its
// destruction as deep as there are keys. 100,000 of them, a copy taken halfway, each refused again
// at the end, then all dropped.
TEST(JsonMode, KeysInTheOrderOfTheirHash) {
  constexpr int kKeys = 100000;
  std::vector<std::string> keys;
  for (int i = 0; i < kKeys; ++i) keys.push_back(std::string("k").append(std::to_string(i)));
  std::sort(keys.begin(), keys.end(), [](const std::string& a, const std::string& b) {
    return std::hash<std::string>()(a) < std::hash<std::string>()(b);
  });
  auto j = std::make_unique<JsonPrefix>();
  ASSERT_TRUE(j->push("{"));
  std::unique_ptr<JsonPrefix> half;
  for (int i = 0; i < kKeys; ++i) {
    if (i == kKeys / 2) half = std::make_unique<JsonPrefix>(*j);
    ASSERT_TRUE(j->advance((i > 0 ? ",\"" : "\"") + keys[size_t(i)] + "\":0")) << i;
  }
  for (int i = 0; i < kKeys; i += 997) {
    JsonPrefix again = *j;
    EXPECT_FALSE(again.push(",\"" + keys[size_t(i)] + "\"")) << i;
    JsonPrefix before = *half;
    EXPECT_EQ(before.push(",\"" + keys[size_t(i)] + "\""), i >= kKeys / 2) << i;
  }
  EXPECT_TRUE(j->push(",\"k\":0}"));
  EXPECT_TRUE(j->complete());
  half.reset();
  j.reset();
}

// The key set alone, against std::set: keys that begin one another (and the empty one), added in
// orders of text, reversed, shuffled, with priorities all equal (a plain search tree: ties go
// below), rising, falling, random and its own; each added once, found, listed in order of text;
// a copy goes on alone.
TEST(JsonMode, KeySetHasEachKeyOnce) {
  std::vector<std::string> keys = {"", "a", "ab", "abc", "b", "\xC3\xA9", std::string(1, '\0'), std::string("a\0", 2)};
  for (int i = 0; i < 600; ++i) keys.push_back(std::to_string(i * 37 % 1000));
  std::mt19937 rng(7);
  for (int order = 0; order < 3; ++order) {
    std::vector<std::string> in = keys;
    if (order == 0) std::sort(in.begin(), in.end());
    if (order == 1) std::sort(in.rbegin(), in.rend());
    if (order == 2) std::shuffle(in.begin(), in.end(), rng);
    for (int rule = 0; rule < 5; ++rule) {
      SCOPED_TRACE(testing::Message() << "order " << order << ", priorities " << rule);
      KeySet set, half;
      std::set<std::string> want;
      for (size_t i = 0; i < in.size(); ++i) {
        if (i == in.size() / 2) half = set;
        const uint64_t priority = rule == 0 ? 7 : rule == 1 ? i : rule == 2 ? in.size() - i : rng();
        std::string key = in[i];
        const bool added = rule == 4 ? set.insert(std::move(key)) : set.insert(std::move(key), priority);
        EXPECT_EQ(added, want.insert(in[i]).second) << i;
        if (!added) {
          EXPECT_EQ(key, in[i]);  // (not moved from)
        }
        std::string again = in[i];
        EXPECT_FALSE(set.insert(std::move(again), priority ^ 1));
      }
      std::vector<std::string> listed, short_ones;
      set.for_each([&](std::string_view k) { listed.emplace_back(k); });
      set.for_each([&](std::string_view k) { short_ones.emplace_back(k); }, 2);
      EXPECT_EQ(listed, std::vector<std::string>(want.begin(), want.end()));
      std::vector<std::string> want_short;
      for (const std::string& k : want)
        if (k.size() <= 2) want_short.push_back(k);
      EXPECT_EQ(short_ones, want_short);
      for (const std::string& k : keys) EXPECT_TRUE(set.contains(k)) << k;
      for (const char* k : {"abcd", "c", "1000", "-1"}) EXPECT_FALSE(set.contains(k)) << k;
      std::set<std::string> first(in.begin(), in.begin() + ptrdiff_t(in.size() / 2));
      for (const std::string& k : keys) EXPECT_EQ(half.contains(k), first.count(k) == 1) << k;
    }
  }
}

// Keys in the order of their std::hash, as the JSON recognizer's tree once held them (by that
// hash, then text: 100,000 of them made it a list 100,000 deep): with random priorities the tree
// is as deep as a random one. And a tree made a list on purpose (priorities rising with the keys,
// 300,000 of them) goes without a destructor inside another's.
TEST(JsonMode, KeySetStaysShallowAndGoesFlat) {
  constexpr int kKeys = 100000;
  std::vector<std::string> keys;
  for (int i = 0; i < kKeys; ++i) keys.push_back(std::string("k").append(std::to_string(i)));
  std::sort(keys.begin(), keys.end(), [](const std::string& a, const std::string& b) {
    return std::hash<std::string>()(a) < std::hash<std::string>()(b);
  });
  KeySet set;
  for (std::string& k : keys) ASSERT_TRUE(set.insert(std::string(k)));
  EXPECT_LE(set.height(), 4 * 17u);  // 4 log2(n): a random tree's is about 2.6 log2(n)
  std::sort(keys.begin(), keys.end());
  KeySet sorted;
  for (std::string& k : keys) ASSERT_TRUE(sorted.insert(std::string(k)));
  EXPECT_LE(sorted.height(), 4 * 17u);

  auto list = std::make_unique<KeySet>();
  constexpr int kList = 300000;
  for (int i = 0; i < kList; ++i) {
    char key[16];
    snprintf(key, sizeof(key), "%08d", i);
    ASSERT_TRUE(list->insert(key, uint64_t(i)));
  }
  EXPECT_EQ(list->height(), size_t(kList));
  KeySet copy = *list;
  EXPECT_TRUE(copy.insert("x", 0));
  list.reset();
  EXPECT_TRUE(copy.contains("00000000"));
}

// The masks know the keys written: a state met again with other keys gets its own mask (the kept
// masks go by the signature, which holds the keys a token could write again), on a vocabulary whose
// tokens write whole keys; and the mask inside a key its object has already is each token tried
// alone, never empty.
TEST(JsonMode, MasksKnowTheKeysWritten) {
  const Tokenizer tok = tokens_of({"{", "}", "[", "]", "\"", "a", "b", ":", ",", "1", "\"a\"", "\"b\"", "\"a\":",
                                   "\"b\":", ",\"a\":", ",\"b\":", "1,\"a\":1", "\"}", "\\u0061", "{\"a\":"},
                                  "keys");
  const int64_t V = tok.vocab_size() + 1;
  const int32_t eos = int32_t(V - 1);
  auto id = [&tok](const char* t) { return *tok.token_to_id(t); };
  auto has = [](const std::vector<int32_t>& ids, int32_t t) { return std::count(ids.begin(), ids.end(), t) == 1; };
  JsonConstraint c(tok, {eos}, -1, -1, false);
  std::vector<int32_t> taken;
  auto take = [&](const char* t) {
    c.accept(id(t));
    taken.push_back(id(t));
    JsonConstraint fresh(tok, {eos}, -1, -1, false);
    for (int32_t t2 : taken) fresh.accept(t2);
    const std::vector<int32_t> ok = allowed(c, V);
    EXPECT_EQ(ok, allowed(fresh, V)) << "after " << t;
    test::expect_mask_is_each_token(c, tok, V, eos, t);
    return ok;
  };
  std::vector<int32_t> ok = take("{\"a\":");
  ok = take("1");
  EXPECT_FALSE(has(ok, id(",\"a\":")));
  EXPECT_TRUE(has(ok, id(",\"b\":")));
  ok = take(",\"b\":");
  ok = take("1");  // where the text was two tokens ago, but with both keys
  EXPECT_FALSE(has(ok, id(",\"a\":")));
  EXPECT_FALSE(has(ok, id(",\"b\":")));
  ok = take(",");
  EXPECT_FALSE(has(ok, id("\"a\":")));
  EXPECT_FALSE(has(ok, id("\"b\"")));
  EXPECT_TRUE(has(ok, id("\"")));
  ok = take("\"");
  EXPECT_TRUE(has(ok, id("\\u0061")));  // (it may become "ab")
  ok = take("a");  // "a" written again: it can go on, but not close
  EXPECT_FALSE(has(ok, id("\"")));
  EXPECT_TRUE(has(ok, id("a")));
  EXPECT_TRUE(has(ok, id("b")));
  ok = take("b");
  EXPECT_TRUE(has(ok, id("\"")));
  ok = take("\"");
  ok = take(":");
  ok = take("{\"a\":");  // a nested object: its own keys
  ok = take("1");
  EXPECT_FALSE(has(ok, id(",\"a\":")));
  EXPECT_TRUE(has(ok, id(",\"b\":")));
  ok = take("}");  // the outer object again: its keys kept
  EXPECT_FALSE(has(ok, id(",\"a\":")));
  EXPECT_FALSE(has(ok, id(",\"b\":")));
  ok = take(",");
  ok = take("\"");
  ok = take("b");
  ok = take("b");
  ok = take("\"");
  ok = take(":");
  ok = take("[");
  EXPECT_TRUE(has(ok, id("{\"a\":")));  // an array's objects: each its own keys
  ok = take("{\"a\":");
  EXPECT_FALSE(has(ok, id("1,\"a\":1")));
  ok = take("1");
  ok = take("}");
  ok = take(",");
  EXPECT_TRUE(has(ok, id("{\"a\":")));
  ok = take("{\"a\":");
  ok = take("1");
  ok = take("}");
  ok = take("]");
  ok = take("}");
  EXPECT_EQ(ok, std::vector<int32_t>{eos});
}

// A reasoning model: unconstrained inside the think block (the prompt opened it, or the answer's
// first token does), constrained after </think>.
TEST(JsonMode, ThinkingComesFirst) {
  const Tokenizer& tok = kjv_tokenizer();
  const int64_t V = tok.vocab_size() + 3;
  const int32_t eos = int32_t(V - 3), open = int32_t(V - 2), close = int32_t(V - 1);  // ids past the tokenizer's
  const int32_t word = tok.encode("light", false).at(0), brace = tok.encode("{", false).at(0);
  JsonConstraint in(tok, {eos}, open, close, /*in_reasoning=*/true);
  EXPECT_EQ(allowed(in, V).size(), size_t(V));  // thinking: anything
  in.accept(word);
  in.accept(close);
  const std::vector<int32_t> after = allowed(in, V);
  EXPECT_EQ(std::count(after.begin(), after.end(), word), 0);
  EXPECT_EQ(std::count(after.begin(), after.end(), brace), 1);
  JsonConstraint opens(tok, {eos}, open, close, false);
  const std::vector<int32_t> first = allowed(opens, V);
  EXPECT_EQ(std::count(first.begin(), first.end(), open), 1);  // the answer may open a think block
  opens.accept(open);
  EXPECT_EQ(allowed(opens, V).size(), size_t(V));
  opens.accept(close);
  const std::vector<int32_t> answer = allowed(opens, V);
  EXPECT_EQ(std::count(answer.begin(), answer.end(), word), 0);
  EXPECT_EQ(std::count(answer.begin(), answer.end(), open), 0);  // one think block
  EXPECT_EQ(std::count(answer.begin(), answer.end(), brace), 1);
  JsonConstraint plain(tok, {eos}, open, close, false);
  plain.accept(brace);
  const std::vector<int32_t> later = allowed(plain, V);
  EXPECT_EQ(std::count(later.begin(), later.end(), open), 0);  // not once the object began
}

}  // namespace
}  // namespace dsi::server
