// SPDX-License-Identifier: Apache-2.0
// The rdmabroker wire protocol's numbers (proto/SPEC.md): the protocol
// versions and what each added, sizes and limits, frame types, header flags
// and error codes, with their names. Shared by rdmabrokerd and
// librdmabroker; wire.hpp builds frames from them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace rdmabroker::proto {

inline constexpr std::uint16_t kFrameMagic = 0x4252;  // bytes "RB"
/// The frame layout's version (every frame's byte 2) and the base protocol
/// version of the handshake: 1 on every connection.
inline constexpr std::uint8_t kVersion = 1;
/// The highest protocol version this code speaks, negotiated in the
/// handshake (SPEC.md §2.1): 2 adds message headers (§3.6), 3 credits by
/// demand (§5.1), 4 messages larger than a frame, sent as fragments (§3.7),
/// 5 the relay time in every DELIVER (§3.4), 6 routes between brokers (§8),
/// 7 gossip: INFO frames and route logins that announce route URLs (§8),
/// 8 rendezvous: a large message read from the publisher's memory by RDMA (§3.8),
/// 9 landing areas: a large message written into the subscriber's memory by RDMA (§3.9),
/// 10 streams: a PUBLISH may ask to be acknowledged once a stream stored it (§3.10),
/// 11 consumers: a stream's messages delivered, acknowledged and redelivered (§3.11),
/// 12 PUB_ACK ranges: one PUB_ACK answers a run of a publisher's messages (§3.10),
/// 13 MSG_ID_INVALID: a Msg-Id over kMaxMsgIdLen is refused with a code of its own (§3.10).
inline constexpr std::uint8_t kProtocolVersion = 13;
/// The first protocol version with message headers.
inline constexpr std::uint8_t kHeadersVersion = 2;
/// The first protocol version with credits by demand over RDMA (SPEC.md §5.1).
inline constexpr std::uint8_t kCreditsByDemandVersion = 3;
/// The first protocol version with fragmented messages (SPEC.md §3.7).
inline constexpr std::uint8_t kFragmentsVersion = 4;
/// The first protocol version whose DELIVERs say how long their first
/// message spent in the broker (SPEC.md §3.4, "Relay time").
inline constexpr std::uint8_t kRelayTimeVersion = 5;
/// The first protocol version in which a broker may log in to another as a
/// route (a CONNECT with kFlagRoute, SPEC.md §8).
inline constexpr std::uint8_t kRouteVersion = 6;
/// The first protocol version with INFO frames (a broker of a cluster tells
/// its clients and routes the cluster's brokers) and route logins that
/// announce the dialing broker's route URLs (SPEC.md §8, "Gossip").
inline constexpr std::uint8_t kGossipVersion = 7;
/// The first protocol version in which a client may offer a large message
/// for the broker to READ from its memory instead of sending it in
/// fragments (SPEC.md §3.8, RDMA only).
inline constexpr std::uint8_t kRendezvousVersion = 8;
/// The first protocol version in which a subscriber may offer a landing
/// area for a large message that the broker then WRITEs into its memory
/// instead of sending the fragments between its first and last (SPEC.md
/// §3.9, RDMA only).
inline constexpr std::uint8_t kLandingVersion = 9;
/// The first protocol version with acknowledged publishing to streams
/// (PUBLISH flag ACK, frame type PUB_ACK: SPEC.md §3.10).
inline constexpr std::uint8_t kStreamsVersion = 10;
/// The first protocol version with stream consumers (CONSUME, CONSUMER_READY,
/// ACK, FETCH, FETCH_DONE and the STREAM flag of an inner PUBLISH: SPEC.md §3.11).
inline constexpr std::uint8_t kConsumersVersion = 11;
/// The first protocol version whose clients take a PUB_ACK with RANGE: one
/// frame for a run of messages stored one after the other (SPEC.md §3.10).
inline constexpr std::uint8_t kAckRangesVersion = 12;
/// The first protocol version whose clients are told MSG_ID_INVALID (older
/// ones PAYLOAD_TOO_LARGE) for a Msg-Id a stream will not remember.
inline constexpr std::uint8_t kMsgIdCodeVersion = 13;
/// The longest Msg-Id header value a stream takes (SPEC.md §3.10): the
/// duplicate window's memory is bounded by it and by its count.
inline constexpr std::size_t kMaxMsgIdLen = 128;
/// The largest relay time a DELIVER can carry, in nanoseconds (~4.3 s): a
/// longer one is sent as this.
inline constexpr std::uint32_t kMaxRelayNs = 0xffffffffu;
/// The largest message (payload, header block included) a broker may be
/// configured to take as fragments (limits.max_payload).
inline constexpr std::uint32_t kMaxMessageSize = 64u << 20;
inline constexpr std::size_t kHeaderSize = 32;
inline constexpr std::size_t kFrameAlign = 8;
inline constexpr std::size_t kMaxSubjectLen = 255;
/// Smallest receive buffer either side may announce: a header plus a subject.
inline constexpr std::uint32_t kMinBufferSize = 1024;
inline constexpr std::uint32_t kMaxBufferSize = 16u << 20;

