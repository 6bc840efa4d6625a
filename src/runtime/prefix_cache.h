// The KV pool's page ids and the prefix cache over them: which pages are free, which requests hold
// them, and which hold full blocks of computed tokens that a later request starting with the same
// tokens can take instead of computing them again (automatic prefix caching). The cache keeps
// blocks after their requests end, and requests running side by side share them.
//
// A block is `block_pages` pages on every rank: the tokens [b B, (b + 1) B) of a sequence, B =
// block_tokens (64 W under DCP; more when the DCP interleave does not divide 64, so that a block is
// whole pages on every rank). A block's key is the cache entry of the block before it (entry ids
// are never reused: a block matches only behind the same prefix), its B tokens and the token after
// them, since the MTP layer's cache entry at the block's last position was made with that token.
// Keys compare whole, so a hash collision cannot hand out another prefix's pages.
//
// Pages are reference counted. A cached block that no request holds is evictable, the least
// recently released first (a request's blocks are released tail first); allocation takes free
// pages, then evicts. Pure bookkeeping, deterministic: every process of a multi-process run makes
// the same calls and gets the same pages.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <unordered_map>
#include <vector>

namespace dsi {

class PrefixCache {
 public:
  // `enabled` false: a plain page allocator (match finds nothing, insert keeps nothing).
  PrefixCache(int64_t n_pages, int64_t block_pages, int64_t block_tokens, bool enabled);
  ~PrefixCache();
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  bool enabled() const { return enabled_; }
  int64_t block_pages() const { return block_pages_; }
  int64_t block_tokens() const { return block_tokens_; }
  int64_t n_pages() const { return int64_t(refs_.size()); }
  // Pages an allocation can get: free ones and those of evictable blocks.
  int64_t available() const { return int64_t(free_.size()) + evictable_pages_; }
  // Pages of cached blocks that no request holds.
  int64_t evictable_pages() const { return evictable_pages_; }
  int64_t cached_blocks() const { return int64_t(entries_.size()); }

  // Appends n pages to `pages` (each held once), evicting cached blocks if free pages run short;
  // false (and nothing appended) when fewer than n are available.
  bool allocate(int64_t n, std::vector<int32_t>& pages);
  // Drops one hold of each page (last page first) and clears `pages`. A page of a cached block
  // that nobody holds any more becomes evictable; any other becomes free.
  void release(std::vector<int32_t>& pages);

  struct Match {
    int64_t tokens = 0;  // leading tokens whose blocks were found (a multiple of block_tokens)
    uint64_t last = 0;   // the entry of the last block found (0: none)
  };
  // The longest chain of cached blocks that `tokens` [0, n) starts with, covering at most
  // `max_tokens` tokens (a block also needs the token after it among the n). Their pages are
  // appended to `pages`, held once more each.
  Match match(const int32_t* tokens, int64_t n, int64_t max_tokens, std::vector<int32_t>& pages);
  // Caches the block behind entry `parent` (0: the sequence's first block) whose block_tokens
  // tokens and the one after them are `tokens`, stored in `pages` (block_pages of them, held by
  // the caller). Returns the entry that now keys this block: the same block cached before keeps
  // its own pages (the caller's stay private), else the caller's pages join the cache.
  uint64_t insert(uint64_t parent, const int32_t* tokens, const int32_t* pages);

 private:
  struct Key {
    uint64_t parent = 0;
    std::vector<int32_t> tokens;  // block_tokens + 1
    bool operator==(const Key& o) const { return parent == o.parent && tokens == o.tokens; }
  };
  struct KeyHash {
    size_t operator()(const Key& k) const;
  };
  struct Entry {
    uint64_t id = 0;
    Key key;
    std::vector<int32_t> pages;
    bool evictable = false;             // nobody holds its pages: it is in lru_
    std::list<uint64_t>::iterator lru;  // where, while evictable
  };

  void evict_one();  // the least recently released evictable block: its pages become free

  int64_t block_pages_, block_tokens_;
  bool enabled_;
  std::vector<int32_t> refs_;       // [page]: holders
  std::vector<uint64_t> entry_of_;  // [page]: the cached block it belongs to (0: none)
  std::vector<int32_t> free_;       // free page ids (a stack)
  std::unordered_map<Key, uint64_t, KeyHash> index_;
  std::unordered_map<uint64_t, Entry> entries_;
  std::list<uint64_t> lru_;  // evictable entries, least recently released first
  int64_t evictable_pages_ = 0;
  uint64_t next_id_ = 1;
};

}  // namespace dsi
