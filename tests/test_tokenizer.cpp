// dsi::Tokenizer: id-for-id parity with Hugging Face `tokenizers` (the oracle's output, made by
// tests/tokenizer/run_oracle.sh before these tests), decode(encode(x)) == x, the stream decoder
// against decode on every prefix, invalid UTF-8, one-line errors, and the CLI's --prompt.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "test_util.h"
#include "text/tokenizer.h"
#include "text/utf8.h"

namespace dsi {
namespace {

using json = nlohmann::json;

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void write_file(const std::string& path, std::string_view data) {
  std::ofstream f(path, std::ios::binary);
  f.write(data.data(), std::streamsize(data.size()));
}

std::string from_hex(std::string_view hex) {
  std::string out;
  std::string digits;
  for (char c : hex)
    if (!std::isspace(static_cast<unsigned char>(c))) digits += c;
  for (size_t i = 0; i + 1 < digits.size(); i += 2)
    out += char(std::stoi(digits.substr(i, 2), nullptr, 16));
  return out;
}

// Printable form of arbitrary bytes for failure messages: control bytes (and, in invalid UTF-8,
// every non-ASCII byte) as \xNN.
std::string show(std::string_view s) {
  const bool valid = utf8::is_valid(s);
  std::string out;
  for (unsigned char c : s) {
    if (c < 0x20 || c == 0x7F || (c >= 0x80 && !valid))
      out += fmt::format("\\x{:02X}", c);
    else
      out += char(c);
  }
  return out.size() > 300 ? out.substr(0, 300) + "..." : out;
}

std::string kjv_path() { return test::source_dir() + "/models/kjv-dsa/tokenizer.json"; }

const Tokenizer& kjv() {
  static const Tokenizer t = Tokenizer::load(kjv_path());
  return t;
}

struct Record {
  std::string name;
  std::string bytes;
  bool hex = false;
};

// tests/tokenizer/corpus.txt, read as oracle.py's read_corpus does.
std::vector<Record> read_corpus() {
  const std::string data = slurp(test::source_dir() + "/tests/tokenizer/corpus.txt");
  struct Head {
    size_t head, body;
    std::string name;
    bool hex;
  };
  std::vector<Head> heads;
  for (size_t pos = 0;;) {
    const size_t i = data.find("#### ", pos);
    if (i == std::string::npos) break;
    if (i == 0 || data[i - 1] == '\n') {
      const size_t eol = data.find('\n', i);
      std::string name = data.substr(i + 5, eol - i - 5);
      const bool hex = name.rfind("hex ", 0) == 0;
      heads.push_back({i, eol + 1, hex ? name.substr(4) : name, hex});
      pos = eol + 1;
    } else {
      pos = i + 1;
    }
  }
  std::vector<Record> out;
  for (size_t k = 0; k < heads.size(); ++k) {
    size_t end = k + 1 < heads.size() ? heads[k + 1].head - 1 : data.size();
    if (k + 1 == heads.size() && !data.empty() && data.back() == '\n') --end;
    std::string body = data.substr(heads[k].body, std::max(end, heads[k].body) - heads[k].body);
    out.push_back({heads[k].name, heads[k].hex ? from_hex(body) : body, heads[k].hex});
  }
  return out;
}

// Valid UTF-8 inputs for the round-trip and stream tests: the corpus's text records and a few
// generated ones.
std::vector<std::string> valid_texts() {
  std::vector<std::string> out;
  for (const Record& r : read_corpus())
    if (!r.hex) out.push_back(r.bytes);
  out.push_back(std::string(300, ' ') + "x" + std::string(100, ' '));
  out.push_back(std::string(40, '\t') + std::string(40, '\n') + "a" + std::string(20, '\r'));
  std::string digits;
  for (int i = 0; i < 1000; ++i) digits += char('0' + i * 7 % 10);
  out.push_back(digits);
  out.push_back("");
  return out;
}

// ---------------------------------------------------------------- parity with HF tokenizers

const json& oracle() {
  static const json j = [] {
    const std::string path = std::string(DSI_TOKENIZER_ORACLE_DIR) + "/oracle.json";
    const std::string text = slurp(path);
    if (text.empty())
      throw std::runtime_error(
          "no oracle output at " + path +
          ": run ctest (its TokenizerOracle.Setup test runs tests/tokenizer/run_oracle.sh), or "
          "run tests/tokenizer/run_oracle.sh " DSI_TOKENIZER_ORACLE_DIR " yourself");
    return json::parse(text);
  }();
  return j;
}

const json& oracle_tokenizer(const std::string& name) {
  for (const json& t : oracle().at("tokenizers"))
    if (t.at("name") == name) return t;
  throw std::runtime_error("oracle.json has no tokenizer " + name);
}

void check_parity(const std::string& name) {
  const json& o = oracle_tokenizer(name);
  const Tokenizer tok = Tokenizer::load(o.at("path").get<std::string>());
  size_t cases = 0, failures = 0;
  for (const json& c : o.at("cases")) {
    ++cases;
    const std::string input = from_hex(c.at("input_hex").get<std::string>());
    SCOPED_TRACE(fmt::format("{} / {}: '{}'", name, c.at("name").get<std::string>(), show(input)));
    EXPECT_EQ(tok.pre_tokenize(input), c.at("pre_tokens").get<std::vector<std::string>>());
    const auto ids = tok.encode(input);
    const auto expected = c.at("ids").get<std::vector<int32_t>>();
    EXPECT_EQ(ids, expected);
    EXPECT_EQ(tok.encode(input, true), c.at("ids_with_special").get<std::vector<int32_t>>());
    EXPECT_EQ(tok.decode(expected), c.at("decoded").get<std::string>());
    EXPECT_EQ(tok.decode(expected, true), c.at("decoded_skip_special").get<std::string>());
    if (ids != expected) ++failures;
  }
  for (const json& c : o.at("decode_cases")) {
    const auto ids = c.at("ids").get<std::vector<int32_t>>();
    SCOPED_TRACE(fmt::format("{} decode {}", name, c.at("ids").dump()));
    EXPECT_EQ(tok.decode(ids), c.at("decoded").get<std::string>());
    EXPECT_EQ(tok.decode(ids, true), c.at("decoded_skip_special").get<std::string>());
  }
  const json& names = o.at("id_to_token");
  for (size_t id = 0; id < names.size(); ++id) {
    const auto t = tok.id_to_token(int32_t(id));
    if (names[id].is_null()) {
      EXPECT_FALSE(t.has_value()) << "id " << id;
    } else {
      ASSERT_TRUE(t.has_value()) << "id " << id;
      EXPECT_EQ(*t, names[id].get<std::string>()) << "id " << id;
      EXPECT_EQ(tok.token_to_id(*t), int32_t(id)) << "token " << *t;
    }
  }
  std::printf("%s: %zu inputs, %zu encodings differ from tokenizers %s\n", name.c_str(), cases,
              failures, oracle().at("tokenizers_version").get<std::string>().c_str());
}

TEST(TokenizerParity, KjvModelTokenizer) { check_parity("kjv"); }
TEST(TokenizerParity, ByteLevelPrefixSpaceLegacyMerges) { check_parity("bytelevel"); }
TEST(TokenizerParity, NfcSplitBehaviorsTemplate) { check_parity("nfc_splits"); }

// Every Split behavior, with and without invert, over patterns with empty matches, lookaheads
// and literals: the pre-tokens of every input, piece by piece.
TEST(TokenizerParity, SplitBehaviorsPieceByPiece) {
  std::vector<std::string> inputs;
  for (const json& c : oracle_tokenizer("kjv").at("cases"))
    inputs.push_back(from_hex(c.at("input_hex").get<std::string>()));
  size_t checked = 0;
  for (const json& sc : oracle().at("split_cases")) {
    const std::string what = fmt::format("Split({}, {}, invert {})", sc.at("pattern").dump(),
                                         sc.at("behavior").get<std::string>(),
                                         sc.at("invert").get<bool>());
    const Tokenizer tok = Tokenizer::from_json_text(sc.at("tokenizer_json").get<std::string>(), what);
    const json& expected = sc.at("pre_tokens");
    ASSERT_EQ(expected.size(), inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i, ++checked) {
      EXPECT_EQ(tok.pre_tokenize(inputs[i]), expected[i].get<std::vector<std::string>>())
          << what << " on '" << show(inputs[i]) << "'";
      if (!sc.contains("ids")) continue;
      const auto ids = sc.at("ids")[i].get<std::vector<int32_t>>();
      EXPECT_EQ(tok.encode(inputs[i]), ids) << what << " on '" << show(inputs[i]) << "'";
      EXPECT_EQ(tok.decode(ids), sc.at("decoded")[i].get<std::string>()) << what;
    }
  }
  EXPECT_GT(checked, 0u);
}

// ---------------------------------------------------------------- the kjv tokenizer

TEST(TokenizerKjv, VocabularyAndSpecialTokens) {
  const Tokenizer& t = kjv();
  EXPECT_EQ(t.vocab_size(), 4096);
  const std::vector<std::pair<std::string, int32_t>> specials = {
      {"<|endoftext|>", 4090}, {"[gMASK]", 4091}, {"<sop>", 4092},
      {"<|system|>", 4093},    {"<|user|>", 4094}, {"<|assistant|>", 4095}};
  for (const auto& [text, id] : specials) {
    EXPECT_EQ(t.token_to_id(text), id);
    EXPECT_EQ(t.id_to_token(id), text);
    EXPECT_TRUE(t.is_special(id));
    EXPECT_EQ(t.encode("a" + text + "b").at(1), id) << text;
  }
  EXPECT_FALSE(t.is_special(100));
  EXPECT_EQ(t.token_to_id("Ġthe"), t.encode(" the").at(0));
  EXPECT_FALSE(t.token_to_id("no such token").has_value());
  EXPECT_FALSE(t.id_to_token(4096).has_value());
  EXPECT_FALSE(t.id_to_token(-1).has_value());
  // Special tokens are kept or skipped on request; unknown ids are skipped (as HF does).
  const auto ids = t.encode("<|user|>hi<|assistant|>");
  EXPECT_EQ(t.decode(ids), "<|user|>hi<|assistant|>");
  EXPECT_EQ(t.decode(ids, true), "hi");
  EXPECT_EQ(t.decode({-5, 99999, t.encode("x").at(0)}), "x");
}

// byte_split: the ids of byte_order() with the property as bits, the others in byte order with
// the bytes each shares with the one before it among them; made once per name.
TEST(TokenizerKjv, ByteSplitPartsTheByteOrder) {
  const Tokenizer& t = kjv();
  const Tokenizer::ByteOrder& order = t.byte_order();
  auto has_e = [](std::string_view b) { return b.find('e') != std::string_view::npos; };
  const Tokenizer::ByteSplit& split = t.byte_split("has e", has_e);
  EXPECT_EQ(&t.byte_split("has e", [](std::string_view) { return false; }), &split) << "made once per name";
  auto with = [&](int32_t id) { return (split.with[size_t(id) / 64] >> (id % 64) & 1) != 0; };
  size_t n_with = 0;
  for (const uint64_t w : split.with) n_with += size_t(__builtin_popcountll(w));
  EXPECT_EQ(n_with + split.rest.ids.size(), order.ids.size());
  EXPECT_GT(n_with, 100u);
  EXPECT_GT(split.rest.ids.size(), 100u);
  for (int32_t id : order.ids) EXPECT_EQ(with(id), has_e(*t.token_bytes(id))) << id;
  size_t longest = 0;
  for (size_t k = 0; k < split.rest.ids.size(); ++k) {
    const std::string& b = *t.token_bytes(split.rest.ids[k]);
    EXPECT_FALSE(has_e(b));
    longest = std::max(longest, b.size());
    if (k == 0) continue;
    const std::string& a = *t.token_bytes(split.rest.ids[k - 1]);
    EXPECT_LT(a, b);
    size_t n = 0;
    while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
    EXPECT_EQ(split.rest.shared[k], n) << a << " / " << b;
  }
  EXPECT_EQ(split.rest.longest, longest);
}

TEST(TokenizerRoundTrip, DecodeOfEncodeIsIdentityOnValidUtf8) {
  for (const std::string& text : valid_texts()) {
    SCOPED_TRACE(show(text));
    ASSERT_TRUE(utf8::is_valid(text));
    EXPECT_EQ(kjv().decode(kjv().encode(text)), text);
    EXPECT_EQ(kjv().decode(kjv().encode(text, true)), text);
  }
}

TEST(TokenizerRoundTrip, InvalidUtf8IsReplacedLikePython) {
  // What Python's bytes.decode('utf-8', 'replace') gives: one U+FFFD per maximal ill-formed
  // subpart (a truncated sequence is one subpart; a byte that cannot continue it starts anew).
  const std::string r = utf8::kReplacement;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"a\x80" "b", "a" + r + "b"},
      {"\xC0\xAF", r + r},                        // overlong: C0 never starts a sequence
      {"\xE0\x80\xAF", r + r + r},                // E0 needs A0..BF next
      {"\xED\xA0\x80", r + r + r},                // a surrogate
      {"\xF4\x90\x80\x80", r + r + r + r},        // above U+10FFFF
      {"\xF0\x9F\x98", r},                        // truncated at the end: one subpart
      {"\xF0\x9F\x98" "A", r + "A"},              // truncated before an ASCII byte
      {"\xE2\x82\xE2\x82\xAC", r + "\xE2\x82\xAC"},  // truncated, then a whole euro sign
      {"caf\xE9", "caf" + r},
      {"\xFF\xFE", r + r},
  };
  for (const auto& [in, want] : cases) {
    SCOPED_TRACE(show(in));
    EXPECT_FALSE(utf8::is_valid(in));
    EXPECT_EQ(utf8::to_valid(in), want);
    EXPECT_EQ(kjv().encode(in), kjv().encode(want));
    EXPECT_EQ(kjv().decode(kjv().encode(in)), want);
  }
}

