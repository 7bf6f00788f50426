// SPDX-License-Identifier: Apache-2.0
// The rdmabroker wire protocol: frame layout, the frame header's encoder and
// the frame decoder with its checks (the protocol's numbers, frame types,
// flags and error codes are in codes.hpp; handshake blocks in handshake.hpp). proto/SPEC.md is the normative
// description; this header implements it and is shared by rdmabrokerd and librdmabroker.
//
// Everything here is pure computation on byte spans: no allocation, no I/O, so
// the decoder can be fuzzed and unit-tested without a transport.
#pragma once

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>

#include "rdmabroker/proto/codes.hpp"
#include "rdmabroker/proto/headers.hpp"

namespace rdmabroker::proto {

static_assert(std::endian::native == std::endian::little,
              "the codec stores fields with memcpy and assumes a little-endian host");

// ---------------------------------------------------------------- byte access

template <typename T>
inline T load(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <typename T>
inline void store(std::byte* p, T v) {
  std::memcpy(p, &v, sizeof v);
}

constexpr std::size_t align_up(std::size_t n) { return (n + kFrameAlign - 1) & ~(kFrameAlign - 1); }

// ---------------------------------------------------------------- frames

/// The fixed 32-byte frame header (SPEC.md, "Frame header").
struct FrameHeader {
  FrameType type{};
  std::uint16_t flags = 0;
  std::uint16_t subject_len = 0;
  std::uint16_t reply_len = 0;
  std::uint16_t header_len =
      0;  // PUBLISH, protocol version 2: the header block at the payload's start (§3.6)
  std::uint32_t payload_len = 0;  // the header block included
  std::uint32_t arg = 0;          // sid, credits or error code, by type; a fragment's message length
  /// Offset 20 (SPEC.md §3.1): a fragment's (kFlagFragment) place in its
  /// message; a DELIVER's relay time (relay_ns()); else 0.
  std::uint32_t offset = 0;
  std::uint64_t sequence = 0;

  /// A DELIVER on a connection of protocol version 5: nanoseconds its first
  /// message spent in the broker (SPEC.md §3.4); 0: not measured or not said.
  std::uint32_t relay_ns() const { return type == FrameType::kDeliver ? offset : 0; }
  void set_relay_ns(std::uint32_t ns) { offset = ns; }  // a DELIVER's

  bool is_fragment() const { return (flags & kFlagFragment) != 0; }
  /// A whole message, or the fragment that starts one: what counts as one message.
  bool starts_message() const { return !is_fragment() || offset == 0; }
  /// A whole message, or the fragment that completes one.
  bool ends_message() const { return !is_fragment() || offset + payload_len == arg; }
  /// The header of a PUBLISH fragment (§3.7): at `offset` of a `length`-byte
  /// message of publisher `publisher` (its connection id), with `flags` too
  /// (REQUEST, on a first fragment); the lengths are encode_frame()'s to set.
  static constexpr FrameHeader fragment(std::uint32_t length, std::uint32_t offset, std::uint64_t publisher,
                                        std::uint16_t flags = 0) {
    FrameHeader h;
    h.type = FrameType::kPublish;
    h.flags = static_cast<std::uint16_t>(flags | kFlagFragment);
    h.arg = length;
    h.offset = offset;
    h.sequence = publisher;
    return h;
  }

  /// Bytes after the header, before padding.
  std::size_t body_len() const { return std::size_t{subject_len} + reply_len + payload_len; }
  /// Bytes the whole frame occupies in a buffer, padding included.
  std::size_t frame_len() const { return align_up(kHeaderSize + body_len()); }
};

inline void encode_header(std::byte* out, const FrameHeader& h) {
  store<std::uint16_t>(out + 0, kFrameMagic);
  store<std::uint8_t>(out + 2, kVersion);
  store<std::uint8_t>(out + 3, static_cast<std::uint8_t>(h.type));
  store<std::uint16_t>(out + 4, h.flags);
  store<std::uint16_t>(out + 6, h.subject_len);
  store<std::uint16_t>(out + 8, h.reply_len);
  store<std::uint16_t>(out + 10, h.header_len);
  store<std::uint32_t>(out + 12, h.payload_len);
  store<std::uint32_t>(out + 16, h.arg);
  store<std::uint32_t>(out + 20, h.offset);
  store<std::uint64_t>(out + 24, h.sequence);
}
/// The header at `p` as encode_header() wrote it, field by field and without
/// checks: for a frame that decode_frame() has already validated.
inline FrameHeader load_header(const std::byte* p) {
  FrameHeader h;
  h.type = static_cast<FrameType>(load<std::uint8_t>(p + 3));
  h.flags = load<std::uint16_t>(p + 4);
  h.subject_len = load<std::uint16_t>(p + 6);
  h.reply_len = load<std::uint16_t>(p + 8);
  h.header_len = load<std::uint16_t>(p + 10);
  h.payload_len = load<std::uint32_t>(p + 12);
  h.arg = load<std::uint32_t>(p + 16);
  h.offset = load<std::uint32_t>(p + 20);
  h.sequence = load<std::uint64_t>(p + 24);
  return h;
}

/// A decoded frame; the views point into the buffer that was decoded.
struct Frame {
  FrameHeader header;
  std::string_view subject;
  std::string_view reply;
  std::span<const std::byte> headers;  // a PUBLISH's header block (§3.6); empty: none
  std::span<const std::byte> payload;  // the payload after the header block
  /// Offset of the frame's first byte within the decoded buffer.
  std::size_t offset = 0;
};

enum class DecodeStatus {
  kOk,
  kNeedMore,  // the buffer ends inside a frame (stream transports read on)
  kBadMagic,
  kBadVersion,
  kBadType,
  kBadReserved,  // a reserved field is not zero
  kBadFlags,     // a flag the frame type does not allow (REQUEST without a reply subject)
  kBadArg,       // arg is not 0 on a type whose arg must be 0
  kBadPadding,   // the padding after the frame's body is not zero
  kBadLength,    // lengths inconsistent with the frame type
  kTooLarge,     // the frame is longer than the receiver's buffer size
  kBadSubject,   // subject (or reply subject, queue group) fails the rules of SPEC.md §3.2
  kBadHeaders,   // a PUBLISH's header block breaks SPEC.md §3.6
  kBadFragment,  // a fragment's length, offset or strings break SPEC.md §3.7
};

constexpr std::string_view to_string(DecodeStatus s) {
  switch (s) {
    case DecodeStatus::kOk:
      return "ok";
    case DecodeStatus::kNeedMore:
      return "truncated frame";
    case DecodeStatus::kBadMagic:
      return "bad frame magic";
    case DecodeStatus::kBadVersion:
      return "unsupported frame version";
    case DecodeStatus::kBadType:
      return "unknown frame type";
    case DecodeStatus::kBadReserved:
      return "reserved field not zero";
    case DecodeStatus::kBadFlags:
      return "flag not allowed for the frame type (REQUEST needs a PUBLISH with a reply subject, "
             "FRAGMENT a PUBLISH, SEQUENCED a DELIVER, ROUTE a CONNECT)";
    case DecodeStatus::kBadArg:
      return "arg not zero (PUBLISH, PING, PONG and NO_RESPONDERS carry 0)";
    case DecodeStatus::kBadPadding:
      return "padding after the frame not zero";
    case DecodeStatus::kBadLength:
      return "frame lengths invalid for its type";
    case DecodeStatus::kTooLarge:
      return "frame larger than the receive buffer size";
    case DecodeStatus::kBadSubject:
      return "invalid subject (1 to 255 bytes, SPEC.md §3.2)";
    case DecodeStatus::kBadHeaders:
      return "malformed header block (\"Name: value\\r\\n\" lines padded to 8 bytes, SPEC.md §3.6)";
    case DecodeStatus::kBadFragment:
      return "malformed fragment (payload not empty and inside the message's length; subject, reply and "
             "header block only in the first; at least two fragments; SPEC.md §3.7)";
  }
  return "unknown";
}

/// An RDV_OFFER's payload (SPEC.md §3.8): where the broker READs the
/// message (`length`, the offer's arg, bytes from `address` with `rkey`),
/// and how many of them, at its start, are the header block (§3.6).
struct RendezvousRegion {
  std::uint64_t address = 0;
  std::uint32_t rkey = 0;
  std::uint16_t header_len = 0;
};

inline std::array<std::byte, kRendezvousRegionLen> encode(const RendezvousRegion& r) {
  std::array<std::byte, kRendezvousRegionLen> b{};
  store<std::uint64_t>(b.data(), r.address);
  store<std::uint32_t>(b.data() + 8, r.rkey);
  store<std::uint16_t>(b.data() + 12, r.header_len);
  return b;
}

/// False if the reserved bytes are not zero.
inline bool decode(std::span<const std::byte> b, RendezvousRegion& out) {
  if (b.size() != kRendezvousRegionLen || load<std::uint16_t>(b.data() + 14) != 0) return false;
  out.address = load<std::uint64_t>(b.data());
  out.rkey = load<std::uint32_t>(b.data() + 8);
  out.header_len = load<std::uint16_t>(b.data() + 12);
  return true;
}

/// An RDV_READY's payload (SPEC.md §3.9): the landing area a subscriber
/// registered for the message `publisher` is sending it in fragments. The
/// broker WRITEs the message's bytes at offset o to `address` + o with
/// `rkey`; the area must hold every byte after the first fragment's.
struct LandingArea {
  std::uint64_t publisher = 0;
  std::uint64_t address = 0;
  std::uint32_t rkey = 0;
};

inline std::array<std::byte, kLandingAreaLen> encode(const LandingArea& a) {
  std::array<std::byte, kLandingAreaLen> b{};
  store<std::uint64_t>(b.data(), a.publisher);
  store<std::uint64_t>(b.data() + 8, a.address);
  store<std::uint32_t>(b.data() + 16, a.rkey);
  return b;
}

/// False if the reserved bytes are not zero.
inline bool decode(std::span<const std::byte> b, LandingArea& out) {
  if (b.size() != kLandingAreaLen || load<std::uint32_t>(b.data() + 20) != 0) return false;
  out.publisher = load<std::uint64_t>(b.data());
  out.address = load<std::uint64_t>(b.data() + 8);
  out.rkey = load<std::uint32_t>(b.data() + 16);
  return true;
}

/// Maps a decode failure to the ERROR code the peer receives.
constexpr ErrorCode error_for(DecodeStatus s) {
  switch (s) {
    case DecodeStatus::kBadVersion:
      return ErrorCode::kUnsupportedVersion;
    case DecodeStatus::kBadSubject:
      return ErrorCode::kInvalidSubject;
    case DecodeStatus::kTooLarge:
      return ErrorCode::kPayloadTooLarge;
    default:
      return ErrorCode::kMalformedFrame;
  }
}

namespace detail {
/// Checks the subject syntax of SPEC.md "Subjects"; with `patterns`, a token
/// may be exactly '*' (one token) and the last token exactly '>' (the rest).
inline bool check_subject(std::string_view s, bool patterns) {
  if (s.empty() || s.size() > kMaxSubjectLen) return false;
  std::size_t start = 0;
  while (true) {
    const std::size_t dot = s.find('.', start);
    const std::string_view tok =
        s.substr(start, dot == std::string_view::npos ? std::string_view::npos : dot - start);
    if (tok.empty()) return false;
    const bool last = dot == std::string_view::npos;
    if (patterns && (tok == "*" || (tok == ">" && last))) {
      // a wildcard token
    } else {
      for (char c : tok) {
        const auto u = static_cast<unsigned char>(c);
        if (u <= 0x20 || u >= 0x7f || c == '*' || c == '>') return false;
      }
    }
    if (last) return true;
    start = dot + 1;
  }
}
}  // namespace detail

/// A subject to publish to (SPEC.md, "Subjects"): 1..255 bytes of printable
/// ASCII without space, tokens separated by '.', none empty, no wildcards.
inline bool valid_subject(std::string_view s) { return detail::check_subject(s, false); }
/// A subject to subscribe to: as valid_subject, but a token may be '*' (any
/// one token) and the last token may be '>' (one or more tokens).
inline bool valid_pattern(std::string_view s) { return detail::check_subject(s, true); }

namespace detail {
/// The frame types whose subject field is a subject (SPEC.md §3.3): a missing
/// or over-long one is INVALID_SUBJECT there, a malformed frame elsewhere.
constexpr bool carries_subject(FrameType t) {
  return t == FrameType::kSubscribe || t == FrameType::kPublish || t == FrameType::kNoResponders ||
         t == FrameType::kRendezvousOffer;
}
/// The frame types whose arg is always 0 (SPEC.md §3.3).
constexpr bool arg_is_zero(const FrameHeader& h) {
  if (h.type == FrameType::kPublish) return !h.is_fragment();  // a fragment's arg is its message's length
  return h.type == FrameType::kPing || h.type == FrameType::kPong || h.type == FrameType::kNoResponders ||
         h.type == FrameType::kInfo;
}

/// A fragment's own rules (SPEC.md §3.7): the first (offset 0) carries the
/// subject, reply and header block and is not the whole message; the others
/// carry neither; every one carries payload inside the message's length.
inline DecodeStatus check_fragment(const FrameHeader& h) {
  const std::uint64_t end = std::uint64_t{h.offset} + h.payload_len;
  if (h.payload_len == 0 || end > h.arg) return DecodeStatus::kBadFragment;
  if (h.offset == 0) return end < h.arg ? DecodeStatus::kOk : DecodeStatus::kBadFragment;
  if (h.subject_len != 0 || h.reply_len != 0 || h.header_len != 0 || (h.flags & kFlagRequest) != 0)
    return DecodeStatus::kBadFragment;
  return DecodeStatus::kOk;
}

/// The flags a frame of `h`'s type and fields may carry (SPEC.md §3.1).
inline std::uint16_t allowed_flags(const FrameHeader& h) {
  // REQUEST belongs to PUBLISH frames with a reply subject, FRAGMENT to
  // PUBLISH, ACK to a whole PUBLISH (with an id), STREAM to a whole PUBLISH
  // without ACK, SEQUENCED to DELIVER, ROUTE to CONNECT, DUPLICATE to
  // PUB_ACK, NAK to ACK.
  const bool fragment_flag = (h.flags & kFlagFragment) != 0;
  const bool stream_flag = (h.flags & kFlagStream) != 0;
  return h.type == FrameType::kPublish
             ? static_cast<std::uint16_t>(
                   (h.reply_len != 0 ? kFlagRequest : 0) | (stream_flag ? 0 : kFlagFragment) |
                   (fragment_flag || stream_flag || h.sequence == 0 ? 0 : kFlagAck) |
                   (fragment_flag || (h.flags & kFlagAck) != 0 || h.sequence == 0 ? 0 : kFlagStream))
         : h.type == FrameType::kRendezvousOffer
             ? static_cast<std::uint16_t>(h.reply_len != 0 ? kFlagRequest : 0)
         : h.type == FrameType::kDeliver ? kFlagSequenced
         : h.type == FrameType::kConnect ? kFlagRoute
         : h.type == FrameType::kPubAck  ? static_cast<std::uint16_t>(kFlagDuplicate | kFlagRange)
         : h.type == FrameType::kAck     ? kFlagNak
                                         : 0;
}

/// PUB_ACK (SPEC.md §3.10), CONSUME, FETCH and ACK (§3.11): the lengths and the sequence.
inline DecodeStatus check_stream_parts(const FrameHeader& h) {
  const bool has_subject = h.subject_len != 0;
  switch (h.type) {
    case FrameType::kPubAck:
      if ((h.flags & kFlagRange) != 0) {
        // A run of stored messages: never a refusal or a duplicate, always a stream's name.
        if (h.arg != 0 || (h.flags & kFlagDuplicate) != 0) return DecodeStatus::kBadFlags;
        return !has_subject && h.reply_len == 0 && h.payload_len > kPubAckRangeMinLen &&
                       h.payload_len <= kPubAckRangeMinLen + kMaxStreamNameLen
                   ? DecodeStatus::kOk
                   : DecodeStatus::kBadLength;
      }
      return !has_subject && h.reply_len == 0 && h.payload_len >= kPubAckMinLen &&
                     h.payload_len <= kPubAckMinLen + kMaxStreamNameLen
                 ? DecodeStatus::kOk
                 : DecodeStatus::kBadLength;
    case FrameType::kConsume:
      // The stream's name, the durable name (optional), the settings (consumer.hpp).
      return has_subject && h.payload_len == kConsumeConfigLen ? DecodeStatus::kOk : DecodeStatus::kBadLength;
    case FrameType::kFetch:
      return !has_subject && h.reply_len == 0 && h.payload_len == kFetchLen && h.sequence != 0
                 ? DecodeStatus::kOk
                 : DecodeStatus::kBadLength;
    default:  // ACK
      return h.sequence != 0 && h.body_len() == 0 ? DecodeStatus::kOk : DecodeStatus::kBadLength;
  }
}

/// Which parts each frame type carries (SPEC.md, "Frame types"); the header's
/// lengths against them.
inline DecodeStatus check_parts(const FrameHeader& h) {
  const bool has_subject = h.subject_len != 0;
  switch (h.type) {
    case FrameType::kSubscribe:
      if (!has_subject) return DecodeStatus::kBadSubject;
      if (h.payload_len != 0) return DecodeStatus::kBadLength;
      break;
    case FrameType::kPublish:
      if (!has_subject && h.starts_message()) return DecodeStatus::kBadSubject;
      if (h.is_fragment()) return check_fragment(h);
      break;
    case FrameType::kDeliver:
      // A run of whole PUBLISH frames for one subscription (SPEC.md, DELIVER).
      if (has_subject || h.reply_len != 0 || h.payload_len < kHeaderSize ||
          h.payload_len % kFrameAlign != 0) {
        return DecodeStatus::kBadLength;
      }
      break;
    case FrameType::kError:
    case FrameType::kClose:
    case FrameType::kInfo:
      if (has_subject || h.reply_len != 0) return DecodeStatus::kBadLength;
      break;
    case FrameType::kNoResponders:
      // The subject is the request's reply subject.
      if (!has_subject) return DecodeStatus::kBadSubject;
      if (h.reply_len != 0 || h.payload_len != 0) return DecodeStatus::kBadLength;
      break;
    case FrameType::kConnect:
      // Payload: the user name (arg bytes) then the password; arg 0: a token
      // or, with an empty payload, no credentials (anonymous). A route's
      // (kFlagRoute) also names its cluster (subject) and its broker (second string).
      if (((h.flags & kFlagRoute) != 0) != (has_subject && h.reply_len != 0) ||
          ((h.flags & kFlagRoute) == 0 && (has_subject || h.reply_len != 0)) ||
          h.payload_len > kMaxCredentialsLen || h.arg > h.payload_len) {
        return DecodeStatus::kBadLength;
      }
      break;
    case FrameType::kMcastJoin:
      if (has_subject || h.reply_len != 0 || h.payload_len != kMcastJoinLen) return DecodeStatus::kBadLength;
      break;
    case FrameType::kMcastJoined:
      if (has_subject || h.reply_len != 0 || h.payload_len > kMaxMcastReasonLen)
        return DecodeStatus::kBadLength;
      break;
    case FrameType::kMcastRepair:
    case FrameType::kMcastLoss:
      if (has_subject || h.reply_len != 0 || h.payload_len != kMcastCountLen) return DecodeStatus::kBadLength;
      break;
    case FrameType::kRendezvousOffer:
      if (!has_subject) return DecodeStatus::kBadSubject;
      if (h.payload_len != kRendezvousRegionLen || h.arg == 0) return DecodeStatus::kBadLength;
      break;
    case FrameType::kRendezvousReady:
      if (has_subject || h.reply_len != 0 || h.payload_len != kLandingAreaLen)
        return DecodeStatus::kBadLength;
      break;
    case FrameType::kPubAck:
    case FrameType::kConsume:
    case FrameType::kFetch:
    case FrameType::kAck:
      return check_stream_parts(h);
    case FrameType::kConsumerReady:
    case FrameType::kFetchDone:
    case FrameType::kRendezvousRelease:
    case FrameType::kMcastLeave:
    case FrameType::kAbort:
    case FrameType::kUnsubscribe:
    case FrameType::kCredit:
    case FrameType::kPing:
    case FrameType::kPong:
      if (h.body_len() != 0) return DecodeStatus::kBadLength;
      break;
  }
  return DecodeStatus::kOk;
}
}  // namespace detail

/// Decodes the frame at the start of `buf`. `max_frame` bounds a frame's total
/// length (the receiver's buffer size); a frame announcing more is kBadLength.
inline DecodeStatus decode_frame(std::span<const std::byte> buf, std::size_t max_frame, Frame& out) {
  if (buf.size() < kHeaderSize) return DecodeStatus::kNeedMore;
  const std::byte* p = buf.data();
  if (load<std::uint16_t>(p) != kFrameMagic) return DecodeStatus::kBadMagic;
  if (load<std::uint8_t>(p + 2) != kVersion) return DecodeStatus::kBadVersion;
  auto type = load<std::uint8_t>(p + 3);
  if (type < 1 || type > kMaxFrameType) return DecodeStatus::kBadType;
  FrameHeader& h = out.header;
  h.type = static_cast<FrameType>(type);
  h.header_len = load<std::uint16_t>(p + 10);
  h.flags = load<std::uint16_t>(p + 4);
  // Offset 10 is a PUBLISH's header_len; offset 20 a fragment's offset or a
  // DELIVER's relay time (a client that negotiated less than version 5 is
  // sent 0 there and may ignore it); both reserved elsewhere.
  // A consumer's inner PUBLISH (STREAM) carries its delivery count there.
  const bool fragment = h.type == FrameType::kPublish && h.is_fragment();
  const bool deliver = h.type == FrameType::kDeliver;
  const bool stored = h.type == FrameType::kPublish && (h.flags & kFlagStream) != 0 && !fragment;
  h.offset = fragment || deliver || stored ? load<std::uint32_t>(p + 20) : 0;
  if ((h.header_len != 0 && h.type != FrameType::kPublish) ||
      (!fragment && !deliver && !stored && load<std::uint32_t>(p + 20) != 0))
    return DecodeStatus::kBadReserved;
  h.subject_len = load<std::uint16_t>(p + 6);
  h.reply_len = load<std::uint16_t>(p + 8);
  h.payload_len = load<std::uint32_t>(p + 12);
  h.arg = load<std::uint32_t>(p + 16);
  h.sequence = load<std::uint64_t>(p + 24);
  const std::uint16_t allowed_flags = detail::allowed_flags(h);
  if ((h.flags & ~allowed_flags) != 0)
    return h.flags & ~(kFlagRequest | kFlagSequenced | kFlagFragment | kFlagRoute | kFlagAck |
                       kFlagDuplicate | kFlagStream | kFlagNak | kFlagRange)
               ? DecodeStatus::kBadReserved
               : DecodeStatus::kBadFlags;
  if (detail::arg_is_zero(h) && h.arg != 0) return DecodeStatus::kBadArg;
  if (h.subject_len > kMaxSubjectLen || h.reply_len > kMaxSubjectLen) {
    return detail::carries_subject(h.type) ? DecodeStatus::kBadSubject : DecodeStatus::kBadLength;
  }
  // 64-bit arithmetic: payload_len is attacker-controlled and may be near 2^32.
  const std::uint64_t total =
      align_up(std::uint64_t{kHeaderSize} + h.subject_len + h.reply_len + h.payload_len);
  if (total > max_frame) return DecodeStatus::kTooLarge;

  if (auto st = detail::check_parts(h); st != DecodeStatus::kOk) return st;
  if (h.header_len % kFrameAlign != 0 || h.header_len > h.payload_len) return DecodeStatus::kBadHeaders;
  if (buf.size() < total) return DecodeStatus::kNeedMore;

  for (std::size_t i = kHeaderSize + h.body_len(); i < total; ++i) {
    if (p[i] != std::byte{0}) return DecodeStatus::kBadPadding;
  }
  const char* body = reinterpret_cast<const char*>(p + kHeaderSize);
  out.subject = std::string_view(body, h.subject_len);
  out.reply = std::string_view(body + h.subject_len, h.reply_len);
  const std::size_t payload_at = kHeaderSize + h.subject_len + h.reply_len;
  out.headers = buf.subspan(payload_at, h.header_len);
  out.payload = buf.subspan(payload_at + h.header_len, h.payload_len - h.header_len);
  // A CONSUME's two strings are a stream's and a consumer's names, checked
  // by the broker (CONSUMER_INVALID, the connection stays: SPEC.md §3.11).
  const bool names = h.type == FrameType::kConsume;
  if (h.subject_len != 0 && !names &&
      !(h.type == FrameType::kSubscribe ? valid_pattern(out.subject) : valid_subject(out.subject))) {
    return DecodeStatus::kBadSubject;
  }
  // A SUBSCRIBE's "reply" field is its queue group name (SPEC.md); both follow the subject rules.
  if (h.reply_len != 0 && !names && !valid_subject(out.reply)) return DecodeStatus::kBadSubject;
  if (h.header_len != 0 && !valid_header_block(out.headers)) return DecodeStatus::kBadHeaders;
  if (h.type == FrameType::kPubAck && (h.flags & kFlagRange) != 0) {
    if (load<std::uint32_t>(out.payload.data() + 12) != 0) return DecodeStatus::kBadReserved;
    if (load<std::uint32_t>(out.payload.data() + 8) < 2) return DecodeStatus::kBadLength;
  }
  return DecodeStatus::kOk;
}

/// For a byte stream (TCP): how many leading bytes of `buf` are whole frames,
/// ready for a decoder that expects whole frames. An incomplete last frame is
/// left for more bytes; a frame that can never be valid (bad header, too long
/// for `max_frame`) is included with everything after it, so the decoder
/// reports it instead of the stream waiting forever.
inline std::size_t whole_frames(std::span<const std::byte> buf, std::size_t max_frame) {
  std::size_t whole = 0;
  while (whole < buf.size()) {
    Frame f;
    const auto st = decode_frame(buf.subspan(whole), max_frame, f);
    if (st == DecodeStatus::kNeedMore) break;
    if (st != DecodeStatus::kOk) return buf.size();
    whole += f.header.frame_len();
  }
  return whole;
}

/// Writes a whole frame (header, subject, reply, header block, payload, zero
/// padding) into `out`. Returns the bytes written, or 0 if it does not fit.
/// `headers` (valid names and values, a block of at most kMaxHeaderBlock
/// bytes) only on a PUBLISH to a peer of protocol version 2.
inline std::size_t encode_frame(std::span<std::byte> out, FrameHeader h, std::string_view subject,
                                std::string_view reply, std::span<const std::byte> payload,
                                std::span<const HeaderField> headers = {}) {
  h.subject_len = static_cast<std::uint16_t>(subject.size());
  h.reply_len = static_cast<std::uint16_t>(reply.size());
  h.header_len = static_cast<std::uint16_t>(header_block_len(headers));
  h.payload_len = static_cast<std::uint32_t>(h.header_len + payload.size());
  const std::size_t len = h.frame_len();
  if (len > out.size()) return 0;
  std::byte* p = out.data();
  encode_header(p, h);
  std::size_t off = kHeaderSize;
  if (!subject.empty()) std::memcpy(p + off, subject.data(), subject.size());
  off += subject.size();
  if (!reply.empty()) std::memcpy(p + off, reply.data(), reply.size());
  off += reply.size();
  if (!headers.empty()) off += encode_header_block(p + off, headers);
  if (!payload.empty()) std::memcpy(p + off, payload.data(), payload.size());
  off += payload.size();
  std::memset(p + off, 0, len - off);
  return len;
}

/// The longest PUBLISH frame a broker whose receive buffers are `max_send`
/// bytes accepts: it must still fit a subscriber's buffer once wrapped in a
/// DELIVER header.
constexpr std::size_t max_publish_frame(std::size_t max_send) {
  return max_send > kHeaderSize ? max_send - kHeaderSize : 0;
}

/// The largest payload (header block included) a frame with this subject can
/// carry within `max_frame`.
constexpr std::size_t max_payload(std::size_t max_frame, std::size_t subject_len, std::size_t reply_len = 0) {
  const std::size_t fixed = kHeaderSize + subject_len + reply_len;
  if (max_frame < fixed + kFrameAlign) return 0;
  // The padded frame must fit: round the limit down to the alignment.
  return (max_frame & ~(kFrameAlign - 1)) - fixed;
}

/// Calls `fn(const Frame&)` for each PUBLISH frame inside a DELIVER's payload.
/// Returns kOk, or the first decode failure (a broker bug or corruption).
template <typename Fn>
DecodeStatus for_each_delivered(const Frame& deliver, Fn&& fn) {
  std::size_t off = 0;
  while (off < deliver.payload.size()) {
    Frame inner;
    const auto st = decode_frame(deliver.payload.subspan(off), deliver.payload.size(), inner);
    if (st != DecodeStatus::kOk) return st;
    if (inner.header.type != FrameType::kPublish) return DecodeStatus::kBadType;
    inner.offset = off;
    fn(inner);
    off += inner.header.frame_len();
  }
  return DecodeStatus::kOk;
}

}  // namespace rdmabroker::proto
