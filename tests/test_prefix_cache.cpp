// The prefix cache's bookkeeping (runtime/prefix_cache.h) and the scheduler's use of it: blocks
// match only behind the same prefix and with the same next token, pages are shared and reference
// counted, evicted least recently released first, never while held; the scheduler admits a
// sequence from its cached blocks, caches blocks only once their entries are final, and sizes
// blocks so that they are whole pages on every DCP rank.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>

#include "dsinfer/error.h"
#include "runtime/prefix_cache.h"
#include "runtime/scheduler.h"

namespace dsi {
namespace {

std::vector<int32_t> iota_tokens(int64_t n, int32_t first) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), first);
  return t;
}

// Caches the leading blocks of `tokens` held in `pages` (one page a block), as a sequence does.
uint64_t insert_blocks(PrefixCache& c, const std::vector<int32_t>& tokens,
                       const std::vector<int32_t>& pages, int64_t blocks) {
  uint64_t last = 0;
  for (int64_t b = 0; b < blocks; ++b)
    last = c.insert(last, tokens.data() + b * c.block_tokens(), pages.data() + b * c.block_pages());
  return last;
}

TEST(PrefixCache, MatchesOnlyTheSamePrefixAndNextToken) {
  PrefixCache c(10, 1, 4, true);
  const std::vector<int32_t> a = iota_tokens(13, 100);  // 3 blocks of 4 and 1 more token
  std::vector<int32_t> pa;
  ASSERT_TRUE(c.allocate(4, pa));
  insert_blocks(c, a, pa, 3);
  EXPECT_EQ(c.cached_blocks(), 3);

  std::vector<int32_t> got;
  PrefixCache::Match m = c.match(a.data(), 13, 100, got);  // the whole chain
  EXPECT_EQ(m.tokens, 12);
  EXPECT_EQ(got, std::vector<int32_t>(pa.begin(), pa.begin() + 3));
  c.release(got);

  m = c.match(a.data(), 12, 100, got);  // block 2 lacks its next token
  EXPECT_EQ(m.tokens, 8);
  c.release(got);
  m = c.match(a.data(), 13, 11, got);  // at most 11 tokens
  EXPECT_EQ(m.tokens, 8);
  c.release(got);

  std::vector<int32_t> b = a;
  b[4] = 7;  // block 1 differs: block 0 still matches (its next token, 104, is different too)
  m = c.match(b.data(), 13, 100, got);
  EXPECT_EQ(m.tokens, 0) << "block 0's next token differs";
  b = a;
  b[5] = 7;
  m = c.match(b.data(), 13, 100, got);
  EXPECT_EQ(m.tokens, 4);
  c.release(got);
  b = a;
  b[0] = 7;  // a different first block: the same later blocks do not match behind it
  m = c.match(b.data(), 13, 100, got);
  EXPECT_EQ(m.tokens, 0);
  EXPECT_TRUE(got.empty());

  PrefixCache off(10, 1, 4, false);
  std::vector<int32_t> po;
  ASSERT_TRUE(off.allocate(3, po));
  EXPECT_EQ(insert_blocks(off, a, po, 3), 0u);
  EXPECT_EQ(off.match(a.data(), 13, 100, got).tokens, 0);
  off.release(po);
  EXPECT_EQ(off.available(), 10);
}

