// SPDX-License-Identifier: Apache-2.0
// Session: what the transport hands up, frame by frame, and the callbacks it ends in (session.hpp).
#include <algorithm>
#include <limits>
#include <thread>

#include "client_internal.hpp"
#include "session.hpp"

namespace rdmabroker {

using proto::FrameType;

// ---------------------------------------------------------------- receive

void Session::on_frames(std::span<const std::byte> data, Deliveries& deliveries, std::vector<Error>& errors) {
  deliveries.received_at = std::chrono::steady_clock::now();
  std::size_t off = 0;
  while (off < data.size()) {
    proto::Frame f;
    const auto st = proto::decode_frame(data.subspan(off), recv_buffer_size_, f);
    if (st != proto::DecodeStatus::kOk) {
      std::lock_guard lock(mu_);
      errors.push_back(Error{ErrorKind::kBrokerError,
                             "undecodable frame from the broker: " + std::string(proto::to_string(st))});
      fail_locked(errors.back());
      return;
    }
    switch (f.header.type) {
      case FrameType::kDeliver:
        if (!on_deliver(f, deliveries, errors)) return;
        break;
      case FrameType::kNoResponders: {
        std::lock_guard lock(mu_);
        if (auto it = pending_.find(std::string(f.subject)); it != pending_.end() && !it->second.done) {
          it->second.done = true;
          it->second.no_responders = true;
          cv_.notify_all();
        }
        break;
      }
      case FrameType::kMcastJoin: {
        const auto j = proto::decode_mcast_join(f.payload);
        SequencedStream& stream = streams_[f.header.arg];
        stream.channel = j->channel;  // decode_frame checked the payload's length
        if (!stream.started) {
          // Everything before this number came over the connection already.
          stream.started = true;
          stream.next = f.header.sequence;
        }
        transport_->join_group(f.header.arg, *j, f.header.sequence);
        break;
      }
      case FrameType::kMcastLeave:
        // The group is gone; the rest comes over the connection, and what the
        // group did not bring before is asked for like any gap.
        transport_->leave_group(f.header.arg);
        if (auto it = streams_.find(f.header.arg); it != streams_.end() && f.header.sequence > 0) {
          it->second.tail = std::max(it->second.tail, f.header.sequence - 1);
        }
        break;
      case FrameType::kMcastLoss:
        on_loss(f.header.arg, f.header.sequence, proto::decode_count(f.payload), errors);
        deliver_in_order(f.header.arg, streams_[f.header.arg], deliveries);
        break;
      case FrameType::kPong:
        // Counted only in dispatch(), after the callbacks and error reports
        // of everything that arrived before it: flush() then means those
        // have been handed to the application too.
        ++pongs_pending_;
        break;
      case FrameType::kError:
      case FrameType::kClose:
        on_error_frame(f, errors);
        break;
      case FrameType::kInfo:
        if (!on_info(f, errors)) return;
        break;
      case FrameType::kAbort:
        // The publisher left or gave up half-way: what came of it is no message.
        if (reassembly_.erase({f.header.arg, f.header.sequence}) != 0)
          aborted_messages_.fetch_add(1, std::memory_order_relaxed);
        break;
      default:
        break;  // CREDIT is the transport's; client-to-broker types are never sent to us
    }
    off += f.header.frame_len();
  }
}

bool Session::on_info(const proto::Frame& f, std::vector<Error>& errors) {
  std::string why;
  std::optional<proto::Info> info;
  if (protocol_version_ < proto::kGossipVersion) {
    why = "INFO needs protocol version " + std::to_string(proto::kGossipVersion) +
          ", this connection negotiated " + std::to_string(protocol_version_);
  } else {
    info = proto::decode_info(
        std::string_view(reinterpret_cast<const char*>(f.payload.data()), f.payload.size()), &why);
  }
  ServerInfo out;
  const auto broker = [&](const proto::BrokerInfo& b) -> std::optional<ServerInfo::Broker> {
    // Every URL as connect() would take it: a broker announces nothing a client cannot use.
    for (const auto* list : {&b.urls, &b.routes}) {
      for (const auto& u : *list) {
        if (auto parsed = parse_url(u); !parsed || !parsed->user.empty() || !parsed->token.empty()) {
          why = "announces '" + u + "', not a broker URL without credentials";
          return std::nullopt;
        }
      }
    }
    return ServerInfo::Broker{b.id, b.urls, b.routes};
  };
  if (info) {
    auto self = broker(info->self);
    if (self) out.self = std::move(*self);
    for (const auto& p : info->peers) {
      if (auto peer = broker(p)) out.peers.push_back(std::move(*peer));
    }
    out.cluster = info->cluster;
  }
  {
    std::lock_guard lock(mu_);
    if (!why.empty()) {
      errors.push_back(Error{ErrorKind::kBrokerError, "malformed INFO from the broker: " + why});
      fail_locked(errors.back());
      return false;
    }
    server_info_ = out;
  }
  if (opt_.on_server_info) opt_.on_server_info(out);  // without mu_: it may call into this client
  return true;
}

bool Session::on_deliver(const proto::Frame& f, Deliveries& deliveries, std::vector<Error>& errors) {
  const bool sequenced = (f.header.flags & proto::kFlagSequenced) != 0;
  std::uint64_t seq = f.header.sequence;
  const auto st = proto::for_each_delivered(f, [&](const proto::Frame& inner) {
    if (sequenced) {
      Message m;
      fill_message(m, f.header.arg, inner);
      on_sequenced(f.header.arg, seq++, std::move(m), deliveries, false);
      return;
    }
    if (inner.header.is_fragment()) return on_fragment(f.header.arg, inner, f.header.relay_ns(), deliveries);
    deliveries.add_in_place(detail::ViewAccess::of(f.header.arg, inner), f.header.relay_ns());
  });
  if (st == proto::DecodeStatus::kOk) return true;
  std::lock_guard lock(mu_);
  errors.push_back(Error{ErrorKind::kBrokerError,
                         "undecodable DELIVER from the broker: " + std::string(proto::to_string(st))});
  fail_locked(errors.back());
  return false;
}

void Session::on_fragment(std::uint32_t sid, const proto::Frame& inner, std::uint32_t relay_ns,
                          Deliveries& deliveries) {
  const auto& h = inner.header;
  const auto key = std::pair{sid, h.sequence};
  if (h.arg > proto::kMaxMessageSize) return;  // no broker sends that: not a message we assemble
  if (h.offset == 0) {
    // A first fragment replaces what an earlier message of that publisher
    // left unfinished (the broker sends ABORT first; this is belt and braces).
    auto [it, fresh] = reassembly_.try_emplace(key);
    if (!fresh) aborted_messages_.fetch_add(1, std::memory_order_relaxed);
    Reassembly& r = it->second;
    fill_message(r.message, sid, inner);
    r.message.payload.reserve(h.arg - h.header_len);
    r.length = h.arg;
    r.next = h.payload_len;
    return;
  }
  auto it = reassembly_.find(key);
  // Not begun here (subscribed after its first fragment was routed: the
  // broker sends it none) or out of order (a broker fault): not a message.
  if (it == reassembly_.end()) return;
  Reassembly& r = it->second;
  if (h.offset != r.next || h.arg != r.length) {
    reassembly_.erase(it);
    aborted_messages_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  r.message.payload.insert(r.message.payload.end(), inner.payload.begin(), inner.payload.end());
  r.next += h.payload_len;
  if (r.next == r.length) {
    deliveries.add_owned(sid, relay_ns) = std::move(r.message);
    reassembly_.erase(it);
  }
}

void Session::on_error_frame(const proto::Frame& f, std::vector<Error>& errors) {
  const auto code = static_cast<proto::ErrorCode>(f.header.arg);
  std::string text(reinterpret_cast<const char*>(f.payload.data()), f.payload.size());
  const bool is_close = f.header.type == FrameType::kClose;
  // A CLOSE after an ERROR with the same code only confirms the close that
  // ERROR announced (SPEC.md §3.5), reported already; alone, it is news
  // (shutdown, slow consumer).
  const bool confirms =
      is_close && code != proto::ErrorCode::kNone && code == last_error_code_ && text.empty();
  if (confirms) text = last_error_text_;
  std::string msg = "broker: " + std::string(proto::to_string(code)) + (text.empty() ? "" : ": " + text);
  if (is_close) {
    if (!confirms) errors.push_back(Error{ErrorKind::kBrokerError, msg});
    std::lock_guard lock(mu_);
    fail_locked(
        Error{ErrorKind::kClosed, "broker closed the connection: " + std::string(proto::to_string(code)) +
                                      (text.empty() ? "" : ": " + text)});
    return;
  }
  last_error_code_ = code;
  last_error_text_ = text;
  ErrorKind kind = ErrorKind::kBrokerError;
  if (code == proto::ErrorCode::kAuthenticationFailed || code == proto::ErrorCode::kAuthenticationRequired) {
    kind = ErrorKind::kAuthenticationFailed;
    std::lock_guard lock(mu_);
    auth_refusal_ = msg;
    // The login's own answer: connect() (or the reconnecting thread) returns
    // it, so on_error does not say it a second time.
    if (logging_in_) return;
  } else if (code == proto::ErrorCode::kPermissionDenied) {
    kind = ErrorKind::kPermissionDenied;
  }
  // An ERROR about a subscription names it (SPEC.md §3.5): the broker
  // refused (permissions, a limit) or revoked it, so it ends here too.
  if (f.header.sequence != 0 &&
      (code == proto::ErrorCode::kPermissionDenied || code == proto::ErrorCode::kTooManySubscriptions)) {
    end_subscription(static_cast<std::uint32_t>(f.header.sequence), msg);
  }
  errors.push_back(Error{kind, msg});
}

std::size_t Session::dispatch(Deliveries& deliveries, std::vector<Error>& errors) {
  // The subscription is looked up once per run of messages for the same
  // subscription (a DELIVER's messages, or a read's worth), not per message.
  const std::size_t delivered = deliveries.entries.size();
  messages_received_.fetch_add(delivered, std::memory_order_relaxed);
  std::uint32_t sid = 0;
  bool looked_up = false;
  std::shared_ptr<const MessageViewHandler> handler;
  std::shared_ptr<QueueSubscription> queue;
  for (const Deliveries::Entry& e : deliveries.entries) {
    if (!looked_up || deliveries.sid(e) != sid) {
      sid = deliveries.sid(e);
      looked_up = true;
      std::lock_guard lock(mu_);
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
  if (opt_.on_error) {
    for (const auto& e : errors) opt_.on_error(e);
  }
  errors.clear();
  if (pongs_pending_ > 0) {
    std::lock_guard lock(mu_);
    pongs_received_ += std::exchange(pongs_pending_, 0);
    cv_.notify_all();
  }
  return delivered;
}

}  // namespace rdmabroker
