#include "broker/subscription_index.hpp"

#include <algorithm>
#include <mutex>

namespace rdmabroker::daemon {

struct SubscriptionIndex::Node {
  struct Hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::unordered_map<std::string, std::unique_ptr<Node>, Hash, std::equal_to<>> literal;
  std::unique_ptr<Node> star;  // '*': exactly one token
  std::unique_ptr<Node> tail;  // '>': one or more tokens, always a leaf
  std::vector<Subscriber> subscribers;  // patterns that end here

  bool empty() const { return literal.empty() && !star && !tail && subscribers.empty(); }
};

namespace {

/// Splits a subject into its tokens (views into it).
void tokenize(std::string_view s, std::vector<std::string_view>& out) {
  out.clear();
  std::size_t start = 0;
  while (true) {
    const std::size_t dot = s.find('.', start);
    if (dot == std::string_view::npos) {
      out.push_back(s.substr(start));
      return;
    }
    out.push_back(s.substr(start, dot - start));
    start = dot + 1;
  }
}

using Node = SubscriptionIndex::Node;

void collect(const Node& node, const std::vector<std::string_view>& tokens, std::size_t i,
             std::vector<Subscriber>& out) {
  if (i == tokens.size()) {
    out.insert(out.end(), node.subscribers.begin(), node.subscribers.end());
    return;
  }
  if (node.tail) out.insert(out.end(), node.tail->subscribers.begin(), node.tail->subscribers.end());
  if (auto it = node.literal.find(tokens[i]); it != node.literal.end()) collect(*it->second, tokens, i + 1, out);
  if (node.star) collect(*node.star, tokens, i + 1, out);
}

}  // namespace

SubscriptionIndex::SubscriptionIndex() : root_(std::make_unique<Node>()) {}
SubscriptionIndex::~SubscriptionIndex() = default;

void SubscriptionIndex::add(std::string_view pattern, const Subscriber& s) {
  std::vector<std::string_view> tokens;
  tokenize(pattern, tokens);
  std::unique_lock lock(mutex_);
  Node* node = root_.get();
  for (std::string_view t : tokens) {
    std::unique_ptr<Node>* next;
    if (t == "*") {
      next = &node->star;
    } else if (t == ">") {
      next = &node->tail;
    } else {
      auto it = node->literal.find(t);
      if (it == node->literal.end()) it = node->literal.emplace(std::string(t), nullptr).first;
      next = &it->second;
    }
    if (!*next) *next = std::make_unique<Node>();
    node = next->get();
  }
  node->subscribers.push_back(s);
  ++count_;
  generation_.fetch_add(1, std::memory_order_release);
}

bool SubscriptionIndex::remove(std::string_view pattern, const Subscriber& s) {
  std::vector<std::string_view> tokens;
  tokenize(pattern, tokens);
  std::unique_lock lock(mutex_);
  // Walk down remembering the path, so empty nodes can be pruned on the way up.
  std::vector<std::pair<Node*, std::string_view>> path;
  Node* node = root_.get();
  for (std::string_view t : tokens) {
    Node* next = nullptr;
    if (t == "*") {
      next = node->star.get();
    } else if (t == ">") {
      next = node->tail.get();
    } else if (auto it = node->literal.find(t); it != node->literal.end()) {
      next = it->second.get();
    }
    if (next == nullptr) return false;
    path.emplace_back(node, t);
    node = next;
  }
  auto pos = std::find(node->subscribers.begin(), node->subscribers.end(), s);
  if (pos == node->subscribers.end()) return false;
  node->subscribers.erase(pos);
  for (auto it = path.rbegin(); it != path.rend() && node->empty(); ++it) {
    auto [parent, t] = *it;
    if (t == "*") {
      parent->star.reset();
    } else if (t == ">") {
      parent->tail.reset();
    } else {
      parent->literal.erase(parent->literal.find(t));
    }
    node = parent;
  }
  --count_;
  generation_.fetch_add(1, std::memory_order_release);
  return true;
}

void SubscriptionIndex::match(std::string_view subject, std::vector<Subscriber>& out) const {
  out.clear();
  std::vector<std::string_view> tokens;
  tokenize(subject, tokens);
  std::shared_lock lock(mutex_);
  collect(*root_, tokens, 0, out);
}

std::size_t SubscriptionIndex::size() const {
  std::shared_lock lock(mutex_);
  return count_;
}

const std::vector<Subscriber>& MatchCache::match(const SubscriptionIndex& index, std::string_view subject) {
  // Read the generation before matching: a change racing with the match
  // leaves an entry tagged with the old generation, which the next lookup
  // discards.
  const std::uint64_t gen = index.generation();
  auto it = entries_.find(subject);
  if (it != entries_.end() && it->second.generation == gen) {
    ++hits_;
    return it->second.subscribers;
  }
  ++misses_;
  if (it == entries_.end()) {
    if (entries_.size() >= capacity_) entries_.clear();  // bounded: start over
    it = entries_.emplace(std::string(subject), Entry{}).first;
  }
  it->second.generation = gen;
  index.match(subject, it->second.subscribers);
  return it->second.subscribers;
}

}  // namespace rdmabroker::daemon
