// KeySet: the keys written in a JSON object, for the recognizers that write each key at most once
// in its object (JSON mode's JsonPrefix, constraints.h; structured outputs' SchemaPrefix,
// json_schema.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dsi::server {

// The keys written in a JSON object: a set of strings that is never changed in place, only copied
// along the path to a new key (a persistent treap), so a copy costs one shared pointer and copies
// share all but the paths they wrote since. Ordered by text (no unseeded hash for a prompt to
// aim at: keys asked for in the order of std::hash made a tree by it a list), and heap-ordered by
// a priority drawn at random for each key as it comes (a generator per thread, seeded from
// std::random_device), none of the key's text: however the keys are chosen and ordered, the tree
// is as deep as a random one, O(log n) with high probability, so a key is found or added in
// O(log n) comparisons, each at most its length. A node's text is shared by its copies: a new
// path copies pointers, where a long key near the root copied with every later key would cost the
// square of the answer's length.
class KeySet {
 public:
  bool empty() const { return root_ == nullptr; }
  bool contains(std::string_view key) const;
  // Adds key: false (and the set unchanged) where it has it already. The priority decides the
  // key's place in the heap (the highest is the root); equal ones are allowed (tests).
  // (key is moved from only where it is added.)
  bool insert(std::string&& key) { return insert(std::move(key), random_priority()); }
  bool insert(std::string&& key, uint64_t priority);
  // f(key) for each key in order of text (the order the keys decide, not the one they came in),
  // skipping those longer than max_size.
  template <class F>
  void for_each(F&& f, size_t max_size = SIZE_MAX) const;
  // f(key) for each key that starts with prefix, in order of text (they lie together in it: found
  // in O(log n + the keys) steps), key a std::string held by the set's nodes (it lives as long as
  // a copy of the set holds them).
  template <class F>
  void for_each_prefixed(std::string_view prefix, F&& f) const;
  size_t height() const;  // the nodes on the longest path from the root (tests)

 private:
  struct Node;
  using Ptr = std::shared_ptr<const Node>;
  struct Node {
    Node(std::shared_ptr<const std::string> k, uint64_t p, Ptr l, Ptr r)
        : key(std::move(k)), priority(p), left(std::move(l)), right(std::move(r)) {}
    std::shared_ptr<const std::string> key;
    uint64_t priority;
    Ptr left, right;
    // Drops the subtrees this node held last without recursion: a tree is as deep as its keys'
    // priorities make it, and its destruction must never be what runs the stack out.
    ~Node();
  };
  static uint64_t random_priority();
  Ptr root_;
};

template <class F>
void KeySet::for_each(F&& f, size_t max_size) const {
  std::vector<const Node*> path;
  for (const Node* n = root_.get(); n != nullptr || !path.empty(); n = n->right.get()) {
    for (; n != nullptr; n = n->left.get()) path.push_back(n);
    n = path.back();
    path.pop_back();
    if (n->key->size() <= max_size) f(std::string_view(*n->key));
  }
}

template <class F>
void KeySet::for_each_prefixed(std::string_view prefix, F&& f) const {
  // The path to the first key not less than prefix: the nodes where it went left, still to come.
  std::vector<const Node*> path;
  for (const Node* n = root_.get(); n != nullptr;) {
    if (std::string_view(*n->key) < prefix) {
      n = n->right.get();
    } else {
      path.push_back(n);
      n = n->left.get();
    }
  }
  while (!path.empty()) {
    const Node* n = path.back();
    path.pop_back();
    if (!std::string_view(*n->key).starts_with(prefix)) return;  // (and none after it)
    f(static_cast<const std::string&>(*n->key));
    for (const Node* m = n->right.get(); m != nullptr; m = m->left.get()) path.push_back(m);
  }
}

}  // namespace dsi::server
