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
      case FrameType::kPubAck:
        on_pub_ack(f);
        break;
      case FrameType::kConsumerReady:
        on_consumer_ready(f);
        break;
      case FrameType::kFetchDone:
        on_fetch_done(f, deliveries);
        break;
      case FrameType::kNoResponders: {
        std::lock_guard lock(mu_);
        if (requests_.no_responders(f.subject)) cv_.notify_all();
        break;
      }
      case FrameType::kMcastJoin:
      case FrameType::kMcastLeave:
      case FrameType::kMcastLoss:
        on_multicast_frame(f, deliveries, errors);
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
      case FrameType::kRendezvousRelease: {
        // The broker read (or refused) an offered message: its region goes.
        std::lock_guard lock(mu_);
        transport_->release_region(f.header.sequence);
        if (auto it = offers_.find(f.header.sequence); it != offers_.end()) {
          offered_bytes_ -= it->second;
          offers_.erase(it);
        }
        cv_.notify_all();
        break;
      }
      case FrameType::kAbort:
        // The publisher left or gave up half-way: what came of it is no message.
        reassembler_.abort(f.header.arg, f.header.sequence);
        break;
      default:
        break;  // CREDIT is the transport's; client-to-broker types are never sent to us
    }
    off += f.header.frame_len();
  }
}

void Session::on_multicast_frame(const proto::Frame& f, Deliveries& deliveries, std::vector<Error>& errors) {
  const std::uint32_t sid = f.header.arg;
  switch (f.header.type) {
    case FrameType::kMcastJoin: {
      const auto j = proto::decode_mcast_join(f.payload);  // decode_frame checked the payload's length
      streams_.joined(sid, j->channel, f.header.sequence);
      transport_->join_group(sid, *j, f.header.sequence);
      break;
    }
    case FrameType::kMcastLeave:
      // The group is gone; the rest comes over the connection.
      transport_->leave_group(sid);
      streams_.left(sid, f.header.sequence);
      break;
    case FrameType::kMcastLoss:
      streams_.lost(sid, f.header.sequence, proto::decode_count(f.payload), deliveries, errors);
      break;
    default:
      break;
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
      streams_.add(f.header.arg, seq++, std::move(m), deliveries, false);
      return;
    }
    if (inner.header.is_fragment())
      return reassembler_.on_fragment(f.header.arg, f.header.sequence, inner, f.header.relay_ns(),
                                      deliveries);
    deliveries.add_in_place(detail::ViewAccess::of(f.header.arg, inner), f.header.relay_ns());
  });
  if (st == proto::DecodeStatus::kOk) return true;
  std::lock_guard lock(mu_);
  errors.push_back(Error{ErrorKind::kBrokerError,
                         "undecodable DELIVER from the broker: " + std::string(proto::to_string(st))});
  fail_locked(errors.back());
  return false;
}

std::optional<std::uint32_t> Session::expose_for_write(std::uint32_t sid, std::uint64_t publisher,
                                                       std::byte* data, std::size_t length) {
  return transport_->expose_for_write(sid, publisher, data, length);
}

void Session::release_landing(std::uint32_t sid, std::uint64_t publisher) {
  transport_->release_landing(sid, publisher);
}

void Session::send_ready(std::uint32_t sid, std::uint64_t sequence, const proto::LandingArea& area) {
  const auto payload = proto::encode(area);
  send_from_io(sid, FrameType::kRendezvousReady, sequence, {payload.begin(), payload.end()});
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
  // A consumer's refusal is consume()'s answer, not news for on_error.
  if (f.header.sequence != 0 && on_consumer_refused(static_cast<std::uint32_t>(f.header.sequence), code, msg))
    return;
  // An ERROR about a subscription names it (SPEC.md §3.5): the broker
  // refused (permissions, a limit) or revoked it, so it ends here too.
  if (f.header.sequence != 0 &&
      (code == proto::ErrorCode::kPermissionDenied || code == proto::ErrorCode::kTooManySubscriptions)) {
    end_subscription(static_cast<std::uint32_t>(f.header.sequence), msg);
  }
  errors.push_back(Error{kind, msg});
}

std::size_t Session::dispatch(Deliveries& deliveries, std::vector<Error>& errors) {
  const std::size_t delivered = subs_.hand_over(deliveries, errors, mu_);
  fail_unanswered_acks();  // once the connection has failed
  messages_received_.fetch_add(delivered, std::memory_order_relaxed);
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
