// SPDX-License-Identifier: Apache-2.0
#include "subscriptions.hpp"

#include <utility>

namespace rdmabroker {

// ---------------------------------------------------------------- QueueSubscription

Result<Message> QueueSubscription::next(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  std::unique_lock lock(mu_);
  if (drive_) {
    // A polled client: what this waits for arrives only through progress.
    while (queue_.empty() && !closed_ && Clock::now() < deadline) {
      lock.unlock();
      drive_(deadline);
      lock.lock();
    }
  } else {
    wait_counted(cv_, lock, deadline, *wakeups_, [&] { return !queue_.empty() || closed_; });
  }
  if (!queue_.empty()) {
    Message m = std::move(queue_.front());
    queue_.pop_front();
    return m;
  }
  if (closed_) return Error{ErrorKind::kClosed, closed_why_};
  return Error{ErrorKind::kTimeout, "no message within " + std::to_string(timeout.count()) + " ms"};
}

bool QueueSubscription::push(Message m) {
  {
    std::lock_guard lock(mu_);
    if (queue_.size() >= limit_) {
      dropped_.fetch_add(1);
      return false;
    }
    queue_.push_back(std::move(m));
  }
  cv_.notify_one();
  return true;
}

void QueueSubscription::close(const std::string& why) {
  {
    std::lock_guard lock(mu_);
    if (closed_) return;
    closed_ = true;
    closed_why_ = why;
  }
  cv_.notify_all();
}

MessageViewHandler owning_handler(MessageHandler handler) {
  if (!handler) return nullptr;
  return [handler = std::move(handler)](const MessageView& v) {
    if (const Message* owned = detail::ViewAccess::message(v)) return handler(*owned);
    // Per thread, not per handler: a ReconnectingClient's handler may run on
    // two sessions' I/O threads for a moment while one replaces the other.
    thread_local Message copy;
    v.copy_to(copy);  // at most a frame's worth: a larger message comes owned
    handler(copy);
  };
}

// ---------------------------------------------------------------- SubscriptionTable

bool SubscriptionTable::end(std::uint32_t sid, const std::string& why) {
  auto it = subs_.find(sid);
  if (it == subs_.end()) return false;
  if (it->second.queue) it->second.queue->close(why);
  subs_.erase(it);
  return true;
}

void SubscriptionTable::close_queues(const std::string& why) {
  for (auto& [sid, e] : subs_) {
    if (e.queue && !e.borrowed_queue) e.queue->close(why);
  }
}

std::size_t SubscriptionTable::hand_over(Deliveries& deliveries, std::vector<Error>& errors,
                                         std::mutex& guard) {
  // The subscription is looked up once per run of messages for the same
  // subscription (a DELIVER's messages, or a read's worth), not per message.
  const std::size_t delivered = deliveries.entries.size();
  std::uint32_t sid = 0;
  bool looked_up = false;
  std::shared_ptr<const MessageViewHandler> handler;
  std::shared_ptr<QueueSubscription> queue;
  for (const Deliveries::Entry& e : deliveries.entries) {
    if (!looked_up || deliveries.sid(e) != sid) {
      sid = deliveries.sid(e);
      looked_up = true;
      std::lock_guard lock(guard);
      auto it = subs_.find(sid);
      handler = it != subs_.end() ? it->second.handler : nullptr;  // neither: unsubscribed while in flight
      queue = it != subs_.end() ? it->second.queue : nullptr;
    }
    const bool in_place = e.owned == Deliveries::kInPlace;
    if (handler && in_place) {
      (*handler)(e.view);
    } else if (handler) {
      MessageView view(deliveries.owned[e.owned]);
      view.received_at = e.view.received_at;
      view.relay_time = e.view.relay_time;
      (*handler)(view);
    } else if (queue && !queue->push(in_place ? e.view.to_message() : std::move(deliveries.owned[e.owned]))) {
      errors.push_back(Error{ErrorKind::kResource, "subscription " + std::to_string(queue->sid()) +
                                                       ": local queue limit reached, message dropped"});
    }
  }
  deliveries.clear();
  return delivered;
}

}  // namespace rdmabroker
