// `dsinfer bench`'s pure parts (tools/dsinfer/bench_core.h): the SSE parser on streams split at
// every byte, the percentiles against numpy's linear interpolation, decode tokens/s, and the
// speculative-decoding counters read from a Prometheus page.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "../tools/dsinfer/bench_core.h"

using dsi::bench::SseParser;

namespace {

// The events of `stream` fed in pieces of `piece` bytes.
std::vector<std::string> events(const std::string& stream, size_t piece, bool* done = nullptr) {
  SseParser p;
  std::vector<std::string> out;
  for (size_t i = 0; i < stream.size(); i += piece)
    p.feed(std::string_view(stream).substr(i, piece), [&](const std::string& d) { out.push_back(d); });
  if (done) *done = p.done();
  return out;
}

const std::string kStream =
    "data: {\"choices\":[{\"text\":\"In\"}]}\n\n"
    ": keep-alive\n\n"
    "data: {\"choices\":[{\"text\":\" the\"}]}\r\n\r\n"
    "data:{\"choices\":[{\"text\":\" beginning\"}]}\r\r"
    "event: message\nid: 7\ndata: line one\ndata: line two\n\n"
    "data: {\"choices\":[],\"usage\":{\"completion_tokens\":3}}\n\n"
    "data: [DONE]\n\n"
    "data: after the end\n\n";

const std::vector<std::string> kExpected = {
    "{\"choices\":[{\"text\":\"In\"}]}", "{\"choices\":[{\"text\":\" the\"}]}",
    "{\"choices\":[{\"text\":\" beginning\"}]}", "line one\nline two",
    "{\"choices\":[],\"usage\":{\"completion_tokens\":3}}"};

}  // namespace

TEST(BenchSse, WholeStream) {
  bool done = false;
  EXPECT_EQ(events(kStream, kStream.size(), &done), kExpected);
  EXPECT_TRUE(done);
}

TEST(BenchSse, SplitAtEveryPieceSize) {
  // Pieces of 1..n bytes put a split at every position, inside "\r\n" and "data:" included.
  for (size_t piece = 1; piece <= 64; ++piece) {
    bool done = false;
    EXPECT_EQ(events(kStream, piece, &done), kExpected) << "pieces of " << piece;
    EXPECT_TRUE(done) << "pieces of " << piece;
  }
}

TEST(BenchSse, CutShortStream) {
  // No [DONE], an unfinished event: nothing is invented, and pending() tells.
  SseParser p;
  std::vector<std::string> got;
  p.feed("data: {\"a\":1}\n\ndata: {\"b\"", [&](const std::string& d) { got.push_back(d); });
  EXPECT_EQ(got, std::vector<std::string>{"{\"a\":1}"});
  EXPECT_FALSE(p.done());
  EXPECT_TRUE(p.pending());
}

TEST(BenchSse, DoneOnlyAsWholeData) {
  // "[DONE]" inside a payload or as a prefix is data, not the end.
  bool done = true;
  const auto got = events("data: [DONE]x\n\ndata: {\"t\":\"[DONE]\"}\n\n", 3, &done);
  EXPECT_EQ(got, (std::vector<std::string>{"[DONE]x", "{\"t\":\"[DONE]\"}"}));
  EXPECT_FALSE(done);
}

TEST(BenchSse, FieldWithoutColonAndEmptyData) {
  // "data" alone is an empty data field; an event of only comments or other fields dispatches nothing.
  const auto got = events("data\n\nretry: 5\n\n:c\n\ndata:\ndata\n\n", 2);
  EXPECT_EQ(got, (std::vector<std::string>{"", "\n"}));
}

TEST(BenchStats, PercentilesMatchNumpyLinear) {
  // numpy.percentile([15, 20, 35, 40, 50], q) for q = 0, 25, 50, 90, 99, 100.
  const std::vector<double> v = {40, 15, 50, 35, 20};
  EXPECT_DOUBLE_EQ(dsi::bench::percentile(v, 0), 15.0);
  EXPECT_DOUBLE_EQ(dsi::bench::percentile(v, 25), 20.0);
  EXPECT_DOUBLE_EQ(dsi::bench::percentile(v, 50), 35.0);
  EXPECT_DOUBLE_EQ(dsi::bench::percentile(v, 90), 46.0);
  EXPECT_DOUBLE_EQ(dsi::bench::percentile(v, 99), 49.6);
  EXPECT_DOUBLE_EQ(dsi::bench::percentile(v, 100), 50.0);
  EXPECT_DOUBLE_EQ(dsi::bench::percentile({7}, 99), 7.0);
  EXPECT_TRUE(std::isnan(dsi::bench::percentile({}, 50)));
  // Even count: the median is the mean of the middle two.
  EXPECT_DOUBLE_EQ(dsi::bench::percentile({1, 2, 3, 4}, 50), 2.5);
}

