// SPDX-License-Identifier: Apache-2.0
// Acknowledged publishing (SPEC.md §3.10): a PUBLISH with ACK and the wait
// for its PUB_ACK.
#include <cstring>

#include "rdmabroker/proto/pub_ack.hpp"
#include "session.hpp"

namespace rdmabroker {

namespace {

Error ack_error(proto::ErrorCode code, std::string_view subject, const std::string& stream) {
  const std::string on = "'" + std::string(subject) + "'";
  switch (code) {
    case proto::ErrorCode::kNoStream:
      return {ErrorKind::kNoStream, "no stream takes " + on};
    case proto::ErrorCode::kStreamFull:
      return {ErrorKind::kStreamFull,
              "stream " + stream + " is full and refuses new messages (discard: new)"};
    case proto::ErrorCode::kDiskFull:
      return {ErrorKind::kDiskFull, "stream " + stream + ": the broker's disk is full"};
    case proto::ErrorCode::kPayloadTooLarge:
      return {ErrorKind::kPayloadTooLarge, "larger than stream " + stream + "'s max_msg_size"};
    case proto::ErrorCode::kPermissionDenied:
      return {ErrorKind::kPermissionDenied, "publish to " + on + " denied"};
    case proto::ErrorCode::kMsgIdInvalid:
      return {ErrorKind::kInvalidArgument, "stream " + stream + " takes a Msg-Id of at most " +
                                               std::to_string(proto::kMaxMsgIdLen) + " bytes"};
    case proto::ErrorCode::kInternalError:
      return {ErrorKind::kBrokerError, "stream " + stream +
                                           ": an I/O error in the broker (see its log); the message on " +
                                           on + " is not known to be stored: publish it again"};
    default:
      return {ErrorKind::kBrokerError, "stream " + stream + " did not store the message on " + on + ": " +
                                           std::string(proto::to_string(code))};
  }
}

}  // namespace

Result<std::uint64_t> Session::send_acked_locked(std::unique_lock<std::mutex>& lock, std::string_view subject,
                                                 const Headers& headers, ByteView payload,
                                                 PubAckHandler handler) {
  if (auto st = check_subject(subject); !st) return st.error();
  auto fields = header_fields(headers);
  if (!fields) return fields.error();
  if (auto st = check_open_locked(); !st) return st.error();
  if (protocol_version_ < proto::kStreamsVersion) {
    return Error{ErrorKind::kInvalidArgument, "the broker speaks protocol version " +
                                                  std::to_string(protocol_version_) +
                                                  ", which has no acknowledged publishing (version 10)"};
  }
  const std::size_t size = proto::header_block_len(fields.value()) + payload.size();
  if (size > frame_room(subject.size(), 0)) {
    return Error{ErrorKind::kPayloadTooLarge,
                 "an acknowledged message goes in one frame: " + std::to_string(size) + " bytes, at most " +
                     std::to_string(frame_room(subject.size(), 0)) + " here"};
  }
  if (handler) {
    // The broker cuts a client that leaves 1,024 answers unread (SPEC.md §6):
    // the library keeps fewer in flight, as JetStream's MaxPending does.
    if (!wait_locked(lock, Clock::now() + opt_.publish_timeout,
                     [&] { return async_acks_ < kMaxAsyncAcks || closed_; })) {
      return Error{ErrorKind::kTimeout, std::to_string(kMaxAsyncAcks) +
                                            " acknowledged publishes unanswered for " +
                                            std::to_string(opt_.publish_timeout.count()) + " ms"};
    }
    if (auto st = check_open_locked(); !st) return st.error();
    ++async_acks_;
  }
  const std::uint64_t id = next_ack_++;
  const bool async = static_cast<bool>(handler);
  acks_.emplace(id, AckWait{false, proto::ErrorCode::kNone, {}, std::string(subject), std::move(handler)});
  proto::FrameHeader h;
  h.type = proto::FrameType::kPublish;
  h.flags = proto::kFlagAck;
  if (auto st = append_frame_locked(lock, h, subject, {}, payload, id, true, fields.value()); !st) {
    acks_.erase(id);
    if (async) --async_acks_;
    return st.error();
  }
  return id;
}

Result<PubAck> Session::publish_acked(std::string_view subject, const Headers& headers, ByteView payload,
                                      std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  auto sent = send_acked_locked(lock, subject, headers, payload, nullptr);
  if (!sent) return sent.error();
  const std::uint64_t id = sent.value();
  wait_locked(lock, Clock::now() + timeout, [&] { return acks_[id].done || closed_; });
  AckWait done = std::move(acks_[id]);
  acks_.erase(id);
  if (!done.done) {
    if (closed_) return close_error_;
    return Error{ErrorKind::kTimeout, "no acknowledgement for '" + std::string(subject) + "' within " +
                                          std::to_string(timeout.count()) +
                                          " ms (it may still be stored: publish again with the same Msg-Id)"};
  }
  if (done.code != proto::ErrorCode::kNone) return ack_error(done.code, subject, done.ack.stream);
  return std::move(done.ack);
}

Status Session::publish_acked_async(std::string_view subject, const Headers& headers, ByteView payload,
                                    PubAckHandler done) {
  if (!done) return Error{ErrorKind::kInvalidArgument, "publish_acked_async needs a handler"};
  std::unique_lock lock(mu_);
  auto sent = send_acked_locked(lock, subject, headers, payload, std::move(done));
  if (!sent) return sent.error();
  return {};
}

void Session::on_pub_ack(const proto::Frame& f) {
  // One answer, or (version 12) a RANGE of them: `count` ids from the
  // frame's sequence on, stored under consecutive stream sequences.
  const proto::PubAckAnswer answer = proto::pub_ack_answer(f);
  const auto code = static_cast<proto::ErrorCode>(f.header.arg);
  const bool duplicate = (f.header.flags & proto::kFlagDuplicate) != 0;
  std::vector<AckWait> answered;  // asynchronous ones: their handlers run after the lock
  std::unique_lock lock(mu_);
  for (std::uint32_t i = 0; i < answer.count; ++i) {
    auto it = acks_.find(answer.first_id + i);
    if (it == acks_.end()) continue;  // its publish_acked() gave up waiting
    AckWait& w = it->second;
    w.done = true;
    w.code = code;
    w.ack.sequence = answer.first_sequence + i;  // a refusal's 0 comes alone (count 1)
    w.ack.stream.assign(answer.stream);
    w.ack.duplicate = duplicate;
    if (!w.handler) continue;  // publish_acked() takes it
    answered.push_back(std::move(w));
    acks_.erase(it);
    --async_acks_;
  }
  cv_.notify_all();  // a publish_acked() is answered, or a publisher may wait for room
  lock.unlock();
  // Asynchronous ones: their handlers run here, on the I/O thread, without the lock, in order.
  for (AckWait& a : answered) {
    if (a.code != proto::ErrorCode::kNone) {
      a.handler(ack_error(a.code, a.subject, a.ack.stream));
    } else {
      a.handler(std::move(a.ack));
    }
  }
}

void Session::fail_unanswered_acks() {
  std::vector<PubAckHandler> orphans;
  Error why{ErrorKind::kClosed, ""};
  {
    std::lock_guard lock(mu_);
    if (!closed_) return;
    why = close_error_;
    for (auto it = acks_.begin(); it != acks_.end();) {
      if (!it->second.handler) {
        ++it;
        continue;
      }
      orphans.push_back(std::move(it->second.handler));
      it = acks_.erase(it);
      --async_acks_;
    }
  }
  // No answer will come: the message may or may not be stored (publish it again with its Msg-Id).
  for (auto& h : orphans) h(why);
}

}  // namespace rdmabroker
