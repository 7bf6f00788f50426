// SPDX-License-Identifier: Apache-2.0
// A token bucket: at most `rate` operations a second, in bursts of as many.
// Owned by one thread (a connection's, on its worker).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>

namespace rdmabroker::daemon {

class RateLimit {
 public:
  using Clock = std::chrono::steady_clock;
  /// One operation at `now`, if the bucket holds a token for it.
  bool take(std::uint32_t rate, Clock::time_point now) {
    const double capacity = rate;
    tokens_ = last_ == Clock::time_point{}
                  ? capacity
                  : std::min(capacity, tokens_ + std::chrono::duration<double>(now - last_).count() * rate);
    last_ = now;
    if (tokens_ < 1) return false;
    tokens_ -= 1;
    return true;
  }

 private:
  double tokens_ = 0;
  Clock::time_point last_{};
};

}  // namespace rdmabroker::daemon
