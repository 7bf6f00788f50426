// SPDX-License-Identifier: Apache-2.0
#include "frames/frame_handler.hpp"

#include <spdlog/spdlog.h>

#include "broker/cluster_interest.hpp"
#include "broker/channels.hpp"
#include "rdmabroker/proto/multicast.hpp"
#include "connection/interest.hpp"

namespace rdmabroker::daemon {

using proto::ErrorCode;
using proto::FrameType;

void FrameHandler::process(Connection& c, const BufferRef& buf, std::uint32_t begin, std::uint32_t end) {
  if (c.dialed) return routes_.process(c, buf, begin, end);
  ctx_.assert_on_loop();
  std::span<const std::byte> data(buf.data(), end);
  std::size_t off = begin;
  while (off < end && c.is_up()) {
    if (c.state == ConnState::kVerifying || c.rendezvous.open || c.stalled) {
      // Everything after CONNECT waits for the verdict, in order (SPEC.md
      // §2.4); everything after an RDV_OFFER for its message (§3.8); a
      // stalled publisher's next frames for the stall's end (§6), so that
      // what it adds to a backlog is one frame, not the rest of a batch.
      hold_input(c, buf, static_cast<std::uint32_t>(off), end);
      return;
    }
    proto::Frame f;
    const auto st = proto::decode_frame(data.subspan(off), ctx_.options.buffer_size, f);
    if (st != proto::DecodeStatus::kOk) {
      if (st == proto::DecodeStatus::kTooLarge) ctx_.stats.limit_payload.add();
      connections_.close(c, CloseReason::kProtocolError, proto::error_for(st),
                         "frame at byte " + std::to_string(off - begin) + " of " +
                             std::to_string(end - begin) +
                             " received bytes: " + std::string(proto::to_string(st)));
      return;
    }
    if (f.header.header_len != 0 && c.protocol_version < proto::kHeadersVersion) {
      // Offset 10 is reserved in version 1 (SPEC.md §3.1).
      connections_.close(c, CloseReason::kProtocolError, ErrorCode::kMalformedFrame,
                         "reserved field not zero: a header block needs protocol version 2, this connection "
                         "negotiated 1");
      return;
    }
    f.offset = off;
    bool going_on = true;
    if (f.header.type == FrameType::kCredit) {
      c.link->add_send_credits(f.header.arg);  // in every state (SPEC.md §5)
    } else if (f.header.type == FrameType::kClose) {
      c.close_received = true;
      connections_.close(c, CloseReason::kClientClose);
      going_on = false;
    } else {
      going_on = c.state == ConnState::kOpen ? on_frame(c, f, buf) : before_authentication(c, f);
    }
    if (!going_on) return;
    off += f.header.frame_len();
  }
}

bool FrameHandler::on_frame(Connection& c, const proto::Frame& f, const BufferRef& buf) {
  switch (f.header.type) {
    case FrameType::kPublish:
      return on_publish(c, f, buf);
    case FrameType::kSubscribe:
      on_subscribe(c, f);
      return true;
    case FrameType::kUnsubscribe:
      on_unsubscribe(c, f);
      return true;
    case FrameType::kMcastJoined:
    case FrameType::kMcastRepair:
      return on_multicast(c, f);
    case FrameType::kPing:
      answer_ping(c);
      return true;
    case FrameType::kAbort:
      return on_abort(c);
    case FrameType::kRendezvousOffer:
      return on_offer(c, f);
    case FrameType::kRendezvousReady:
      return on_ready(c, f);
    case FrameType::kConsume:
    case FrameType::kAck:
    case FrameType::kFetch:
      return on_consumer_frame(c, f);
    case FrameType::kCredit:
    case FrameType::kClose:
      return true;  // process() takes them, in every state
    case FrameType::kConnect:
      connections_.close(c, CloseReason::kProtocolError, ErrorCode::kProtocolViolation, "CONNECT sent twice");
      return false;
    case FrameType::kDeliver:
    case FrameType::kPong:
    case FrameType::kError:
    case FrameType::kNoResponders:
    case FrameType::kMcastJoin:
    case FrameType::kMcastLoss:
    case FrameType::kMcastLeave:
    case FrameType::kInfo:
    case FrameType::kRendezvousRelease:
    case FrameType::kPubAck:
    case FrameType::kConsumerReady:
    case FrameType::kFetchDone:
      break;
  }
  connections_.close(c, CloseReason::kProtocolError, ErrorCode::kProtocolViolation,
                     std::string(proto::to_string(f.header.type)) + " is sent by the broker, never to it");
  return false;
}

bool FrameHandler::on_publish(Connection& c, const proto::Frame& f, const BufferRef& buf) {
  const auto& h = f.header;
  const auto& opt = ctx_.options;
  if (c.identity->route) {
    // A route only subscribes: its broker takes what it wants (SPEC.md §8).
    connections_.close(c, CloseReason::kProtocolError, ErrorCode::kProtocolViolation,
                       "PUBLISH on a route: a route only subscribes (SPEC.md §8)");
    return false;
  }
  if (h.frame_len() > proto::max_publish_frame(opt.buffer_size)) {
    return refuse_too_large(c, "PUBLISH of " + std::to_string(h.frame_len()) +
                                   " bytes exceeds the limit of " +
                                   std::to_string(proto::max_publish_frame(opt.buffer_size)));
  }
  if (h.is_fragment()) return on_fragment(c, f, buf);
  if (c.open_message.open) {
    return fragment_violation(c, "a whole PUBLISH while a fragmented message is open (" +
                                     std::to_string(c.open_message.next_offset) + " of " +
                                     std::to_string(c.open_message.length) +
                                     " bytes sent): a message's fragments go back to back");
  }
  if (opt.max_payload != 0 && h.payload_len > opt.max_payload) {
    return refuse_too_large(c, "payload of " + std::to_string(h.payload_len) +
                                   " bytes exceeds limits.max_payload (" + std::to_string(opt.max_payload) +
                                   ")");
  }
  if ((h.flags & proto::kFlagStream) != 0) {
    connections_.close(c, CloseReason::kProtocolError, ErrorCode::kMalformedFrame,
                       "flag not allowed: STREAM marks a consumer's message from the broker (SPEC.md §3.11)");
    return false;
  }
  const bool ack = (h.flags & proto::kFlagAck) != 0;
  if (ack && c.protocol_version < proto::kStreamsVersion) {
    connections_.close(c, CloseReason::kProtocolError, ErrorCode::kMalformedFrame,
                       "flag not allowed: ACK needs protocol version 10, this connection negotiated " +
                           std::to_string(c.protocol_version));
    return false;
  }
  if (!may_publish(c, f.subject)) {
    // Refused, not accepted: nothing was lost. One waiting for an ACK hears it there.
    if (ack) {
      ctx_.stats.denied_publish.add();
      connections_.enqueue(c, make_pub_ack(h.sequence, ErrorCode::kPermissionDenied));
    } else {
      deny(c, "publish", f.subject, 0);
    }
    return true;
  }
  ctx_.stats.messages_in.add();
  ctx_.stats.bytes_in.add(h.payload_len);
  ++c.messages_in;
  c.bytes_in += h.payload_len;
  if (ack) {
    // Subscribers get the frame as it came, less ACK: a flag between this
    // publisher and the broker, which older clients would take as malformed.
    auto* flags = reinterpret_cast<std::uint16_t*>(buf.data() + f.offset + 4);
    *flags = static_cast<std::uint16_t>(*flags & ~proto::kFlagAck);
  }
  router_.route_publish(c, f, buf);
  return true;
}

bool FrameHandler::fragment_violation(Connection& c, std::string why) {
  connections_.close(c, CloseReason::kProtocolError, ErrorCode::kProtocolViolation, std::move(why));
  return false;
}

bool FrameHandler::refuse_too_large(Connection& c, std::string why) {
  ctx_.stats.limit_payload.add();
  connections_.close(c, CloseReason::kProtocolError, ErrorCode::kPayloadTooLarge, std::move(why));
  return false;
}

bool FrameHandler::on_fragment(Connection& c, const proto::Frame& f, const BufferRef& buf) {
  const auto& h = f.header;
  auto& open = c.open_message;
  if (c.protocol_version < proto::kFragmentsVersion) {
    connections_.close(c, CloseReason::kProtocolError, ErrorCode::kMalformedFrame,
                       "flag not allowed: FRAGMENT needs protocol version 4, this connection negotiated " +
                           std::to_string(c.protocol_version));
    return false;
  }
  if (h.sequence != c.id) {
    return fragment_violation(c, "a fragment's sequence must be the connection id from the accept (" +
                                     std::to_string(c.id) + "), not " + std::to_string(h.sequence));
  }
  if (h.offset == 0) {
    if (open.open) {
      return fragment_violation(c, "a new message began while " + std::to_string(open.next_offset) + " of " +
                                       std::to_string(open.length) + " bytes of the last were sent");
    }
    const std::uint32_t limit = ctx_.options.max_payload;
    if (h.arg > limit) {
      return refuse_too_large(c, "message of " + std::to_string(h.arg) +
                                     " bytes exceeds limits.max_payload (" + std::to_string(limit) + ")");
    }
    open = Connection::OpenMessage{true, h.arg, 0, {}, may_publish(c, f.subject), ctx_.now};
    connections_.watch_open_message(c);
    if (!open.accepted) {
      // Refused, not accepted: its fragments are taken and go nowhere (nor count as received).
      deny(c, "publish", f.subject, 0);
    } else {
      ctx_.stats.messages_in.add();
      ++c.messages_in;
      router_.route_publish(c, f, buf);  // pins the recipients in c.open_message
    }
  } else {
    if (!open.open) {
      return fragment_violation(c, "a fragment at offset " + std::to_string(h.offset) +
                                       " of no message (the first fragment has offset 0)");
    }
    if (h.arg != open.length || h.offset != open.next_offset) {
      return fragment_violation(
          c, "a fragment at offset " + std::to_string(h.offset) + " of a " + std::to_string(h.arg) +
                 "-byte message where offset " + std::to_string(open.next_offset) + " of the " +
                 std::to_string(open.length) + "-byte message was due (fragments go in order, each once)");
    }
    router_.route_fragment(c, f, buf);
    open.waiting_since = ctx_.now;
  }
  if (!c.is_up()) return false;
  if (open.accepted) {
    ctx_.stats.bytes_in.add(h.payload_len);
    c.bytes_in += h.payload_len;
  }
  open.next_offset += h.payload_len;
  if (open.next_offset == open.length) open = {};
  return true;
}

bool FrameHandler::on_abort(Connection& c) {
  if (!c.open_message.open) return fragment_violation(c, "ABORT without a fragmented message in progress");
  router_.abort_open_message(c);
  return true;
}

void FrameHandler::on_subscribe(Connection& c, const proto::Frame& f) {
  const std::uint32_t sid = f.header.arg;
  const auto& opt = ctx_.options;
  if (c.subscriptions.contains(sid)) {
    return reply_error(c, ErrorCode::kDuplicateSubscription,
                       "subscription id " + std::to_string(sid) + " is already in use");
  }
  // A route carries its whole broker's interest: the broker-wide budget bounds it, not the per-client limit.
  if (c.subscriptions.size() >= opt.max_subscriptions && !c.identity->route) {
    ctx_.stats.limit_subscriptions.add();
    // Logged once per connection: a client looping over subscribe must not flood the log.
    if (!std::exchange(c.subscription_limit_logged, true)) {
      spdlog::warn("connection {} from {}: limit of {} subscriptions reached (limits.max_subscriptions)",
                   c.id, c.peer, opt.max_subscriptions);
    }
    return reply_error(c, ErrorCode::kTooManySubscriptions,
                       "limit of " + std::to_string(opt.max_subscriptions) + " subscriptions reached", sid);
  }
  if (!c.identity->may_subscribe(f.subject)) return deny(c, "subscribe", f.subject, sid);
  const std::uint64_t cost = SubscriptionBudget::cost(f.subject, f.reply);
  bool tenant_charged = false;
  if (!charge_subscription(c, sid, cost, tenant_charged)) return;
  add_subscription(ctx_, c, f, cost);
  c.subscriptions[sid].tenant_charged = tenant_charged;
}

bool FrameHandler::charge_subscription(Connection& c, std::uint32_t sid, std::uint64_t cost,
                                       bool& tenant_charged) {
  const auto& opt = ctx_.options;
  // The tenant's quota first: one user (one anonymous address) that
  // subscribes without end stops at its part and leaves the rest to others.
  // (100 %: no quota of its own, the broker-wide bounds alone.)
  TenantUsage* tenant =
      c.identity->route || opt.user_subscription_share_percent >= 100 ? nullptr : c.tenant.get();
  if (tenant != nullptr) {
    const std::uint32_t percent = opt.user_subscription_share_percent;
    if (auto refusal =
            tenant->subscriptions.take(cost, SubscriptionBudget::part(opt.max_subscriptions_total, percent),
                                       SubscriptionBudget::part(opt.max_subscription_memory, percent));
        refusal != SubscriptionBudget::Refusal::kNone) {
      refuse_subscription(c, sid, refusal, /*tenant=*/true);
      return false;
    }
  }
  if (auto refusal =
          ctx_.core.subscription_budget.take(cost, opt.max_subscriptions_total, opt.max_subscription_memory);
      refusal != SubscriptionBudget::Refusal::kNone) {
    if (tenant != nullptr) tenant->subscriptions.give_back(cost);
    refuse_subscription(c, sid, refusal, /*tenant=*/false);
    return false;
  }
  tenant_charged = tenant != nullptr;
  return true;
}

void FrameHandler::on_unsubscribe(Connection& c, const proto::Frame& f) {
  auto it = c.subscriptions.find(f.header.arg);
  if (it == c.subscriptions.end()) {
    return reply_error(c, ErrorCode::kUnknownSubscription,
                       "no subscription with id " + std::to_string(f.header.arg));
  }
  drop_subscription(ctx_, c, it->second, it->first);
  c.subscriptions.erase(it);
}

bool FrameHandler::on_multicast(Connection& c, const proto::Frame& f) {
  MulticastChannels* engine = ctx_.core.multicast;
  if (engine == nullptr || !c.multicast_capable) {
    connections_.close(c, CloseReason::kProtocolError, ErrorCode::kProtocolViolation,
                       std::string(proto::to_string(f.header.type)) +
                           " without multicast (the broker has it off, or the client "
                           "did not offer it when connecting)");
    return false;
  }
  const auto it = c.subscriptions.find(f.header.arg);
  if (it == c.subscriptions.end() || it->second.channel == 0) {
    // Crossed with an UNSUBSCRIBE, or a subject moved off multicast by a reload: nothing to do.
    return true;
  }
  if (f.header.type == FrameType::kMcastJoined) {
    engine->joined(c.id, f.header.arg, f.header.sequence,
                   std::string(reinterpret_cast<const char*>(f.payload.data()), f.payload.size()));
  } else {
    engine->repair(c.id, f.header.arg, f.header.sequence, proto::decode_count(f.payload));
  }
  return true;
}

void FrameHandler::send_info(Connection& c, const std::shared_ptr<const Announcement>& info) {
  // A route this broker dialed is its client there: a client sends no INFO.
  if (info && !c.dialed && c.protocol_version >= proto::kGossipVersion)
    connections_.enqueue(c, make_info(*info, c.peer_buffer_size));
}

void FrameHandler::answer_ping(Connection& c) {
  // In a cluster a PONG also means "the other brokers have your
  // subscriptions' interest" (SPEC.md §8): a request's reply, or a message
  // published elsewhere right after, then finds its way here. Held PONGs
  // keep their order: a later PING waits behind an earlier one.
  const ClusterInterest* interest = ctx_.core.interest;
  if (c.pongs_held == 0 && (interest == nullptr || c.interest_through <= interest->synced())) {
    connections_.enqueue(c, make_control(FrameType::kPong, 0));
    return;
  }
  if (c.pongs_held++ == 0) pongs_held_.push_back(c.id);
}

void FrameHandler::release_pongs(std::uint32_t through) {
  std::erase_if(pongs_held_, [&](std::uint64_t id) {
    Connection* c = connections_.find(id);
    if (c == nullptr || !c->is_up()) return true;  // gone, or closing: nobody waits for it
    if (c->interest_through > through) return false;
    for (; c->pongs_held > 0; --c->pongs_held) connections_.enqueue(*c, make_control(FrameType::kPong, 0));
    return true;
  });
}

void FrameHandler::reply_error(Connection& c, ErrorCode code, std::string text, std::uint32_t sid) {
  connections_.enqueue(
      c, make_control(FrameType::kError, static_cast<std::uint32_t>(code), std::move(text), sid));
}

}  // namespace rdmabroker::daemon
