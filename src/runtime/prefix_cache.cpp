// Page allocation and the prefix cache; see prefix_cache.h.
#include "runtime/prefix_cache.h"

#include <algorithm>

#include "dsinfer/error.h"

namespace dsi {

PrefixCache::PrefixCache(int64_t n_pages, int64_t block_pages, int64_t block_tokens, bool enabled)
    : block_pages_(block_pages), block_tokens_(block_tokens), enabled_(enabled) {
  DSI_CHECK(n_pages >= 0 && n_pages <= INT32_MAX, "prefix cache: {} pages", n_pages);
  DSI_CHECK(block_pages >= 1 && block_tokens >= 1, "prefix cache: blocks of {} pages, {} tokens",
            block_pages, block_tokens);
  refs_.assign(size_t(n_pages), 0);
  entry_of_.assign(size_t(n_pages), 0);
  free_.reserve(size_t(n_pages));
  for (int64_t p = n_pages - 1; p >= 0; --p) free_.push_back(int32_t(p));
}

PrefixCache::~PrefixCache() = default;

size_t PrefixCache::KeyHash::operator()(const Key& k) const {
  uint64_t h = 1469598103934665603ull ^ k.parent;  // FNV-1a over the parent and the tokens
  for (int32_t t : k.tokens) h = (h ^ uint32_t(t)) * 1099511628211ull;
  return size_t(h ^ (h >> 29));
}

bool PrefixCache::allocate(int64_t n, std::vector<int32_t>& pages) {
  if (n <= 0) return true;
  if (n > available()) return false;
  while (int64_t(free_.size()) < n) evict_one();
  for (int64_t i = 0; i < n; ++i) {
    const int32_t p = free_.back();
    free_.pop_back();
    refs_[size_t(p)] = 1;
    pages.push_back(p);
  }
  return true;
}

void PrefixCache::release(std::vector<int32_t>& pages) {
  for (auto it = pages.rbegin(); it != pages.rend(); ++it) {
    const int32_t p = *it;
    DSI_CHECK(p >= 0 && p < n_pages() && refs_[size_t(p)] > 0, "prefix cache: page {} is not held", p);
    if (--refs_[size_t(p)] > 0) continue;
    const uint64_t e = entry_of_[size_t(p)];
    if (e == 0) {
      free_.push_back(p);
      continue;
    }
    Entry& entry = entries_.at(e);
    const bool unheld = std::all_of(entry.pages.begin(), entry.pages.end(),
                                    [&](int32_t q) { return refs_[size_t(q)] == 0; });
    if (unheld && !entry.evictable) {
      entry.evictable = true;
      entry.lru = lru_.insert(lru_.end(), e);
      evictable_pages_ += int64_t(entry.pages.size());
    }
  }
  pages.clear();
}

void PrefixCache::evict_one() {
  DSI_CHECK(!lru_.empty(), "prefix cache: nothing to evict");
  const uint64_t e = lru_.front();
  lru_.pop_front();
  auto it = entries_.find(e);
  Entry& entry = it->second;
  for (int32_t p : entry.pages) {
    entry_of_[size_t(p)] = 0;
    free_.push_back(p);
  }
  evictable_pages_ -= int64_t(entry.pages.size());
  index_.erase(entry.key);
  entries_.erase(it);
}

PrefixCache::Match PrefixCache::match(const int32_t* tokens, int64_t n, int64_t max_tokens,
                                      std::vector<int32_t>& pages) {
  Match m;
  if (!enabled_) return m;
  Key key;
  for (;;) {
    const int64_t end = m.tokens + block_tokens_;
    if (end > max_tokens || end + 1 > n) break;
    key.parent = m.last;
    key.tokens.assign(tokens + m.tokens, tokens + end + 1);
    const auto found = index_.find(key);
    if (found == index_.end()) break;
    Entry& entry = entries_.at(found->second);
    if (entry.evictable) {
      lru_.erase(entry.lru);
      entry.evictable = false;
      evictable_pages_ -= int64_t(entry.pages.size());
    }
    for (int32_t p : entry.pages) {
      ++refs_[size_t(p)];
      pages.push_back(p);
    }
    m.tokens = end;
    m.last = entry.id;
  }
  return m;
}

uint64_t PrefixCache::insert(uint64_t parent, const int32_t* tokens, const int32_t* pages) {
  if (!enabled_) return 0;
  Key key{parent, std::vector<int32_t>(tokens, tokens + block_tokens_ + 1)};
  const auto found = index_.find(key);
  if (found != index_.end()) return found->second;
  for (int64_t i = 0; i < block_pages_; ++i) {
    const int32_t p = pages[i];
    DSI_CHECK(p >= 0 && p < n_pages() && refs_[size_t(p)] > 0 && entry_of_[size_t(p)] == 0,
              "prefix cache: page {} cannot join a cached block", p);
  }
  Entry entry;
  entry.id = next_id_++;
  entry.key = key;
  entry.pages.assign(pages, pages + block_pages_);
  for (int32_t p : entry.pages) entry_of_[size_t(p)] = entry.id;
  index_.emplace(std::move(key), entry.id);
  const uint64_t id = entry.id;
  entries_.emplace(id, std::move(entry));
  return id;
}

}  // namespace dsi