enum class FrameType : std::uint8_t {
  kSubscribe = 1,
  kUnsubscribe = 2,
  kPublish = 3,
  kDeliver = 4,
  kCredit = 5,
  kPing = 6,
  kPong = 7,
  kError = 8,
  kClose = 9,
  kNoResponders = 10,
  kConnect = 11,  // client -> broker, first frame: credentials (SPEC.md §2.3)
  // Multicast (SPEC.md §7): only between a broker and a client that offered
  // kConnectMulticast in its connect request.
  kMcastJoin = 12,    // B -> C: subscription `arg` is served by a multicast channel (McastJoin payload)
  kMcastJoined = 13,  // C -> B: outcome of joining for subscription `arg`: empty payload ok, else why not
  kMcastRepair = 14,  // C -> B: resend subscription `arg`'s messages from `sequence` (payload: u64 count)
  kMcastLoss = 15,    // B -> C: subscription `arg` lost messages from `sequence` (payload: u64 count)
  kMcastLeave = 16,  // B -> C: subscription `arg`'s channel left its group: all further messages come over RC
  // Version 4 (SPEC.md §3.7): a fragmented message that will not be completed.
  kAbort = 17,  // C -> B: the open message is abandoned; B -> C: message `sequence` on subscription `arg` is
  // Version 7 (SPEC.md §8, "Gossip"): B -> C, the broker and its cluster (info.hpp).
  kInfo = 18,
  // Version 8 (SPEC.md §3.8), RDMA only: a message the broker reads from the publisher's memory.
  kRendezvousOffer = 19,    // C -> B: subject, reply, RendezvousRegion payload; arg: its length
  kRendezvousRelease = 20,  // B -> C: offer `sequence` is read (arg 0) or refused (arg: the error code)
  // Version 9 (SPEC.md §3.9), RDMA only: where the broker may WRITE the rest of a message.
  kRendezvousReady = 21,  // C -> B: arg: subscription, sequence: its first fragment's DELIVER; LandingArea
  // Version 10 (SPEC.md §3.10): B -> C, the outcome of a PUBLISH with ACK.
  kPubAck = 22,  // sequence: the PUBLISH's; arg: 0 stored, else the error code; PubAck payload
  // Version 11 (SPEC.md §3.11): stream consumers; arg: the consumer's subscription id.
  kConsume = 23,        // C -> B: subject the stream, second string the durable name; ConsumerConfig
  kConsumerReady = 24,  // B -> C: the consumer is open; sequence: the messages it has yet to deliver
  kAck = 25,            // C -> B: sequence: a stream sequence acknowledged (NAK flag: redeliver it)
  kFetch = 26,          // C -> B: a pull consumer's request: sequence: messages; payload u32 expires_ms
  kFetchDone = 27,      // B -> C: the open FETCH ended; sequence: the messages it delivered
};
inline constexpr std::uint8_t kMaxFrameType = 27;
/// Longest CONNECT payload (user name plus password, or a token).
inline constexpr std::size_t kMaxCredentialsLen = 1024;

