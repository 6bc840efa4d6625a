// Output text of the server: stop strings (held back while they may still complete, cut where
// they appear) and incremental detokenisation that never emits half a UTF-8 character.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "server/output_text.h"
#include "test_util.h"
#include "text/utf8.h"

namespace dsi::server {
namespace {

TEST(ServerStopStrings, HoldsBackPossibleStarts) {
  StopStringMatcher m({"STOP", "xy"});
  EXPECT_EQ(m.push("hello S"), "hello ");  // "S" may begin "STOP"
  EXPECT_EQ(m.push("T"), "");
  EXPECT_EQ(m.push("AR"), "STAR");  // not a stop after all: released
  EXPECT_EQ(m.push(" x"), " ");
  EXPECT_EQ(m.push("z"), "xz");
  EXPECT_FALSE(m.stopped());
  EXPECT_EQ(m.push("ab ST"), "ab ");
  EXPECT_EQ(m.flush(), "ST");  // the end of the stream releases what was held
}

TEST(ServerStopStrings, CutsAtTheFirstStop) {
  StopStringMatcher m({"STOP", "xy"});
  EXPECT_EQ(m.push("one ST"), "one ");
  EXPECT_EQ(m.push("OP two"), "");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.push("more"), "");
  EXPECT_EQ(m.flush(), "");
  // Across pieces, earliest occurrence wins.
  StopStringMatcher e({"bc", "ab"});
  EXPECT_EQ(e.push("zza"), "zz");
  EXPECT_EQ(e.push("bc"), "");
  EXPECT_TRUE(e.stopped());
  // A stop inside one piece.
  StopStringMatcher one({"\n\n"});
  EXPECT_EQ(one.push("line\n\nnext"), "line");
  // No stops: everything passes at once.
  StopStringMatcher none({});
  EXPECT_EQ(none.push("abc"), "abc");
  // Overlapping prefixes: "aab" after "aa" must still be found.
  StopStringMatcher ov({"aab"});
  EXPECT_EQ(ov.push("xa"), "x");
  EXPECT_EQ(ov.push("a"), "");
  EXPECT_EQ(ov.push("a"), "a");
  EXPECT_EQ(ov.push("b!"), "");
  EXPECT_TRUE(ov.stopped());
}

// Every split of a text into pieces gives the same output as the text in one piece.
TEST(ServerStopStrings, SplitInvariance) {
  const std::string text = "the LORD said unto Moses, STOP; and he stopped";
  const std::vector<std::string> stops = {"STOP", "Moses,", "nothing"};
  StopStringMatcher whole(stops);
  const std::string expect = whole.push(text) + whole.flush();
  EXPECT_EQ(expect, "the LORD said unto ");
  for (size_t a = 0; a <= text.size(); ++a)
    for (size_t b = a; b <= text.size(); b += 3) {
      StopStringMatcher m(stops);
      std::string got = m.push(text.substr(0, a));
      got += m.push(text.substr(a, b - a));
      got += m.push(text.substr(b));
      got += m.flush();
      ASSERT_EQ(got, expect) << a << " " << b;
    }
}

class ServerOutputText : public ::testing::Test {
 protected:
  static const Tokenizer& tok() {
    static const Tokenizer t = Tokenizer::load(test::source_dir() + "/models/kjv-dsa/tokenizer.json");
    return t;
  }
  static std::vector<GeneratedToken> gen(const std::vector<int32_t>& ids) {
    std::vector<GeneratedToken> out;
    for (int32_t id : ids) out.push_back(GeneratedToken{id, -1.0f, {}});
    return out;
  }
};

TEST_F(ServerOutputText, TokenByTokenNeverSplitsACharacter) {
  // Characters outside the training text's alphabet become byte tokens: several ids per character.
  const std::string text = "In the beginning — God’s “word” é 日本 🙂 end";
  const std::vector<int32_t> ids = tok().encode(text);
  ASSERT_GT(ids.size(), 10u);
  OutputText out(tok(), true, {}, false);
  std::string all;
  int empty_pieces = 0;
  for (int32_t id : ids) {
    const TextDelta d = out.push(gen({id}));
    EXPECT_TRUE(utf8::is_valid(d.text)) << "piece of id " << id;
    empty_pieces += d.text.empty();
    all += d.text;
  }
  all += out.finish().text;
  EXPECT_EQ(all, tok().decode(ids, true));
  EXPECT_EQ(all, text);
  EXPECT_GT(empty_pieces, 0) << "no token split a character: the test does not test it";
  EXPECT_EQ(out.tokens_consumed(), int64_t(ids.size()));
}

TEST_F(ServerOutputText, StopStringCutsTextAndTokens) {
  const std::vector<int32_t> ids = tok().encode("And God said, Let there be light: and there was light.");
  OutputText out(tok(), true, {"light:"}, true);
  std::string all;
  std::vector<TokenRecord> recs;
  for (size_t i = 0; i < ids.size(); i += 3) {
    std::vector<int32_t> part(ids.begin() + long(i), ids.begin() + long(std::min(ids.size(), i + 3)));
    TextDelta d = out.push(gen(part));
    all += d.text;
    for (auto& r : d.tokens) recs.push_back(r);
  }
  all += out.finish().text;
  EXPECT_TRUE(out.stopped());
  EXPECT_EQ(all, "And God said, Let there be ");
  EXPECT_EQ(out.text(), all);
  // The tokens up to the one that completed the stop string are kept, later ones dropped.
  ASSERT_LT(recs.size(), ids.size());
  EXPECT_EQ(int64_t(recs.size()), out.tokens_consumed());
  std::string joined;
  for (const auto& r : recs) {
    EXPECT_EQ(r.text_offset, std::min(joined.size(), all.size()));
    joined += r.text;
    EXPECT_FLOAT_EQ(r.logprob, -1.0f);
  }
  EXPECT_NE(joined.find("light:"), std::string::npos);
}

TEST_F(ServerOutputText, SpecialTokensSkippedOrKept) {
  const int32_t eos = *tok().token_to_id("<|endoftext|>");
  std::vector<int32_t> ids = tok().encode("Amen.");
  ids.push_back(eos);
  OutputText skip(tok(), true, {}, false);
  std::string text = skip.push(gen(ids)).text;
  EXPECT_EQ(text + skip.finish().text, "Amen.");
  OutputText keep(tok(), false, {}, false);
  text = keep.push(gen(ids)).text;
  EXPECT_EQ(text + keep.finish().text, "Amen.<|endoftext|>");
}

// Special tokens a reasoning splitter reads (think tags) stay in the text when the request skips
// special tokens; other special tokens are still skipped.
TEST(OutputText, KeptSpecialTokensStayWhenSpecialTokensAreSkipped) {
  nlohmann::json j = {
      {"version", "1.0"}, {"truncation", nullptr}, {"padding", nullptr}, {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}}},
      {"post_processor", nullptr}, {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"vocab", {{"a", 0}, {"b", 1}, {"ab", 2}}}, {"merges", nlohmann::json::array({"a b"})}}}};
  auto added = [](int id, const char* content) {
    return nlohmann::json{{"id", id}, {"content", content}, {"single_word", false}, {"lstrip", false},
                          {"rstrip", false}, {"normalized", false}, {"special", true}};
  };
  j["added_tokens"] = {added(3, "<think>"), added(4, "</think>"), added(5, "<eos>")};
  const Tokenizer tok = Tokenizer::from_json_text(j.dump(), "think tags");
  std::vector<GeneratedToken> ids;
  for (int32_t id : {3, 0, 4, 2, 5}) ids.push_back(GeneratedToken{id, 0.0f, {}});
  auto text = [&](bool skip, std::vector<int32_t> keep) {
    OutputText out(tok, skip, {}, false, std::move(keep));
    std::string t = out.push(ids).text;
    return t + out.finish().text;
  };
  EXPECT_EQ(text(true, {3, 4}), "<think>a</think>ab");
  EXPECT_EQ(text(true, {}), "aab");
  EXPECT_EQ(text(false, {}), "<think>a</think>ab<eos>");
}

}  // namespace
}  // namespace dsi::server