// Every chunk is valid UTF-8; for every prefix of the ids, the chunks so far plus a flush equal
// decode(prefix), and the chunks alone are a prefix of it (nothing is ever taken back).
void check_stream(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip_special) {
  Tokenizer::StreamDecoder d = tok.stream_decoder(skip_special);
  std::string so_far;
  for (size_t k = 0; k < ids.size(); ++k) {
    const std::string chunk = d.push(ids[k]);
    ASSERT_TRUE(utf8::is_valid(chunk)) << "chunk " << k << ": " << show(chunk);
    so_far += chunk;
    const std::vector<int32_t> prefix(ids.begin(), ids.begin() + long(k) + 1);
    const std::string full = tok.decode(prefix, skip_special);
    ASSERT_EQ(full.compare(0, so_far.size(), so_far), 0) << "after " << k + 1 << " ids";
    Tokenizer::StreamDecoder copy = d;
    ASSERT_EQ(so_far + copy.flush(), full) << "after " << k + 1 << " ids";
  }
  EXPECT_EQ(so_far + d.flush(), tok.decode(ids, skip_special));
}

TEST(TokenizerStream, ChunksMatchDecodeOnEveryPrefix) {
  for (const std::string& text : valid_texts()) {
    SCOPED_TRACE(show(text));
    const auto ids = kjv().encode(text);
    check_stream(kjv(), ids, false);
    check_stream(kjv(), ids, true);
  }
}