TEST(BenchStats, Summary) {
  const auto s = dsi::bench::summarize({3, 1, 2, 10});
  EXPECT_EQ(s.count, 4u);
  EXPECT_DOUBLE_EQ(s.mean, 4.0);
  EXPECT_DOUBLE_EQ(s.median, 2.5);
  EXPECT_DOUBLE_EQ(s.min, 1.0);
  EXPECT_DOUBLE_EQ(s.max, 10.0);
  EXPECT_DOUBLE_EQ(s.p90, 7.9);    // rank 2.7 between 3 and 10
  EXPECT_DOUBLE_EQ(s.p99, 9.79);   // rank 2.97
  const auto empty = dsi::bench::summarize({});
  EXPECT_EQ(empty.count, 0u);
  EXPECT_TRUE(std::isnan(empty.mean) && std::isnan(empty.p99));
}

TEST(BenchStats, DecodeTokensPerSecond) {
  // 33 tokens, the first at 0.5 s and the last at 2.5 s: 32 decode steps in 2 s.
  EXPECT_DOUBLE_EQ(dsi::bench::decode_tokens_per_second(33, 0.5, 2.5), 16.0);
  EXPECT_TRUE(std::isnan(dsi::bench::decode_tokens_per_second(1, 0.5, 0.5)));
  EXPECT_TRUE(std::isnan(dsi::bench::decode_tokens_per_second(0, 0, 0)));
  EXPECT_TRUE(std::isnan(dsi::bench::decode_tokens_per_second(5, 1.0, 1.0)));  // one chunk
}

TEST(BenchMetrics, SpecCountersAndDelta) {
  const std::string before =
      "# HELP dsinfer:spec_decode_num_drafts_total Speculative decoding: draft rounds.\n"
      "# TYPE dsinfer:spec_decode_num_drafts_total counter\n"
      "dsinfer:spec_decode_num_drafts_total{model_name=\"kjv-dsa\"} 10\n"
      "dsinfer:spec_decode_num_draft_tokens_total{model_name=\"kjv-dsa\"} 30\n"
      "dsinfer:spec_decode_num_accepted_tokens_total{model_name=\"kjv-dsa\"} 12\n"
      "dsinfer:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"kjv-dsa\",position=\"0\"} 8\n"
      "dsinfer:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"kjv-dsa\",position=\"1\"} 3\n"
      "dsinfer:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"kjv-dsa\",position=\"2\"} 1\n"
      "dsinfer:num_requests_running{model_name=\"kjv-dsa\"} 2\n";
  const std::string after =
      "dsinfer:spec_decode_num_drafts_total{model_name=\"kjv-dsa\"} 110\r\n"
      "dsinfer:spec_decode_num_draft_tokens_total{model_name=\"kjv-dsa\"} 3.3e2\n"
      "dsinfer:spec_decode_num_accepted_tokens_total{model_name=\"kjv-dsa\"} 192\n"
      "dsinfer:spec_decode_num_accepted_tokens_per_pos_total{position=\"2\",model_name=\"a,b=\\\"c\\\"\"} 21\n"
      "dsinfer:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"kjv-dsa\",position=\"0\"} 98\n"
      "dsinfer:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"kjv-dsa\",position=\"1\"} 73\n";
  const auto b = dsi::bench::parse_spec_counters(before);
  const auto a = dsi::bench::parse_spec_counters(after);
  ASSERT_TRUE(b.present && a.present);
  EXPECT_DOUBLE_EQ(b.drafts, 10);
  EXPECT_EQ(b.accepted_per_pos, (std::vector<double>{8, 3, 1}));
  EXPECT_EQ(a.accepted_per_pos, (std::vector<double>{98, 73, 21}));
  const auto d = dsi::bench::spec_delta(b, a);
  EXPECT_DOUBLE_EQ(d.drafts, 100);
  EXPECT_DOUBLE_EQ(d.draft_tokens, 300);
  EXPECT_DOUBLE_EQ(d.accepted_tokens, 180);
  EXPECT_EQ(d.accepted_per_pos, (std::vector<double>{90, 70, 20}));
}

TEST(BenchMetrics, NoSpecCountersOrGarbage) {
  const auto none = dsi::bench::parse_spec_counters(
      "dsinfer:num_requests_running 1\n"
      "dsinfer:spec_decode_num_drafts_total{model_name=\"x\"} not-a-number\n"
      "dsinfer:spec_decode_num_accepted_tokens_per_pos_total{position=\"-1\"} 5\n"
      "dsinfer:spec_decode_num_accepted_tokens_per_pos_total{position=\"99999999\"} 5\n"
      "dsinfer:spec_decode_num_accepted_tokens_per_pos_total{position=\"1x\"} 5\n"
      "garbage {\n\n{}\n");
  EXPECT_FALSE(none.present);
  EXPECT_TRUE(none.accepted_per_pos.empty());
}
