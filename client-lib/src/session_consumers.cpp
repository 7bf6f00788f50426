// SPDX-License-Identifier: Apache-2.0
// A stream's consumers (SPEC.md §3.11): CONSUME and the wait for its
// CONSUMER_READY, and the Consumer the application reads: a queue like a
// subscription's, ACK and FETCH frames, FETCH_DONE as a mark in the queue.
#include <algorithm>
#include <cstring>

#include "rdmabroker/proto/subjects.hpp"
#include "rdmabroker/proto/consumer.hpp"
#include "session.hpp"

namespace rdmabroker {

using proto::FrameType;

namespace {

/// A message in a consumer's queue that is no message: FETCH_DONE's mark.
bool is_fetch_mark(const Message& m) { return m.subject.empty(); }

class StreamConsumer final : public Consumer {
 public:
  StreamConsumer(std::shared_ptr<SessionAnchor> anchor, std::uint32_t sid, std::uint64_t pending,
                 std::shared_ptr<QueueSubscription> queue, const ConsumerOptions& options)
      : anchor_(std::move(anchor)),
        sid_(sid),
        pending_(pending),
        queue_(std::move(queue)),
        ack_none_(options.ack == ConsumerOptions::Ack::kNone),
        pull_(options.pull),
        report_every_(std::max<std::uint32_t>(1, options.max_ack_pending / 4)) {}
  ~StreamConsumer() override { (void)close(); }

  std::uint32_t sid() const override { return sid_; }
  std::uint64_t pending_at_open() const override { return pending_; }

  Result<Message> next(std::chrono::milliseconds timeout) override {
    if (pull_) return Error{ErrorKind::kInvalidArgument, "a pull consumer's messages come by fetch()"};
    const auto deadline = Clock::now() + timeout;
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      auto m = queue_->next(std::max(left, std::chrono::milliseconds{0}));
      if (!m) return m.error();
      if (is_fetch_mark(*m)) continue;
      if (auto st = taken(*m); !st) return st.error();
      return m;
    }
  }

  Result<std::vector<Message>> fetch(std::size_t count, std::chrono::milliseconds timeout) override {
    if (!pull_)
      return Error{ErrorKind::kInvalidArgument, "fetch() is for a pull consumer (ConsumerOptions::pull)"};
    if (count == 0) return std::vector<Message>{};
    std::array<std::byte, proto::kFetchLen> expires{};
    const auto ms =
        static_cast<std::uint32_t>(std::clamp<std::int64_t>(timeout.count(), 1, proto::kMaxAckWaitMs));
    std::memcpy(expires.data(), &ms, sizeof ms);
    if (auto st = send(FrameType::kFetch, count, 0, {expires.data(), expires.size()}); !st) return st.error();
    // The broker ends the FETCH by its own clock: wait a little past it for the mark.
    const auto deadline = Clock::now() + timeout + std::chrono::seconds(2);
    std::vector<Message> out;
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      auto m = queue_->next(std::max(left, std::chrono::milliseconds{0}));
      if (!m) {
        if (m.error().kind == ErrorKind::kTimeout) break;
        if (out.empty()) return m.error();
        break;
      }
      if (is_fetch_mark(*m)) break;
      if (auto st = taken(*m); !st) return st.error();
      out.push_back(std::move(*m));
    }
    return out;
  }

  Status ack(const Message& m) override { return send(FrameType::kAck, m.stream_sequence, 0); }
  Status nak(const Message& m) override { return send(FrameType::kAck, m.stream_sequence, proto::kFlagNak); }

  Status close() override {
    if (std::exchange(closed_, true)) return {};
    return anchor_->with([&](Session& s) -> Status { return s.unsubscribe(sid_); });
  }

 private:
  Status send(FrameType type, std::uint64_t sequence, std::uint16_t flags, ByteView payload = {}) {
    if (sequence == 0) return Error{ErrorKind::kInvalidArgument, "not a message of this consumer"};
    return anchor_->with(
        [&](Session& s) -> Status { return s.send_consumer_frame(type, sid_, sequence, flags, payload); });
  }
  /// Ack none: every so often, the broker hears what the application took
  /// (its flow control); the others acknowledge each message themselves.
  Status taken(const Message& m) {
    if (!ack_none_ || ++taken_ % report_every_ != 0) return {};
    return send(FrameType::kAck, m.stream_sequence, 0);
  }

  const std::shared_ptr<SessionAnchor> anchor_;
  const std::uint32_t sid_;
  const std::uint64_t pending_;
  const std::shared_ptr<QueueSubscription> queue_;
  const bool ack_none_;
  const bool pull_;
  const std::uint32_t report_every_;
  std::uint64_t taken_ = 0;
  bool closed_ = false;
};

