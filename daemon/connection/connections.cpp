// SPDX-License-Identifier: Apache-2.0
#include "connection/connections.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>

#include "connection/interest.hpp"

namespace rdmabroker::daemon {

using proto::ErrorCode;
using proto::FrameType;

Connections::~Connections() {
  // Links first destroy their transports (QP before cm_id, or the socket).
  table_.clear();
}

// ---------------------------------------------------------------- the table

Connection& Connections::add(std::unique_ptr<Connection> c) {
  ctx_.assert_on_loop();
  Connection& ref = *c;
  ctx_.stats.connections_current.add(1);
  table_.emplace(ref.id, std::move(c));
  return ref;
}

Connection* Connections::find(std::uint64_t id) {
  auto it = table_.find(id);
  return it == table_.end() ? nullptr : it->second.get();
}

Connection* Connections::find_up(std::uint64_t id) {
  Connection* c = find(id);
  return c != nullptr && c->is_up() ? c : nullptr;
}

std::vector<Connection*> Connections::snapshot() const {
  std::vector<Connection*> all;
  all.reserve(table_.size());
  for (const auto& [id, c] : table_) all.push_back(c.get());
  return all;
}

// ---------------------------------------------------------------- state machine

void Connections::establish(Connection& c) {
  ctx_.assert_on_loop();
  if (c.state != ConnState::kAccepting) return;
  c.state = ConnState::kAwaitingConnect;
  c.last_progress = ctx_.now;
  ctx_.stats.connections_accepted.add();
  c.auth_deadline = ctx_.now + std::chrono::milliseconds(ctx_.options.auth.timeout_ms);
  unauthenticated_.push_back(c.id);
  spdlog::info("connection {} {} {} established {} (worker {}, protocol version {})", c.id,
               c.dialed ? "to route" : "from", c.peer, c.link->where(), ctx_.index, c.protocol_version);
  touch(c);  // its initial credits may already allow sends
}

void Connections::close(Connection& c, CloseReason reason, ErrorCode code, std::string message) {
  ctx_.assert_on_loop();
  if (c.is_closing()) {
    if (c.state == ConnState::kDraining && c.peer_disconnected) disconnect(c);
    return;
  }
  // A credential check still queued is moot now (it would only cost crypt(3)).
  if (c.state == ConnState::kVerifying) ctx_.core.authenticator->cancel(c.id);
  c.reason = reason;
  drop_all_subscriptions(ctx_, c);
  end_open_message(c);
  if (c.dialed) report_route_down(c, reason, message);
  const bool can_tell = c.is_up() && !c.peer_disconnected && code != ErrorCode::kNone;
  if (!can_tell) {
    disconnect(c);
    return;
  }
  // Shutdown flushes what is queued, then sends CLOSE; any other reason drops
  // the queue (counted) and sends ERROR then CLOSE with the same code, or
  // CLOSE alone for a slow consumer. Either way the client learns why before
  // the disconnect (SPEC.md §3.5), and every close ends with CLOSE.
  if (reason == CloseReason::kProtocolError) {
    ctx_.stats.protocol_errors.add();
    spdlog::warn("connection {} ({}): protocol error: {}", c.id, c.peer, message);
  }
  if (reason != CloseReason::kBrokerShutdown) {
    drop_queue(c, drop_reason_for(reason));
    c.link->cut_short();
  }
  // A route this broker dialed is a client there: it ends with CLOSE (code
  // 0) alone, as a client does (SPEC.md §4); its log line says why.
  const bool is_close =
      reason == CloseReason::kBrokerShutdown || reason == CloseReason::kSlowConsumer || c.dialed;
  const FrameType type = is_close ? FrameType::kClose : FrameType::kError;
  if (c.dialed) {
    code = ErrorCode::kNone;
    message.clear();
  }
  c.outq.push_back(make_control(type, static_cast<std::uint32_t>(code), std::move(message)));
  if (!is_close) c.outq.push_back(make_control(FrameType::kClose, static_cast<std::uint32_t>(code)));
  c.state = ConnState::kDraining;
  c.deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(ctx_.options.drain_timeout_ms);
  closing_.push_back(c.id);
  touch(c);
}

void Connections::report_route_down(Connection& c, CloseReason reason, const std::string& message) {
  DialedRoute& d = *c.dialed;
  if (std::exchange(d.reported_down, true) || ctx_.core.routes == nullptr) return;
  std::string why = d.refusal;
  if (why.empty()) why = std::string(to_string(reason)) + (message.empty() ? "" : ": " + message);
  const RouteEnd end = d.removed                                 ? RouteEnd::kRemoved
                       : why.find("itself") != std::string::npos ? RouteEnd::kItself
                                                                 : RouteEnd::kLost;
  ctx_.core.routes->route_down(d.dial.route, end, why);
}

void dial_failed(WorkerContext& ctx, std::uint32_t slot, const RouteDial& dial, const std::string& why) {
  ctx.core.admission->release(slot);
  if (ctx.core.routes != nullptr) ctx.core.routes->route_down(dial.route, RouteEnd::kLost, why);
}

void Connections::peer_gone(Connection& c, CloseReason reason) {
  c.peer_disconnected = true;
  close(c, reason);
  try_finish(c);
}

void Connections::disconnect(Connection& c) {
  if (c.state == ConnState::kDisconnecting) return;
  if (c.reason == CloseReason::kCount) c.reason = CloseReason::kPeerDisconnected;
  drop_all_subscriptions(ctx_, c);
  end_open_message(c);
  drop_queue(c, drop_reason_for(c.reason));
  c.state = ConnState::kDisconnecting;
  c.deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(ctx_.options.drain_timeout_ms);
  closing_.push_back(c.id);
  c.link->disconnect();
  try_finish(c);
}

void Connections::end_open_message(Connection& c) {
  const bool forwarding = c.dialed && !c.dialed->open.empty();  // a route's messages in fragments
  if ((c.open_message.open || forwarding) && message_cut_) message_cut_(c);
  c.open_message = {};
}

void Connections::drop_queue(Connection& c, DropReason why) {
  ctx_.stats.pending_messages.add(-static_cast<std::int64_t>(c.pending_messages));
  ctx_.stats.pending_bytes.add(-static_cast<std::int64_t>(c.pending_bytes));
  // And the messages in fragments it was in the middle of: their later
  // fragments, routed to it after this, count nothing (messages_begun).
  ctx_.stats.dropped[static_cast<std::size_t>(why)].add(c.pending_messages + c.begun_messages);
  unqueue(c.slot, c.pending_bytes);
  c.pending_messages = 0;
  c.begun_messages = 0;
  c.pending_bytes = 0;
  c.queued_replies = 0;
  c.outq.clear();
  pin(c, -c.pins);
  c.unexamined = 0;
  c.compact_buffer.reset();
  c.compact_used = 0;
}

void Connections::pin(Connection& c, std::int64_t n) {
  if (n == 0) return;
  ctx_.core.pool_shares.moved(c.pins, n);
  c.pins += n;
  ctx_.core.slots->set_pins(c.slot, c.pins);
  if (c.tenant) c.tenant->pins.fetch_add(n, std::memory_order_relaxed);
  ctx_.stats.queue_pins.add(n);
}

void Connections::try_finish(Connection& c) {
  if (c.state != ConnState::kDisconnecting || c.reaping) return;
  const bool drained = c.inflight_count == 0 && c.peer_disconnected;
  if (!drained && std::chrono::steady_clock::now() < c.deadline) return;
  // Destroyed at the end of the loop turn, never under a caller that still
  // holds a reference to it.
  c.reaping = true;
  reap_.push_back(c.id);
}

void Connections::reap() {
  for (std::uint64_t id : reap_) {
    if (Connection* c = find(id)) destroy(*c);
  }
  reap_.clear();
}

void Connections::destroy(Connection& c) {
  // Release what in-flight sends still hold (only after a deadline forced us).
  while (c.inflight_count > 0) retire_send(c, false);
  c.link->release();
  ctx_.stats.connections_closed[static_cast<std::size_t>(c.reason)].add();
  ctx_.stats.connections_current.add(-1);
  ctx_.core.admission->release(c.slot);
  // Closes a client can cause at will (failed or missing logins) are logged
  // within a throttle per reason; every one is counted above.
  std::uint64_t suppressed = 0;
  if (ctx_.core.close_log_throttles[static_cast<std::size_t>(c.reason)].allow(suppressed)) {
    spdlog::info(
        "connection {} ({}, {}) closed: {}{}", c.id, c.link->protocol(), c.peer, to_string(c.reason),
        suppressed > 0 ? fmt::format(" ({} more closes for this reason not logged)", suppressed) : "");
  }
  if (c.touched) std::erase(touched_, &c);
  set_awaits_send(c, false);
  table_.erase(c.id);  // the link destroys its transport (QP before cm_id; or the socket)
}

bool Connections::evict_unauthenticated(std::uint64_t id) {
  Connection* c = find(id);
  if (c == nullptr) return false;
  if (c->identity || c->is_closing()) return true;  // authenticated meanwhile, or going anyway
  ctx_.stats.auth_failed.add();
  close(*c, CloseReason::kUnauthenticatedEvicted, ErrorCode::kAuthenticationRequired,
        "closed before authenticating: the broker's unauthenticated connections are at their limit "
        "(limits.max_unauthenticated) and this was the oldest");
  return true;
}

void Connections::close_all_for_shutdown() {
  for (Connection* cp : snapshot()) {
    Connection& c = *cp;
    if (c.is_up()) {
      close(c, CloseReason::kBrokerShutdown, ErrorCode::kServerShutdown, "broker shutting down");
    } else {
      close(c, CloseReason::kBrokerShutdown);
    }
  }
}

// ---------------------------------------------------------------- out-queue

std::uint64_t Connections::fair_pending_share() const {
  return ctx_.options.max_pending_bytes_total / std::max<std::uint32_t>(ctx_.options.max_connections, 1);
}

bool Connections::may_queue(const Connection& c, std::uint64_t len, std::uint32_t messages) const {
  if (c.pending_bytes + len > ctx_.options.max_pending_bytes) return false;
  // The broker-wide bound charges each queued message its bookkeeping too
  // (payloads sit in the registered pool; the heap holds one OutItem per
  // message at most). Within its share of that bound a subscriber never
  // needs the total (no cross-worker reads on the common path); above it,
  // only while the broker's queues together stay within the bound.
  const std::int64_t charge = queued_charge(static_cast<std::int64_t>(len), messages);
  const std::int64_t held = queued_charge(static_cast<std::int64_t>(c.pending_bytes),
                                          static_cast<std::int64_t>(c.pending_messages));
  if (held + charge <= static_cast<std::int64_t>(fair_pending_share())) return true;
  return ctx_.core.workers->pending_charge_total() + charge <=
         static_cast<std::int64_t>(ctx_.options.max_pending_bytes_total);
}

bool Connections::crowds_total(std::int64_t queued, std::int64_t share_divisor,
                               std::int64_t total_percent) const {
  // Cheap test first: the total is a read of every worker's counters.
  if (queued <= static_cast<std::int64_t>(fair_pending_share()) / share_divisor) return false;
  return ctx_.core.workers->pending_charge_total() * 100 >
         static_cast<std::int64_t>(ctx_.options.max_pending_bytes_total) * total_percent;
}

void Connections::enqueue(Connection& c, OutItem item) {
  ctx_.assert_on_loop();
  if (c.protocol_version < proto::kFragmentsVersion && refuse_fragments(c, item)) return;
  if (c.peer_buffer_size < ctx_.options.buffer_size && cut_for_peer(c, item)) return;
  if (item.header.type == FrameType::kAbort) {
    ctx_.stats.dropped[static_cast<std::size_t>(DropReason::kIncomplete)].add();
    if (c.begun_messages > 0) --c.begun_messages;  // counted as incomplete, not again at a close
  }
  if (item.is_delivery() && c.protocol_version < proto::kHeadersVersion && carries_headers(item)) {
    // A client of version 1 reads no header block: its messages go without
    // (counted), the rest as they are (SPEC.md §3.6).
    for (OutItem& piece : split_without_headers(std::move(item))) {
      if (piece.strip != 0 && c.is_up()) ctx_.stats.headers_stripped.add();
      enqueue_piece(c, std::move(piece));
    }
    return;
  }
  const auto& opt = ctx_.options;
  if (item.is_delivery() && !may_queue(c, item.body_len, item.messages)) {
    const bool own = c.pending_bytes + item.body_len > opt.max_pending_bytes;
    const std::string why = own ? std::to_string(c.pending_bytes) + " bytes pending, limit " +
                                      std::to_string(opt.max_pending_bytes)
                                : std::to_string(c.pending_bytes) +
                                      " bytes pending while the broker's queues hold more than "
                                      "limits.max_pending_bytes_total (" +
                                      std::to_string(opt.max_pending_bytes_total) +
                                      "), above this subscriber's share of it (" +
                                      std::to_string(fair_pending_share()) + ")";
    spdlog::warn(
        "connection {} ({}): slow consumer, {} messages{}: {}", c.id, c.peer, c.pending_messages,
        c.begun_messages == 0 ? "" : " and " + std::to_string(c.begun_messages) + " begun in fragments", why);
    if (!own) ctx_.stats.limit_pending_total.add();
    // This one (if it begins its messages; a later fragment's message is in begun_messages).
    ctx_.stats.dropped[static_cast<std::size_t>(DropReason::kSlowConsumer)].add(messages_begun(item));
    unqueue(c.slot, item.body_len);
    close(c, CloseReason::kSlowConsumer, ErrorCode::kSlowConsumer, why);
    return;
  }
  if (!item.is_delivery()) {
    // A dialed route's frames are its own (one SUBSCRIBE per interest
    // entry at its login), bounded by the subscription budgets, not by this.
    if (c.queued_replies >= kMaxQueuedReplies && !c.dialed) {
      spdlog::warn("connection {} ({}): slow consumer, {} replies unread", c.id, c.peer, c.queued_replies);
      close(c, CloseReason::kSlowConsumer, ErrorCode::kSlowConsumer,
            std::to_string(c.queued_replies) + " replies unread");
      return;
    }
    ++c.queued_replies;
  }
  if (c.pending_bytes == 0) c.last_progress = ctx_.now;  // the write deadline counts from here
  // Queue bounds count messages: a reply with a body (a long INFO) is bounded by queued_replies.
  const std::uint32_t bytes = item.is_delivery() ? item.body_len : 0;
  c.pending_messages += item.messages;
  c.pending_bytes += bytes;
  ctx_.stats.pending_messages.add(item.messages);
  ctx_.stats.pending_bytes.add(bytes);
  // A delivery holds its body's pool buffer; one right behind an item of the
  // same buffer (a cut or split message, a run) holds nothing more.
  if (item.is_delivery() && item.body &&
      (c.outq.empty() || !c.outq.back().body || c.outq.back().body.index() != item.body.index())) {
    item.pinned = true;
    pin(c, 1);
  }
  if (const FragmentPiece piece = fragment_piece(item); piece.is_fragment) {
    if (piece.begins) ++c.begun_messages;
    if (item.messages > 0 && c.begun_messages > 0)
      --c.begun_messages;  // its last fragment: whole in the queue
  }
  ++c.unexamined;
  c.outq.push_back(std::move(item));
  touch(c);
}

bool Connections::refuse_fragments(Connection& c, const OutItem& item) {
  auto& needs_fragments = ctx_.stats.dropped[static_cast<std::size_t>(DropReason::kNeedsFragments)];
  if (item.header.type == FrameType::kAbort) {
    needs_fragments.add();  // the message that will not come: it was sent none of it
    return true;
  }
  if (!item.is_delivery() || !item.fragment) return false;
  // A client of version < 4 reads no fragment: the message is not sent to it
  // (SPEC.md §3.7), counted once, with its last fragment (item.messages).
  needs_fragments.add(item.messages);
  unqueue(c.slot, item.body_len);
  return true;
}

void Connections::enqueue_piece(Connection& c, OutItem piece) {
  if (!c.is_up()) {
    // Closed as a slow consumer by an earlier piece: the rest goes nowhere, like that piece.
    ctx_.stats.dropped[static_cast<std::size_t>(DropReason::kSlowConsumer)].add(piece.messages);
    unqueue(c.slot, piece.body_len);
    return;
  }
  enqueue(c, std::move(piece));
}

bool Connections::cut_for_peer(Connection& c, OutItem& item) {
  auto& uncut = c.uncut_messages;
  if (item.header.type == FrameType::kAbort) {
    // The end of a message this subscriber was sent none of: nothing to say (counted at its first fragment).
    const auto it = std::find(uncut.begin(), uncut.end(), std::pair{item.header.arg, item.header.sequence});
    if (it == uncut.end()) return false;
    uncut.erase(it);
    return true;
  }
  if (!item.is_delivery()) return false;
  if (!uncut.empty() && item.fragment) {
    // A fragment travels alone (SPEC.md §3.4): the item is this one frame.
    const auto it = std::find(uncut.begin(), uncut.end(), std::pair{item.header.arg, item.publisher});
    if (it != uncut.end()) {
      if (item.ends) uncut.erase(it);
      unqueue(c.slot, item.body_len);
      return true;
    }
  }
  if (item.wire_len() <= c.peer_buffer_size) return false;
  for (OutItem& piece : cut_to_fit(std::move(item), c.peer_buffer_size)) {
    if (piece.wire_len() > c.peer_buffer_size) {
      // Its subject, reply and header block alone fill this client's receive buffer.
      ctx_.stats.dropped[static_cast<std::size_t>(DropReason::kBufferTooSmall)].add();
      unqueue(c.slot, piece.body_len);
      if (!piece.ends) uncut.emplace_back(piece.header.arg, piece.publisher);
      continue;
    }
    enqueue_piece(c, std::move(piece));
  }
  return true;
}

void Connections::deliver(Connection& c, const BufferRef& buf, std::uint32_t sid, const RoutedFrame& frame) {
  const bool needs_strip = c.protocol_version < proto::kHeadersVersion && frame.header_len != 0;
  if (!needs_strip && may_queue(c, frame.len) && !c.outq.empty() &&
      extend_delivery(c.outq.back(), buf, sid, frame,
                      std::min(c.peer_buffer_size, ctx_.options.buffer_size))) {
    ++c.pending_messages;
    c.pending_bytes += frame.len;
    ctx_.stats.pending_messages.add(1);
    ctx_.stats.pending_bytes.add(frame.len);
    touch(c);
    return;
  }
  enqueue(c, make_delivery(buf.clone(), sid, frame, ctx_.now.time_since_epoch().count()));
}

void Connections::touch(Connection& c) {
  if (!c.touched) {
    c.touched = true;
    touched_.push_back(&c);
  }
}

void Connections::flush_touched() {
  ctx_.assert_on_loop();
  // flush() may close a connection, but never destroys one: pointers stay valid.
  for (std::size_t i = 0; i < touched_.size(); ++i) {
    Connection* c = touched_[i];
    c->touched = false;
    flush(*c);
  }
  touched_.clear();
}

void Connections::flush(Connection& c) {
  if (c.is_up() || c.state == ConnState::kDraining) c.link->flush();
  if (c.state == ConnState::kDraining && c.outq.empty() && c.inflight_count == 0) disconnect(c);
  if (!c.is_up()) return;
  if (c.unexamined > 0) {
    compact(c);
    over_pool_share(c);
  } else if (c.outq.empty() && c.compact_buffer) {
    c.compact_buffer.reset();  // what was copied into it has gone (or goes with its sends)
    c.compact_used = 0;
  }
}

namespace {

/// Whether a waiting delivery is worth copying out of its receive buffer:
/// at most half a buffer, and as received (not a piece of a frame).
bool compactable(const OutItem& item, std::uint32_t buffer_size) {
  return item.is_delivery() && item.body && item.strip == 0 && item.cut_start == 0 &&
         item.body_len <= buffer_size / 2;
}

}  // namespace

void Connections::compact(Connection& c) {
  auto& q = c.outq;
  const std::size_t first = q.size() - std::min<std::size_t>(c.unexamined, q.size());
  // A few waiting buffers are not worth the copies: a subscriber that is
  // merely waiting for its next credit holds that much for a moment.
  if (c.pins < kCompactAbovePins) {
    c.unexamined = 0;
    return;
  }
  // Only what has waited kCompactAfter: by then a subscriber that keeps up
  // has sent it, and so have the others that share its buffer (a copy made
  // sooner would free nothing, and subscribers that lag together would each
  // hold a copy of one shared buffer). The younger ones, at the back, wait
  // for a later flush; each item is looked at once.
  const std::int64_t young = (ctx_.now - kCompactAfter).time_since_epoch().count();
  std::size_t end = first;
  while (end < q.size() && q[end].received_at <= young) ++end;
  c.unexamined = static_cast<std::uint32_t>(q.size() - end);
  if (end == first) return;
  BufferPool& pool = *ctx_.core.pool;
  const std::uint32_t size = pool.buffer_size();
  const std::uint32_t max_frame = std::min(c.peer_buffer_size, size);
  const std::uint32_t reserve = ctx_.core.pool_shares.reserve();
  std::vector<OutItem> kept;
  kept.reserve(q.size() - first);
  std::uint64_t copied = 0;
  for (std::size_t i = first; i < end; ++i) {
    OutItem item = std::move(q[i]);
    // Not worth a copy, or still shared: a subscriber that lags with others.
    if (!compactable(item, size) || pool.shared(item.body.index())) {
      kept.push_back(std::move(item));
      continue;
    }
    bool fresh = false;
    if (!c.compact_buffer || c.compact_used + item.body_len > size) {
      std::uint32_t index = 0;
      if (pool.acquire(&index, 1, reserve) == 0) {  // short of buffers: it stays where it is
        kept.push_back(std::move(item));
        continue;
      }
      c.compact_buffer = BufferRef(&pool, index);
      c.compact_used = 0;
      fresh = true;
    }
    std::memcpy(c.compact_buffer.data() + c.compact_used, item.body.data() + item.body_offset, item.body_len);
    if (item.pinned) pin(c, -1);
    item.body = c.compact_buffer.clone();
    item.body_offset = c.compact_used;
    item.pinned = fresh;
    if (fresh) pin(c, 1);
    c.compact_used += item.body_len;
    copied += item.messages;
    if (!kept.empty() && extend_delivery(kept.back(), item, max_frame)) continue;
    kept.push_back(std::move(item));
  }
  for (std::size_t i = end; i < q.size(); ++i) kept.push_back(std::move(q[i]));
  q.erase(q.begin() + static_cast<std::ptrdiff_t>(first), q.end());
  for (OutItem& item : kept) q.push_back(std::move(item));
  ctx_.stats.compacted_messages.add(copied);
}

bool Connections::over_pool_share(Connection& c) {
  if (c.pins < PoolShares::kBacklogPins) return false;
  const auto& shares = ctx_.core.pool_shares;
  const auto& opt = ctx_.options;
  ShareScope scope;
  std::int64_t limit = 0;
  std::string what;
  // The user's and the broker's bounds count buffers that subscribers of
  // one message share once per subscriber: they apply only while the pool
  // itself runs short (no more free than twice the reserve), so a fan-out
  // of large messages to subscribers that keep up is never cut for them.
  const bool pool_short = !ctx_.core.pool->has_free_above(2 * shares.reserve());
  if (c.pins > (limit = shares.share(opt.pool_share_percent))) {
    scope = ShareScope::kConnection;
    what = "its share of the buffer pool (limits.pool_share_percent " +
           std::to_string(opt.pool_share_percent) + "%: " + std::to_string(limit) + " buffers)";
  } else if (pool_short && c.tenant &&
             c.tenant->pins.load(std::memory_order_relaxed) >
                 (limit = shares.share(opt.user_pool_share_percent))) {
    scope = ShareScope::kUser;
    what = "its user's share of the buffer pool (limits.user_pool_share_percent " +
           std::to_string(opt.user_pool_share_percent) + "%: " + std::to_string(limit) +
           " buffers for the user's connections together) while the pool runs short";
  } else if (pool_short && c.pins > (limit = shares.fair_part())) {
    scope = ShareScope::kBroker;
    what = "its part of the pool while the pool runs short (the subscribers' budget of " +
           std::to_string(shares.queue_budget()) + " buffers shared by " +
           std::to_string(shares.backlogged()) + " backlogged subscribers: " + std::to_string(limit) +
           " each)";
  } else {
    return false;
  }
  const std::string why = std::to_string(c.pending_messages) + " messages queued hold " +
                          std::to_string(c.pins) + " pool buffers, above " + what;
  spdlog::warn("connection {} ({}): slow consumer, {}", c.id, c.peer, why);
  ctx_.stats.share_cuts[static_cast<std::size_t>(scope)].add();
  close(c, CloseReason::kSlowConsumer, ErrorCode::kSlowConsumer, why);
  return true;
}

}  // namespace rdmabroker::daemon