TEST(PrefixCache, SharedPagesAreHeldUntilTheLastHolderReleases) {
  PrefixCache c(6, 2, 8, true);  // blocks of 2 pages
  const std::vector<int32_t> t = iota_tokens(17, 1);
  std::vector<int32_t> owner;
  ASSERT_TRUE(c.allocate(5, owner));  // two blocks and a partial page
  insert_blocks(c, t, owner, 2);
  EXPECT_EQ(c.available(), 1);
  std::vector<int32_t> other;
  EXPECT_EQ(c.match(t.data(), 17, 17, other).tokens, 16);
  EXPECT_EQ(other, std::vector<int32_t>(owner.begin(), owner.begin() + 4));
  c.release(owner);  // the partial page is free, the blocks are still held by `other`
  EXPECT_EQ(c.available(), 2);
  EXPECT_EQ(c.evictable_pages(), 0);
  std::vector<int32_t> more;
  EXPECT_FALSE(c.allocate(3, more)) << "held blocks are not evicted";
  EXPECT_TRUE(more.empty());
  c.release(other);
  EXPECT_EQ(c.evictable_pages(), 4);
  EXPECT_EQ(c.available(), 6);
  ASSERT_TRUE(c.allocate(6, more));  // evicts both blocks
  EXPECT_EQ(c.cached_blocks(), 0);
  EXPECT_EQ(std::set<int32_t>(more.begin(), more.end()).size(), 6u);
  std::vector<int32_t> none;
  EXPECT_EQ(c.match(t.data(), 17, 17, none).tokens, 0);
  c.release(more);
  std::vector<int32_t> twice = {0, 0};
  EXPECT_THROW(c.release(twice), Error);  // a page nobody holds
}

TEST(PrefixCache, EvictsTheLeastRecentlyReleasedTailFirst) {
  PrefixCache c(4, 1, 2, true);
  const std::vector<int32_t> a = iota_tokens(5, 10), b = iota_tokens(5, 50);
  std::vector<int32_t> pa, pb;
  ASSERT_TRUE(c.allocate(2, pa));
  ASSERT_TRUE(c.allocate(2, pb));
  insert_blocks(c, a, pa, 2);
  insert_blocks(c, b, pb, 2);
  const std::vector<int32_t> pa0 = pa, pb0 = pb;
  c.release(pa);  // a's blocks first (its tail first), then b's
  c.release(pb);
  std::vector<int32_t> one;
  ASSERT_TRUE(c.allocate(1, one));
  EXPECT_EQ(one[0], pa0[1]) << "a's tail block goes first";
  std::vector<int32_t> got;
  EXPECT_EQ(c.match(a.data(), 5, 5, got).tokens, 2);  // a's first block is still there
  EXPECT_EQ(c.match(b.data(), 5, 5, got).tokens, 4);
  // Matching took a's first block and b's blocks back: only what is left can be evicted.
  std::vector<int32_t> more;
  EXPECT_FALSE(c.allocate(1, more));
  c.release(got);
  c.release(one);
  EXPECT_EQ(c.available(), 4);
}

TEST(PrefixCache, TheSameBlockCachedTwiceKeepsTheFirstPages) {
  PrefixCache c(4, 1, 2, true);
  const std::vector<int32_t> t = iota_tokens(3, 5);
  std::vector<int32_t> p1, p2;
  ASSERT_TRUE(c.allocate(1, p1));
  ASSERT_TRUE(c.allocate(1, p2));
  const uint64_t e1 = c.insert(0, t.data(), p1.data());
  EXPECT_EQ(c.insert(0, t.data(), p2.data()), e1);
  EXPECT_EQ(c.cached_blocks(), 1);
  c.release(p2);  // private: free at once
  EXPECT_EQ(c.available(), 3);
  EXPECT_EQ(c.evictable_pages(), 0);
  std::vector<int32_t> got;
  EXPECT_EQ(c.match(t.data(), 3, 3, got).tokens, 2);
  EXPECT_EQ(got, p1);
  c.release(got);
  c.release(p1);
  EXPECT_EQ(c.evictable_pages(), 1);
}

// A sequence as the engine keeps it for the scheduler.
struct Seq {
  std::vector<int32_t> tokens;
  SchedSeq s;
  Seq(uint64_t id, std::vector<int32_t> t) : tokens(std::move(t)) {
    s.id = id;
    s.n_tokens = int64_t(tokens.size());
    s.tokens = &tokens;
  }
  // The engine's bookkeeping after a step computed `n` rows of a prefill.
  void computed(int64_t n) { s.computed += n; }
  void generate(int32_t tok) {
    tokens.push_back(tok);
    s.n_tokens = int64_t(tokens.size());
    ++s.n_generated;
  }
};

