// SPDX-License-Identifier: Apache-2.0
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
  std::uint32_t worker = 0;      // index of the worker that owns the connection
  std::uint64_t connection = 0;  // broker-wide connection id
  std::uint32_t sid = 0;         // the client's subscription id
  std::uint32_t slot = 0;        // the connection's ConnectionSlots slot
  std::uint32_t group = 0;       // queue group id (SubscriptionIndex::add), 0: none
  /// The ClusterInterest entry of a local client's subscription (0: no
  /// cluster): a message a route brings for that entry is for it.
  std::uint32_t interest = 0;
  /// A route's subscription (another broker of the cluster, SPEC.md §8): it is
  /// sent only what local clients publish, and a queue group's route members
  /// only when no local member matches.
  bool route = false;
  bool operator==(const Subscriber&) const = default;
};

/// The subscribers of one subject, as routing uses them: every plain
/// subscriber gets each message; each queue group gets it once, through one
/// member (pick()).
struct Match {
  std::vector<Subscriber> plain;
  std::vector<std::vector<Subscriber>> groups;  // members of each matching group
  std::vector<std::uint32_t> next;              // per group: the round-robin position

  bool empty() const { return plain.empty() && groups.empty(); }
  /// Messages one publish turns into: one per plain subscriber and per group.
  std::size_t fanout() const { return plain.size() + groups.size(); }
  /// Group g's next member in round-robin order.
  const Subscriber& pick(std::size_t g) {
    const auto& members = groups[g];
    return members[next[g]++ % members.size()];
  }
  void clear() {
    plain.clear();
    groups.clear();
    next.clear();
  }
};

class SubscriptionIndex {
 public:
  SubscriptionIndex();
  ~SubscriptionIndex();

  /// `pattern` is a valid subscription subject (proto::valid_pattern);
  /// `group` a queue group name, or empty. Returns the subscriber as stored
  /// (with its group id): pass that to remove().
  Subscriber add(std::string_view pattern, Subscriber s, std::string_view group = {});
  /// Removes one subscription; returns false if it was not there.
  bool remove(std::string_view pattern, const Subscriber& s);
  /// Every subscriber whose pattern matches the (wildcard-free) subject, queue
  /// group members included, into `out` (cleared first).
  void match(std::string_view subject, std::vector<Subscriber>& out) const;
  /// The same, with queue group members gathered per group (a group is one
  /// name across all patterns, as in NATS). Round-robin positions start at `seed`.
  void match(std::string_view subject, Match& out, std::uint32_t seed = 0) const;
  std::size_t size() const;
  /// Changes with every add and remove: cached matches of an older generation are stale.
  std::uint64_t generation() const { return generation_.load(std::memory_order_acquire); }

  struct Node;  // a trie node (defined in the .cpp)

 private:
  struct GroupName {
    std::uint32_t id = 0;
    std::size_t members = 0;
  };
  struct Hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };

  mutable std::shared_mutex mutex_;
  std::unique_ptr<Node> root_;  // guarded by mutex_
  std::size_t count_ = 0;       // guarded by mutex_
  // Queue group names interned to ids while they have members; guarded by mutex_.
  std::unordered_map<std::string, GroupName, Hash, std::equal_to<>> groups_;
  std::unordered_map<std::uint32_t, std::string> group_names_;
  std::uint32_t next_group_ = 1;
  std::atomic<std::uint64_t> generation_{0};
};

/// A worker's bounded cache of match results (one owner thread, no locks).
class MatchCache {
 public:
  explicit MatchCache(std::size_t capacity = 4096) : capacity_(capacity) {}
  /// The subscribers of `subject`, from the cache while the index generation
  /// is unchanged, else from the index (and remembered). Mutable: pick()
  /// advances the queue groups' round-robin positions.
  Match& match(const SubscriptionIndex& index, std::string_view subject);
  std::uint64_t hits() const { return hits_; }
  std::uint64_t misses() const { return misses_; }

 private:
  struct Hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  struct Entry {
    std::uint64_t generation = 0;
    Match match;
  };
  std::size_t capacity_;
  std::unordered_map<std::string, Entry, Hash, std::equal_to<>> entries_;
  std::uint64_t hits_ = 0;
  std::uint64_t misses_ = 0;
  std::uint32_t seed_ = 0;  // rotates where a fresh entry's round robin starts
};

}  // namespace rdmabroker::daemon
