// SPDX-License-Identifier: Apache-2.0
// Connections: publishers held back for their subscribers, and every deadline a connection has
// (connections.hpp).
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>

#include "connection/connections.hpp"

namespace rdmabroker::daemon {

using proto::ErrorCode;
using proto::FrameType;

// ---------------------------------------------------------------- flow control

void Connections::stall(Connection& publisher, std::uint32_t slot) {
  if (publisher.stalled) return;
  // Slow this publisher down rather than let a subscriber that is merely
  // behind overflow its queue. Bounded in time: a subscriber that stopped
  // reading overflows its bound or misses its write deadline and is cut off.
  ctx_.stats.producer_stalls.add();
  publisher.stalled = true;
  publisher.stall_slot = slot;
  publisher.stall_queued = ctx_.core.slots->queued(slot);
  publisher.stall_sent = ctx_.core.slots->sent(slot);
  publisher.stalled_until = ctx_.now + std::chrono::milliseconds(ctx_.options.producer_stall_ms);
  stalled_.push_back(publisher.id);
  publisher.link->pause();
}

// ---------------------------------------------------------------- deadlines

void Connections::check_deadlines() {
  ctx_.assert_on_loop();
  // Refresh the loop's clock: links compare stalls with it.
  ctx_.now = std::chrono::steady_clock::now();
  if (!stalled_.empty()) check_stalls();
  if (!unauthenticated_.empty()) check_auth_deadlines();
  if (!open_messages_.empty()) check_open_messages();
  if (!closing_.empty()) check_closing();
  check_write_deadlines();
}

void Connections::check_stalls() {
  // A stall ends when the subscriber it waits for has drained to half its
  // bound (and, while the broker's queues together are above half theirs,
  // to an eighth of its share of them), or when that queue stopped
  // shrinking for producer_stall_ms; the publisher then takes the input it
  // held and its link resumes (owed credits go back).
  const auto now = ctx_.now;
  const auto patience = std::chrono::milliseconds(ctx_.options.producer_stall_ms);
  std::vector<std::uint64_t> ended;
  std::erase_if(stalled_, [&](std::uint64_t id) {
    Connection* c = find(id);
    if (c == nullptr) return true;
    const auto low =
        static_cast<std::int64_t>(ctx_.core.backlog_bound(c->stall_slot, ctx_.options.max_pending_bytes) / 2);
    const std::int64_t queued = ctx_.core.slots->queued(c->stall_slot);
    // Progress (keep waiting): its queue shrank (the multicast engine's
    // backlog), or it was sent frames, whatever what the publisher still had
    // in flight added meanwhile.
    const std::int64_t sent = ctx_.core.slots->sent(c->stall_slot);
    if (queued < c->stall_queued || sent != c->stall_sent) {
      c->stall_queued = std::min(queued, c->stall_queued);
      c->stall_sent = sent;
      c->stalled_until = now + patience;
    }
    if (now >= c->stalled_until) {
      // Waited in vain: what it holds flows (Connection::stall_waived_slot).
      spdlog::debug("connection {}: stalled {} ms for slot {} ({} bytes queued) without progress", c->id,
                    ctx_.options.producer_stall_ms, c->stall_slot, queued);
      c->stall_waived_slot = c->stall_slot;
    } else {
      // Drained means below half the byte bound and a quarter of the pool share.
      const bool pins_high = ctx_.core.slots->pins(c->stall_slot) >
                             ctx_.core.pool_shares.share(ctx_.options.pool_share_percent) / 4;
      // The broker-wide byte bound, as Router::over_watermark: a connection's only.
      const bool crowds = !ctx_.core.is_engine_slot(c->stall_slot) && crowds_total(queued, 8, 50);
      if (queued > low || pins_high || crowds) return false;
    }
    c->stalled = false;
    ended.push_back(id);
    return true;
  });
  // After the walk: taking held input may stall the publisher again.
  for (std::uint64_t id : ended) {
    Connection* c = find(id);
    if (c == nullptr) continue;
    if (stall_end_ && c->is_up()) {
      stall_end_(*c);
    } else {
      c->link->resume();
    }
    c->stall_waived_slot = UINT32_MAX;
    touch(*c);
  }
  flush_touched();
}

void Connections::check_auth_deadlines() {
  std::erase_if(unauthenticated_, [&](std::uint64_t id) {
    Connection* c = find(id);
    if (c == nullptr || (c->state != ConnState::kAwaitingConnect && c->state != ConnState::kVerifying))
      return true;
    if (ctx_.now < c->auth_deadline) return false;
    if (c->dialed) {
      // A route this broker dialed, whose broker did not answer its login.
      c->dialed->refusal =
          "no answer to the route's login within " + std::to_string(ctx_.options.auth.timeout_ms) + " ms";
      close(*c, CloseReason::kConnectFailed);
      return true;
    }
    ctx_.stats.auth_failed.add();
    close(*c, CloseReason::kAuthTimeout, ErrorCode::kAuthenticationRequired,
          "not authenticated within " + std::to_string(ctx_.options.auth.timeout_ms) + " ms of connecting");
    return true;
  });
}

void Connections::watch_open_message(Connection& c) {
  if (std::find(open_messages_.begin(), open_messages_.end(), c.id) == open_messages_.end())
    open_messages_.push_back(c.id);
}

void Connections::check_open_messages() {
  const auto timeout = std::chrono::milliseconds(ctx_.options.fragment_timeout_ms);
  std::erase_if(open_messages_, [&](std::uint64_t id) {
    Connection* c = find(id);
    if (c == nullptr || !c->is_up() || !c->open_message.open) return true;
    // Time the broker keeps the publisher from sending is not its delay:
    // a stall (a backlogged subscriber), TCP not read (no pool buffer), or,
    // over RDMA, no credit left to send with.
    const bool held = c->input_held() || c->link->input_paused();
    if (held) c->open_message.waiting_since = ctx_.now;
    if (ctx_.now - c->open_message.waiting_since < timeout) return false;
    const auto& open = c->open_message;
    close(*c, CloseReason::kFragmentTimeout, ErrorCode::kProtocolViolation,
          "a message in fragments was left open: " + std::to_string(open.next_offset) + " of its " +
              std::to_string(open.length) + " bytes came, and no fragment for " +
              std::to_string(ctx_.options.fragment_timeout_ms) +
              " ms (limits.fragment_timeout_ms); send ABORT to abandon a message");
    return true;
  });
}

void Connections::check_closing() {
  std::vector<std::uint64_t> ids;
  ids.swap(closing_);
  for (std::uint64_t id : ids) {
    Connection* c = find(id);
    if (c == nullptr || c->reaping) continue;
    if (ctx_.now >= c->deadline) {
      if (c->state == ConnState::kDraining) {
        disconnect(*c);  // re-registers it in closing_
        continue;
      }
      try_finish(*c);
    }
    if (!c->reaping && c->is_closing()) closing_.push_back(id);
  }
  // disconnect() above may have appended duplicates; they are harmless.
}

void Connections::check_write_deadlines() {
  if (ctx_.now < next_write_check_) return;
  next_write_check_ = ctx_.now + std::chrono::milliseconds(100);
  const auto limit = std::chrono::milliseconds(ctx_.options.write_deadline_ms);
  std::vector<Connection*> stuck;
  for (auto& [id, c] : table_) {
    if (c->is_up() && c->pending_bytes > 0 && ctx_.now - c->last_progress > limit) stuck.push_back(c.get());
  }
  for (Connection* c : stuck) {
    spdlog::warn("connection {} ({}): slow consumer, accepted nothing for {} ms with {} bytes queued", c->id,
                 c->peer, ctx_.options.write_deadline_ms, c->pending_bytes);
    close(*c, CloseReason::kSlowConsumer, ErrorCode::kSlowConsumer,
          "accepted nothing for " + std::to_string(ctx_.options.write_deadline_ms) + " ms");
  }
}

}  // namespace rdmabroker::daemon
