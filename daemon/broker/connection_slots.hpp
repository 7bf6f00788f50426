// SPDX-License-Identifier: Apache-2.0
// A slot per open connection, broker-wide: enforces the connection limit and
// carries the one piece of per-connection state every worker touches on the
// hot path: how many frame bytes are routed to the connection and not yet sent,
// counting those still travelling between workers in command queues. Every
// increment (at routing) is matched by exactly one decrement (sent, or
// dropped by a counted policy) for the same slot, so a reused slot starts
// balanced.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

namespace rdmabroker::daemon {

class ConnectionSlots {
 public:
  /// `max` slots for connections, then `reserved` more that acquire() never
  /// hands out: slot `max + i` is reserved slot i (the multicast engine's
  /// backlog is one, so that publishers feeding it are slowed like those
  /// feeding a backlogged subscriber).
  explicit ConnectionSlots(std::uint32_t max, std::uint32_t reserved = 0)
      : queued_(new std::atomic<std::int64_t>[max + reserved]),
        pins_(new std::atomic<std::int64_t>[max + reserved]),
        sent_(new std::atomic<std::int64_t>[max + reserved]) {
    for (std::uint32_t s = 0; s < max + reserved; ++s) {
      queued_[s].store(0, std::memory_order_relaxed);
      pins_[s].store(0, std::memory_order_relaxed);
      sent_[s].store(0, std::memory_order_relaxed);
    }
    free_.reserve(max);
    for (std::uint32_t s = max; s-- > 0;) free_.push_back(s);
  }
  /// Any thread. Empty when the connection limit is reached.
  std::optional<std::uint32_t> acquire() {
    std::lock_guard lock(mutex_);
    if (free_.empty()) return std::nullopt;
    const std::uint32_t s = free_.back();
    free_.pop_back();
    ++in_use_;
    return s;
  }
  void release(std::uint32_t slot) {
    std::lock_guard lock(mutex_);
    free_.push_back(slot);
    --in_use_;
  }
  std::uint32_t in_use() const {
    std::lock_guard lock(mutex_);
    return in_use_;
  }
  void add_queued(std::uint32_t slot, std::int64_t n) {
    queued_[slot].fetch_add(n, std::memory_order_relaxed);
  }
  std::int64_t queued(std::uint32_t slot) const { return queued_[slot].load(std::memory_order_relaxed); }
  /// Pool buffers the connection's out-queue holds (broker/pool_shares.hpp):
  /// its owner sets it, the routers of every worker read it to slow publishers.
  void set_pins(std::uint32_t slot, std::int64_t n) { pins_[slot].store(n, std::memory_order_relaxed); }
  std::int64_t pins(std::uint32_t slot) const { return pins_[slot].load(std::memory_order_relaxed); }
  /// Frames handed to the connection's transport since the slot was taken:
  /// only grows, so a stalled publisher sees its subscriber's progress even
  /// while what is already in flight to the broker keeps its queue as long.
  void add_sent(std::uint32_t slot, std::int64_t n) { sent_[slot].fetch_add(n, std::memory_order_relaxed); }
  std::int64_t sent(std::uint32_t slot) const { return sent_[slot].load(std::memory_order_relaxed); }

 private:
  std::unique_ptr<std::atomic<std::int64_t>[]> queued_;
  std::unique_ptr<std::atomic<std::int64_t>[]> pins_;
  std::unique_ptr<std::atomic<std::int64_t>[]> sent_;
  mutable std::mutex mutex_;
  std::vector<std::uint32_t> free_;  // guarded by mutex_
  std::uint32_t in_use_ = 0;         // guarded by mutex_
};

}  // namespace rdmabroker::daemon