/// PUBLISH flag: the publisher wants a NO_RESPONDERS frame back when the
/// message (which must carry a reply subject) matches no subscription.
inline constexpr std::uint16_t kFlagRequest = 1;
/// DELIVER flag: the subscription is served by a multicast channel; the
/// header's `sequence` is the channel sequence number of the first inner
/// message, the others follow it one by one (SPEC.md §7).
inline constexpr std::uint16_t kFlagSequenced = 2;
/// PUBLISH flag (version 4): the frame is one fragment of a message larger
/// than a frame (SPEC.md §3.7): `arg` is the message's length, the reserved
/// word its offset, `sequence` the publisher's connection id.
inline constexpr std::uint16_t kFlagFragment = 4;
/// CONNECT flag (version 6): the connection is a route from another broker of
/// the same cluster (SPEC.md §8): the subject is the cluster's name, the
/// second string the dialing broker's id, the payload the route credentials.
inline constexpr std::uint16_t kFlagRoute = 8;
/// PUBLISH flag (version 10): the publisher wants a PUB_ACK once a stream
/// has stored the message durably, or why not (SPEC.md §3.10). `sequence`
/// is the publisher's id for it, not 0. Never on a fragment.
inline constexpr std::uint16_t kFlagAck = 16;
/// PUB_ACK flag: the message's Msg-Id header was stored before within the
/// stream's duplicate window; the sequence is the first one's (nothing stored).
inline constexpr std::uint16_t kFlagDuplicate = 32;
/// PUBLISH flag (version 11), only on a whole PUBLISH inside a DELIVER to a
/// consumer (SPEC.md §3.11): `sequence` is the stream sequence, the word at
/// offset 20 the delivery count (1 the first time). Never from a client.
inline constexpr std::uint16_t kFlagStream = 64;
/// ACK flag (version 11): not acknowledged; deliver the message again now.
inline constexpr std::uint16_t kFlagNak = 128;
/// PUB_ACK flag (version 12): the frame answers `count` PUBLISHes with the
/// ids `sequence`, `sequence` + 1, ..., stored under the stream sequences
/// `first`, `first` + 1, ... (payload: kPubAckRangeMinLen, SPEC.md §3.10).
inline constexpr std::uint16_t kFlagRange = 256;
/// Payload of CONSUME (SPEC.md §3.11): the consumer's settings (consumer.hpp).
inline constexpr std::size_t kConsumeConfigLen = 32;
/// Payload of FETCH: u32 how long the request stays open, in milliseconds.
inline constexpr std::size_t kFetchLen = 4;
/// Longest durable consumer name.
inline constexpr std::size_t kMaxConsumerNameLen = 64;
/// Payload of PUB_ACK: the stream sequence (u64; 0 when not stored), then
/// the stream's name (0 .. kMaxStreamNameLen bytes; none when no stream took it).
inline constexpr std::size_t kPubAckMinLen = 8;
/// Payload of a PUB_ACK with RANGE: the first stream sequence (u64), how
/// many messages (u32, at least 2), 4 reserved bytes (0), then the stream's name.
inline constexpr std::size_t kPubAckRangeMinLen = 16;
inline constexpr std::size_t kMaxStreamNameLen = 64;
/// Payload of RDV_OFFER (SPEC.md §3.8): the region's address (u64), rkey
/// (u32), the message's header block length (u16) and 2 reserved bytes.
inline constexpr std::size_t kRendezvousRegionLen = 16;
/// Payload of RDV_READY (SPEC.md §3.9): the publisher's connection id (u64),
/// the address of the message's byte 0 (u64), the rkey (u32), 4 reserved bytes.
inline constexpr std::size_t kLandingAreaLen = 24;
/// Payload of MCAST_REPAIR and MCAST_LOSS: a u64 message count.
inline constexpr std::size_t kMcastCountLen = 8;
/// Payload of MCAST_JOIN (see multicast.hpp).
inline constexpr std::size_t kMcastJoinLen = 24;
/// Longest MCAST_JOINED text (why a join failed).
inline constexpr std::size_t kMaxMcastReasonLen = 200;

