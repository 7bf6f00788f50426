// SPDX-License-Identifier: Apache-2.0
// Each client's share of the registered buffer pool (docs/security.md,
// "Pool shares"). A message stays in the receive buffer it arrived in until
// every subscriber was sent it, so what a subscriber's out-queue holds is
// counted in pool buffers ("pins"), not only in bytes, and bounded three
// ways: per connection (limits.pool_share_percent), per tenant (a user's
// connections together, or an anonymous address's; limits.
// user_pool_share_percent), and broker-wide (an equal part of the queue
// budget: what the receive queues and the reserve leave of the pool); the
// last two only while the pool runs short. Messages that wait are
// copied compactly into buffers of the subscriber's own (Connections::
// compact), so a slow subscriber of small messages holds a buffer per
// buffer's worth of bytes, not one per message.
//
// The reserve is the part of the pool that only receive-queue refills may
// take: TCP reads, compaction and routes leave it, so that an RDMA client's
// credit returns and control frames always find a posted receive.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "broker/subscription_budget.hpp"

namespace rdmabroker::daemon {

/// What one tenant's connections hold together; shared by them (any worker).
struct TenantUsage {
  std::atomic<std::int64_t> pins{0};
  /// Its subscriptions, within limits.user_subscription_share_percent of
  /// the broker-wide subscription bounds.
  SubscriptionBudget subscriptions;
};

/// Which bound a subscriber was cut for (counted by scope).
enum class ShareScope : std::uint8_t { kConnection, kUser, kBroker, kCount };
inline constexpr std::size_t kShareScopeCount = static_cast<std::size_t>(ShareScope::kCount);
constexpr std::string_view to_string(ShareScope s) {
  switch (s) {
    case ShareScope::kConnection:
      return "connection";
    case ShareScope::kUser:
      return "user";
    case ShareScope::kBroker:
      return "broker";
    case ShareScope::kCount:
      break;
  }
  return "unknown";
}

class PoolShares {
 public:
  /// A connection whose out-queue holds this many buffers or more counts as
  /// backlogged: the broker-wide budget is divided among those.
  static constexpr std::int64_t kBacklogPins = 16;

  /// Sizes the reserve and the queue budget for a pool of `count` buffers:
  /// the receive queues may hold half the pool (RdmaPort::create), a
  /// sixteenth is the reserve, the rest is what out-queues may hold.
  void configure(std::uint32_t count) {
    count_ = count;
    reserve_ = std::max<std::uint32_t>(2, count / 16);
    budget_ = std::max<std::int64_t>(1, static_cast<std::int64_t>(count / 2) - reserve_);
  }
  std::uint32_t reserve() const { return reserve_; }
  std::int64_t queue_budget() const { return budget_; }
  /// `percent` of the pool, at least kBacklogPins buffers.
  std::int64_t share(std::uint32_t percent) const {
    if (count_ == 0) return kUnbounded;
    return std::max<std::int64_t>(kBacklogPins, std::int64_t{count_} * percent / 100);
  }
  /// What one backlogged connection may hold while the pool runs short: an
  /// equal part of the out-queues' budget.
  std::int64_t fair_part() const {
    return std::max<std::int64_t>(
        kBacklogPins, budget_ / std::max<std::int64_t>(1, backlogged_.load(std::memory_order_relaxed)));
  }

  /// Any thread: the usage record of tenant `key`, shared by its connections.
  std::shared_ptr<TenantUsage> tenant(const std::string& key) {
    std::lock_guard lock(mu_);
    auto& weak = tenants_[key];
    auto usage = weak.lock();
    if (!usage) {
      if (tenants_.size() > 2 * live_hint_ + 64) prune_locked();
      usage = std::make_shared<TenantUsage>();
      weak = usage;
      ++live_hint_;
    }
    return usage;
  }

  /// A connection's out-queue took (n > 0) or let go of (n < 0) buffers:
  /// `before` is what it held before. Counts the backlogged ones (the sum
  /// is each worker's rdmabroker_pool_buffers_held{holder="out_queues"}).
  void moved(std::int64_t before, std::int64_t n) {
    const bool was = before >= kBacklogPins, is = before + n >= kBacklogPins;
    if (was != is) backlogged_.fetch_add(is ? 1 : -1, std::memory_order_relaxed);
  }
  std::int64_t backlogged() const { return backlogged_.load(std::memory_order_relaxed); }

 private:
  void prune_locked() {
    std::erase_if(tenants_, [](const auto& kv) { return kv.second.expired(); });
    live_hint_ = tenants_.size();
  }

  // Until configure(): no bounds (a core built by a unit test without a server).
  static constexpr std::int64_t kUnbounded = std::int64_t{1} << 60;
  std::uint32_t count_ = 0;
  std::uint32_t reserve_ = 0;
  std::int64_t budget_ = kUnbounded;
  std::atomic<std::int64_t> backlogged_{0};
  std::mutex mu_;
  std::unordered_map<std::string, std::weak_ptr<TenantUsage>> tenants_;  // guarded by mu_
  std::size_t live_hint_ = 0;                                            // guarded by mu_
};

}  // namespace rdmabroker::daemon
