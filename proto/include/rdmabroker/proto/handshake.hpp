// SPDX-License-Identifier: Apache-2.0
// The rdmabroker connection handshake (SPEC.md, "Handshake") and the credit
// immediates: what a transport carries outside frames. Over RDMA the blocks
// travel in the rdma_cm connect/accept/reject private data, over TCP as the
// first bytes of the stream. Pure computation on byte spans, like wire.hpp.
#pragma once

#include "rdmabroker/proto/wire.hpp"

namespace rdmabroker::proto {

// ---------------------------------------------------------------- handshake

inline constexpr std::uint32_t kHandshakeMagic = 0x31424452;  // bytes "RDB1"

/// Client -> broker, in the rdma_cm connect private data (16 bytes).
struct ConnectRequest {
  std::uint32_t recv_buffer_size = 0;  // size of each receive buffer the client posted
  std::uint32_t initial_credits = 0;   // receives the client posted for the broker
  std::uint16_t flags = 0;             // kConnectMulticast, kConnectLanding; other bits ignored (sent as 0)
  /// The highest protocol version the client speaks (byte 5; a version-1
  /// client sends 0, read as 1). The broker answers with the version used.
  std::uint8_t max_version = kProtocolVersion;
};
/// Connect request flag: the client can join multicast groups (SPEC.md §7).
inline constexpr std::uint16_t kConnectMulticast = 1;
/// Connect request flag (version 9, RDMA): the client answers the first
/// fragment of every message of at least the accept's rendezvous_min with
/// RDV_READY, naming a landing area or none, so the broker may wait for the
/// answer before the rest of the message (SPEC.md §3.9).
inline constexpr std::uint16_t kConnectLanding = 2;

/// Broker -> client, in the rdma_cm accept private data (24 bytes; 32 from
/// version 4 on, with max_payload).
struct ConnectAccept {
  std::uint32_t max_frame_size = 0;   // the broker's receive buffer size: largest SEND the client may post
  std::uint32_t initial_credits = 0;  // SENDs the client may post before credits return
  std::uint64_t connection_id = 0;
  std::uint8_t version = kVersion;  // the protocol version of this connection (the lower of both sides')
  /// Version 4: the largest message the broker takes (limits.max_payload), as
  /// fragments where it does not fit one frame (SPEC.md §3.7); 0 before.
  std::uint32_t max_payload = 0;
  /// Version 8, RDMA: the smallest message a client may offer by rendezvous
  /// (SPEC.md §3.8), payload and header block; 0: none (TCP, or disabled).
  std::uint32_t rendezvous_min = 0;
};

/// Reasons a broker refuses a connection (in the rdma_cm reject private data).
enum class RejectReason : std::uint16_t {
  kBadMagic = 1,
  kUnsupportedVersion = 2,
  kBufferTooSmall = 3,  // the client's receive buffers are smaller than the broker's frames
  kTooManyConnections = 4,
  kNoResources = 5,
  kShuttingDown = 6,
  kInvalidRequest = 7,  // a connect request field out of range: retrying the same request cannot succeed
  kTlsRequired = 8,     // a plain TCP connect request where the broker accepts TLS only (tls.mode: required)
};

constexpr std::string_view to_string(RejectReason r) {
  switch (r) {
    case RejectReason::kBadMagic:
      return "not an rdmabroker handshake";
    case RejectReason::kUnsupportedVersion:
      return "unsupported protocol version";
    case RejectReason::kBufferTooSmall:
      return "receive buffers smaller than the broker's frame size";
    case RejectReason::kTooManyConnections:
      return "connection limit reached";
    case RejectReason::kNoResources:
      return "broker out of resources";
    case RejectReason::kShuttingDown:
      return "broker shutting down";
    case RejectReason::kInvalidRequest:
      return "connect request out of range (initial_credits 2..65535, recv_buffer_size at most 16 MiB)";
    case RejectReason::kTlsRequired:
      return "TLS required (connect with tls://)";
  }
  return "unknown reason";
}

/// Broker -> client, in the rdma_cm reject private data (16 bytes).
struct ConnectReject {
  RejectReason reason{};
  std::uint32_t required_buffer_size = 0;  // set with kBufferTooSmall
};

inline constexpr std::size_t kConnectRequestSize = 16;
inline constexpr std::size_t kConnectAcceptSize = 24;
/// The accept of a version-4 connection: the 24 bytes, max_payload, then 4
/// bytes reserved until version 8 (rendezvous_min).
inline constexpr std::size_t kConnectAcceptSizeV4 = 32;
/// How many bytes the accept of a connection of `version` has.
constexpr std::size_t accept_size(std::uint8_t version) {
  return version >= kFragmentsVersion ? kConnectAcceptSizeV4 : kConnectAcceptSize;
}
inline constexpr std::size_t kConnectRejectSize = 16;

// Common prefix: magic u32, version u8, reserved (the request's max_version) u8, flags/reason u16.
inline void encode_prefix(std::byte* p, std::uint16_t word, std::uint8_t version = kVersion,
                          std::uint8_t byte5 = 0) {
  store<std::uint32_t>(p, kHandshakeMagic);
  store<std::uint8_t>(p + 4, version);
  store<std::uint8_t>(p + 5, byte5);
  store<std::uint16_t>(p + 6, word);
}

/// The version a broker that speaks up to `broker_max` uses with a client
/// that asked for up to `requested` (0: a version-1 client).
constexpr std::uint8_t negotiate_version(std::uint8_t requested, std::uint8_t broker_max = kProtocolVersion) {
  if (requested < kVersion) return kVersion;
  return requested < broker_max ? requested : broker_max;
}

/// A client's receive window below which version 3 is not used (SPEC.md
/// §5.1: with credits by demand the broker's window may be 2, so the client's
/// must be at least 4 for pure credit updates to die out).
inline constexpr std::uint32_t kMinCreditsByDemandWindow = 4;

/// The version of a connection made by `r` with a broker that speaks up to
/// `broker_max`: negotiate_version(), and version 2 in place of 3 for a client
/// that posted fewer than kMinCreditsByDemandWindow receives.
constexpr std::uint8_t connection_version(const ConnectRequest& r,
                                          std::uint8_t broker_max = kProtocolVersion) {
  const std::uint8_t v = negotiate_version(r.max_version, broker_max);
  if (v >= kCreditsByDemandVersion && r.initial_credits < kMinCreditsByDemandWindow) return kHeadersVersion;
  return v;
}

inline std::array<std::byte, kConnectRequestSize> encode(const ConnectRequest& r) {
  std::array<std::byte, kConnectRequestSize> b{};
  encode_prefix(b.data(), r.flags, kVersion, r.max_version);
  store<std::uint32_t>(b.data() + 8, r.recv_buffer_size);
  store<std::uint32_t>(b.data() + 12, r.initial_credits);
  return b;
}
/// All kConnectAcceptSizeV4 bytes; the first accept_size(a.version) are the accept.
inline std::array<std::byte, kConnectAcceptSizeV4> encode(const ConnectAccept& a) {
  std::array<std::byte, kConnectAcceptSizeV4> b{};
  encode_prefix(b.data(), 0, a.version);
  store<std::uint32_t>(b.data() + 8, a.max_frame_size);
  store<std::uint32_t>(b.data() + 12, a.initial_credits);
  store<std::uint64_t>(b.data() + 16, a.connection_id);
  if (a.version >= kFragmentsVersion) store<std::uint32_t>(b.data() + 24, a.max_payload);
  if (a.version >= kRendezvousVersion) store<std::uint32_t>(b.data() + 28, a.rendezvous_min);
  return b;
}
inline std::array<std::byte, kConnectRejectSize> encode(const ConnectReject& r) {
  std::array<std::byte, kConnectRejectSize> b{};
  encode_prefix(b.data(), static_cast<std::uint16_t>(r.reason));
  store<std::uint32_t>(b.data() + 8, r.required_buffer_size);
  return b;
}

enum class HandshakeStatus {
  kOk,
  kTooShort,
  kBadMagic,
  kBadVersion,
  kBufferTooSmall,  // recv_buffer_size below kMinBufferSize
  kBadValue,        // any other field out of range
};

constexpr std::string_view to_string(HandshakeStatus s) {
  switch (s) {
    case HandshakeStatus::kOk:
      return "ok";
    case HandshakeStatus::kTooShort:
      return "handshake block too short";
    case HandshakeStatus::kBadMagic:
      return "bad handshake magic";
    case HandshakeStatus::kBadVersion:
      return "unsupported handshake version";
    case HandshakeStatus::kBufferTooSmall:
      return "receive buffer size below the minimum";
    case HandshakeStatus::kBadValue:
      return "handshake value out of range";
  }
  return "unknown";
}

// rdma_cm may deliver more private data than was sent (zero padded): only the
// prefix we define is read, longer input is fine. `max_version`: the
// highest version byte 4 may carry (an accept's is the negotiated one).
inline HandshakeStatus check_prefix(std::span<const std::byte> b, std::size_t need,
                                    std::uint8_t max_version = kVersion) {
  if (b.size() < need) return HandshakeStatus::kTooShort;
  if (load<std::uint32_t>(b.data()) != kHandshakeMagic) return HandshakeStatus::kBadMagic;
  const auto version = load<std::uint8_t>(b.data() + 4);
  if (version < kVersion || version > max_version) return HandshakeStatus::kBadVersion;
  return HandshakeStatus::kOk;
}

inline HandshakeStatus decode(std::span<const std::byte> b, ConnectRequest& out) {
  if (auto s = check_prefix(b, kConnectRequestSize); s != HandshakeStatus::kOk) return s;
  out.flags = load<std::uint16_t>(b.data() + 6);
  out.max_version = load<std::uint8_t>(b.data() + 5);
  out.recv_buffer_size = load<std::uint32_t>(b.data() + 8);
  out.initial_credits = load<std::uint32_t>(b.data() + 12);
  if (out.initial_credits < 2 || out.initial_credits > 65535) return HandshakeStatus::kBadValue;
  if (out.recv_buffer_size > kMaxBufferSize) return HandshakeStatus::kBadValue;
  if (out.recv_buffer_size < kMinBufferSize) return HandshakeStatus::kBufferTooSmall;
  return HandshakeStatus::kOk;
}
inline HandshakeStatus decode(std::span<const std::byte> b, ConnectAccept& out) {
  if (auto s = check_prefix(b, kConnectAcceptSize, kProtocolVersion); s != HandshakeStatus::kOk) return s;
  out.version = load<std::uint8_t>(b.data() + 4);
  out.max_frame_size = load<std::uint32_t>(b.data() + 8);
  out.initial_credits = load<std::uint32_t>(b.data() + 12);
  out.connection_id = load<std::uint64_t>(b.data() + 16);
  if (out.max_frame_size < kMinBufferSize || out.max_frame_size > kMaxBufferSize)
    return HandshakeStatus::kBadValue;
  out.max_payload = 0;
  if (out.version >= kFragmentsVersion) {
    if (b.size() < kConnectAcceptSizeV4) return HandshakeStatus::kTooShort;
    out.max_payload = load<std::uint32_t>(b.data() + 24);
    if (out.max_payload > kMaxMessageSize) return HandshakeStatus::kBadValue;
  }
  out.rendezvous_min = out.version >= kRendezvousVersion ? load<std::uint32_t>(b.data() + 28) : 0;
  return HandshakeStatus::kOk;
}
inline HandshakeStatus decode(std::span<const std::byte> b, ConnectReject& out) {
  if (auto s = check_prefix(b, kConnectRejectSize); s != HandshakeStatus::kOk) return s;
  out.reason = static_cast<RejectReason>(load<std::uint16_t>(b.data() + 6));
  out.required_buffer_size = load<std::uint32_t>(b.data() + 8);
  return HandshakeStatus::kOk;
}

// ---------------------------------------------------------------- credits

/// Over RDMA every SEND is a SEND_WITH_IMM whose immediate value returns
/// receive credits to the peer (SPEC.md, "Flow control"). A SEND of zero bytes
/// is a pure credit update.
inline constexpr std::uint32_t kMaxCreditsPerImm = 0xffff;

/// Version 3 (SPEC.md §5.1) splits the immediate value: the low 16 bits
/// return credits as before, the high 16 bits ask the client to give credits
/// back (broker -> client) or give them back (client -> broker). Versions 1
/// and 2 send the high bits as 0.
struct CreditImm {
  std::uint32_t returned = 0;
  std::uint32_t release = 0;
};
constexpr std::uint32_t encode_credit_imm(CreditImm c) { return (c.release << 16) | (c.returned & 0xffff); }
constexpr CreditImm decode_credit_imm(std::uint32_t imm) { return CreditImm{imm & 0xffff, imm >> 16}; }

}  // namespace rdmabroker::proto
