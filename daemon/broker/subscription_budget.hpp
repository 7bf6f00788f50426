// SPDX-License-Identifier: Apache-2.0
// The broker-wide bound on subscriptions (limits.max_subscriptions_total and
// limits.max_subscription_memory): what all clients together can make the
// broker hold in its subscription index, whatever each connection's own limit
// (limits.max_subscriptions) allows. Every worker takes from it before adding
// a subscription and gives back what it took when the subscription ends, so
// the totals are exact; a refused SUBSCRIBE gets TOO_MANY_SUBSCRIPTIONS and
// holds nothing.
#pragma once

#include <atomic>
#include <cassert>
#include <cstdint>
#include <string_view>

namespace rdmabroker::daemon {

class SubscriptionBudget {
 public:
  /// What one subscription is charged, an upper bound on the heap it costs
  /// the broker: its record in the connection and the index entry, a trie
  /// node per token (when no other subscription shares it: the costliest
  /// shape), and its strings twice (trie tokens and the connection's copy).
  /// Calibrated by tests/bench/idle-rss.sh with SUBS=10000 (docs/benchmarks.md,
  /// "Client state"): 1,271 bytes measured for a 4-token, 28-byte subject
  /// sharing no node, charged 1,336.
  static constexpr std::uint64_t kFixedCost = 256;
  static constexpr std::uint64_t kPerToken = 256;

  static std::uint64_t cost(std::string_view pattern, std::string_view group) {
    std::uint64_t tokens = 1;
    for (char ch : pattern) tokens += ch == '.' ? 1 : 0;
    return kFixedCost + kPerToken * tokens + 2 * pattern.size() + group.size();
  }

  /// `percent` of a broker-wide bound, rounded up: one tenant's quota.
  static std::uint64_t part(std::uint64_t bound, std::uint32_t percent) {
    return (bound * percent + 99) / 100;
  }

  enum class Refusal { kNone, kCount, kMemory };

  /// Any thread. Takes one subscription of `bytes` unless that would pass either bound.
  Refusal take(std::uint64_t bytes, std::uint64_t max_count, std::uint64_t max_bytes) {
    std::uint64_t n = count_.load(std::memory_order_relaxed);
    do {
      if (n + 1 > max_count) return Refusal::kCount;
    } while (!count_.compare_exchange_weak(n, n + 1, std::memory_order_relaxed));
    std::uint64_t b = bytes_.load(std::memory_order_relaxed);
    do {
      if (b + bytes > max_bytes) {
        count_.fetch_sub(1, std::memory_order_relaxed);
        return Refusal::kMemory;
      }
    } while (!bytes_.compare_exchange_weak(b, b + bytes, std::memory_order_relaxed));
    return Refusal::kNone;
  }
  /// Any thread: a subscription that take() admitted has ended.
  void give_back(std::uint64_t bytes) {
    // More given back than taken would wrap the count below zero, and the
    // next take() would find "the limit reached" for every client.
    [[maybe_unused]] const std::uint64_t count = count_.fetch_sub(1, std::memory_order_relaxed);
    [[maybe_unused]] const std::uint64_t held = bytes_.fetch_sub(bytes, std::memory_order_relaxed);
    assert(count > 0 && held >= bytes);
  }
  std::uint64_t count() const { return count_.load(std::memory_order_relaxed); }
  std::uint64_t bytes() const { return bytes_.load(std::memory_order_relaxed); }

 private:
  std::atomic<std::uint64_t> count_{0};
  std::atomic<std::uint64_t> bytes_{0};
};

}  // namespace rdmabroker::daemon
