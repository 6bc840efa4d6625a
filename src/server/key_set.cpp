// KeySet (key_set.h): a persistent treap of strings.
#include "server/key_set.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <random>

namespace dsi::server {

namespace {
// Seeds a thread's generator of priorities: std::random_device (the time and a stack address where
// it has no source, which a prompt can guess no better).
uint64_t entropy() {
  try {
    std::random_device device;
    return uint64_t(device()) << 32 ^ device();
  } catch (...) {
    const int here = 0;
    return uint64_t(std::chrono::steady_clock::now().time_since_epoch().count()) ^
           uint64_t(reinterpret_cast<uintptr_t>(&here));
  }
}
}  // namespace

uint64_t KeySet::random_priority() {
  // splitmix64: a generator per thread (the constraints step on the engine's threads, their
  // copies on others), seeded at its first key.
  thread_local uint64_t state = entropy();
  uint64_t z = state += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

KeySet::Node::~Node() {
  // The subtrees that only nodes being dropped hold are taken out of them before they go, so each
  // node's destructor finds its children gone or still held elsewhere (then it only lets go of
  // them): no destructor runs inside another's. (Nodes are made non-const, so taking out of them is
  // allowed; a count of 1 is this thread's own reference, and the fence orders the other owners'
  // reads of the node before the taking, as the count's last decrement does.)
  std::vector<Ptr> last;
  auto take = [&last](Ptr& p) {
    if (p != nullptr && p.use_count() == 1) last.push_back(std::move(p));
  };
  take(left);
  take(right);
  while (!last.empty()) {
    Ptr p = std::move(last.back());
    last.pop_back();
    std::atomic_thread_fence(std::memory_order_acquire);
    Node& n = const_cast<Node&>(*p);
    take(n.left);
    take(n.right);
  }
}

bool KeySet::contains(std::string_view key) const {
  for (const Node* n = root_.get(); n != nullptr;) {
    const int c = key.compare(*n->key);
    if (c == 0) return true;
    n = c < 0 ? n->left.get() : n->right.get();
  }
  return false;
}

bool KeySet::insert(std::string&& key, uint64_t priority) {
  // The new node goes where the path to the key first meets a lower priority (or ends): the nodes
  // above keep their places (copied down to it), and the subtree there is split by the key, its
  // nodes less than it to the new node's left, the others to its right (each side a path of that
  // subtree, copied). The key met on either walk is there already, and nothing is made.
  std::vector<std::pair<const Node*, bool>> above;  // and whether the key goes to its left
  const Node* n = root_.get();
  for (; n != nullptr && n->priority >= priority; n = above.back().second ? n->left.get() : n->right.get()) {
    const int c = std::string_view(key).compare(*n->key);
    if (c == 0) return false;
    above.emplace_back(n, c < 0);
  }
  std::vector<const Node*> less, more;  // the split's two paths, top down
  for (const Node* m = n; m != nullptr;) {
    const int c = std::string_view(key).compare(*m->key);
    if (c == 0) return false;
    if (c > 0) less.push_back(m), m = m->right.get();
    else more.push_back(m), m = m->left.get();
  }
  Ptr left, right;
  for (size_t i = less.size(); i-- > 0;)
    left = std::make_shared<Node>(less[i]->key, less[i]->priority, less[i]->left, std::move(left));
  for (size_t i = more.size(); i-- > 0;)
    right = std::make_shared<Node>(more[i]->key, more[i]->priority, std::move(right), more[i]->right);
  Ptr node = std::make_shared<Node>(std::make_shared<const std::string>(std::move(key)), priority, std::move(left),
                                    std::move(right));
  for (size_t i = above.size(); i-- > 0;) {
    const auto [p, to_left] = above[i];
    node = std::make_shared<Node>(p->key, p->priority, to_left ? std::move(node) : p->left,
                                  to_left ? p->right : std::move(node));
  }
  root_ = std::move(node);
  return true;
}

size_t KeySet::height() const {
  size_t height = 0;
  std::vector<std::pair<const Node*, size_t>> todo;
  if (root_ != nullptr) todo.emplace_back(root_.get(), 1);
  while (!todo.empty()) {
    const auto [n, depth] = todo.back();
    todo.pop_back();
    height = std::max(height, depth);
    for (const Node* c : {n->left.get(), n->right.get()})
      if (c != nullptr) todo.emplace_back(c, depth + 1);
  }
  return height;
}

}  // namespace dsi::server
