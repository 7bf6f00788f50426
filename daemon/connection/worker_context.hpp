// SPDX-License-Identifier: Apache-2.0
// What the transport-neutral layers of one worker share (its connections,
// router and frame handlers): the worker's index, the broker core, its own
// copy of the live settings, its statistics and the loop's clock. Owned by
// the worker; used only on its thread, which assert_on_loop() checks in
// debug builds (the sanitizer trees run them).
#pragma once

#include <cassert>
#include <chrono>
#include <cstdint>
#include <memory>
#include <thread>

#include "broker/core.hpp"
#include "broker/stats.hpp"

namespace rdmabroker::daemon {

struct WorkerContext {
  WorkerContext(std::uint32_t index_, BrokerCore& core_)
      : index(index_), core(core_), options(core_.options), auth(core_.auth) {}

  /// From now on only the calling thread may use what this worker owns.
  void bind_to_this_thread() { owner_ = std::this_thread::get_id(); }
  void assert_on_loop() const { assert(owner_ == std::this_thread::get_id()); }

  /// The pool gave a refill or a read nothing (or again something): logged
  /// and counted once per shortage.
  void note_pool_starved(bool starved);

  const std::uint32_t index;
  BrokerCore& core;
  BrokerOptions options;                  // this worker's copy: reloads update the live settings
  std::shared_ptr<const AuthTable> auth;  // this worker's version of the users
  WorkerStats stats;
  /// Refreshed once per loop turn, and after each poll or read that
  /// brought frames: what they route counts its relay time from here.
  std::chrono::steady_clock::time_point now{};

 private:
  bool pool_starved_ = false;  // the last refill or read found the pool empty
  std::thread::id owner_ = std::this_thread::get_id();
};

}  // namespace rdmabroker::daemon