TEST(TokenizerStream, HoldsBackSplitCharactersAndFlushesInvalidOnes) {
  const Tokenizer& t = kjv();
  // "😀" is four byte tokens here; nothing comes out until the fourth.
  const auto ids = t.encode("😀");
  ASSERT_GE(ids.size(), 2u);
  Tokenizer::StreamDecoder d = t.stream_decoder();
  for (size_t k = 0; k + 1 < ids.size(); ++k) EXPECT_EQ(d.push(ids[k]), "") << k;
  EXPECT_EQ(d.push(ids.back()), "😀");
  EXPECT_EQ(d.flush(), "");
  // A truncated sequence followed by ASCII: the replacement comes out with the ASCII.
  Tokenizer::StreamDecoder e = t.stream_decoder();
  EXPECT_EQ(e.push(ids[0]), "");
  EXPECT_EQ(e.push(t.encode("A").at(0)), std::string(utf8::kReplacement) + "A");
  // A truncated sequence at the end: flush gives one replacement character.
  Tokenizer::StreamDecoder f = t.stream_decoder();
  EXPECT_EQ(f.push(ids[0]), "");
  EXPECT_EQ(f.push(ids[1]), "");
  EXPECT_EQ(f.flush(), utf8::kReplacement);
  // Random id sequences split characters everywhere.
  uint64_t state = 42;
  for (int round = 0; round < 200; ++round) {
    std::vector<int32_t> r;
    const int n = 1 + int(state % 16);
    for (int k = 0; k < n; ++k) {
      state = state * 6364136223846793005ULL + 1442695040888963407ULL;
      r.push_back(int32_t((state >> 33) % 4100));
    }
    SCOPED_TRACE(round);
    check_stream(t, r, round % 2 == 0);
  }
}

