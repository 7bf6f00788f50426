// SPDX-License-Identifier: Apache-2.0
// Session: closing, and the turns of its I/O loop (the I/O thread's, or a polled client's own) (session.hpp).
#include <algorithm>
#include <limits>
#include <thread>

#include "client_internal.hpp"
#include "session.hpp"

namespace rdmabroker {

using proto::FrameType;

// ---------------------------------------------------------------- polled

namespace {
// The session whose loop this thread is running (a callback of it is on
// the stack): it must not start another turn of that loop.
thread_local const Session* tl_progressing = nullptr;
}  // namespace

void Session::close() {
  if (!transport_) return;
  if (!opt_.polled) {
    transport_->close();
  } else {
    // No other thread is in the loop while the transport goes; waits of the
    // close itself (the last frames leaving) make only the sends progress.
    auto turn = take_turn();
    const Session* outer = std::exchange(tl_progressing, this);
    transport_->close();
    tl_progressing = outer;
  }
  fail_unanswered_acks();
}

std::unique_lock<std::mutex> Session::take_turn() {
  std::unique_lock turn(progress_mu_, std::try_to_lock);
  if (turn.owns_lock()) return turn;
  // Announced before polling_ is read, and a poll() sets polling_ before it
  // reads wanting_turn_ (both sequentially consistent): either this thread
  // sees the poll() and wakes it, or the poll() sees this thread and does
  // not sleep.
  wanting_turn_.fetch_add(1);
  if (polling_.load()) transport_->wake();
  turn.lock();
  wanting_turn_.fetch_sub(1);
  return turn;
}

std::size_t Session::progress(int timeout_ms, Turn kind) {
  const std::uint64_t seen = turns_.load(std::memory_order_relaxed);
  auto turn = kind == Turn::kWait ? take_turn() : std::unique_lock(progress_mu_);
  // Another thread's turn ran while this one waited for it: what the caller
  // waits for may have come in then, so it looks before it sleeps.
  if (turns_.load(std::memory_order_relaxed) != seen) timeout_ms = 0;
  turns_.fetch_add(1, std::memory_order_relaxed);
  {
    std::lock_guard lock(mu_);
    if (stop_) return 0;          // closed: the transport's resources are gone
    if (closed_) timeout_ms = 0;  // ended: what is left is taken in, nothing more comes
  }
  if (kind == Turn::kPoll) {
    polling_.store(true);
    if (wanting_turn_.load() > 0) timeout_ms = 0;  // a wait inside the library is next
  }
  const Session* outer = std::exchange(tl_progressing, this);
  const std::size_t n = transport_->progress(timeout_ms);
  tl_progressing = outer;
  polling_.store(false);
  return n;
}

std::size_t Session::progress_until(Clock::time_point deadline) {
  if (tl_progressing == this) {
    transport_->progress_sends();
    std::this_thread::yield();
    return 0;
  }
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return progress(static_cast<int>(std::clamp<std::int64_t>(left, 0, 100)));
}

Result<std::size_t> Session::poll(std::chrono::microseconds timeout) {
  if (!opt_.polled) return not_polled("poll()");
  if (tl_progressing == this)
    return Error{ErrorKind::kInvalidArgument, "poll() from a callback of its own client"};
  if (!transport_) return Error{ErrorKind::kClosed, "not connected"};
  const auto ms =
      std::chrono::ceil<std::chrono::milliseconds>(std::max(timeout, std::chrono::microseconds{0}));
  const std::size_t delivered = progress(
      static_cast<int>(std::min<std::int64_t>(ms.count(), std::numeric_limits<int>::max())), Turn::kPoll);
  std::lock_guard lock(mu_);
  if (delivered == 0 && closed_) return close_error_;
  return delivered;
}

Status Session::wake() {
  if (!opt_.polled) return not_polled("wake()");
  if (!transport_) return Error{ErrorKind::kClosed, "not connected"};
  transport_->wake();
  std::lock_guard lock(mu_);
  if (stop_) return close_error_;
  return {};
}

ClientStats Session::stats() const {
  ClientStats s;
  s.messages_received = messages_received_.load(std::memory_order_relaxed);
  s.multicast_messages = streams_.multicast_messages.load(std::memory_order_relaxed);
  s.join_failures = join_failures_.load(std::memory_order_relaxed);
  s.repairs_requested = streams_.repairs_requested.load(std::memory_order_relaxed);
  s.duplicates = streams_.duplicates.load(std::memory_order_relaxed);
  s.messages_lost = streams_.messages_lost.load(std::memory_order_relaxed);
  if (transport_) {
    s.multicast_groups = transport_->groups_joined();
    s.io_wakeups = transport_->io_wakeups();
  }
  s.app_wakeups = app_wakeups_->load(std::memory_order_relaxed);
  s.aborted_messages = reassembler_.aborted();
  s.landed_messages = reassembler_.landed();
  return s;
}

}  // namespace rdmabroker
