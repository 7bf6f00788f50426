// SPDX-License-Identifier: Apache-2.0
// Message and byte rates for `rdmabroker stat`: the main loop samples the
// broker's counters about once a second, and rates are the change over the
// last few samples (about five seconds), so a single stat call shows current
// throughput without waiting. Prometheus computes its own rates from the
// counters; these are for people at a terminal.
#pragma once

#include <chrono>
#include <deque>

#include "broker/stats.hpp"

namespace rdmabroker::daemon {

class RateMeter {
 public:
  using Clock = std::chrono::steady_clock;
  /// Records the counters if at least ~1 s passed since the last sample.
  void sample(const StatsSnapshot& s, Clock::time_point now);
  /// Adds rates.* (per second, over the window) to `s`; zero until two samples exist.
  void add_rates(StatsSnapshot& s) const;

 private:
  struct Sample {
    Clock::time_point at;
    std::int64_t messages_in, messages_out, bytes_in, bytes_out;
  };
  std::deque<Sample> window_;  // oldest first, at most kSamples
  static constexpr std::size_t kSamples = 6;
};

}  // namespace rdmabroker::daemon
