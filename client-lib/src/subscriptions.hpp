// SPDX-License-Identifier: Apache-2.0
// Internal to librdmabroker: a session's subscriptions and their delivery.
// Each subscription hands its messages to a callback or to a blocking queue
// (QueueSubscription); the table maps the broker's subscription ids to them
// and hands over what a turn of the I/O loop decoded (Deliveries), running
// callbacks without the session's lock.
//
// The table is guarded by the session's lock; hand_over() takes it only to
// look a subscription up.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <algorithm>
#include <unordered_map>
#include <vector>

#include "deliveries.hpp"
#include "rdmabroker/client.hpp"

namespace rdmabroker {

/// Waits on `cv` until pred() or the deadline; each time the thread slept and
/// woke (notified, spuriously or at the deadline) counts in `wakeups`
/// (ClientStats::app_wakeups). Returns pred().
template <typename Pred>
bool wait_counted(std::condition_variable& cv, std::unique_lock<std::mutex>& lock, Clock::time_point deadline,
                  std::atomic<std::uint64_t>& wakeups, Pred pred) {
  while (!pred()) {
    const bool timed_out = cv.wait_until(lock, deadline) == std::cv_status::timeout;
    wakeups.fetch_add(1, std::memory_order_relaxed);
    if (timed_out) return pred();
  }
  return true;
}

/// Where a client's application threads count their wake-ups: shared by the
/// session and its subscription queues (which may outlive it).
using WakeupCounter = std::shared_ptr<std::atomic<std::uint64_t>>;

/// A polled client's way to make progress while a thread waits in it: one
/// turn of its loop, waiting no later than the deadline.
using Driver = std::function<void(Clock::time_point deadline)>;

/// Blocking subscription queue, filled by the I/O thread (or by whoever
/// polls a polled client: then next() drives the client through `drive`).
class QueueSubscription final : public Subscription {
 public:
  QueueSubscription(std::uint32_t sid, std::size_t limit, WakeupCounter wakeups, Driver drive = nullptr)
      : Subscription(sid), limit_(limit), wakeups_(std::move(wakeups)), drive_(std::move(drive)) {}

  Result<Message> next(std::chrono::milliseconds timeout) override;
  std::uint64_t dropped() const override { return dropped_.load(); }

  /// Returns false when the message was dropped (queue limit).
  bool push(Message m);
  void close(const std::string& why);
  bool closed() {
    std::lock_guard lock(mu_);
    return closed_;
  }

 private:
  const std::size_t limit_;
  const WakeupCounter wakeups_;
  const Driver drive_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Message> queue_;
  bool closed_ = false;
  std::string closed_why_;
  std::atomic<std::uint64_t> dropped_{0};
};

/// The subscriptions of one session, by the id the broker knows them by.
class SubscriptionTable {
 public:
  struct Entry {
    std::string subject;
    // Shared so that hand_over() can call it without the lock while
    // unsubscribe() erases the entry, at the cost of one reference count per
    // run of messages rather than a copy of the function per message.
    std::shared_ptr<const MessageViewHandler> handler;  // or
    std::shared_ptr<QueueSubscription> queue;           // one of the two
    bool borrowed_queue = false;  // a ReconnectingClient's: not closed when this session fails
  };

  /// The id a new subscription takes: `wanted` (a restored one's), or the next free.
  std::uint32_t claim_id(std::uint32_t wanted) {
    const std::uint32_t sid = wanted != 0 ? wanted : next_sid_++;
    next_sid_ = std::max(next_sid_, sid + 1);
    return sid;
  }
  void add(std::uint32_t sid, Entry e) { subs_[sid] = std::move(e); }
  bool contains(std::uint32_t sid) const { return subs_.contains(sid); }
  /// Removes `sid`, closing its queue with `why`; false if there was none.
  bool end(std::uint32_t sid, const std::string& why);
  /// Removes `sid` without a word to its queue (its SUBSCRIBE never left).
  void forget(std::uint32_t sid) { subs_.erase(sid); }
  /// The session failed: every queue of its own closes with `why`.
  void close_queues(const std::string& why);

  /// Hands `deliveries` to their subscriptions' callbacks and queues (a
  /// queue that is full drops the message and says so in `errors`); `guard`
  /// is the lock of this table, taken for each lookup only.
  std::size_t hand_over(Deliveries& deliveries, std::vector<Error>& errors, std::mutex& guard);

 private:
  std::uint32_t next_sid_ = 1;
  std::unordered_map<std::uint32_t, Entry> subs_;
};

}  // namespace rdmabroker
