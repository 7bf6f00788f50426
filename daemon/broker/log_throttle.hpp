// SPDX-License-Identifier: Apache-2.0
// Logs of events that a client can cause at will (refused connections, failed
// logins) must not let it flood the journal: each kind of event is logged at
// most `burst` times per `period`, and the first line after a quiet spell
// says how many were left out. Counters still count every event.
#pragma once

#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

namespace rdmabroker::daemon {

class LogThrottle {
 public:
  explicit LogThrottle(std::uint32_t burst = 10, std::chrono::seconds period = std::chrono::seconds(10))
      : burst_(burst), period_(period) {}

  /// Any thread. True if this event may be logged; `suppressed` is then the
  /// number of events of this kind that were not logged before it.
  bool allow(std::uint64_t& suppressed) {
    const auto now = std::chrono::steady_clock::now();
    std::lock_guard lock(mu_);
    if (now - window_start_ >= period_) {
      window_start_ = now;
      logged_ = 0;
    }
    if (logged_ >= burst_) {
      ++suppressed_;
      return false;
    }
    ++logged_;
    suppressed = suppressed_;
    suppressed_ = 0;
    return true;
  }

 private:
  const std::uint32_t burst_;
  const std::chrono::steady_clock::duration period_;
  std::mutex mu_;
  std::chrono::steady_clock::time_point window_start_{};  // guarded by mu_
  std::uint32_t logged_ = 0;                              // in this window (mu_)
  std::uint64_t suppressed_ = 0;                          // since the last line (mu_)
};

/// Logs one line at `level` unless `throttle` holds it back; the line says
/// how many like it were left out before it.
template <typename... Args>
void log_throttled(LogThrottle& throttle, spdlog::level::level_enum level, fmt::format_string<Args...> format,
                   Args&&... args) {
  std::uint64_t suppressed = 0;
  if (!throttle.allow(suppressed)) return;
  std::string line = fmt::format(format, std::forward<Args>(args)...);
  if (suppressed > 0) line += fmt::format(" ({} more like it not logged)", suppressed);
  spdlog::log(level, "{}", line);
}

}  // namespace rdmabroker::daemon
