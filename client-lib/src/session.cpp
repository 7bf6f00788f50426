// SPDX-License-Identifier: Apache-2.0
#include "session.hpp"

#include "client_internal.hpp"
#include "rdmabroker/common/url.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <random>
#include <thread>

namespace rdmabroker {

using proto::FrameType;

Status check_subject(std::string_view subject, bool pattern) {
  if (pattern ? proto::valid_pattern(subject) : proto::valid_subject(subject)) return {};
  return Error{ErrorKind::kInvalidArgument, "invalid subject '" + std::string(subject) + "'" +
                                                (pattern ? "" : " (wildcards only in subscriptions)") +
                                                " (see docs/subjects.md)"};
}

// ---------------------------------------------------------------- connect

Status Session::connect(const ParsedUrl& url) {
  transport_ = url.scheme == "rdma" ? make_rdma_transport(*this, url) : make_tcp_transport(*this, url);
  return transport_->connect();
}

Status Session::connect_with_retry(const std::function<Status(std::uint32_t, proto::ConnectReject*)>& attempt,
                                   const std::function<void()>& reset) {
  proto::ConnectReject reject{};
  recv_buffer_size_ = opt_.recv_buffer_size;
  Status st = attempt(recv_buffer_size_, &reject);
  if (!st && st.error().kind == ErrorKind::kRejected &&
      reject.reason == proto::RejectReason::kBufferTooSmall &&
      reject.required_buffer_size > opt_.recv_buffer_size &&
      reject.required_buffer_size <= proto::kMaxBufferSize) {
    // The broker told us the size it needs: one more try with that.
    reset();
    recv_buffer_size_ = reject.required_buffer_size;
    st = attempt(recv_buffer_size_, &reject);
  }
  if (!st) reset();
  return st;
}

void Session::init_send_buffers(const proto::ConnectAccept& accept, std::uint32_t count) {
  protocol_version_ = accept.version;
  max_message_ = accept.max_payload;
  connection_id_ = accept.connection_id;
  rendezvous_min_ = accept.rendezvous_min;
  // Version 9: large messages it receives may land (SPEC.md §3.9).
  const bool landing = accept.version >= proto::kLandingVersion && accept.rendezvous_min != 0;
  reassembler_.set_landing(landing ? this : nullptr, accept.rendezvous_min);
  offers_.clear();
  offered_bytes_ = 0;
  sends_.init(accept.max_frame_size, count);
}

void Session::established(std::string description) {
  std::lock_guard lock(mu_);
  description_ = std::move(description);
  established_ = true;
}

void Session::ended() {
  std::lock_guard lock(mu_);
  established_ = false;
}

Status Session::append_frame_locked(std::unique_lock<std::mutex>& lock, const proto::FrameHeader& h,
                                    std::string_view subject, std::string_view reply, ByteView payload,
                                    std::uint64_t sequence, bool wait,
                                    std::span<const proto::HeaderField> headers) {
  const std::size_t len = proto::align_up(proto::kHeaderSize + subject.size() + reply.size() +
                                          proto::header_block_len(headers) + payload.size());
  const auto deadline = Clock::now() + opt_.publish_timeout;
  while (true) {
    if (auto st = check_open_locked(); !st) return st;
    if (sends_.make_room(len)) break;
    if (!wait) return Error{ErrorKind::kTimeout, "no free send buffer"};
    // Every send buffer is full or in flight: wait for one to come back.
    transport_->reclaim_locked();
    if (sends_.has_free()) continue;
    if (!wait_locked(lock, deadline, [&] { return sends_.has_free() || closed_; }) && !sends_.has_free()) {
      return Error{ErrorKind::kTimeout, "send queue full for " +
                                            std::to_string(opt_.publish_timeout.count()) +
                                            " ms (the broker is not taking data)"};
    }
  }
  sends_.append(len, h, subject, reply, payload, sequence, headers);
  // A publisher streaming acknowledged publishes waits for the broker
  // anyway: with kCorkAfterAsyncAcks of them unanswered, what it appends
  // goes when the next PUB_ACK arrives (the RDMA I/O thread's turn that
  // takes it sends what is ready), many frames to a SEND, instead of a SEND
  // (or a hand-off) per publish. Nagle's rule; an answer is always on its
  // way, since the first kCorkAfterAsyncAcks were sent. (TCP batches by
  // itself: TcpTransport::transmit_locked.)
  if (async_acks_ >= kCorkAfterAsyncAcks && transport_->transmits_every_turn()) return {};
  transport_->transmit_locked();
  return {};
}

// ---------------------------------------------------------------- publish

Status Session::publish_locked(std::unique_lock<std::mutex>& lock, std::string_view subject,
                               std::string_view reply, ByteView payload, std::uint16_t flags,
                               std::span<const proto::HeaderField> headers) {
  // A message in fragments goes out whole before anything else is published.
  if (!wait_locked(lock, Clock::now() + opt_.publish_timeout, [&] { return !fragmenting_ || closed_; })) {
    return Error{ErrorKind::kTimeout, "another thread's large message still sending after " +
                                          std::to_string(opt_.publish_timeout.count()) + " ms"};
  }
  if (auto st = check_open_locked(); !st) return st;
  if (abort_pending_) {
    proto::FrameHeader abort;
    abort.type = FrameType::kAbort;
    if (auto st = append_frame_locked(lock, abort, {}, {}, {}); !st) return st;
    abort_pending_ = false;
  }
  if (!headers.empty() && protocol_version_ < proto::kHeadersVersion) {
    return Error{ErrorKind::kInvalidArgument,
                 "the broker speaks protocol version " + std::to_string(protocol_version_) +
                     ", which has no message headers (an rdmabrokerd with headers speaks version 2)"};
  }
  const std::size_t block = proto::header_block_len(headers);
  if (block > proto::kMaxHeaderBlock) {
    return Error{ErrorKind::kPayloadTooLarge, "headers of " + std::to_string(block) +
                                                  " bytes exceed the limit of " +
                                                  std::to_string(proto::kMaxHeaderBlock)};
  }
  const std::size_t room = max_payload(subject.size());
  if (rendezvous_min_ != 0 && block + payload.size() >= rendezvous_min_ && block + payload.size() <= room &&
      block < frame_room(subject.size(), reply.size())) {
    return publish_rendezvous_locked(lock, subject, reply, payload, flags, headers);
  }
  if (block + payload.size() + reply.size() > frame_room(subject.size(), 0) &&
      protocol_version_ >= proto::kFragmentsVersion && block + payload.size() <= room) {
    return publish_fragments_locked(lock, subject, reply, payload, flags, headers);
  }
  if (block + payload.size() + reply.size() > room) {
    const std::size_t fixed = block + reply.size();
    return Error{ErrorKind::kPayloadTooLarge,
                 "payload of " + std::to_string(payload.size()) + " bytes exceeds the broker's limit of " +
                     std::to_string(room - std::min(room, fixed)) + " for this subject" +
                     (block != 0 ? " with these headers (" + std::to_string(block) + " bytes)" : "")};
  }
  proto::FrameHeader h;
  h.type = FrameType::kPublish;
  h.flags = flags;
  return append_frame_locked(lock, h, subject, reply, payload, 0, true, headers);
}

Status Session::publish_rendezvous_locked(std::unique_lock<std::mutex>& lock, std::string_view subject,
                                          std::string_view reply, ByteView payload, std::uint16_t flags,
                                          std::span<const proto::HeaderField> headers) {
  const std::size_t block = proto::header_block_len(headers);
  const std::size_t length = block + payload.size();
  const auto room = [&] {
    return offers_.empty() || (offers_.size() < kMaxOffers && offered_bytes_ + length <= kMaxOfferedBytes);
  };
  if (!wait_locked(lock, Clock::now() + opt_.publish_timeout, [&] { return room() || closed_; })) {
    return Error{ErrorKind::kTimeout, "the broker has not read the last large messages after " +
                                          std::to_string(opt_.publish_timeout.count()) + " ms"};
  }
  if (auto st = check_open_locked(); !st) return st;
  // The message as the broker will READ it: header block, then payload. A
  // copy, so that publish() returns as with any message; the region is the
  // only memory of ours the broker can reach, and only until it releases it.
  std::unique_ptr<std::byte[]> data(new std::byte[length]);
  if (block != 0) proto::encode_header_block(data.get(), headers);
  if (!payload.empty()) std::memcpy(data.get() + block, payload.data(), payload.size());
  const std::uint64_t offer = ++next_offer_;
  auto region = transport_->expose_for_read(offer, std::move(data), length);
  if (!region) return region.error();
  region->header_len = static_cast<std::uint16_t>(block);
  const auto descriptor = proto::encode(*region);
  proto::FrameHeader h;
  h.type = FrameType::kRendezvousOffer;
  h.flags = flags;
  h.arg = static_cast<std::uint32_t>(length);
  if (auto st =
          append_frame_locked(lock, h, subject, reply, ByteView(descriptor.data(), descriptor.size()), offer);
      !st) {
    transport_->release_region(offer);
    return st;
  }
  offers_.emplace(offer, length);
  offered_bytes_ += length;
  return {};
}

Status Session::publish_fragments_locked(std::unique_lock<std::mutex>& lock, std::string_view subject,
                                         std::string_view reply, ByteView payload, std::uint16_t flags,
                                         std::span<const proto::HeaderField> headers) {
  const std::size_t block = proto::header_block_len(headers);
  auto h = proto::FrameHeader::fragment(static_cast<std::uint32_t>(block + payload.size()), 0, connection_id_,
                                        flags);
  // The first fragment carries the strings and the header block, each later
  // one a frame's worth of payload (SPEC.md §3.7).
  const std::size_t first_room = frame_room(subject.size(), reply.size());
  if (block >= first_room) {
    return Error{ErrorKind::kPayloadTooLarge, "subject, reply and headers leave no room in a frame"};
  }
  fragmenting_ = true;
  const std::size_t first = std::min(payload.size(), first_room - block);
  Status st =
      append_frame_locked(lock, h, subject, reply, payload.first(first), connection_id_, true, headers);
  std::size_t sent = st ? first : 0;
  h.flags = proto::kFlagFragment;
  const std::size_t room = frame_room(0, 0);
  while (st && sent < payload.size()) {
    const std::size_t n = std::min(room, payload.size() - sent);
    h.offset = static_cast<std::uint32_t>(block + sent);
    st = append_frame_locked(lock, h, {}, {}, payload.subspan(sent, n), connection_id_);
    if (st) sent += n;
  }
  // Begun and not finished (a full send queue for publish_timeout): the
  // broker must hear that the message is abandoned before the next one.
  if (!st && sent != 0 && !closed_) abort_pending_ = true;
  fragmenting_ = false;
  cv_.notify_all();
  return st;
}

Result<std::span<const proto::HeaderField>> header_fields(const Headers& headers) {
  thread_local std::vector<proto::HeaderField> fields;
  fields.clear();
  for (const auto& [name, value] : headers) {
    if (!proto::valid_header_name(name)) {
      return Error{ErrorKind::kInvalidArgument, "invalid header name \"" + std::string(name) +
                                                    "\": 1 or more printable ASCII characters, "
                                                    "no space or ':'"};
    }
    if (!proto::valid_header_value(value)) {
      return Error{ErrorKind::kInvalidArgument,
                   "invalid value of header \"" + std::string(name) + "\": no CR, LF or NUL"};
    }
    fields.push_back({name, value});
  }
  return std::span<const proto::HeaderField>(fields);
}

Status Session::publish(std::string_view subject, const Headers& headers, ByteView payload,
                        std::string_view reply) {
  if (auto st = check_subject(subject); !st) return st;
  if (!reply.empty()) {
    if (auto st = check_subject(reply); !st) return st;
  }
  auto fields = header_fields(headers);
  if (!fields) return fields.error();
  std::unique_lock lock(mu_);
  return publish_locked(lock, subject, reply, payload, 0, fields.value());
}

Status Session::publish(std::string_view subject, ByteView payload) {
  if (auto st = check_subject(subject); !st) return st;
  std::unique_lock lock(mu_);
  return publish_locked(lock, subject, {}, payload, 0);
}

Status Session::publish_request(std::string_view subject, std::string_view reply, ByteView payload) {
  return publish(subject, Headers{}, payload, reply);
}

// ---------------------------------------------------------------- request/reply

Status Session::ensure_inbox_locked(std::unique_lock<std::mutex>& lock, Clock::time_point deadline) {
  if (!requests_.inbox().empty()) return {};
  std::string inbox = PendingRequests::new_inbox();
  // The SUBSCRIBE precedes the request on the same connection, so the broker
  // has it before any responder of its own can answer. One round trip more,
  // once per connection, covers responders on other brokers of a cluster: a
  // request travels there on their routes, the inbox's interest on this
  // broker's, and the PONG comes once that has arrived.
  auto sid = subscribe_locked(lock, inbox + ".*", {}, [this](const MessageView& m) { on_inbox_message(m); });
  if (!sid) return sid.error();
  requests_.set_inbox(std::move(inbox));  // kept if the PONG is late: the next request uses it
  return flush_locked(lock, deadline);
}

void Session::on_inbox_message(const MessageView& m) {
  std::lock_guard lock(mu_);
  if (requests_.answer(m.subject, m)) cv_.notify_all();
}

Result<Message> Session::request(std::string_view subject, ByteView payload,
                                 std::chrono::milliseconds timeout) {
  return request_with(subject, {}, payload, timeout);
}

Result<Message> Session::request(std::string_view subject, const Headers& headers, ByteView payload,
                                 std::chrono::milliseconds timeout) {
  auto fields = header_fields(headers);
  if (!fields) return fields.error();
  return request_with(subject, fields.value(), payload, timeout);
}

Result<Message> Session::request_with(std::string_view subject, std::span<const proto::HeaderField> headers,
                                      ByteView payload, std::chrono::milliseconds timeout) {
  if (auto st = check_subject(subject); !st) return st.error();
  std::unique_lock lock(mu_);
  if (auto st = check_open_locked(); !st) return st.error();
  const auto deadline = Clock::now() + timeout;
  if (auto st = ensure_inbox_locked(lock, deadline); !st) {
    if (st.error().kind != ErrorKind::kTimeout) return st.error();
    return Error{ErrorKind::kTimeout, "request to '" + std::string(subject) + "': no reply within " +
                                          std::to_string(timeout.count()) + " ms (" + st.error().message +
                                          ")"};
  }
  const std::string reply = requests_.open();
  if (auto st = publish_locked(lock, subject, reply, payload, proto::kFlagRequest, headers); !st) {
    requests_.close(reply);
    return st.error();
  }
  wait_locked(lock, deadline, [&] { return requests_.done(reply) || closed_; });
  PendingRequests::Outcome done = requests_.close(reply);
  if (done.done && done.no_responders) {
    return Error{ErrorKind::kNoResponders,
                 "no responders: nobody subscribes to '" + std::string(subject) + "'"};
  }
  if (done.done) return std::move(done.reply);
  if (closed_) return close_error_;
  return Error{ErrorKind::kTimeout, "request to '" + std::string(subject) + "': no reply within " +
                                        std::to_string(timeout.count()) + " ms"};
}

// ---------------------------------------------------------------- subscriptions

Result<std::uint32_t> Session::add_subscription(std::string_view subject, std::string_view group,
                                                MessageViewHandler handler,
                                                std::shared_ptr<QueueSubscription>* made) {
  if (auto st = check_subject(subject, true); !st) return st.error();
  if (!group.empty() && !proto::valid_subject(group)) {
    return Error{ErrorKind::kInvalidArgument,
                 "invalid queue group name '" + std::string(group) +
                     "' (subject characters, no wildcards; see docs/subjects.md)"};
  }
  std::unique_lock lock(mu_);
  return subscribe_locked(lock, subject, group, std::move(handler), 0, nullptr, made);
}

Result<std::uint32_t> Session::subscribe_locked(std::unique_lock<std::mutex>& lock, std::string_view subject,
                                                std::string_view group, MessageViewHandler handler,
                                                std::uint32_t sid, std::shared_ptr<QueueSubscription> queue,
                                                std::shared_ptr<QueueSubscription>* made) {
  sid = subs_.claim_id(sid);
  SubscriptionTable::Entry entry{
      std::string(subject),
      handler ? std::make_shared<const MessageViewHandler>(std::move(handler)) : nullptr, nullptr};
  entry.borrowed_queue = queue != nullptr;
  if (!entry.handler)
    entry.queue = queue ? std::move(queue)
                        : std::make_shared<QueueSubscription>(sid, opt_.subscription_queue_limit,
                                                              app_wakeups_, driver());
  if (made != nullptr) *made = entry.queue;
  subs_.add(sid, std::move(entry));
  proto::FrameHeader h;
  h.type = FrameType::kSubscribe;
  h.arg = sid;
  // A SUBSCRIBE's reply field carries its queue group (SPEC.md §3.3).
  if (auto st = append_frame_locked(lock, h, subject, group, {}); !st) {
    subs_.forget(sid);
    return st.error();
  }
  return sid;
}

Result<std::uint32_t> Session::restore_subscription(std::uint32_t sid, std::string_view subject,
                                                    std::string_view group, MessageViewHandler handler,
                                                    std::shared_ptr<QueueSubscription> queue) {
  std::unique_lock lock(mu_);
  if (subs_.contains(sid))
    return Error{ErrorKind::kInvalidArgument, "subscription " + std::to_string(sid) + " exists"};
  return subscribe_locked(lock, subject, group, std::move(handler), sid, std::move(queue));
}

Result<std::uint32_t> Session::subscribe(std::string_view subject, MessageHandler handler) {
  return queue_subscribe(subject, {}, std::move(handler));
}

Result<std::shared_ptr<Subscription>> Session::subscribe(std::string_view subject) {
  return queue_subscribe(subject, {});
}

Result<std::uint32_t> Session::queue_subscribe(std::string_view subject, std::string_view group,
                                               MessageHandler handler) {
  if (!handler) return Error{ErrorKind::kInvalidArgument, "subscribe needs a handler"};
  return add_subscription(subject, group, owning_handler(std::move(handler)));
}

Result<std::uint32_t> Session::queue_subscribe_view(std::string_view subject, std::string_view group,
                                                    MessageViewHandler handler) {
  if (!handler) return Error{ErrorKind::kInvalidArgument, "subscribe needs a handler"};
  return add_subscription(subject, group, std::move(handler));
}

Result<std::shared_ptr<Subscription>> Session::queue_subscribe(std::string_view subject,
                                                               std::string_view group) {
  // The queue is taken as it is registered: the broker's refusal (a
  // permission, a limit) may arrive and end the subscription before this
  // call returns, and then the caller's next() says why (kClosed).
  std::shared_ptr<QueueSubscription> queue;
  auto sid = add_subscription(subject, group, nullptr, &queue);
  if (!sid) return sid.error();
  return std::shared_ptr<Subscription>(std::move(queue));
}

Status Session::unsubscribe(std::uint32_t sid) {
  std::unique_lock lock(mu_);
  if (!subs_.end(sid, "unsubscribed"))
    return Error{ErrorKind::kInvalidArgument, "no subscription " + std::to_string(sid)};
  proto::FrameHeader h;
  h.type = FrameType::kUnsubscribe;
  h.arg = sid;
  return append_frame_locked(lock, h, {}, {}, {});
}

void Session::end_subscription(std::uint32_t sid, const std::string& why) {
  std::lock_guard lock(mu_);
  subs_.end(sid, why);
}

Status Session::authenticate() {
  {
    std::unique_lock lock(mu_);
    const bool token = !opt_.token.empty();
    const std::string& user = token ? std::string() : opt_.user;
    const std::string& secret = token ? opt_.token : opt_.password;
    if (user.size() + secret.size() > proto::kMaxCredentialsLen) {
      return Error{ErrorKind::kInvalidArgument,
                   "credentials longer than " + std::to_string(proto::kMaxCredentialsLen) + " bytes"};
    }
    std::string payload = user + secret;
    proto::FrameHeader h;
    h.type = FrameType::kConnect;
    h.arg = static_cast<std::uint32_t>(user.size());
    const bool route = !opt_.route_cluster.empty();
    if (route) {
      if (protocol_version_ < proto::kRouteVersion) {
        return Error{ErrorKind::kRejected, "the broker speaks protocol version " +
                                               std::to_string(protocol_version_) + ": routes need version " +
                                               std::to_string(proto::kRouteVersion)};
      }
      h.flags = proto::kFlagRoute;
    }
    // Version 7: the dialing broker's route URLs after its id (SPEC.md §8, "Gossip").
    const std::string route_name = protocol_version_ >= proto::kGossipVersion
                                       ? proto::route_login_name(opt_.route_server, opt_.route_announce)
                                       : opt_.route_server;
    const Status st = append_frame_locked(lock, h, route ? std::string_view(opt_.route_cluster) : "",
                                          route ? std::string_view(route_name) : "", as_payload(payload));
    explicit_bzero(payload.data(), payload.size());
    if (!st) return st;
    // Only a CONNECT that is on its way has a verdict to wait for; set under
    // the same lock, so no refusal can arrive between the two.
    logging_in_ = true;
  }
  // The broker answers a PING sent after CONNECT only once it accepted the
  // credentials; a refusal comes as ERROR then CLOSE.
  const Status st = flush(opt_.connect_timeout);
  std::lock_guard lock(mu_);
  logging_in_ = false;
  if (st) return st;
  if (!auth_refusal_.empty()) return Error{ErrorKind::kAuthenticationFailed, auth_refusal_};
  return st;
}

Status Session::flush(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  if (auto st = flush_locked(lock, Clock::now() + timeout); !st) {
    if (st.error().kind != ErrorKind::kTimeout) return st;
    return Error{ErrorKind::kTimeout, "flush: no PONG within " + std::to_string(timeout.count()) + " ms"};
  }
  return {};
}

Status Session::flush_locked(std::unique_lock<std::mutex>& lock, Clock::time_point deadline) {
  proto::FrameHeader h;
  h.type = FrameType::kPing;
  if (auto st = append_frame_locked(lock, h, {}, {}, {}); !st) return st;
  const std::uint64_t my_ping = ++pings_sent_;
  // PONGs come back in PING order: the n-th PONG answers the n-th PING.
  if (!wait_locked(lock, deadline, [&] { return pongs_received_ >= my_ping || closed_; }))
    return Error{ErrorKind::kTimeout, "no PONG from the broker in time"};
  if (pongs_received_ >= my_ping) return {};
  return close_error_;
}

// ---------------------------------------------------------------- close

bool Session::begin_close() {
  std::unique_lock lock(mu_);
  if (!established_) return false;
  closing_ = true;  // the disconnect that follows is ours, not an error to report
  if (!closed_) {
    proto::FrameHeader h;
    h.type = FrameType::kClose;
    // Offered messages first: the broker READs them before it takes the
    // CLOSE (SPEC.md §3.8), and their regions must stay until it has.
    wait_locked(lock, Clock::now() + opt_.publish_timeout, [&] { return closed_ || offers_.empty(); });
    if (append_frame_locked(lock, h, {}, {}, {})) {
      // Give what is queued a moment to leave before the disconnect.
      wait_locked(lock, Clock::now() + std::chrono::seconds(2),
                  [&] { return closed_ || (!has_ready_locked() && transport_->drained_locked()); });
    }
    fail_locked(Error{ErrorKind::kClosed, "client closed the connection"});
  }
  stop_ = true;
  return true;
}

void Session::fail_locked(Error why) {
  if (closed_) return;
  closed_ = true;
  close_error_ = std::move(why);
  subs_.close_queues(close_error_.message);
  cv_.notify_all();
}

}  // namespace rdmabroker