TEST(TokenizerUtf8, LossyStreamEqualsWholeDecoding) {
  const std::string bytes = "a\xF0\x9F\x98\x80" "b\xE2\x82\xAC\xE2\x82" "c\xED\xA0\x80\xF0\x9F";
  for (size_t split = 0; split <= bytes.size(); ++split) {
    utf8::LossyStream s;
    std::string out = s.push(bytes.substr(0, split));
    out += s.push(bytes.substr(split));
    out += s.flush();
    EXPECT_EQ(out, utf8::to_valid(bytes)) << split;
  }
}

// ---------------------------------------------------------------- errors

// A minimal valid tokenizer.json with `patch` merged over it.
std::string tokenizer_json(const json& patch) {
  json j = {{"version", "1.0"},
            {"truncation", nullptr},
            {"padding", nullptr},
            {"added_tokens", json::array()},
            {"normalizer", nullptr},
            {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false},
                               {"trim_offsets", true}, {"use_regex", true}}},
            {"post_processor", nullptr},
            {"decoder", {{"type", "ByteLevel"}}},
            {"model", {{"type", "BPE"}, {"vocab", {{"a", 0}, {"b", 1}, {"ab", 2}}},
                       {"merges", json::array({"a b"})}}}};
  j.merge_patch(patch);
  return j.dump();
}