/// Numbered error codes carried in ERROR frames (arg field) and CLOSE frames.
enum class ErrorCode : std::uint32_t {
  kNone = 0,
  kMalformedFrame = 1,
  kUnsupportedVersion = 2,
  kPayloadTooLarge = 3,
  kInvalidSubject = 4,
  kUnknownSubscription = 5,
  kDuplicateSubscription = 6,
  kProtocolViolation = 7,
  kTooManySubscriptions = 8,
  kSlowConsumer = 9,
  kServerShutdown = 10,
  kInternalError = 11,
  kAuthenticationRequired = 12,  // a frame other than CONNECT came first
  kAuthenticationFailed = 13,    // unknown user, wrong password or token, or anonymous access is off
  kPermissionDenied = 14,        // the user may not publish or subscribe to that subject (or no longer may)
  // Version 10, in a PUB_ACK only (SPEC.md §3.10): why a stream did not store the message.
  kNoStream = 15,    // no stream takes the subject
  kStreamFull = 16,  // the stream is at its limits and refuses new messages (discard: new)
  kDiskFull = 17,    // the broker's file system is full
  // Version 11 (SPEC.md §3.11), in an ERROR about a consumer (stays open).
  kConsumerInvalid = 18,  // settings out of range, or a durable consumer in use with other settings
  // Version 13, in a PUB_ACK only (SPEC.md §3.10).
  kMsgIdInvalid = 19,  // a Msg-Id longer than kMaxMsgIdLen: not stored
};

constexpr std::string_view to_string(FrameType t) {
  switch (t) {
    case FrameType::kSubscribe:
      return "SUBSCRIBE";
    case FrameType::kUnsubscribe:
      return "UNSUBSCRIBE";
    case FrameType::kPublish:
      return "PUBLISH";
    case FrameType::kDeliver:
      return "DELIVER";
    case FrameType::kCredit:
      return "CREDIT";
    case FrameType::kPing:
      return "PING";
    case FrameType::kPong:
      return "PONG";
    case FrameType::kError:
      return "ERROR";
    case FrameType::kClose:
      return "CLOSE";
    case FrameType::kNoResponders:
      return "NO_RESPONDERS";
    case FrameType::kConnect:
      return "CONNECT";
    case FrameType::kMcastJoin:
      return "MCAST_JOIN";
    case FrameType::kMcastJoined:
      return "MCAST_JOINED";
    case FrameType::kMcastRepair:
      return "MCAST_REPAIR";
    case FrameType::kMcastLoss:
      return "MCAST_LOSS";
    case FrameType::kMcastLeave:
      return "MCAST_LEAVE";
    case FrameType::kAbort:
      return "ABORT";
    case FrameType::kInfo:
      return "INFO";
    case FrameType::kRendezvousOffer:
      return "RDV_OFFER";
    case FrameType::kRendezvousRelease:
      return "RDV_RELEASE";
    case FrameType::kRendezvousReady:
      return "RDV_READY";
    case FrameType::kPubAck:
      return "PUB_ACK";
    case FrameType::kConsume:
      return "CONSUME";
    case FrameType::kConsumerReady:
      return "CONSUMER_READY";
    case FrameType::kAck:
      return "ACK";
    case FrameType::kFetch:
      return "FETCH";
    case FrameType::kFetchDone:
      return "FETCH_DONE";
  }
  return "UNKNOWN";
}

constexpr std::string_view to_string(ErrorCode c) {
  switch (c) {
    case ErrorCode::kNone:
      return "none";
    case ErrorCode::kMalformedFrame:
      return "malformed frame";
    case ErrorCode::kUnsupportedVersion:
      return "unsupported protocol version";
    case ErrorCode::kPayloadTooLarge:
      return "payload too large";
    case ErrorCode::kInvalidSubject:
      return "invalid subject";
    case ErrorCode::kUnknownSubscription:
      return "unknown subscription id";
    case ErrorCode::kDuplicateSubscription:
      return "subscription id already in use";
    case ErrorCode::kProtocolViolation:
      return "protocol violation";
    case ErrorCode::kTooManySubscriptions:
      return "too many subscriptions";
    case ErrorCode::kSlowConsumer:
      return "slow consumer";
    case ErrorCode::kServerShutdown:
      return "server shutting down";
    case ErrorCode::kInternalError:
      return "internal error";
    case ErrorCode::kAuthenticationRequired:
      return "authentication required";
    case ErrorCode::kAuthenticationFailed:
      return "authentication failed";
    case ErrorCode::kPermissionDenied:
      return "permission denied";
    case ErrorCode::kNoStream:
      return "no stream takes the subject";
    case ErrorCode::kStreamFull:
      return "the stream is full";
    case ErrorCode::kDiskFull:
      return "the broker's disk is full";
    case ErrorCode::kConsumerInvalid:
      return "consumer settings invalid or in conflict";
    case ErrorCode::kMsgIdInvalid:
      return "Msg-Id too long";
  }
  return "unknown error";
}

}  // namespace rdmabroker::proto
