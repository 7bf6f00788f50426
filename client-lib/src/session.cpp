// SPDX-License-Identifier: Apache-2.0
#include "session.hpp"

#include "client_internal.hpp"
#include "rdmabroker/common/url.hpp"

#include <algorithm>
#include <limits>
#include <random>
#include <thread>

namespace rdmabroker {

void Transport::join_group(std::uint32_t sid, const proto::McastJoin& /*j*/, std::uint64_t epoch) {
  session_.join_done(sid, epoch, "this transport has no multicast");
}

using proto::FrameType;

namespace {

Status check_subject(std::string_view subject, bool pattern = false) {
  if (pattern ? proto::valid_pattern(subject) : proto::valid_subject(subject)) return {};
  return Error{ErrorKind::kInvalidArgument, "invalid subject '" + std::string(subject) + "'" +
                                                (pattern ? "" : " (wildcards only in subscriptions)") +
                                                " (see docs/subjects.md)"};
}

}  // namespace

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

// ---------------------------------------------------------------- connect

Status Session::connect_with_retry(const std::function<Status(std::uint32_t, proto::ConnectReject*)>& attempt,
                                   const std::function<void()>& reset) {
  proto::ConnectReject reject{};
  Status st = attempt(opt_.recv_buffer_size, &reject);
  if (!st && st.error().kind == ErrorKind::kRejected &&
      reject.reason == proto::RejectReason::kBufferTooSmall &&
      reject.required_buffer_size > opt_.recv_buffer_size &&
      reject.required_buffer_size <= proto::kMaxBufferSize) {
    // The broker told us the size it needs: one more try with that.
    reset();
    st = attempt(reject.required_buffer_size, &reject);
  }
  if (!st) reset();
  return st;
}

Error Session::rejected(const std::string& where, const proto::ConnectReject& reject) {
  std::string msg =
      "broker at " + where + " refused the connection: " + std::string(proto::to_string(reject.reason));
  if (reject.reason == proto::RejectReason::kBufferTooSmall) {
    msg += " (it needs " + std::to_string(reject.required_buffer_size) + "-byte receive buffers)";
  }
  return Error{ErrorKind::kRejected, msg};
}

// ---------------------------------------------------------------- send buffers

void Session::init_send_buffers(const proto::ConnectAccept& accept, std::uint32_t count) {
  max_frame_ = accept.max_frame_size;
  protocol_version_ = accept.version;
  max_message_ = accept.max_payload;
  connection_id_ = accept.connection_id;
  send_count_ = count;
  send_mem_.reset(new std::byte[std::size_t{count} * max_frame_]);
  free_send_.clear();
  for (std::uint32_t i = count; i-- > 0;) free_send_.push_back(i);
  ready_.clear();
  open_buf_ = kNoBuffer;
}

std::pair<std::uint32_t, std::uint32_t> Session::take_ready_locked() {
  if (!ready_.empty()) {
    auto r = ready_.front();
    ready_.pop_front();
    return r;
  }
  if (open_buf_ != kNoBuffer) return {std::exchange(open_buf_, kNoBuffer), open_len_};
  return {kNoBuffer, 0};
}

void Session::release_send_buffer_locked(std::uint32_t buffer) {
  if (buffer == kNoBuffer) return;
  free_send_.push_back(buffer);
  cv_.notify_all();
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
    if (open_buf_ != kNoBuffer && open_len_ + len > max_frame_) {
      ready_.emplace_back(open_buf_, open_len_);
      open_buf_ = kNoBuffer;
    }
    if (open_buf_ == kNoBuffer && !free_send_.empty()) {
      open_buf_ = free_send_.back();
      free_send_.pop_back();
      open_len_ = 0;
    }
    if (open_buf_ != kNoBuffer) break;
    if (!wait) return Error{ErrorKind::kTimeout, "no free send buffer"};
    // Every send buffer is full or in flight: wait for one to come back.
    transport_->reclaim_locked();
    if (!free_send_.empty()) continue;
    if (!wait_locked(lock, deadline, [&] { return !free_send_.empty() || closed_; }) && free_send_.empty()) {
      return Error{ErrorKind::kTimeout, "send queue full for " +
                                            std::to_string(opt_.publish_timeout.count()) +
                                            " ms (the broker is not taking data)"};
    }
  }
  proto::FrameHeader hdr = h;
  hdr.sequence = next_sequence_++;
  if (sequence != 0) hdr.sequence = sequence;
  proto::encode_frame(std::span<std::byte>(send_buf(open_buf_) + open_len_, len), hdr, subject, reply,
                      payload, headers);
  open_len_ += static_cast<std::uint32_t>(len);
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

namespace {

/// The fields of `headers` as the wire codec takes them, checked; views valid
/// until the calling thread's next call (one vector per thread, reused: a
/// publish with headers allocates nothing once it has grown).
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

}  // namespace

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
  if (!inbox_.empty()) return {};
  // Unguessable per connection, so no other client's subscription catches replies by accident.
  std::random_device rd;
  static constexpr char kHex[] = "0123456789abcdef";
  std::string inbox = "_INBOX.";
  for (int i = 0; i < 16; ++i) inbox += kHex[rd() % 16];
  // The SUBSCRIBE precedes the request on the same connection, so the broker
  // has it before any responder of its own can answer. One round trip more,
  // once per connection, covers responders on other brokers of a cluster: a
  // request travels there on their routes, the inbox's interest on this
  // broker's, and the PONG comes once that has arrived.
  auto sid = subscribe_locked(lock, inbox + ".*", {}, [this](const MessageView& m) { on_inbox_message(m); });
  if (!sid) return sid.error();
  inbox_ = std::move(inbox);  // kept if the PONG is late: the next request uses it
  return flush_locked(lock, deadline);
}

