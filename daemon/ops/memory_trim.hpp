// Gives memory back to the system after many connections have closed.
// glibc keeps freed heap memory in its per-thread arenas; after a burst of
// connections (each with its queues, rings and maps on a worker's arena)
// leaves, the broker's RSS would stay near its peak. Main thread only.
#pragma once

#include <malloc.h>

#include <algorithm>
#include <cstdint>

namespace rdmabroker::daemon {

class MemoryTrimmer {
 public:
  /// Connections closed since the last trim that are worth one (malloc_trim
  /// walks every arena: cheap at this rate, pointless per connection).
  static constexpr std::int64_t kClosedBeforeTrim = 64;

  /// Called with the open connection count now and then (about once a second).
  /// True when it trimmed.
  bool observe(std::int64_t connections) {
    peak_ = std::max(peak_, connections);
    if (peak_ - connections < kClosedBeforeTrim) return false;
    malloc_trim(0);
    peak_ = connections;
    return true;
  }

 private:
  std::int64_t peak_ = 0;  // most connections open since the last trim
};

}  // namespace rdmabroker::daemon
