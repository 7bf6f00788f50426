// SPDX-License-Identifier: Apache-2.0
// The only way other threads reach a worker: a multi-producer queue owned by
// the worker, with an eventfd that wakes the worker's epoll when the queue goes
// from empty to non-empty.
#pragma once

#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

#include "rdmabroker/common/fd.hpp"

namespace rdmabroker::daemon {

template <typename T>
class CommandQueue {
 public:
  CommandQueue() : wake_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}

  bool valid() const { return static_cast<bool>(wake_); }
  int fd() const { return wake_.get(); }

  /// Any thread.
  void post(T item) {
    bool was_empty;
    {
      std::lock_guard lock(mutex_);
      was_empty = items_.empty();
      items_.push_back(std::move(item));
      nonempty_.store(true, std::memory_order_release);
    }
    if (was_empty) wake();
  }

  /// Owner thread: swaps out everything posted so far (FIFO order).
  void drain(std::vector<T>& out) {
    std::uint64_t v;
    [[maybe_unused]] auto n = ::read(wake_.get(), &v, sizeof v);
    out.clear();
    std::lock_guard lock(mutex_);
    std::swap(out, items_);
    nonempty_.store(false, std::memory_order_relaxed);
  }

  /// Owner thread, without a system call: whether anything waits (a busy-
  /// polling owner checks this instead of its eventfd).
  bool pending() const { return nonempty_.load(std::memory_order_acquire); }

  /// Any thread: wakes the owner's epoll without an item.
  void wake() {
    std::uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(wake_.get(), &one, sizeof one);
  }

 private:
  UniqueFd wake_;
  std::mutex mutex_;
  std::vector<T> items_;  // guarded by mutex_
  std::atomic<bool> nonempty_{false};
};

}  // namespace rdmabroker::daemon