Result<proto::ConsumerConfig> config_of(const ConsumerOptions& o) {
  proto::ConsumerConfig c;
  c.start = static_cast<proto::ConsumerStart>(o.start);
  c.ack = static_cast<proto::ConsumerAck>(o.ack);
  c.pull = o.pull;
  c.original_pace = o.original_pace;
  c.max_ack_pending = o.max_ack_pending;
  c.ack_wait_ms =
      static_cast<std::uint32_t>(std::clamp<std::int64_t>(o.ack_wait.count(), 0, proto::kMaxAckWaitMs + 1));
  c.max_deliver = o.max_deliver;
  if (o.start == ConsumerOptions::Start::kSequence) c.start_at = o.start_sequence;
  if (o.start == ConsumerOptions::Start::kTime) {
    c.start_at = static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(o.start_time.time_since_epoch()).count());
  }
  if (c.max_ack_pending == 0 || c.max_ack_pending > proto::kMaxAckPendingLimit)
    return Error{ErrorKind::kInvalidArgument, "max_ack_pending is 1 to 65536"};
  if (c.ack_wait_ms == 0 || c.ack_wait_ms > proto::kMaxAckWaitMs)
    return Error{ErrorKind::kInvalidArgument, "ack_wait is 1 ms to 24 h"};
  if (o.start == ConsumerOptions::Start::kSequence && o.start_sequence == 0)
    return Error{ErrorKind::kInvalidArgument, "start_sequence counts from 1"};
  if (!o.durable.empty() && !proto::valid_name(o.durable))
    return Error{ErrorKind::kInvalidArgument, "a durable name is 1 to 64 letters, digits, '-' or '_'"};
  return c;
}

}  // namespace

Result<std::shared_ptr<Consumer>> Session::consume(std::string_view stream, const ConsumerOptions& options,
                                                   std::chrono::milliseconds timeout) {
  if (stream.empty() || stream.size() > proto::kMaxStreamNameLen || !proto::valid_subject(stream))
    return Error{ErrorKind::kInvalidArgument, "'" + std::string(stream) + "' is no stream name"};
  auto config = config_of(options);
  if (!config) return config.error();
  std::array<std::byte, proto::kConsumeConfigLen> payload{};
  proto::encode_consumer_config(config.value(), payload);
  std::unique_lock lock(mu_);
  if (auto st = check_open_locked(); !st) return st.error();
  if (protocol_version_ < proto::kConsumersVersion) {
    return Error{ErrorKind::kInvalidArgument, "the broker speaks protocol version " +
                                                  std::to_string(protocol_version_) +
                                                  ", which has no stream consumers (version 11)"};
  }
  const std::uint32_t sid = subs_.claim_id(0);
  // Room for every message the broker may have outstanding, and FETCH_DONE marks.
  const std::size_t limit =
      std::max<std::size_t>(opt_.subscription_queue_limit, 2 * config.value().max_ack_pending + 64);
  auto queue = std::make_shared<QueueSubscription>(sid, limit, app_wakeups_, driver());
  subs_.add(sid, SubscriptionTable::Entry{"$RB.STREAM." + std::string(stream), nullptr, queue});
  consumer_waits_[sid] = ConsumerWait{};
  proto::FrameHeader h;
  h.type = FrameType::kConsume;
  h.arg = sid;
  if (auto st = append_frame_locked(lock, h, stream, options.durable, {payload.data(), payload.size()});
      !st) {
    subs_.forget(sid);
    consumer_waits_.erase(sid);
    return st.error();
  }
  wait_locked(lock, Clock::now() + timeout, [&] {
    const ConsumerWait& w = consumer_waits_[sid];
    return w.ready || w.refused || closed_;
  });
  const ConsumerWait w = consumer_waits_[sid];
  consumer_waits_.erase(sid);
  if (!w.ready) {
    subs_.end(sid, "not opened");
    proto::FrameHeader un;
    un.type = FrameType::kUnsubscribe;  // the broker keeps the id until told (SPEC.md §3.11)
    un.arg = sid;
    if (!closed_) (void)append_frame_locked(lock, un, {}, {}, {});
    if (w.refused) return *w.refused;
    if (closed_) return close_error_;
    return Error{ErrorKind::kTimeout, "stream " + std::string(stream) + ": no answer to CONSUME within " +
                                          std::to_string(timeout.count()) + " ms"};
  }
  return std::shared_ptr<Consumer>(
      std::make_shared<StreamConsumer>(anchor_, sid, w.pending, std::move(queue), options));
}

Status Session::send_consumer_frame(FrameType type, std::uint32_t sid, std::uint64_t sequence,
                                    std::uint16_t flags, ByteView payload) {
  std::unique_lock lock(mu_);
  if (auto st = check_open_locked(); !st) return st;
  proto::FrameHeader h;
  h.type = type;
  h.arg = sid;
  h.flags = flags;
  return append_frame_locked(lock, h, {}, {}, payload, sequence);
}

void Session::on_consumer_ready(const proto::Frame& f) {
  std::lock_guard lock(mu_);
  auto it = consumer_waits_.find(f.header.arg);
  if (it == consumer_waits_.end()) return;
  it->second.ready = true;
  it->second.pending = f.header.sequence;
  cv_.notify_all();
}

void Session::on_fetch_done(const proto::Frame& f, Deliveries& deliveries) {
  Message& mark = deliveries.add_owned(f.header.arg);
  mark.subject.clear();
  mark.reply.clear();
  mark.headers.clear();
  mark.payload.clear();
  mark.stream_sequence = 0;
  mark.deliveries = 0;
}

bool Session::on_consumer_refused(std::uint32_t sid, proto::ErrorCode code, const std::string& msg) {
  std::lock_guard lock(mu_);
  auto it = consumer_waits_.find(sid);
  if (it == consumer_waits_.end() || it->second.ready) return false;
  ErrorKind kind = ErrorKind::kBrokerError;
  if (code == proto::ErrorCode::kNoStream) kind = ErrorKind::kNoStream;
  if (code == proto::ErrorCode::kConsumerInvalid) kind = ErrorKind::kConsumerInvalid;
  if (code == proto::ErrorCode::kPermissionDenied) kind = ErrorKind::kPermissionDenied;
  it->second.refused = Error{kind, msg};
  cv_.notify_all();
  return true;
}

}  // namespace rdmabroker