SchedulerConfig config(int speculative_tokens = 0) {
  SchedulerConfig cfg;
  cfg.max_num_batched_tokens = 1000;
  cfg.speculative_tokens = speculative_tokens;
  cfg.n_pages = 20;
  return cfg;
}

StepPlan plan(Scheduler& sc) {
  return sc.schedule([](const SchedSeq&) { return int64_t(0); });
}

TEST(PrefixCacheScheduler, AdmitsFromCachedBlocksAndCachesFinishedOnes) {
  Scheduler sc(config());
  Seq a(1, iota_tokens(200, 0));
  sc.add(&a.s);
  StepPlan p = plan(sc);
  ASSERT_EQ(p.prefill.size(), 1u);
  EXPECT_EQ(p.prefill[0].n, 200);
  EXPECT_EQ(a.s.cache_hit, 0);
  a.computed(200);
  a.generate(7);  // tokens [0, 201): blocks 0..2 are final and have their next token
  p = plan(sc);   // caches them
  EXPECT_EQ(sc.prefix_cache().cached_blocks(), 3);

  // The same prompt: 192 tokens from the cache, 8 computed (at least one always is).
  Seq b(2, iota_tokens(200, 0));
  sc.add(&b.s);
  p = plan(sc);
  ASSERT_EQ(p.prefill.size(), 1u);
  EXPECT_EQ(p.prefill[0].seq, &b.s);
  EXPECT_EQ(b.s.cache_hit, 192);
  EXPECT_EQ(b.s.computed, 192);
  EXPECT_EQ(p.prefill[0].n, 8);
  EXPECT_EQ(std::vector<int32_t>(b.s.pages.begin(), b.s.pages.begin() + 3),
            std::vector<int32_t>(a.s.pages.begin(), a.s.pages.begin() + 3));
  // A prompt of exactly 192: its last block lacks a next token, so two blocks.
  Seq c(3, iota_tokens(192, 0));
  sc.add(&c.s);
  p = plan(sc);
  EXPECT_EQ(c.s.cache_hit, 128);
  EXPECT_EQ(sc.cache_queries(), 200 + 200 + 192);
  EXPECT_EQ(sc.cache_hits(), 192 + 128);

  sc.remove(&a.s);
  sc.remove(&b.s);
  sc.remove(&c.s);
  EXPECT_EQ(sc.used_pages(), 0);
  EXPECT_EQ(sc.prefix_cache().evictable_pages(), 3);
}

// Prompts sharing blocks, queued together (the n choices of a request): the first is admitted, the
// others wait until it has cached the blocks they share and then take them; a prompt sharing
// nothing, or less than a block, is admitted at once past them.
TEST(PrefixCacheScheduler, PromptsQueuedTogetherShareTheBlocksOneComputes) {
  Scheduler sc(config());
  Seq a(1, iota_tokens(200, 0)), b(2, iota_tokens(200, 0)), c(3, iota_tokens(100, 500));
  Seq d(4, iota_tokens(150, 0)), e(5, iota_tokens(40, 0));
  for (Seq* q : {&a, &b, &c, &d, &e}) sc.add(&q->s);
  StepPlan p = plan(sc);
  std::vector<SchedSeq*> admitted;
  for (const auto& r : p.prefill) admitted.push_back(r.seq);
  EXPECT_EQ(admitted, (std::vector<SchedSeq*>{&a.s, &c.s, &e.s})) << "b and d wait for a's blocks";
  for (Seq* q : {&a, &c, &e}) {  // prefilled, and their first token sampled
    q->computed(q->s.n_tokens);
    q->generate(7);
  }
  p = plan(sc);
  EXPECT_EQ(p.decode.size(), 3u);
  ASSERT_EQ(p.prefill.size(), 2u);
  EXPECT_EQ(p.prefill[0].seq, &b.s);
  EXPECT_EQ(b.s.cache_hit, 192);
  EXPECT_EQ(p.prefill[1].seq, &d.s);
  EXPECT_EQ(d.s.cache_hit, 128);
  EXPECT_EQ(std::vector<int32_t>(b.s.pages.begin(), b.s.pages.begin() + 3),
            std::vector<int32_t>(a.s.pages.begin(), a.s.pages.begin() + 3));
  for (Seq* q : {&a, &b, &c, &d, &e}) sc.remove(&q->s);

  // Without the cache nobody waits.
  SchedulerConfig off = config();
  off.prefix_caching = false;
  Scheduler plain(off);
  Seq f(6, iota_tokens(200, 0)), g(7, iota_tokens(200, 0));
  plain.add(&f.s);
  plain.add(&g.s);
  EXPECT_EQ(plan(plain).prefill.size(), 2u);
}

