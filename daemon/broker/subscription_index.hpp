// Which connections subscribe to which subjects. A token trie: a subscription
// pattern's tokens are edges; '*' and '>' have their own edges (docs/subjects.md).
// Shared by all workers: subscribe/unsubscribe take the lock exclusively and
// bump the generation; each worker keeps a MatchCache of recent results that
// it reuses without any lock while the generation is unchanged.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace rdmabroker::daemon {

struct Subscriber {
  std::uint32_t worker = 0;        // index of the worker that owns the connection
  std::uint64_t connection = 0;    // broker-wide connection id
  std::uint32_t sid = 0;           // the client's subscription id
  std::uint32_t slot = 0;          // the connection's ConnectionSlots slot
  bool operator==(const Subscriber&) const = default;
};

class SubscriptionIndex {
 public:
  SubscriptionIndex();
  ~SubscriptionIndex();

  /// `pattern` is a valid subscription subject (proto::valid_pattern).
  void add(std::string_view pattern, const Subscriber& s);
  /// Removes one subscription; returns false if it was not there.
  bool remove(std::string_view pattern, const Subscriber& s);
  /// Every subscriber whose pattern matches the (wildcard-free) subject,
  /// appended to `out` (cleared first).
  void match(std::string_view subject, std::vector<Subscriber>& out) const;
  std::size_t size() const;
  /// Changes with every add and remove: cached matches of an older generation are stale.
  std::uint64_t generation() const { return generation_.load(std::memory_order_acquire); }

  struct Node;  // a trie node (defined in the .cpp)

 private:
  mutable std::shared_mutex mutex_;
  std::unique_ptr<Node> root_;  // guarded by mutex_
  std::size_t count_ = 0;       // guarded by mutex_
  std::atomic<std::uint64_t> generation_{0};
};

/// A worker's bounded cache of match results (one owner thread, no locks).
class MatchCache {
 public:
  explicit MatchCache(std::size_t capacity = 4096) : capacity_(capacity) {}
  /// The subscribers of `subject`, from the cache while the index generation
  /// is unchanged, else from the index (and remembered).
  const std::vector<Subscriber>& match(const SubscriptionIndex& index, std::string_view subject);
  std::uint64_t hits() const { return hits_; }
  std::uint64_t misses() const { return misses_; }

 private:
  struct Hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  struct Entry {
    std::uint64_t generation = 0;
    std::vector<Subscriber> subscribers;
  };
  std::size_t capacity_;
  std::unordered_map<std::string, Entry, Hash, std::equal_to<>> entries_;
  std::uint64_t hits_ = 0;
  std::uint64_t misses_ = 0;
};

}  // namespace rdmabroker::daemon
