// SPDX-License-Identifier: Apache-2.0
// Gives memory back to the system after connections and queues are gone.
// glibc keeps freed heap memory in its per-thread arenas; after a burst of
// connections (each with its queues, rings and maps on a worker's arena)
// leaves, after many come and go one at a time (a TLS handshake allocates
// ~40 KiB in OpenSSL), or after large out-queues are dropped, the broker's
// RSS would stay near its peak (docs/operations.md, "Memory"). Main thread
// only.
#pragma once

#include <malloc.h>

#include <algorithm>
#include <cstdint>

namespace rdmabroker::daemon {

class MemoryTrimmer {
 public:
  /// Connections closed (at once, or since the last trim) that are worth a
  /// trim: malloc_trim walks every arena, cheap at this rate, pointless per
  /// connection.
  static constexpr std::int64_t kClosedBeforeTrim = 64;
  /// Queued bytes (rdmabroker_pending_bytes) given up since their peak that are worth one.
  static constexpr std::int64_t kQueuedDropBeforeTrim = std::int64_t{16} << 20;
  /// Calls between trims for connections that come and go one at a time: a
  /// steady churn trims every 3 s, not every second.
  static constexpr int kChurnTrimEvery = 3;

  /// Called now and then (about once a second) with the connections open
  /// now, those ended since start (closed, or refused in their handshake: a
  /// TLS handshake left half-way holds OpenSSL's buffers until then), and
  /// the bytes queued for subscribers.
  /// True when it trimmed.
  bool observe(std::int64_t connections, std::int64_t closed, std::int64_t queued) {
    peak_ = std::max(peak_, connections);
    peak_queued_ = std::max(peak_queued_, queued);
    ++calls_;
    const bool burst_left = peak_ - connections >= kClosedBeforeTrim;
    const bool drained = peak_queued_ - queued >= kQueuedDropBeforeTrim;
    const bool churned = closed - closed_at_trim_ >= kClosedBeforeTrim && calls_ >= kChurnTrimEvery;
    if (!burst_left && !drained && !churned) return false;
    malloc_trim(0);
    peak_ = connections;
    peak_queued_ = queued;
    closed_at_trim_ = closed;
    calls_ = 0;
    ++trims_;
    return true;
  }
  std::uint64_t trims() const { return trims_; }

 private:
  std::int64_t peak_ = 0;         // most connections open since the last trim
  std::int64_t peak_queued_ = 0;  // most bytes queued since the last trim
  std::int64_t closed_at_trim_ = 0;
  int calls_ = 0;
  std::uint64_t trims_ = 0;
};

}  // namespace rdmabroker::daemon
