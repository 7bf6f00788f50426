// SPDX-License-Identifier: Apache-2.0
#include "frames/route_frames.hpp"

#include <spdlog/spdlog.h>

#include <cstring>

#include "rdmabroker/proto/info.hpp"

namespace rdmabroker::daemon {

using proto::ErrorCode;
using proto::FrameType;

void RouteFrames::process(Connection& c, const BufferRef& buf, std::uint32_t begin, std::uint32_t end) {
  ctx_.assert_on_loop();
  std::span<const std::byte> data(buf.data(), end);
  std::size_t off = begin;
  while (off < end && c.is_up()) {
    proto::Frame f;
    const auto st = proto::decode_frame(data.subspan(off), ctx_.options.buffer_size, f);
    if (st != proto::DecodeStatus::kOk) {
      connections_.close(c, CloseReason::kProtocolError, proto::error_for(st),
                         "its broker sent an undecodable frame: " + std::string(proto::to_string(st)));
      return;
    }
    f.offset = off;
    switch (f.header.type) {
      case FrameType::kDeliver:
        on_deliver(c, f, buf);
        break;
      case FrameType::kPong:
        on_pong(c);
        break;
      case FrameType::kInfo:
        on_info(c, f);
        break;
      case FrameType::kError:
        on_error(c, f);
        break;
      case FrameType::kClose:
        c.close_received = true;
        if (c.dialed->refusal.empty() && f.header.arg != 0)
          c.dialed->refusal =
              "closed by its broker: " + std::string(proto::to_string(static_cast<ErrorCode>(f.header.arg)));
        connections_.close(c, CloseReason::kClientClose);
        return;
      case FrameType::kCredit:
        c.link->add_send_credits(f.header.arg);
        break;
      case FrameType::kAbort:
        router_.abort_from_peer(c, f.header.arg, f.header.sequence);
        break;
      case FrameType::kNoResponders:
        break;  // a route sends no request
      default:
        connections_.close(c, CloseReason::kProtocolError, ErrorCode::kProtocolViolation,
                           std::string(proto::to_string(f.header.type)) + " from a route's broker");
        return;
    }
    off += f.header.frame_len();
  }
}

void RouteFrames::on_deliver(Connection& c, const proto::Frame& f, const BufferRef& buf) {
  const std::uint32_t sid = f.header.arg;
  const auto it = c.dialed->by_sid.find(sid);
  if (it == c.dialed->by_sid.end()) return;  // unsubscribed there meanwhile: nobody here wants it now
  const DialedRoute::Entry entry = it->second;
  const std::size_t base = f.offset + proto::kHeaderSize;
  // The PUBLISH frames as its broker received them (SPEC.md §3.4), each
  // routed where it lies in the receive buffer.
  const auto st = proto::for_each_delivered(f, [&](const proto::Frame& inner) {
    if (!c.is_up()) return;
    proto::Frame at = inner;
    at.offset = base + inner.offset;
    router_.route_from_peer(c, sid, entry, at, buf);
  });
  if (st != proto::DecodeStatus::kOk && c.is_up()) {
    connections_.close(c, CloseReason::kProtocolError, proto::error_for(st),
                       "its broker sent an undecodable DELIVER: " + std::string(proto::to_string(st)));
  }
}

void RouteFrames::on_pong(Connection& c) {
  DialedRoute& d = *c.dialed;
  if (d.pings.empty()) return;
  const DialedRoute::Ping p = d.pings.front();
  d.pings.pop_front();
  RouteEvents& events = *ctx_.core.routes;
  if (!d.logged_in) {
    // The PING after CONNECT is answered once the login is accepted (SPEC.md §2.4).
    d.logged_in = true;
    c.state = ConnState::kOpen;
    events.route_up(d.dial.route, std::string(c.link->protocol()) + " " + c.link->where() + ", connection " +
                                      std::to_string(c.id));
  }
  d.synced = std::max(d.synced, p.through);
  if (!p.reported) events.route_synced(d.dial.route, p.through);
}

void RouteFrames::on_info(Connection& c, const proto::Frame& f) {
  std::string why;
  const auto info = proto::decode_info(
      std::string_view(reinterpret_cast<const char*>(f.payload.data()), f.payload.size()), &why);
  if (!info) {
    spdlog::warn("route {}: its broker's INFO is malformed ({}); ignored", c.dialed->dial.url, why);
    return;
  }
  c.dialed->broker = info->self.id;
  ctx_.core.routes->route_info(c.dialed->dial.route, *info);
}

void RouteFrames::on_error(Connection& c, const proto::Frame& f) {
  DialedRoute& d = *c.dialed;
  const auto code = static_cast<ErrorCode>(f.header.arg);
  const std::string text(reinterpret_cast<const char*>(f.payload.data()), f.payload.size());
  const std::string said = std::string(proto::to_string(code)) + (text.empty() ? "" : ": " + text);
  if (!d.logged_in) {
    d.refusal = said;  // the login's verdict: reported with the close that follows
    return;
  }
  // An ERROR about a subscription names it (SPEC.md §3.5): it ended there,
  // and the next change of interest subscribes to its entry again.
  if (const auto sid = static_cast<std::uint32_t>(f.header.sequence); sid != 0) {
    if (auto it = d.by_sid.find(sid); it != d.by_sid.end()) {
      d.sid_of.erase(it->second.id);
      d.by_sid.erase(it);
      d.dial.counters->interest.store(d.sid_of.size(), std::memory_order_relaxed);
    }
  }
  spdlog::warn("route {}: {}", d.dial.url, said);
}

void RouteFrames::send(Connection& c, proto::FrameHeader h, std::string_view subject, std::string_view reply,
                       std::string_view payload) {
  const std::size_t body = subject.size() + reply.size() + payload.size();
  OutItem item;
  if (proto::kHeaderSize + proto::align_up(body) <= kSendBlockSize) {
    item = make_frame(h, subject, reply, payload);
  } else {
    // Longer than a send block (a login's credentials): from a pool buffer, like INFO.
    std::uint32_t index = 0;
    if (ctx_.core.pool->acquire(&index, 1) != 1) {
      c.dialed->refusal = "no pool buffer for the login";
      connections_.close(c, CloseReason::kConnectFailed);
      return;
    }
    BufferRef buf(ctx_.core.pool, index);
    std::byte* p = buf.data();
    for (std::string_view part : {subject, reply, payload}) {
      std::memcpy(p, part.data(), part.size());
      p += part.size();
    }
    std::memset(p, 0, proto::align_up(body) - body);
    h.subject_len = static_cast<std::uint16_t>(subject.size());
    h.reply_len = static_cast<std::uint16_t>(reply.size());
    h.payload_len = static_cast<std::uint32_t>(payload.size());
    item.header = h;
    item.body = std::move(buf);
    item.body_len = static_cast<std::uint32_t>(proto::align_up(body));
  }
  connections_.enqueue(c, std::move(item));
}

void RouteFrames::ping(Connection& c, std::uint32_t through) {
  DialedRoute& d = *c.dialed;
  proto::FrameHeader h;
  h.type = FrameType::kPing;
  send(c, h, {}, {}, {});
  d.pings.push_back({through, ctx_.now, false});
  d.pinged = std::max(d.pinged, through);
}

void RouteFrames::log_in(Connection& c) {
  DialedRoute& d = *c.dialed;
  const RouteDial& dial = d.dial;
  if (c.protocol_version < proto::kRouteVersion) {
    d.refusal = "the broker speaks protocol version " + std::to_string(c.protocol_version) +
                ": routes need version " + std::to_string(proto::kRouteVersion);
    connections_.close(c, CloseReason::kConnectFailed);
    return;
  }
  proto::FrameHeader h;
  h.type = FrameType::kConnect;
  h.flags = proto::kFlagRoute;
  h.arg = static_cast<std::uint32_t>(dial.user.size());
  // Version 7: this broker's route URLs after its id (SPEC.md §8, "Gossip").
  const std::string name = c.protocol_version >= proto::kGossipVersion
                               ? proto::route_login_name(dial.server, dial.announce)
                               : dial.server;
  std::string credentials = dial.user + dial.password;
  send(c, h, dial.cluster, name, credentials);
  explicit_bzero(credentials.data(), credentials.size());
  // Everything after CONNECT waits for the verdict there and is then taken
  // in order (SPEC.md §2.4): the subscriptions go at once, and the PING's
  // PONG says both that the login took and that they are in effect.
  const auto interest = ctx_.core.interest->snapshot();
  reconcile(c, interest);
  if (d.pings.empty()) ping(c, interest.through);
}

void RouteFrames::reconcile(Connection& c, const ClusterInterest::Snapshot& interest) {
  DialedRoute& d = *c.dialed;
  bool subscribed = false;
  for (const auto& e : interest.entries) {
    if (d.sid_of.contains(e.id)) continue;
    const std::uint32_t sid = d.next_sid++;
    d.by_sid[sid] = {e.id, e.group};
    d.sid_of[e.id] = sid;
    proto::FrameHeader h;
    h.type = FrameType::kSubscribe;
    h.arg = sid;
    send(c, h, e.pattern, e.group, {});  // a SUBSCRIBE's reply field is its queue group (SPEC.md §3.3)
    subscribed = true;
  }
  std::vector<std::uint32_t> gone;
  for (const auto& [entry, sid] : d.sid_of) {
    const bool wanted = std::any_of(interest.entries.begin(), interest.entries.end(),
                                    [&](const auto& e) { return e.id == entry; });
    if (!wanted) gone.push_back(sid);
  }
  for (const std::uint32_t sid : gone) {
    proto::FrameHeader h;
    h.type = FrameType::kUnsubscribe;
    h.arg = sid;
    send(c, h, {}, {}, {});
    d.sid_of.erase(d.by_sid[sid].id);
    d.by_sid.erase(sid);
  }
  d.dial.counters->interest.store(d.sid_of.size(), std::memory_order_relaxed);
  // A PONG after the SUBSCRIBEs confirms them; with nothing new to confirm
  // the PING still orders this interest after what is outstanding.
  if (c.is_up() && (subscribed || interest.through > d.pinged)) ping(c, interest.through);
}

void RouteFrames::interest_changed() {
  const auto interest = ctx_.core.interest->snapshot();
  std::uint32_t stall_ms = 0;
  for (const std::uint64_t id : routes_) {
    Connection* c = connections_.find_up(id);
    if (c == nullptr || !c->dialed->logged_in) continue;  // a login subscribes to everything
    if constexpr (fault::kEnabled) {
      if (stall_ms == 0) stall_ms = ctx_.core.faults.route_stall_ms.exchange(0);
      if (stall_ms > 0) {
        spdlog::warn("fault: route {} waits {} ms before it subscribes to new interest", c->dialed->dial.url,
                     stall_ms);
        c->dialed->held_until = ctx_.now + std::chrono::milliseconds(stall_ms);
        c->dialed->held = true;
        continue;
      }
    }
    if (!c->dialed->held) reconcile(*c, interest);
  }
}

void RouteFrames::check() {
  std::erase_if(routes_, [&](std::uint64_t id) { return connections_.find(id) == nullptr; });
  for (const std::uint64_t id : routes_) {
    Connection* c = connections_.find_up(id);
    if (c == nullptr) continue;
    DialedRoute& d = *c->dialed;
    if (d.held && ctx_.now >= d.held_until) {
      d.held = false;
      reconcile(*c, ctx_.core.interest->snapshot());
    }
    for (auto& p : d.pings) {
      if (p.reported || ctx_.now - p.sent < kSyncTimeout) continue;
      // Not waited for any longer: clients' PONGs go out without it.
      p.reported = true;
      if (d.logged_in) {
        spdlog::debug("route {}: new subscriptions not confirmed within {} s", d.dial.url,
                      kSyncTimeout.count());
        ctx_.core.routes->route_synced(d.dial.route, p.through);
      }
    }
  }
}

}  // namespace rdmabroker::daemon
