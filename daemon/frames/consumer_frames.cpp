// SPDX-License-Identifier: Apache-2.0
// A stream's consumers as a worker sees them (SPEC.md §3.11): CONSUME, ACK
// and FETCH are checked against the connection (its version, its
// subscription ids, its permissions) and handed to the stream engine, which
// owns every consumer and answers on the connection itself.
#include <spdlog/spdlog.h>

#include <algorithm>

#include "broker/streams.hpp"
#include "frames/frame_handler.hpp"
#include "rdmabroker/proto/subjects.hpp"

namespace rdmabroker::daemon {

using proto::ErrorCode;
using proto::FrameType;

bool FrameHandler::on_consumer_frame(Connection& c, const proto::Frame& f) {
  const auto type = f.header.type;
  if (c.protocol_version < proto::kConsumersVersion) {
    connections_.close(c, CloseReason::kProtocolError, ErrorCode::kMalformedFrame,
                       std::string(proto::to_string(type)) +
                           " needs protocol version 11, this connection negotiated " +
                           std::to_string(c.protocol_version));
    return false;
  }
  if (c.identity->route) {
    connections_.close(
        c, CloseReason::kProtocolError, ErrorCode::kProtocolViolation,
        std::string(proto::to_string(type)) + " on a route: a route only subscribes (SPEC.md §8)");
    return false;
  }
  if (type == FrameType::kConsume) {
    on_consume(c, f);
    return true;
  }
  const std::uint32_t sid = f.header.arg;
  const auto it = c.subscriptions.find(sid);
  if (it == c.subscriptions.end() || !it->second.consumer) {
    // Crossed with its UNSUBSCRIBE, or never a consumer: the id names none.
    reply_error(
        c, ErrorCode::kUnknownSubscription,
        std::string(proto::to_string(type)) + " for " + std::to_string(sid) + ", which is no consumer", sid);
    return true;
  }
  using Kind = ConsumerCommand::Kind;
  const Kind kind = type == FrameType::kFetch                 ? Kind::kFetch
                    : (f.header.flags & proto::kFlagNak) != 0 ? Kind::kNak
                                                              : Kind::kAck;
  ConsumerCommand cmd = consumer_command(kind, c, sid);
  cmd.sequence = f.header.sequence;
  if (kind == Kind::kFetch) std::memcpy(&cmd.expires_ms, f.payload.data(), sizeof cmd.expires_ms);
  ctx_.core.streams->command(std::move(cmd));
  return true;
}

ConsumerCommand FrameHandler::consumer_command(ConsumerCommand::Kind kind, const Connection& c,
                                               std::uint32_t sid) const {
  ConsumerCommand cmd;
  cmd.kind = kind;
  cmd.connection = c.id;
  cmd.slot = c.slot;
  cmd.worker = ctx_.index;
  cmd.sid = sid;
  // Who reads: what opening and a reload's renewal check, not each ACK.
  if (kind == ConsumerCommand::Kind::kOpen || kind == ConsumerCommand::Kind::kRenew)
    cmd.identity = c.identity;
  return cmd;
}

void FrameHandler::on_consume(Connection& c, const proto::Frame& f) {
  const std::uint32_t sid = f.header.arg;
  if (c.subscriptions.contains(sid)) {
    return reply_error(c, ErrorCode::kDuplicateSubscription,
                       "subscription id " + std::to_string(sid) + " is already in use", sid);
  }
  if (ctx_.core.streams == nullptr) {
    return reply_error(c, ErrorCode::kNoStream, "this broker keeps no streams", sid);
  }
  // A connection that opens consumers in a flood (each may create a durable
  // one, kept on disk) is held to a rate; the others are not slowed by it.
  if (!c.consume_rate.take(ctx_.options.consumer_opens_per_second, ctx_.now)) {
    ctx_.stats.limit_consumer_opens.add();
    return reply_error(c, ErrorCode::kTooManySubscriptions,
                       "more than " + std::to_string(ctx_.options.consumer_opens_per_second) +
                           " CONSUMEs a second on this connection (limits.consumer_opens_per_second)",
                       sid);
  }
  if (c.subscriptions.size() >= ctx_.options.max_subscriptions) {
    ctx_.stats.limit_subscriptions.add();
    return reply_error(
        c, ErrorCode::kTooManySubscriptions,
        "limit of " + std::to_string(ctx_.options.max_subscriptions) + " subscriptions reached", sid);
  }
  // A name no stream or durable consumer can have is the client's mistake,
  // not a broken frame: refused, the connection stays (SPEC.md §3.11).
  if (!proto::valid_name(f.subject) || (!f.reply.empty() && !proto::valid_name(f.reply))) {
    return reply_error(c, ErrorCode::kConsumerInvalid,
                       "a stream's or durable consumer's name is 1 to 64 letters, digits, '-' or '_'", sid);
  }
  // Which streams a user may read is streams.read; each message delivered
  // passes its subscribe permissions too, in the engine (docs/security.md, "Streams").
  if (!c.identity->may_read_stream(f.subject)) return deny(c, "consume", f.subject, sid);
  const std::string access = std::string(kConsumerPatternPrefix) + std::string(f.subject);
  const auto config = proto::decode_consumer_config(f.payload);
  if (!config)
    return reply_error(c, ErrorCode::kConsumerInvalid, "CONSUME settings out of range (SPEC.md §3.11)", sid);
  // A stored message goes whole (SPEC.md §3.11): to receive buffers smaller
  // than the broker's frames it could go only in fragments, which carry no
  // stream sequence to acknowledge.
  if (c.peer_buffer_size < ctx_.options.buffer_size) {
    return reply_error(c, ErrorCode::kConsumerInvalid,
                       "this connection's receive buffers (" + std::to_string(c.peer_buffer_size) +
                           " bytes) are smaller than the broker's frames (buffers.size " +
                           std::to_string(ctx_.options.buffer_size) +
                           "): a stored message could not be delivered whole",
                       sid);
  }
  // A consumer is a subscription to the bounds too: charged like one, and
  // given back like one when it ends (drop_subscription).
  Connection::Subscription sub;
  sub.cost = SubscriptionBudget::cost(access, f.reply);
  if (!charge_subscription(c, sid, sub.cost, sub.tenant_charged)) return;
  sub.pattern = access;
  sub.consumer = true;
  c.subscriptions.emplace(sid, std::move(sub));
  ConsumerCommand cmd = consumer_command(ConsumerCommand::Kind::kOpen, c, sid);
  cmd.max_frame = c.peer_buffer_size;
  cmd.stream = std::string(f.subject);
  cmd.durable = std::string(f.reply);
  cmd.config = *config;
  ctx_.core.streams->command(std::move(cmd));
}

}  // namespace rdmabroker::daemon
