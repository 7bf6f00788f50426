// SPDX-License-Identifier: Apache-2.0
// What this broker's own clients subscribe to, as the other brokers of its
// cluster must learn it (docs/cluster.md, SPEC.md §8): one entry per
// distinct (pattern, queue group) of local subscriptions, counted. Each
// route subscribes once per entry at its broker, so a message crosses a
// route only when someone here wants it, and the entry's id says, when it
// comes back, which local subscriptions it is for.
//
// Workers add and remove entries as their clients subscribe and unsubscribe
// (one short lock); the workers' routes (frames/route_frames.hpp) read them.
//
// Entry ids only grow, so "every entry up to id N is in effect at the other
// brokers" is one number (synced()): the routes (cluster/routes.hpp) raise
// it once every route that is up has subscribed to a snapshot's entries and
// its broker answered a PING after that; a worker holds a client's PONG until it covers the
// entries that client's subscriptions use (SPEC.md §8, "Interest in effect").
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace rdmabroker::daemon {

class ClusterInterest {
 public:
  struct Entry {
    std::uint32_t id = 0;
    std::string pattern;
    std::string group;  // empty: plain subscriptions
  };

  /// Called, outside the lock, when an entry appears or goes away.
  void on_change(std::function<void()> notify) { notify_ = std::move(notify); }
  /// A local subscription to `pattern` in queue group `group` (empty: none)
  /// begins; returns its entry's id (never 0). A new entry stays out of
  /// snapshots (the other brokers do not hear of it) until activate(): a
  /// message they send for it must find the subscription in the index.
  std::uint32_t acquire(std::string_view pattern, std::string_view group);
  /// The subscription that acquire() returned `id` for is in the index (or
  /// its channel): the entry is announced to the other brokers if it was not.
  void activate(std::uint32_t id);
  /// One ended (the id acquire() returned).
  void release(std::uint32_t id);
  struct Snapshot {
    std::vector<Entry> entries;  // every entry now
    std::uint32_t through = 0;   // every entry up to this id is in `entries` or gone (none pending)
  };
  Snapshot snapshot() const;
  /// snapshot().through, without the entries.
  std::uint32_t through() const;
  /// Every entry up to `through` is in effect at every route that is up.
  void set_synced(std::uint32_t through) { synced_.store(through, std::memory_order_release); }
  std::uint32_t synced() const { return synced_.load(std::memory_order_acquire); }
  std::size_t size() const;

 private:
  struct Counted {
    Entry entry;
    std::size_t subscriptions = 0;
    bool active = false;  // announced: some subscription of it is in the index
  };
  mutable std::mutex mu_;
  std::map<std::pair<std::string, std::string>, std::uint32_t> by_key_;  // guarded by mu_
  std::unordered_map<std::uint32_t, Counted> by_id_;                     // guarded by mu_
  std::uint32_t next_id_ = 1;                                            // guarded by mu_
  std::function<void()> notify_;                                         // set before any worker runs
  std::atomic<std::uint32_t> synced_{0};
};

}  // namespace rdmabroker::daemon
