// SPDX-License-Identifier: Apache-2.0
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
  std::unique_ptr<Node> star;           // '*': exactly one token
  std::unique_ptr<Node> tail;           // '>': one or more tokens, always a leaf
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
  if (auto it = node.literal.find(tokens[i]); it != node.literal.end())
    collect(*it->second, tokens, i + 1, out);
  if (node.star) collect(*node.star, tokens, i + 1, out);
}

}  // namespace

SubscriptionIndex::SubscriptionIndex() : root_(std::make_unique<Node>()) {}
SubscriptionIndex::~SubscriptionIndex() = default;

Subscriber SubscriptionIndex::add(std::string_view pattern, Subscriber s, std::string_view group) {
  std::vector<std::string_view> tokens;
  tokenize(pattern, tokens);
  std::unique_lock lock(mutex_);
  s.group = 0;
  if (!group.empty()) {
    auto it = groups_.find(group);
    if (it == groups_.end()) {
      it = groups_.emplace(std::string(group), GroupName{next_group_++, 0}).first;
      group_names_.emplace(it->second.id, it->first);
    }
    ++it->second.members;
    s.group = it->second.id;
  }
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
  return s;
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
  if (s.group != 0) {
    auto name = group_names_.find(s.group);
    auto it = groups_.find(name->second);
    if (--it->second.members == 0) {
      groups_.erase(it);
      group_names_.erase(name);
    }
  }
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

void SubscriptionIndex::match(std::string_view subject, Match& out, std::uint32_t seed) const {
  out.clear();
  match(subject, out.plain);
  // Move group members out of `plain`, gathered per group id; stable, so
  // member order (and with it the round robin) follows subscription order.
  auto grouped = std::stable_partition(out.plain.begin(), out.plain.end(),
                                       [](const Subscriber& s) { return s.group == 0; });
  if (grouped == out.plain.end()) return;
  std::vector<Subscriber> members(grouped, out.plain.end());
  out.plain.erase(grouped, out.plain.end());
  std::stable_sort(members.begin(), members.end(),
                   [](const Subscriber& a, const Subscriber& b) { return a.group < b.group; });
  for (std::size_t i = 0; i < members.size(); ++i) {
    if (i == 0 || members[i].group != members[i - 1].group) {
      out.groups.emplace_back();
      out.next.push_back(seed);
    }
    out.groups.back().push_back(members[i]);
  }
}

std::size_t SubscriptionIndex::size() const {
  std::shared_lock lock(mutex_);
  return count_;
}

Match& MatchCache::match(const SubscriptionIndex& index, std::string_view subject) {
  // Read the generation before matching: a change racing with the match
  // leaves an entry tagged with the old generation, which the next lookup
  // discards.
  const std::uint64_t gen = index.generation();
  auto it = entries_.find(subject);
  if (it != entries_.end() && it->second.generation == gen) {
    ++hits_;
    return it->second.match;
  }
  ++misses_;
  if (it == entries_.end()) {
    if (entries_.size() >= capacity_) entries_.clear();  // bounded: start over
    it = entries_.emplace(std::string(subject), Entry{}).first;
  }
  it->second.generation = gen;
  // A rotating start: entries rebuilt after every subscription change do not
  // all begin with each group's first member.
  index.match(subject, it->second.match, seed_++);
  return it->second.match;
}

}  // namespace rdmabroker::daemon