TEST(TokenizerErrors, OneLineMessagesNamingFileAndField) {
  const test::TempDir dir;
  const std::string path = dir.path() + "/tokenizer.json";
  const auto load_with = [&](const json& patch) {
    return [&, text = tokenizer_json(patch)] {
      write_file(path, text);
      Tokenizer::load(path);
    };
  };
  // The minimal file loads and merges.
  write_file(path, tokenizer_json(json::object()));
  EXPECT_EQ(Tokenizer::load(path).encode("ab"), std::vector<int32_t>{2});

  test::expect_error([&] { Tokenizer::load(dir.path() + "/missing.json"); },
                     {"cannot open tokenizer file", "missing.json"});
  test::expect_error([&] {
    write_file(path, "{\"model\": {\"type\": \"BPE\",");
    Tokenizer::load(path);
  }, {path, "not valid JSON"});
  test::expect_error(load_with({{"model", {{"type", "WordPiece"}}}}),
                     {path, "model.type 'WordPiece' is not supported"});
  test::expect_error(load_with({{"normalizer", {{"type", "NFKC"}}}}),
                     {path, "normalizer", "'NFKC' is not supported"});
  test::expect_error(load_with({{"normalizer",
                                 {{"type", "Sequence"},
                                  {"normalizers", json::array({json{{"type", "NFC"}},
                                                               json{{"type", "Lowercase"}}})}}}}),
                     {path, "normalizer.normalizers[1]", "'Lowercase'"});
  test::expect_error(load_with({{"pre_tokenizer", {{"type", "Metaspace"}}}}),
                     {path, "pre_tokenizer", "'Metaspace' is not supported"});
  const json bad_split = {{"type", "Split"}, {"pattern", {{"Regex", "(a"}}}, {"behavior", "Isolated"}};
  test::expect_error(load_with({{"pre_tokenizer", {{"type", "Sequence"},
                                                   {"pretokenizers", json::array({bad_split})}}}}),
                     {path, "pre_tokenizer.pretokenizers[0].pattern.Regex", "does not compile"});
  test::expect_error(load_with({{"pre_tokenizer", {{"type", "Split"}, {"pattern", {{"Regex", "a"}}},
                                                   {"behavior", "Sideways"}}}}),
                     {path, "behavior", "Sideways"});
  test::expect_error(load_with({{"pre_tokenizer", {{"type", "Split"}, {"pattern", {{"Regex", "^a"}}},
                                                   {"behavior", "Isolated"}}}}),
                     {path, "anchor '^' is not supported"});
  // Patterns holding raw control characters are quoted escaped: the message stays one line.
  test::expect_error(load_with({{"pre_tokenizer", {{"type", "Split"}, {"pattern", {{"Regex", "a\n[b[c]]\t"}}},
                                                   {"behavior", "Isolated"}}}}),
                     {path, "regex 'a\\n[b[c]]\\t'", "nested character classes"});
  test::expect_error(load_with({{"pre_tokenizer", {{"type", "Split"}, {"pattern", {{"Regex", "(\r\x01"}}},
                                                   {"behavior", "Isolated"}}}}),
                     {path, "regex '(\\r\\x01' does not compile"});
  // So are types, token names and merges (found by fuzz_tokenizer_json: a type holding a newline).
  test::expect_error(load_with({{"pre_tokenizer", {{"type", "Sequ\nce"}}}}),
                     {path, "type 'Sequ\\nce' is not supported"});
  test::expect_error(load_with({{"model", {{"type", "B\rPE"}}}}), {path, "model.type 'B\\rPE'"});
  test::expect_error(load_with({{"model", {{"merges", json::array({"a\tb c d"})}}}}),
                     {path, "model.merges[0] = 'a\\tb c d'"});
  test::expect_error(load_with({{"model", {{"merges", json::array({"a b\n"})}}}}),
                     {path, "model.merges[0]: token 'b\\n' is not in the vocab"});
  test::expect_error(load_with({{"model", {{"unk_token", "\n"}}}}), {path, "unk_token '\\n' is not in the vocab"});
  test::expect_error(load_with({{"decoder", {{"type", "WordPiece"}}}}),
                     {path, "decoder", "'WordPiece' is not supported"});
  test::expect_error(load_with({{"post_processor", {{"type", "Weird"}}}}),
                     {path, "post_processor", "'Weird' is not supported"});
  test::expect_error(load_with({{"truncation", {{"max_length", 8}}}}), {path, "truncation"});
  test::expect_error(load_with({{"model", {{"byte_fallback", true}}}}), {path, "byte_fallback"});
  test::expect_error(load_with({{"model", {{"dropout", 0.1}}}}), {path, "dropout"});
  test::expect_error(load_with({{"model", {{"merges", json::array({"a c"})}}}}),
                     {path, "model.merges[0]", "'c' is not in the vocab"});
  test::expect_error(load_with({{"model", {{"merges", json::array({"a b c"})}}}}),
                     {path, "model.merges[0]"});
  test::expect_error(load_with({{"added_tokens", json::array({json{{"content", "x"}}})}}),
                     {path, "added_tokens[0]"});
  test::expect_error(load_with({{"model", {{"unk_token", 7}}}}), {path, "malformed"});
  test::expect_error(load_with({{"model", {{"vocab", {{"a", "zero"}}}}}}),
                     {path, "model.vocab", "token 'a'"});
  test::expect_error(load_with({{"model", {{"vocab", json::array()}}}}),
                     {path, "model.vocab: missing or not an object"});
}