void Session::on_inbox_message(const MessageView& m) {
  std::lock_guard lock(mu_);
  auto it = pending_.find(std::string(m.subject));
  if (it == pending_.end() || it->second.done) return;  // late or duplicate answer
  it->second.done = true;
  m.copy_to(it->second.reply);
  cv_.notify_all();
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
  const std::string reply = inbox_ + "." + std::to_string(next_request_++);
  pending_.emplace(reply, PendingRequest{});
  if (auto st = publish_locked(lock, subject, reply, payload, proto::kFlagRequest, headers); !st) {
    pending_.erase(reply);
    return st.error();
  }
  wait_locked(lock, deadline, [&] { return pending_[reply].done || closed_; });
  PendingRequest done = std::move(pending_[reply]);
  pending_.erase(reply);
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
  if (sid == 0) sid = next_sid_++;
  next_sid_ = std::max(next_sid_, sid + 1);
  SubscriptionEntry entry{std::string(subject),
                          handler ? std::make_shared<const MessageViewHandler>(std::move(handler)) : nullptr,
                          nullptr};
  entry.borrowed_queue = queue != nullptr;
  if (!entry.handler)
    entry.queue = queue ? std::move(queue)
                        : std::make_shared<QueueSubscription>(sid, opt_.subscription_queue_limit,
                                                              app_wakeups_, driver());
  if (made != nullptr) *made = entry.queue;
  subs_[sid] = std::move(entry);
  proto::FrameHeader h;
  h.type = FrameType::kSubscribe;
  h.arg = sid;
  // A SUBSCRIBE's reply field carries its queue group (SPEC.md §3.3).
  if (auto st = append_frame_locked(lock, h, subject, group, {}); !st) {
    subs_.erase(sid);
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
  auto it = subs_.find(sid);
  if (it == subs_.end()) return Error{ErrorKind::kInvalidArgument, "no subscription " + std::to_string(sid)};
  if (it->second.queue) it->second.queue->close("unsubscribed");
  subs_.erase(it);
  proto::FrameHeader h;
  h.type = FrameType::kUnsubscribe;
  h.arg = sid;
  return append_frame_locked(lock, h, {}, {}, {});
}

void Session::end_subscription(std::uint32_t sid, const std::string& why) {
  std::lock_guard lock(mu_);
  auto it = subs_.find(sid);
  if (it == subs_.end()) return;
  if (it->second.queue) it->second.queue->close(why);
  subs_.erase(it);
}

Status Session::authenticate() {
  {
    std::unique_lock lock(mu_);
    logging_in_ = true;
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
  for (auto& [sid, e] : subs_) {
    if (e.queue && !e.borrowed_queue) e.queue->close(close_error_.message);
  }
  cv_.notify_all();
}

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

// ---------------------------------------------------------------- polled

namespace {
// The session whose loop this thread is running (a callback of it is on
// the stack): it must not start another turn of that loop.
thread_local const Session* tl_progressing = nullptr;
}  // namespace

void Session::close() {
  if (!transport_) return;
  if (!opt_.polled) return transport_->close();
  // No other thread is in the loop while the transport goes; waits of the
  // close itself (the last frames leaving) make only the sends progress.
  auto turn = take_turn();
  const Session* outer = std::exchange(tl_progressing, this);
  transport_->close();
  tl_progressing = outer;
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
  s.multicast_messages = multicast_messages_.load(std::memory_order_relaxed);
  s.multicast_groups = groups_joined_.load(std::memory_order_relaxed);
  s.join_failures = join_failures_.load(std::memory_order_relaxed);
  s.repairs_requested = repairs_requested_.load(std::memory_order_relaxed);
  s.duplicates = duplicates_.load(std::memory_order_relaxed);
  s.messages_lost = messages_lost_.load(std::memory_order_relaxed);
  s.io_wakeups = io_wakeups_.load(std::memory_order_relaxed);
  s.app_wakeups = app_wakeups_->load(std::memory_order_relaxed);
  s.aborted_messages = aborted_messages_.load(std::memory_order_relaxed);
  return s;
}

}  // namespace rdmabroker