TEST(PrefixCacheScheduler, WithSpeculationBlocksWaitForTheirMtpEntries) {
  Scheduler sc(config(2));
  Seq a(1, iota_tokens(150, 0));
  sc.add(&a.s);
  plan(sc);
  a.computed(150);
  a.generate(1);
  plan(sc);
  EXPECT_EQ(sc.prefix_cache().cached_blocks(), 0) << "no MTP entries yet";
  a.s.mtp_computed = 100;  // the drafter consumed the first 100 rows
  plan(sc);
  EXPECT_EQ(sc.prefix_cache().cached_blocks(), 1);
  a.s.mtp_computed = 150;
  plan(sc);
  EXPECT_EQ(sc.prefix_cache().cached_blocks(), 2);
}

TEST(PrefixCacheScheduler, ARecomputedSequenceResumesAsAPrefill) {
  // A preempted sequence that had generated tokens takes its own blocks back but recomputes at
  // least its last two tokens, so it samples from a prefill row again.
  Scheduler sc(config());
  Seq a(1, iota_tokens(128, 0));
  sc.add(&a.s);
  plan(sc);
  a.computed(128);
  a.generate(128);
  a.s.computed = 128;  // decoding: all but the newest token cached
  a.generate(129);     // 130 tokens, 129 of them computed after the next decode round
  a.s.computed = 129;
  ASSERT_TRUE(a.s.decoding());
  StepPlan p;
  // Preempt it by hand, as a full cache would: its blocks join the cache on the way out.
  sc.remove(&a.s);
  a.s.computed = 0;
  sc.add(&a.s);
  p = plan(sc);
  ASSERT_EQ(p.prefill.size(), 1u);
  EXPECT_EQ(a.s.cache_hit, 128);
  EXPECT_EQ(p.prefill[0].n, 2);
  EXPECT_FALSE(a.s.decoding());
}

TEST(PrefixCacheScheduler, BlocksAreWholePagesOnEveryDcpRank) {
  struct L {
    int w, interleave;
    int64_t block_pages, block_tokens;
  };
  for (const L& l : {L{1, 1, 1, 64}, L{2, 1, 1, 128}, L{4, 2, 1, 256}, L{2, 3, 3, 384}, L{4, 48, 3, 768}}) {
    SchedulerConfig cfg;
    cfg.n_pages = 30;
    cfg.dcp = DcpLayout{l.w, 0, l.interleave};
    Scheduler sc(cfg);
    EXPECT_EQ(sc.prefix_cache().block_pages(), l.block_pages) << l.w << " " << l.interleave;
    EXPECT_EQ(sc.prefix_cache().block_tokens(), l.block_tokens) << l.w << " " << l.interleave;
    // The block's tokens are exactly the first block_pages pages of every rank of the group.
    for (int r = 0; r < l.w; ++r) {
      const DcpLayout d{l.w, r, l.interleave};
      EXPECT_EQ(d.local_len(l.block_tokens), l.block_pages * 64) << "rank " << r;
    }
  }
}

}  // namespace
}  // namespace dsi