// ---------------------------------------------------------------- the CLI

struct CliResult {
  int exit_code = -1;
  std::string out, err;
};

CliResult run_cli(const std::string& args) {
  test::TempDir tmp;
  const std::string out = tmp.path() + "/out", err = tmp.path() + "/err";
  const std::string cmd = std::string(DSI_CLI_PATH) + " " + args + " >" + out + " 2>" + err +
                          " </dev/null";
  const int status = std::system(cmd.c_str());
  CliResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

TEST(TokenizerCli, GenerateWithPromptPrintsText) {
  const std::string model = test::source_dir() + "/models/kjv-dsa";
  const CliResult text = run_cli("generate --model " + model +
                                 " --prompt 'In the beginning' --max-new-tokens 8");
  ASSERT_EQ(text.exit_code, 0) << text.err;
  ASSERT_FALSE(text.out.empty());
  EXPECT_EQ(text.out.back(), '\n');
  const std::string printed = text.out.substr(0, text.out.size() - 1);
  EXPECT_TRUE(utf8::is_valid(printed));

  const CliResult js = run_cli("generate --model " + model +
                               " --prompt 'In the beginning' --max-new-tokens 8 --json");
  ASSERT_EQ(js.exit_code, 0) << js.err;
  const std::string last = js.out.substr(js.out.rfind('\n', js.out.size() - 2) + 1);
  const json j = json::parse(last);
  EXPECT_EQ(j.at("prompt_ids").get<std::vector<int32_t>>(), kjv().encode("In the beginning", true));
  const auto out_ids = j.at("output_ids").get<std::vector<int32_t>>();
  EXPECT_FALSE(out_ids.empty());
  EXPECT_EQ(j.at("output_text").get<std::string>(), kjv().decode(out_ids, true));
  EXPECT_EQ(j.at("output_text").get<std::string>(), printed);  // greedy: both runs agree
}

}  // namespace
}  // namespace dsi
