// SPDX-License-Identifier: Apache-2.0
// Adaptive waiting: how long a thread that found no work spins on its
// completion queues before it sleeps on their completion channel, tuned by
// what happened the last times instead of a guessed number of microseconds.
//
// The rule is the kernel's halt polling (KVM's halt_poll_ns, the cpuidle
// haltpoll governor), applied to a CQ: spin up to a window; if work arrives
// within it, the window stays; if the thread had to sleep and its wake-up
// came within the bound, a longer spin would have caught it: the window
// grows (to a start value, then doubling up to the bound); if it slept
// longer than the bound, a spin would have been wasted: the window halves,
// down to zero. So a thread fed every few tens of microseconds spins just
// long enough to catch the next message without a wake-up, and an idle one
// stops spinning after a few sleeps and costs no CPU.
//
// Spinning is bounded across threads as well: SpinSlots lets at most a set
// number of threads of a process spin at once (the broker: its cores but
// one, so the kernel, the clients and its other threads keep a core); a
// thread that finds no free slot sleeps at once.
#pragma once

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>

namespace rdmabroker {

class AdaptiveSpin {
 public:
  using Clock = std::chrono::steady_clock;
  /// The default bound: a sleep longer than this is not worth a spin.
  static constexpr std::chrono::microseconds kDefaultBound{200};

  explicit AdaptiveSpin(std::chrono::nanoseconds bound = kDefaultBound) { set_bound(bound); }

  void set_bound(std::chrono::nanoseconds bound) {
    bound_ = std::max(bound, std::chrono::nanoseconds(1000));
    window_ = std::min(window_, bound_);
  }
  std::chrono::nanoseconds bound() const { return bound_; }
  /// How long to spin now (zero: sleep at once).
  std::chrono::nanoseconds window() const { return window_; }

  /// The thread ran out of work at `now`; `bound` is its busy-poll setting
  /// (zero: kDefaultBound). Returns until when to spin (`now`: do not).
  Clock::time_point ran_out(Clock::time_point now, std::chrono::nanoseconds bound) {
    set_bound(bound.count() > 0 ? bound : kDefaultBound);
    idle_since_ = now;
    return now + window_;
  }
  /// The thread woke at `now` from the sleep that followed ran_out().
  void woke(Clock::time_point now) { slept(now - idle_since_); }

  /// The thread slept (after spinning its window, if any) and woke `waited`
  /// after it ran out of work: grows or shrinks the window.
  void slept(std::chrono::nanoseconds waited) {
    if (waited > bound_) {
      window_ /= 2;
      if (window_ < grow_start()) window_ = std::chrono::nanoseconds(0);
    } else if (window_ < bound_) {
      window_ = window_.count() == 0 ? grow_start() : std::min(window_ * 2, bound_);
    }
  }

 private:
  /// A quarter of the bound: the first spin after a short sleep.
  std::chrono::nanoseconds grow_start() const { return bound_ / 4; }

  std::chrono::nanoseconds bound_{};
  std::chrono::nanoseconds window_{0};
  Clock::time_point idle_since_{};  // the last ran_out()
};

/// At most `limit` threads spin at once; the others sleep at once.
class SpinSlots {
 public:
  explicit SpinSlots(std::uint32_t limit = default_limit()) : limit_(limit) {}

  /// The cores this process may run on (its affinity mask), less one for
  /// everything else; at least one.
  static std::uint32_t default_limit() {
    std::uint32_t cores = 0;
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) == 0) cores = static_cast<std::uint32_t>(CPU_COUNT(&set));
    if (cores == 0) cores = std::max(1u, std::thread::hardware_concurrency());
    return std::max(1u, cores - 1);
  }

  std::uint32_t limit() const { return limit_; }
  /// True if the caller may spin now; it calls release() when it stops.
  bool try_take() {
    std::uint32_t n = taken_.load(std::memory_order_relaxed);
    while (n < limit_) {
      if (taken_.compare_exchange_weak(n, n + 1, std::memory_order_acquire, std::memory_order_relaxed))
        return true;
    }
    return false;
  }
  void release() { taken_.fetch_sub(1, std::memory_order_release); }

 private:
  const std::uint32_t limit_;
  std::atomic<std::uint32_t> taken_{0};
};

}  // namespace rdmabroker
