// SPDX-License-Identifier: Apache-2.0
// The wire codec: round trips for every frame type and one case per class of
// malformed input (proto/SPEC.md, "Validation").
#include <gtest/gtest.h>
#include <array>

#include <string>
#include <vector>

#include "rdmabroker/proto/multicast.hpp"
#include "rdmabroker/proto/handshake.hpp"
#include "rdmabroker/proto/info.hpp"

namespace rdmabroker::proto {
namespace {

std::span<const std::byte> bytes(std::string_view s) {
  return std::as_bytes(std::span<const char>(s.data(), s.size()));
}

std::vector<std::byte> encode(FrameType type, std::uint32_t arg, std::string_view subject,
                              std::string_view payload, std::string_view reply = {},
                              std::uint16_t flags = 0) {
  std::vector<std::byte> buf(4096);
  FrameHeader h;
  h.type = type;
  h.arg = arg;
  h.flags = flags;
  h.sequence = 42;
  const std::size_t n = encode_frame(buf, h, subject, reply, bytes(payload));
  buf.resize(n);
  return buf;
}

DecodeStatus decode(const std::vector<std::byte>& buf, Frame& f, std::size_t max_frame = 4096) {
  return decode_frame(buf, max_frame, f);
}

TEST(Wire, PublishRoundTrip) {
  auto buf = encode(FrameType::kPublish, 0, "orders.eu", "hello");
  EXPECT_EQ(buf.size(), align_up(kHeaderSize + 9 + 5));
  EXPECT_EQ(buf.size() % kFrameAlign, 0u);
  Frame f;
  ASSERT_EQ(decode(buf, f), DecodeStatus::kOk);
  EXPECT_EQ(f.header.type, FrameType::kPublish);
  EXPECT_EQ(f.subject, "orders.eu");
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(f.payload.data()), f.payload.size()), "hello");
  EXPECT_EQ(f.header.sequence, 42u);
  EXPECT_EQ(f.header.frame_len(), buf.size());
}

TEST(Wire, EveryTypeRoundTrips) {
  struct Case {
    FrameType type;
    std::string subject, payload;
    std::uint32_t arg;
  };
  const std::vector<Case> cases = {
      {FrameType::kSubscribe, "a.b", "", 7},   {FrameType::kUnsubscribe, "", "", 7},
      {FrameType::kPublish, "a", "", 0},       {FrameType::kCredit, "", "", 12},
      {FrameType::kPing, "", "", 0},           {FrameType::kPong, "", "", 0},
      {FrameType::kError, "", "bad thing", 4}, {FrameType::kClose, "", "", 10},
  };
  for (const auto& c : cases) {
    auto buf = encode(c.type, c.arg, c.subject, c.payload);
    Frame f;
    ASSERT_EQ(decode(buf, f), DecodeStatus::kOk) << to_string(c.type);
    EXPECT_EQ(f.header.type, c.type);
    EXPECT_EQ(f.header.arg, c.arg);
    EXPECT_EQ(f.subject, c.subject);
    EXPECT_EQ(f.payload.size(), c.payload.size());
  }
}

TEST(Wire, DeliverCarriesWholePublishFrames) {
  auto a = encode(FrameType::kPublish, 0, "x", "1");
  auto b = encode(FrameType::kPublish, 0, "y.z", "22");
  std::string inner(reinterpret_cast<const char*>(a.data()), a.size());
  inner.append(reinterpret_cast<const char*>(b.data()), b.size());
  auto d = encode(FrameType::kDeliver, 9, "", inner);
  Frame f;
  ASSERT_EQ(decode(d, f), DecodeStatus::kOk);
  EXPECT_EQ(f.header.arg, 9u);
  std::vector<std::string> subjects;
  EXPECT_EQ(for_each_delivered(f, [&](const Frame& m) { subjects.emplace_back(m.subject); }),
            DecodeStatus::kOk);
  EXPECT_EQ(subjects, (std::vector<std::string>{"x", "y.z"}));
  // A DELIVER with a subject, an empty or unaligned body is malformed.
  EXPECT_EQ(decode(encode(FrameType::kDeliver, 9, "a", inner), f), DecodeStatus::kBadLength);
  EXPECT_EQ(decode(encode(FrameType::kDeliver, 9, "", ""), f), DecodeStatus::kBadLength);
  EXPECT_EQ(decode(encode(FrameType::kDeliver, 9, "", inner.substr(0, 33)), f), DecodeStatus::kBadLength);
  // Inside, only PUBLISH frames.
  auto ping = encode(FrameType::kPing, 0, "", "");
  auto bad = encode(FrameType::kDeliver, 9, "",
                    std::string(reinterpret_cast<const char*>(ping.data()), ping.size()));
  ASSERT_EQ(decode(bad, f), DecodeStatus::kOk);
  EXPECT_EQ(for_each_delivered(f, [](const Frame&) {}), DecodeStatus::kBadType);
}

TEST(Wire, DeliverCarriesItsRelayTimeInWord20) {
  // Version 5 (SPEC.md §3.4): a DELIVER's offset 20 is the relay time, which
  // no other type has; a fragment keeps its offset there.
  auto publish = encode(FrameType::kPublish, 0, "x", "1");
  auto d = encode(FrameType::kDeliver, 9, "",
                  std::string(reinterpret_cast<const char*>(publish.data()), publish.size()));
  FrameHeader h = load_header(d.data());
  h.set_relay_ns(123456789);
  encode_header(d.data(), h);
  EXPECT_EQ(load<std::uint32_t>(d.data() + 20), 123456789u);
  Frame f;
  ASSERT_EQ(decode(d, f), DecodeStatus::kOk);
  EXPECT_EQ(f.header.relay_ns(), 123456789u);
  EXPECT_EQ(load_header(d.data()).relay_ns(), 123456789u);
  const FrameHeader piece = FrameHeader::fragment(100, 48, 7);
  std::array<std::byte, kHeaderSize> raw{};
  encode_header(raw.data(), piece);
  EXPECT_EQ(load<std::uint32_t>(raw.data() + 20), 48u) << "a PUBLISH fragment's offset, not a relay time";
  EXPECT_EQ(load_header(raw.data()).relay_ns(), 0u);
  // Any other type still has the word reserved.
  auto pong = encode(FrameType::kPong, 0, "", "");
  store<std::uint32_t>(pong.data() + 20, 5);
  EXPECT_EQ(decode(pong, f), DecodeStatus::kBadReserved);
}

TEST(Wire, SeveralFramesInOneBuffer) {
  auto a = encode(FrameType::kPublish, 0, "x", "1");
  auto b = encode(FrameType::kPublish, 0, "y", "22");
  std::vector<std::byte> both = a;
  both.insert(both.end(), b.begin(), b.end());
  Frame f;
  ASSERT_EQ(decode_frame(both, 4096, f), DecodeStatus::kOk);
  EXPECT_EQ(f.subject, "x");
  ASSERT_EQ(decode_frame(std::span(both).subspan(f.header.frame_len()), 4096, f), DecodeStatus::kOk);
  EXPECT_EQ(f.subject, "y");
}

TEST(Wire, TruncatedHeaderAndBody) {
  auto buf = encode(FrameType::kPublish, 0, "subject", "payload");
  Frame f;
  for (std::size_t n = 0; n < buf.size(); ++n) {
    std::vector<std::byte> cut(buf.begin(), buf.begin() + static_cast<long>(n));
    EXPECT_EQ(decode(cut, f), DecodeStatus::kNeedMore) << n;
  }
}

TEST(Wire, BadMagicVersionType) {
  Frame f;
  auto buf = encode(FrameType::kPing, 0, "", "");
  auto m = buf;
  m[0] = std::byte{0};
  EXPECT_EQ(decode(m, f), DecodeStatus::kBadMagic);
  auto v = buf;
  v[2] = std::byte{2};
  EXPECT_EQ(decode(v, f), DecodeStatus::kBadVersion);
  EXPECT_EQ(error_for(DecodeStatus::kBadVersion), ErrorCode::kUnsupportedVersion);
  for (std::uint8_t t : {0, 28, 255}) {
    auto tt = buf;
    tt[3] = std::byte{t};
    EXPECT_EQ(decode(tt, f), DecodeStatus::kBadType) << int(t);
  }
}

TEST(Wire, ReservedFieldsAndFlagsMustBeZero) {
  Frame f;
  auto buf = encode(FrameType::kPing, 0, "", "");
  for (std::size_t off : {10u, 20u}) {
    auto r = buf;
    r[off] = std::byte{1};
    EXPECT_EQ(decode(r, f), DecodeStatus::kBadReserved) << off;
  }
  // A flag bit the protocol does not define is a reserved bit...
  auto undefined = buf;
  undefined[5] = std::byte{2};  // bit 9
  EXPECT_EQ(decode(undefined, f), DecodeStatus::kBadReserved);
  // ...a defined one on the wrong type says which rule it broke.
  auto misplaced = buf;
  misplaced[4] = std::byte{1};
  EXPECT_EQ(decode(misplaced, f), DecodeStatus::kBadFlags);
  misplaced[4] = std::byte{4};  // FRAGMENT belongs to PUBLISH
  EXPECT_EQ(decode(misplaced, f), DecodeStatus::kBadFlags);
  misplaced[4] = std::byte{8};  // ROUTE belongs to CONNECT
  EXPECT_EQ(decode(misplaced, f), DecodeStatus::kBadFlags);
  EXPECT_EQ(error_for(DecodeStatus::kBadFlags), ErrorCode::kMalformedFrame);
}

TEST(Wire, ARouteConnectNamesItsClusterAndBrokerAndNothingElseDoes) {
  // SPEC.md §8: CONNECT with ROUTE carries the cluster's name (subject) and
  // the dialing broker's id (second string); a client's CONNECT carries neither.
  Frame f;
  auto route = encode(FrameType::kConnect, 0, "prod", "", "0123456789abcdef");
  route[4] = std::byte{8};
  ASSERT_EQ(decode(route, f), DecodeStatus::kOk);
  EXPECT_EQ(f.subject, "prod");
  EXPECT_EQ(f.reply, "0123456789abcdef");
  auto unnamed = encode(FrameType::kConnect, 0, "", "");
  unnamed[4] = std::byte{8};
  EXPECT_EQ(decode(unnamed, f), DecodeStatus::kBadLength) << "a route names its cluster and broker";
  auto no_server = encode(FrameType::kConnect, 0, "prod", "");
  no_server[4] = std::byte{8};
  EXPECT_EQ(decode(no_server, f), DecodeStatus::kBadLength);
  EXPECT_EQ(decode(encode(FrameType::kConnect, 0, "prod", "", "0123456789abcdef"), f),
            DecodeStatus::kBadLength)
      << "without ROUTE a CONNECT has no strings";
}

TEST(Wire, ArgIsZeroWhereTheSpecSaysSo) {
  Frame f;
  for (FrameType t : {FrameType::kPublish, FrameType::kPing, FrameType::kPong, FrameType::kNoResponders}) {
    const bool subject = t == FrameType::kPublish || t == FrameType::kNoResponders;
    ASSERT_EQ(decode(encode(t, 0, subject ? "a.b" : "", ""), f), DecodeStatus::kOk) << to_string(t);
    EXPECT_EQ(decode(encode(t, 1, subject ? "a.b" : "", ""), f), DecodeStatus::kBadArg) << to_string(t);
  }
  EXPECT_EQ(error_for(DecodeStatus::kBadArg), ErrorCode::kMalformedFrame);
  // Where arg means something, any value decodes.
  EXPECT_EQ(decode(encode(FrameType::kSubscribe, 0xffffffff, "a.b", ""), f), DecodeStatus::kOk);
  EXPECT_EQ(decode(encode(FrameType::kCredit, 3, "", ""), f), DecodeStatus::kOk);
}

TEST(Wire, PaddingIsZero) {
  Frame f;
  auto padded = encode(FrameType::kPublish, 0, "a.b", "hi");  // 37: three bytes of padding
  ASSERT_EQ(padded.size(), 40u);
  ASSERT_EQ(decode(padded, f), DecodeStatus::kOk);
  for (std::size_t off = 37; off < 40; ++off) {
    auto bad = padded;
    bad[off] = std::byte{0x20};
    EXPECT_EQ(decode(bad, f), DecodeStatus::kBadPadding) << off;
  }
  EXPECT_EQ(error_for(DecodeStatus::kBadPadding), ErrorCode::kMalformedFrame);
}

TEST(Wire, AnEmptyOrOverlongSubjectIsAnInvalidSubject) {
  Frame f;
  for (FrameType t : {FrameType::kPublish, FrameType::kSubscribe, FrameType::kNoResponders}) {
    EXPECT_EQ(decode(encode(t, 0, "", ""), f), DecodeStatus::kBadSubject) << to_string(t);
    // 256 bytes: one more than a subject may have (written by hand: the
    // encoder takes the length from the string).
    std::vector<std::byte> buf(4096);
    FrameHeader h;
    h.type = t;
    auto n = encode_frame(buf, h, std::string(255, 'x'), "", {});
    store<std::uint16_t>(buf.data() + 6, 256);
    buf.resize(align_up(n + 1));
    EXPECT_EQ(decode(buf, f), DecodeStatus::kBadSubject) << to_string(t);
  }
  // A 256-byte reply subject (or queue group) too.
  std::vector<std::byte> buf(4096);
  FrameHeader h;
  h.type = FrameType::kPublish;
  auto n = encode_frame(buf, h, "a", std::string(255, 'r'), {});
  store<std::uint16_t>(buf.data() + 8, 256);
  buf.resize(align_up(n + 1));
  EXPECT_EQ(decode(buf, f), DecodeStatus::kBadSubject);
  EXPECT_EQ(error_for(DecodeStatus::kBadSubject), ErrorCode::kInvalidSubject);
  // On a type without a subject, any subject bytes are a malformed frame.
  EXPECT_EQ(decode(encode(FrameType::kPing, 0, "a", ""), f), DecodeStatus::kBadLength);
}

TEST(Wire, RequestFlagOnlyOnPublishWithAReply) {
  Frame f;
  std::vector<std::byte> buf(128);
  FrameHeader h;
  h.type = FrameType::kPublish;
  h.flags = kFlagRequest;
  const auto payload = std::as_bytes(std::span<const char>("hi", 2));
  auto n = encode_frame(buf, h, "svc.time", "_INBOX.abc.1", payload);
  ASSERT_EQ(decode_frame(std::span<const std::byte>(buf.data(), n), 4096, f), DecodeStatus::kOk);
  EXPECT_EQ(f.header.flags, kFlagRequest);
  EXPECT_EQ(f.reply, "_INBOX.abc.1");
  // Without a reply subject there is nothing to answer: the flag is illegal.
  n = encode_frame(buf, h, "svc.time", "", payload);
  EXPECT_EQ(decode_frame(std::span<const std::byte>(buf.data(), n), 4096, f), DecodeStatus::kBadFlags);
  // On any other type too; and a reply subject follows the subject rules.
  h.type = FrameType::kSubscribe;
  n = encode_frame(buf, h, "svc.time", "q", {});
  EXPECT_EQ(decode_frame(std::span<const std::byte>(buf.data(), n), 4096, f), DecodeStatus::kBadFlags);
  h.type = FrameType::kPublish;
  n = encode_frame(buf, h, "svc.time", "_INBOX.*", payload);
  EXPECT_EQ(decode_frame(std::span<const std::byte>(buf.data(), n), 4096, f), DecodeStatus::kBadSubject);
}

TEST(Wire, NoRespondersCarriesTheReplySubjectOnly) {
  Frame f;
  std::vector<std::byte> buf(128);
  FrameHeader h;
  h.type = FrameType::kNoResponders;
  auto n = encode_frame(buf, h, "_INBOX.abc.7", "", {});
  ASSERT_EQ(decode_frame(std::span<const std::byte>(buf.data(), n), 4096, f), DecodeStatus::kOk);
  EXPECT_EQ(f.subject, "_INBOX.abc.7");
  n = encode_frame(buf, h, "", "", {});
  EXPECT_EQ(decode_frame(std::span<const std::byte>(buf.data(), n), 4096, f), DecodeStatus::kBadSubject);
  n = encode_frame(buf, h, "_INBOX.abc.7", "", std::as_bytes(std::span<const char>("x", 1)));
  EXPECT_EQ(decode_frame(std::span<const std::byte>(buf.data(), n), 4096, f), DecodeStatus::kBadLength);
}

TEST(Wire, WholeFramesOfAStream) {
  auto a = encode(FrameType::kPublish, 0, "a.b", "hello");
  auto b = encode(FrameType::kPing, 0, "", "");
  auto c = encode(FrameType::kPublish, 0, "c", std::string(100, 'x'));
  std::vector<std::byte> stream = a;
  stream.insert(stream.end(), b.begin(), b.end());
  stream.insert(stream.end(), c.begin(), c.begin() + 40);  // the third is incomplete
  EXPECT_EQ(whole_frames(stream, 4096), a.size() + b.size());
  EXPECT_EQ(whole_frames(std::span(stream).first(10), 4096), 0u);  // not even a header
  stream.insert(stream.end(), c.begin() + 40, c.end());
  EXPECT_EQ(whole_frames(stream, 4096), stream.size());
  // A frame that can never be valid is handed over with everything after it.
  auto bad = a;
  bad[0] = std::byte{0};
  bad.insert(bad.end(), c.begin(), c.begin() + 40);
  EXPECT_EQ(whole_frames(bad, 4096), bad.size());
  // So is a header announcing more than the limit, before its body arrives.
  EXPECT_EQ(whole_frames(std::span(c).first(32), 64), 32u);
}

TEST(Wire, LengthsMustMatchTheType) {
  Frame f;
  // SUBSCRIBE or PUBLISH without a subject: an invalid (empty) subject.
  EXPECT_EQ(decode(encode(FrameType::kSubscribe, 1, "", ""), f), DecodeStatus::kBadSubject);
  EXPECT_EQ(decode(encode(FrameType::kPublish, 0, "", "x"), f), DecodeStatus::kBadSubject);
  // SUBSCRIBE with a payload.
  EXPECT_EQ(decode(encode(FrameType::kSubscribe, 1, "a", "x"), f), DecodeStatus::kBadLength);
  // Frames that carry nothing, carrying something.
  EXPECT_EQ(decode(encode(FrameType::kUnsubscribe, 1, "a", ""), f), DecodeStatus::kBadLength);
  EXPECT_EQ(decode(encode(FrameType::kPing, 0, "", "x"), f), DecodeStatus::kBadLength);
  EXPECT_EQ(decode(encode(FrameType::kCredit, 5, "a", ""), f), DecodeStatus::kBadLength);
  // ERROR with a subject.
  EXPECT_EQ(decode(encode(FrameType::kError, 1, "a", "x"), f), DecodeStatus::kBadLength);
}

TEST(Wire, OversizedFramesAreTooLargeNotOverflow) {
  Frame f;
  auto buf = encode(FrameType::kPublish, 0, "a", std::string(100, 'x'));
  EXPECT_EQ(decode(buf, f, 64), DecodeStatus::kTooLarge);
  EXPECT_EQ(error_for(DecodeStatus::kTooLarge), ErrorCode::kPayloadTooLarge);
  // A payload length near 2^32 must not wrap around into a small frame.
  auto huge = buf;
  store<std::uint32_t>(huge.data() + 12, 0xfffffff8u);
  EXPECT_EQ(decode(huge, f, 1u << 20), DecodeStatus::kTooLarge);
  // Subject length over the limit.
  auto longsub = buf;
  store<std::uint16_t>(longsub.data() + 6, 300);
  EXPECT_EQ(decode(longsub, f), DecodeStatus::kBadSubject);
}

TEST(Wire, SubjectSyntax) {
  for (std::string_view ok : {"a", "a.b", "orders.eu-west.1", "A_B.c$d"})
    EXPECT_TRUE(valid_subject(ok)) << ok;
  for (std::string_view bad : {"", ".a", "a.", "a..b", "a b", "a\tb", "a.*", "a.>", "caf\xc3\xa9"}) {
    EXPECT_FALSE(valid_subject(bad)) << bad;
  }
  EXPECT_FALSE(valid_subject(std::string(256, 'a')));
  EXPECT_TRUE(valid_subject(std::string(255, 'a')));
  Frame f;
  EXPECT_EQ(decode(encode(FrameType::kPublish, 0, "a..b", "x"), f), DecodeStatus::kBadSubject);
  EXPECT_EQ(error_for(DecodeStatus::kBadSubject), ErrorCode::kInvalidSubject);
}

TEST(Wire, WildcardsOnlyAsWholeTokensAndOnlyInSubscriptions) {
  for (std::string_view ok : {"a.*", "*", ">", "a.>", "*.b.>", "a.*.c"}) {
    EXPECT_TRUE(valid_pattern(ok)) << ok;
    EXPECT_FALSE(valid_subject(ok)) << ok;
  }
  for (std::string_view bad : {"a.>.b", "a*", "*a.b", "a.b>", ">.a", "a..*", ""})
    EXPECT_FALSE(valid_pattern(bad)) << bad;
  Frame f;
  EXPECT_EQ(decode(encode(FrameType::kSubscribe, 1, "orders.*.>", ""), f), DecodeStatus::kOk);
  EXPECT_EQ(decode(encode(FrameType::kPublish, 0, "orders.*", "x"), f), DecodeStatus::kBadSubject);
  EXPECT_EQ(decode(encode(FrameType::kSubscribe, 1, "orders.>.x", ""), f), DecodeStatus::kBadSubject);
}

/// A PUBLISH fragment (SPEC.md §3.7) of a `length`-byte message.
std::vector<std::byte> fragment(std::uint32_t offset, std::uint32_t length, std::string_view subject,
                                std::string_view payload, std::string_view reply = {},
                                std::uint16_t flags = 0) {
  std::vector<std::byte> buf(4096);
  buf.resize(
      encode_frame(buf, FrameHeader::fragment(length, offset, 7, flags), subject, reply, bytes(payload)));
  return buf;
}

TEST(Wire, FragmentsCarryTheirOffsetAndTheMessagesLength) {
  Frame f;
  const auto first = fragment(0, 10, "a.b", "hello", "r", kFlagRequest);  // f's views point into it
  ASSERT_EQ(decode(first, f), DecodeStatus::kOk);
  EXPECT_TRUE(f.header.is_fragment());
  EXPECT_EQ(f.header.arg, 10u);
  EXPECT_EQ(f.header.offset, 0u);
  EXPECT_TRUE(f.header.starts_message());
  EXPECT_FALSE(f.header.ends_message());
  EXPECT_EQ(f.subject, "a.b");
  ASSERT_EQ(decode(fragment(5, 10, "", "world"), f), DecodeStatus::kOk);
  EXPECT_EQ(f.header.offset, 5u);
  EXPECT_FALSE(f.header.starts_message());
  EXPECT_TRUE(f.header.ends_message());
  EXPECT_EQ(f.header.sequence, 7u);
  // Every broken rule of §3.7 is a malformed frame.
  EXPECT_EQ(decode(fragment(0, 5, "a.b", "hello"), f), DecodeStatus::kBadFragment) << "one fragment, whole";
  EXPECT_EQ(decode(fragment(0, 4, "a.b", "hello"), f), DecodeStatus::kBadFragment) << "past the length";
  EXPECT_EQ(decode(fragment(8, 10, "", "world"), f), DecodeStatus::kBadFragment) << "past the length";
  EXPECT_EQ(decode(fragment(5, 10, "a.b", "world"), f), DecodeStatus::kBadFragment)
      << "a later one's subject";
  EXPECT_EQ(decode(fragment(5, 10, "", ""), f), DecodeStatus::kBadFragment) << "empty";
  EXPECT_EQ(decode(fragment(0, 10, "", "hello"), f), DecodeStatus::kBadSubject) << "a first one needs one";
  EXPECT_EQ(error_for(DecodeStatus::kBadFragment), ErrorCode::kMalformedFrame);
  // Offset 20 stays reserved in a frame that is not a fragment.
  auto whole = encode(FrameType::kPublish, 0, "a.b", "x");
  whole[20] = std::byte{1};
  EXPECT_EQ(decode(whole, f), DecodeStatus::kBadReserved);
  // ABORT has no body.
  ASSERT_EQ(decode(encode(FrameType::kAbort, 3, "", ""), f), DecodeStatus::kOk);
  EXPECT_EQ(decode(encode(FrameType::kAbort, 3, "", "x"), f), DecodeStatus::kBadLength);
}

TEST(Wire, InfoIsTextWithoutStringsAndArgZero) {
  Frame f;
  ASSERT_EQ(decode(encode(FrameType::kInfo, 0, "", "id 0123456789abcdef\n"), f), DecodeStatus::kOk);
  EXPECT_EQ(to_string(FrameType::kInfo), "INFO");
  EXPECT_EQ(decode(encode(FrameType::kInfo, 1, "", "id x\n"), f), DecodeStatus::kBadArg) << "arg 0";
  EXPECT_EQ(decode(encode(FrameType::kInfo, 0, "a.b", "id x\n"), f), DecodeStatus::kBadLength) << "a subject";
  EXPECT_EQ(decode(encode(FrameType::kInfo, 0, "", "id x\n", "r"), f), DecodeStatus::kBadLength) << "a reply";
}

TEST(Wire, RendezvousOfferCarriesItsRegionAndReleaseNothing) {
  Frame f;
  const RendezvousRegion region{0x7f0012345678, 0xabcd, 16};
  const auto body = encode(region);
  const std::string payload(reinterpret_cast<const char*>(body.data()), body.size());
  auto offer = encode(FrameType::kRendezvousOffer, 1u << 20, "big.one", payload, "reply.to", kFlagRequest);
  ASSERT_EQ(decode(offer, f), DecodeStatus::kOk);
  EXPECT_EQ(to_string(FrameType::kRendezvousOffer), "RDV_OFFER");
  EXPECT_EQ(f.subject, "big.one");
  EXPECT_EQ(f.reply, "reply.to");
  RendezvousRegion back;
  ASSERT_TRUE(decode(f.payload, back));
  EXPECT_EQ(back.address, region.address);
  EXPECT_EQ(back.rkey, region.rkey);
  EXPECT_EQ(back.header_len, 16);
  auto reserved = body;
  reserved[15] = std::byte{1};
  EXPECT_FALSE(decode(std::span<const std::byte>(reserved), back)) << "reserved bytes not zero";
  EXPECT_EQ(decode(encode(FrameType::kRendezvousOffer, 1u << 20, "", payload), f), DecodeStatus::kBadSubject);
  EXPECT_EQ(decode(encode(FrameType::kRendezvousOffer, 1u << 20, "a.*", payload), f),
            DecodeStatus::kBadSubject);
  EXPECT_EQ(decode(encode(FrameType::kRendezvousOffer, 1u << 20, "a", "short"), f), DecodeStatus::kBadLength);
  EXPECT_EQ(decode(encode(FrameType::kRendezvousOffer, 0, "a", payload), f), DecodeStatus::kBadLength)
      << "a message of 0 bytes";
  EXPECT_EQ(decode(encode(FrameType::kRendezvousOffer, 1u << 20, "a", payload, "", kFlagRequest), f),
            DecodeStatus::kBadFlags)
      << "REQUEST without a reply";
  // RDV_RELEASE: no body; arg and sequence are the broker's.
  ASSERT_EQ(decode(encode(FrameType::kRendezvousRelease, 14, "", ""), f), DecodeStatus::kOk);
  EXPECT_EQ(to_string(FrameType::kRendezvousRelease), "RDV_RELEASE");
  EXPECT_EQ(decode(encode(FrameType::kRendezvousRelease, 0, "a", ""), f), DecodeStatus::kBadLength);
  EXPECT_EQ(decode(encode(FrameType::kRendezvousRelease, 0, "", "x"), f), DecodeStatus::kBadLength);
  // RDV_READY (version 9, §3.9): arg the subscription, sequence the DELIVER, 24 bytes of landing area.
  const LandingArea area{42, 0x7f00abcdef00, 0x1234};
  const auto area_bytes = encode(area);
  const std::string area_payload(reinterpret_cast<const char*>(area_bytes.data()), area_bytes.size());
  const auto ready = encode(FrameType::kRendezvousReady, 7, "", area_payload);  // f's payload points into it
  ASSERT_EQ(decode(ready, f), DecodeStatus::kOk);
  EXPECT_EQ(to_string(FrameType::kRendezvousReady), "RDV_READY");
  EXPECT_EQ(f.header.arg, 7u);
  LandingArea area_back;
  ASSERT_TRUE(decode(f.payload, area_back));
  EXPECT_EQ(area_back.publisher, 42u);
  EXPECT_EQ(area_back.address, area.address);
  EXPECT_EQ(area_back.rkey, 0x1234u);
  auto area_reserved = area_bytes;
  area_reserved[23] = std::byte{1};
  EXPECT_FALSE(decode(std::span<const std::byte>(area_reserved), area_back)) << "reserved bytes not zero";
  EXPECT_EQ(decode(encode(FrameType::kRendezvousReady, 7, "a", area_payload), f), DecodeStatus::kBadLength);
  EXPECT_EQ(decode(encode(FrameType::kRendezvousReady, 7, "", "short"), f), DecodeStatus::kBadLength);
  EXPECT_EQ(decode(encode(FrameType::kRendezvousReady, 7, "", area_payload, "", kFlagRequest), f),
            DecodeStatus::kBadFlags);
}

TEST(Info, RoundTripsAndSkipsKeysItDoesNotKnow) {
  Info info;
  info.self = {"0123456789abcdef", {"rdma://10.0.0.1:7470", "tcp://10.0.0.1:7471"}, {"rdma://10.0.0.1:7472"}};
  info.cluster = "prod";
  info.peers = {{"fedcba9876543210", {"tcp://10.0.0.2:7471"}, {"tcp://10.0.0.2:7473"}},
                {"00000000000000aa", {}, {}}};
  const std::string text = encode_info(info, 4096);
  EXPECT_EQ(text,
            "id 0123456789abcdef\ncluster prod\nurl rdma://10.0.0.1:7470\nurl tcp://10.0.0.1:7471\n"
            "route rdma://10.0.0.1:7472\npeer_url fedcba9876543210 tcp://10.0.0.2:7471\n"
            "peer_route fedcba9876543210 tcp://10.0.0.2:7473\npeer 00000000000000aa\n");
  auto back = decode_info(text);
  ASSERT_TRUE(back);
  EXPECT_EQ(*back, info);
  // A later version's keys are skipped; the rest still reads.
  auto later = decode_info("id 1\nweight 5 7\nurl tcp://h:1\n");
  ASSERT_TRUE(later);
  EXPECT_EQ(later->self.urls, std::vector<std::string>{"tcp://h:1"});
  // Peers that do not fit the receiver's buffer are left out, whole; the sender stays.
  const std::size_t first = text.find("peer_url");
  const std::string cut = encode_info(info, first + 10);
  EXPECT_EQ(cut, text.substr(0, first));
  // Then the sender's own URLs, one by one: its id and cluster always go.
  const std::string head = "id 0123456789abcdef\ncluster prod\nurl rdma://10.0.0.1:7470\n";
  EXPECT_EQ(encode_info(info, head.size() + 20), head);
  EXPECT_EQ(encode_info(info, 33), "id 0123456789abcdef\ncluster prod\n");
  EXPECT_EQ(encode_info(info, 8), "") << "not even the sender's id fits";
}

TEST(Info, EveryBrokenRuleIsRefusedWithWhy) {
  std::string why;
  for (std::string_view bad :
       {"", "url tcp://h:1\n", "id 1\nid 2\n", "id 1", "id 1\nurl\n", "id 1\nurl a b\n", "id 1\n url x\n",
        "id 1\npeer_url 2\n", "id 1\npeer 2 tcp://h:1\n", "id 1\nurl tab\there\n"}) {
    why.clear();
    EXPECT_FALSE(decode_info(bad, &why)) << bad;
    EXPECT_FALSE(why.empty()) << bad;
  }
}

TEST(Info, RouteLoginNamesTheBrokerThenItsRouteUrls) {
  EXPECT_EQ(route_login_name("0123456789abcdef", {}), "0123456789abcdef");
  const std::string s = route_login_name("0123456789abcdef", {"rdma://a:7472", "tcp://a:7473"});
  EXPECT_EQ(s, "0123456789abcdef,rdma://a:7472,tcp://a:7473");
  EXPECT_TRUE(valid_subject(s)) << "it travels where a subject does";
  const BrokerInfo b = split_route_login(s);
  EXPECT_EQ(b.id, "0123456789abcdef");
  EXPECT_EQ(b.routes, (std::vector<std::string>{"rdma://a:7472", "tcp://a:7473"}));
  EXPECT_EQ(split_route_login("0123456789abcdef").id, "0123456789abcdef");
  for (std::string_view bad : {"", ",x", "x,", "x,,y", "x\ty", "x y"})
    EXPECT_EQ(split_route_login(bad).id, "") << bad;
}

TEST(Wire, MaxPayloadFitsExactly) {
  const std::size_t max_frame = 1024;
  const std::size_t p = max_payload(max_frame, 5);
  std::vector<std::byte> buf(max_frame);
  std::string payload(p, 'z');
  FrameHeader h;
  h.type = FrameType::kPublish;
  EXPECT_EQ(encode_frame(buf, h, "abcde", {}, bytes(payload)), max_frame);
  std::string one_more(p + 1, 'z');
  EXPECT_EQ(encode_frame(buf, h, "abcde", {}, bytes(one_more)), 0u);
}

// ---------------------------------------------------------------- multicast (SPEC.md §7)

TEST(WireMulticast, FramesHaveTheirFixedShapes) {
  McastJoin j;
  j.channel = 9;
  j.qkey = 0x01234567;
  j.group[10] = 0xff;
  j.group[11] = 0xff;
  j.group[12] = 239;
  const auto jb = proto::encode(j);
  const std::string join(reinterpret_cast<const char*>(jb.data()), jb.size());
  const auto cb = encode_count(1234);
  const std::string count(reinterpret_cast<const char*>(cb.data()), cb.size());
  Frame f;
  auto buf = encode(FrameType::kMcastJoin, 3, "", join);
  ASSERT_EQ(decode(buf, f), DecodeStatus::kOk);
  auto back = decode_mcast_join(f.payload);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->channel, 9u);
  EXPECT_EQ(back->qkey, 0x01234567u);
  EXPECT_EQ(back->group, j.group);
  EXPECT_EQ(decode(encode(FrameType::kMcastJoin, 3, "", join.substr(1)), f), DecodeStatus::kBadLength);
  EXPECT_EQ(decode(encode(FrameType::kMcastJoin, 3, "a", join), f), DecodeStatus::kBadLength);

  for (FrameType t : {FrameType::kMcastRepair, FrameType::kMcastLoss}) {
    buf = encode(t, 3, "", count);
    ASSERT_EQ(decode(buf, f), DecodeStatus::kOk) << to_string(t);
    EXPECT_EQ(decode_count(f.payload), 1234u);
    EXPECT_EQ(decode(encode(t, 3, "", "1234567"), f), DecodeStatus::kBadLength) << to_string(t);
  }
  EXPECT_EQ(decode(encode(FrameType::kMcastLeave, 3, "", ""), f), DecodeStatus::kOk);
  EXPECT_EQ(decode(encode(FrameType::kMcastLeave, 3, "", "x"), f), DecodeStatus::kBadLength);
  EXPECT_EQ(decode(encode(FrameType::kMcastJoined, 3, "", ""), f), DecodeStatus::kOk);
  EXPECT_EQ(decode(encode(FrameType::kMcastJoined, 3, "", "no such device"), f), DecodeStatus::kOk);
  EXPECT_EQ(decode(encode(FrameType::kMcastJoined, 3, "", std::string(kMaxMcastReasonLen + 1, 'x')), f),
            DecodeStatus::kBadLength);
}

TEST(WireMulticast, SequencedFlagOnlyOnDeliver) {
  auto inner = encode(FrameType::kPublish, 0, "a", "x");
  std::string inner_text(reinterpret_cast<const char*>(inner.data()), inner.size());
  auto deliver = encode(FrameType::kDeliver, 5, "", inner_text);
  deliver[4] = std::byte{kFlagSequenced};
  Frame f;
  ASSERT_EQ(decode(deliver, f), DecodeStatus::kOk);
  EXPECT_EQ(f.header.flags, kFlagSequenced);
  auto ping = encode(FrameType::kPing, 0, "", "");
  ping[4] = std::byte{kFlagSequenced};
  EXPECT_EQ(decode(ping, f), DecodeStatus::kBadFlags);
  auto publish = encode(FrameType::kPublish, 0, "a", "x");
  publish[4] = std::byte{kFlagSequenced};
  EXPECT_EQ(decode(publish, f), DecodeStatus::kBadFlags);
}

TEST(WireMulticast, ConnectRequestOffersMulticast) {
  ConnectRequest r{16384, 32, kConnectMulticast};
  ConnectRequest back;
  ASSERT_EQ(proto::decode(proto::encode(r), back), HandshakeStatus::kOk);
  EXPECT_EQ(back.flags, kConnectMulticast);
  ASSERT_EQ(proto::decode(proto::encode(ConnectRequest{16384, 32}), back), HandshakeStatus::kOk);
  EXPECT_EQ(back.flags, 0);
}

TEST(WireMulticast, DatagramsAreCheckedBeforeTheyAreTrusted) {
  std::vector<std::byte> d(kDatagramHeaderSize + 100);
  proto::encode(d.data(), DatagramHeader{7, 42, 300, 200, 1});
  auto h = decode_datagram(d, 4096);
  ASSERT_TRUE(h);
  EXPECT_EQ(h->channel, 7u);
  EXPECT_EQ(h->sequence, 42u);
  EXPECT_EQ(h->total_len, 300u);
  EXPECT_EQ(h->offset, 200u);
  EXPECT_FALSE(decode_datagram(d, 299)) << "longer than the receiver's largest message";
  proto::encode(d.data(), DatagramHeader{7, 42, 300, 201, 1});
  EXPECT_FALSE(decode_datagram(d, 4096)) << "fragment past the message's end";
  proto::encode(d.data(), DatagramHeader{7, 0, 300, 0, 1});
  EXPECT_FALSE(decode_datagram(d, 4096)) << "sequence numbers start at 1";
  proto::encode(d.data(), DatagramHeader{7, 42, 300, 200, 0});
  EXPECT_FALSE(decode_datagram(d, 4096)) << "data without a message count";
  proto::encode(d.data(), DatagramHeader{7, 42, 300, 200, 2});
  EXPECT_FALSE(decode_datagram(d, 4096)) << "several messages are never fragmented";
  proto::encode(d.data(), DatagramHeader{7, 42, 100, 0, 3});
  ASSERT_TRUE(decode_datagram(d, 4096)) << "three whole messages in one datagram";
  EXPECT_EQ(decode_datagram(d, 4096)->count, 3u);
  std::vector<std::byte> hb(kDatagramHeaderSize);
  proto::encode(hb.data(), DatagramHeader{7, 42, 0, 0, 0});
  ASSERT_TRUE(decode_datagram(hb, 4096));
  EXPECT_EQ(decode_datagram(hb, 4096)->total_len, 0u) << "a heartbeat";
  auto bad = hb;
  bad[0] = std::byte{0};
  EXPECT_FALSE(decode_datagram(bad, 4096)) << "bad magic";
  EXPECT_FALSE(decode_datagram(std::span(hb).first(kDatagramHeaderSize - 1), 4096)) << "short";
  hb.push_back(std::byte{1});
  EXPECT_FALSE(decode_datagram(hb, 4096)) << "a heartbeat carries no data";
}

// ---------------------------------------------------------------- headers (§3.6)

std::vector<std::byte> with_headers(std::span<const HeaderField> fields, std::string_view payload,
                                    std::string_view reply = {}) {
  std::vector<std::byte> buf(4096);
  FrameHeader h;
  h.type = FrameType::kPublish;
  buf.resize(encode_frame(buf, h, "orders.eu", reply, bytes(payload), fields));
  return buf;
}

TEST(WireHeaders, RoundTripInOrderWithRepeatsAndEmptyValues) {
  const HeaderField fields[] = {{"Trace-Id", "4bf92f3577b34da6"},
                                {"Accept", "a"},
                                {"Accept", "b"},
                                {"X-Empty", ""},
                                {"Note", "grüße: 1"}};
  auto buf = with_headers(fields, "payload", "_INBOX.r.1");
  Frame f;
  ASSERT_EQ(decode(buf, f), DecodeStatus::kOk);
  EXPECT_EQ(f.header.header_len % 8, 0u);
  EXPECT_EQ(f.header.header_len, header_block_len(fields));
  EXPECT_EQ(f.header.payload_len, f.header.header_len + 7u) << "payload_len counts the block";
  EXPECT_EQ(std::string_view(reinterpret_cast<const char*>(f.payload.data()), f.payload.size()), "payload");
  EXPECT_EQ(f.reply, "_INBOX.r.1");
  std::vector<std::pair<std::string, std::string>> got;
  ASSERT_TRUE(
      for_each_header(f.headers, [&](std::string_view n, std::string_view v) { got.emplace_back(n, v); }));
  ASSERT_EQ(got.size(), 5u);
  for (std::size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].first, fields[i].name);
    EXPECT_EQ(got[i].second, fields[i].value);
  }
  // The block is the NATS-style text, then zeros to 8 bytes.
  const std::string_view text(reinterpret_cast<const char*>(f.headers.data()), f.headers.size());
  EXPECT_EQ(text.substr(0, 28), "Trace-Id: 4bf92f3577b34da6\r\n");
  // A frame without headers has none, and an empty payload with headers is fine.
  ASSERT_EQ(decode(encode(FrameType::kPublish, 0, "a", "x"), f), DecodeStatus::kOk);
  EXPECT_TRUE(f.headers.empty());
  ASSERT_EQ(decode(with_headers(fields, ""), f), DecodeStatus::kOk);
  EXPECT_TRUE(f.payload.empty());
  // Inside a DELIVER the inner frame keeps its block.
  std::vector<std::byte> deliver(4096);
  FrameHeader d;
  d.type = FrameType::kDeliver;
  d.arg = 3;
  deliver.resize(encode_frame(deliver, d, {}, {}, buf));
  ASSERT_EQ(decode(deliver, f), DecodeStatus::kOk);
  int inner = 0;
  ASSERT_EQ(for_each_delivered(f, [&](const Frame& m) { inner += m.headers.empty() ? 0 : 1; }),
            DecodeStatus::kOk);
  EXPECT_EQ(inner, 1);
}

TEST(WireHeaders, EveryBrokenBlockRuleIsBadHeaders) {
  const HeaderField one[] = {{"Trace-Id", "abc"}};  // "Trace-Id: abc\r\n" = 15 bytes, 1 of padding
  auto good = with_headers(one, "data");
  Frame f;
  ASSERT_EQ(decode(good, f), DecodeStatus::kOk);
  const std::size_t block_at = kHeaderSize + 9;  // after "orders.eu"
  auto text_at = [&](std::vector<std::byte>& b, std::size_t i) -> std::byte& { return b[block_at + i]; };

  auto not_aligned = good;
  store<std::uint16_t>(not_aligned.data() + 10, 12);
  EXPECT_EQ(decode(not_aligned, f), DecodeStatus::kBadHeaders) << "header_len not a multiple of 8";
  auto past_payload = good;
  store<std::uint16_t>(past_payload.data() + 10, 32);
  EXPECT_EQ(decode(past_payload, f), DecodeStatus::kBadHeaders) << "header_len beyond payload_len";
  // One byte of "Trace-Id: abc\r\n\0" changed breaks one rule each.
  const struct {
    std::size_t at;
    char byte;
    const char* rule;
  } one_byte[] = {
      {9, '_', "name: without the space"}, {5, ' ', "a space in the name"}, {8, 'x', "no colon"},
      {14, 'x', "a line without CR LF"},   {11, '\0', "NUL in the value"},  {15, '!', "padding not zero"}};
  for (const auto& c : one_byte) {
    auto broken = good;
    text_at(broken, c.at) = static_cast<std::byte>(c.byte);
    EXPECT_EQ(decode(broken, f), DecodeStatus::kBadHeaders) << c.rule;
  }
  auto only_padding = good;
  for (std::size_t i = 0; i < 16; ++i) text_at(only_padding, i) = std::byte{0};
  EXPECT_EQ(decode(only_padding, f), DecodeStatus::kBadHeaders) << "a block without a field";
  // A whole block of padding after the fields: zeros beyond what alignment needs.
  const HeaderField eight[] = {{"A", "bcd"}};  // "A: bcd\r\n" = 8 bytes, no padding
  auto overlong = with_headers(eight, "12345678");
  store<std::uint16_t>(overlong.data() + 10, 16);
  for (std::size_t i = 8; i < 16; ++i) overlong[kHeaderSize + 9 + i] = std::byte{0};
  EXPECT_EQ(decode(overlong, f), DecodeStatus::kBadHeaders) << "more padding than alignment needs";
  // On any other type, offset 10 is still reserved.
  auto ping = encode(FrameType::kPing, 0, "", "");
  store<std::uint16_t>(ping.data() + 10, 8);
  EXPECT_EQ(decode(ping, f), DecodeStatus::kBadReserved);
  EXPECT_EQ(error_for(DecodeStatus::kBadHeaders), ErrorCode::kMalformedFrame);
}

TEST(WireHeaders, NamesAndValues) {
  EXPECT_TRUE(valid_header_name("Content-Type"));
  EXPECT_FALSE(valid_header_name(""));
  EXPECT_FALSE(valid_header_name("a b"));
  EXPECT_FALSE(valid_header_name("a:b"));
  EXPECT_FALSE(valid_header_name("caf\xc3\xa9"));
  EXPECT_TRUE(valid_header_value(""));
  EXPECT_TRUE(valid_header_value("text/plain; charset=utf-8"));
  EXPECT_FALSE(valid_header_value("a\r\nInjected: 1"));
  EXPECT_FALSE(valid_header_value(std::string_view("a\0b", 3)));
}

TEST(Handshake, VersionIsNegotiatedDownToTheLowerSide) {
  // A client of this code asks for version 13 in byte 5, with version 1 in byte 4.
  auto req = encode(ConnectRequest{16384, 64});
  EXPECT_EQ(std::to_integer<int>(req[4]), 1);
  EXPECT_EQ(std::to_integer<int>(req[5]), kProtocolVersion);
  ConnectRequest r;
  ASSERT_EQ(decode(std::span<const std::byte>(req), r), HandshakeStatus::kOk);
  EXPECT_EQ(negotiate_version(r.max_version), 13);
  EXPECT_EQ(connection_version(r), 13);
  EXPECT_EQ(connection_version(r, 12), 12) << "a version-12 broker";
  EXPECT_EQ(connection_version(r, 11), 11) << "a version-11 broker";
  EXPECT_EQ(connection_version(r, 10), 10) << "a version-10 broker";
  EXPECT_EQ(connection_version(r, 9), 9) << "a version-9 broker";
  EXPECT_EQ(connection_version(r, 8), 8) << "a version-8 broker";
  EXPECT_EQ(connection_version(r, 7), 7) << "a version-7 broker";
  EXPECT_EQ(connection_version(r, 6), 6) << "a version-6 broker";
  EXPECT_EQ(connection_version(r, 5), 5) << "a version-5 broker";
  EXPECT_EQ(connection_version(r, 4), 4) << "a version-4 broker";
  EXPECT_EQ(connection_version(r, 3), 3) << "a version-3 broker";
  // Credits by demand need a client window of 4 (SPEC.md §5.1): with fewer
  // receives the connection is version 2.
  EXPECT_EQ(connection_version(ConnectRequest{16384, 3}), 2);
  EXPECT_EQ(connection_version(ConnectRequest{16384, 4}), 13);
  EXPECT_EQ(connection_version(ConnectRequest{16384, 2, 0, 2}), 2);
  EXPECT_EQ(connection_version(ConnectRequest{16384, 64}, 2), 2) << "a version-2 broker";
  // A version-1 client sends 0 there.
  req[5] = std::byte{0};
  ASSERT_EQ(decode(std::span<const std::byte>(req), r), HandshakeStatus::kOk);
  EXPECT_EQ(negotiate_version(r.max_version), 1);
  // A later client asking for more gets what the broker has.
  EXPECT_EQ(negotiate_version(kProtocolVersion + 1), kProtocolVersion);
  EXPECT_EQ(negotiate_version(9, 1), 1) << "a version-1 broker";
  // The accept carries the outcome; a client takes 1 to 7 and nothing else.
  ConnectAccept a;
  ASSERT_EQ(decode(std::span<const std::byte>(encode(ConnectAccept{8192, 32, 77, 2})), a),
            HandshakeStatus::kOk);
  EXPECT_EQ(a.version, 2);
  ASSERT_EQ(decode(std::span<const std::byte>(encode(ConnectAccept{8192, 32, 77})), a), HandshakeStatus::kOk);
  EXPECT_EQ(a.version, 1);
  ASSERT_EQ(decode(std::span<const std::byte>(encode(ConnectAccept{8192, 32, 77, 3})), a),
            HandshakeStatus::kOk);
  EXPECT_EQ(a.version, 3);
  EXPECT_EQ(a.max_payload, 0u) << "no max_payload before version 4";
  // Version 4's accept is 32 bytes: max_payload follows (SPEC.md §2.2).
  const auto v4 = encode(ConnectAccept{8192, 32, 77, 4, 1u << 20});
  ASSERT_EQ(decode(std::span<const std::byte>(v4), a), HandshakeStatus::kOk);
  EXPECT_EQ(a.version, 4);
  EXPECT_EQ(a.max_payload, 1u << 20);
  EXPECT_EQ(accept_size(4), 32u);
  EXPECT_EQ(accept_size(3), 24u);
  EXPECT_EQ(decode(std::span<const std::byte>(v4).first(24), a), HandshakeStatus::kTooShort);
  auto too_big = v4;
  store<std::uint32_t>(too_big.data() + 24, kMaxMessageSize + 1);
  EXPECT_EQ(decode(std::span<const std::byte>(too_big), a), HandshakeStatus::kBadValue);
  auto v5 = v4;
  v5[4] = std::byte{5};
  ASSERT_EQ(decode(std::span<const std::byte>(v5), a), HandshakeStatus::kOk);
  EXPECT_EQ(a.version, 5);
  EXPECT_EQ(a.max_payload, 1u << 20) << "version 5's accept is version 4's";
  auto v6 = v4;
  v6[4] = std::byte{6};
  ASSERT_EQ(decode(std::span<const std::byte>(v6), a), HandshakeStatus::kOk);
  EXPECT_EQ(a.version, 6) << "version 6's accept is version 4's";
  auto v7 = v4;
  v7[4] = std::byte{7};
  ASSERT_EQ(decode(std::span<const std::byte>(v7), a), HandshakeStatus::kOk);
  EXPECT_EQ(a.version, 7) << "version 7's accept is version 4's";
  EXPECT_EQ(a.rendezvous_min, 0u) << "bytes 28..31 are reserved before version 8";
  // Version 8: the accept's last word is rendezvous_min (SPEC.md §2.2, §3.8).
  const auto v8 = encode(ConnectAccept{8192, 32, 77, 8, 1u << 20, 64u << 10});
  ASSERT_EQ(decode(std::span<const std::byte>(v8), a), HandshakeStatus::kOk);
  EXPECT_EQ(a.version, 8);
  EXPECT_EQ(a.rendezvous_min, 64u << 10);
  EXPECT_EQ(load<std::uint32_t>(encode(ConnectAccept{8192, 32, 77, 7, 1u << 20, 64u << 10}).data() + 28), 0u)
      << "not sent to a version-7 client";
  // Version 9's accept is version 8's (landing areas take rendezvous_min too, §3.9).
  auto v9 = v8;
  v9[4] = std::byte{9};
  ASSERT_EQ(decode(std::span<const std::byte>(v9), a), HandshakeStatus::kOk);
  EXPECT_EQ(a.version, 9);
  EXPECT_EQ(a.rendezvous_min, 64u << 10);
  // So is version 10's (acknowledged publishing changes frames only, §3.10).
  auto v10 = v8;
  v10[4] = std::byte{10};
  ASSERT_EQ(decode(std::span<const std::byte>(v10), a), HandshakeStatus::kOk);
  EXPECT_EQ(a.version, 10);
  // And version 11's (consumers change frames only, §3.11).
  auto v11 = v8;
  v11[4] = std::byte{11};
  ASSERT_EQ(decode(std::span<const std::byte>(v11), a), HandshakeStatus::kOk);
  EXPECT_EQ(a.version, 11);
  // And version 12's (PUB_ACK ranges change frames only, §3.10).
  auto v12 = v8;
  v12[4] = std::byte{12};
  ASSERT_EQ(decode(std::span<const std::byte>(v12), a), HandshakeStatus::kOk);
  EXPECT_EQ(a.version, 12);
  // And version 13's (one more error code in a PUB_ACK, §3.10).
  auto v13 = v8;
  v13[4] = std::byte{13};
  ASSERT_EQ(decode(std::span<const std::byte>(v13), a), HandshakeStatus::kOk);
  EXPECT_EQ(a.version, 13);
  auto v14 = v8;
  v14[4] = std::byte{14};
  EXPECT_EQ(decode(std::span<const std::byte>(v14), a), HandshakeStatus::kBadVersion);
  // Byte 4 of a request stays the base version: 2 there is not a request this broker takes.
  auto v2_in_byte4 = encode(ConnectRequest{16384, 64});
  v2_in_byte4[4] = std::byte{2};
  EXPECT_EQ(decode(std::span<const std::byte>(v2_in_byte4), r), HandshakeStatus::kBadVersion);
}

TEST(Handshake, RoundTrips) {
  auto req = encode(ConnectRequest{16384, 64});
  ConnectRequest r;
  ASSERT_EQ(decode(std::span<const std::byte>(req), r), HandshakeStatus::kOk);
  EXPECT_EQ(r.recv_buffer_size, 16384u);
  EXPECT_EQ(r.initial_credits, 64u);

  auto acc = encode(ConnectAccept{8192, 32, 77});
  ConnectAccept a;
  ASSERT_EQ(decode(std::span<const std::byte>(acc), a), HandshakeStatus::kOk);
  EXPECT_EQ(a.max_frame_size, 8192u);
  EXPECT_EQ(a.initial_credits, 32u);
  EXPECT_EQ(a.connection_id, 77u);

  auto rej = encode(ConnectReject{RejectReason::kBufferTooSmall, 65536});
  ConnectReject j;
  ASSERT_EQ(decode(std::span<const std::byte>(rej), j), HandshakeStatus::kOk);
  EXPECT_EQ(j.reason, RejectReason::kBufferTooSmall);
  EXPECT_EQ(j.required_buffer_size, 65536u);
}

TEST(Handshake, RejectsBadInputAcceptsPadding) {
  auto req = encode(ConnectRequest{16384, 64});
  ConnectRequest r;
  std::vector<std::byte> padded(req.begin(), req.end());
  padded.resize(56);  // rdma_cm may hand over zero-padded private data
  EXPECT_EQ(decode(std::span<const std::byte>(padded), r), HandshakeStatus::kOk);
  EXPECT_EQ(decode(std::span<const std::byte>(req).first(15), r), HandshakeStatus::kTooShort);
  auto bad = req;
  bad[0] = std::byte{0};
  EXPECT_EQ(decode(std::span<const std::byte>(bad), r), HandshakeStatus::kBadMagic);
  bad = req;
  bad[4] = std::byte{9};
  EXPECT_EQ(decode(std::span<const std::byte>(bad), r), HandshakeStatus::kBadVersion);
  // Too small a buffer is the one thing a retry fixes (with the broker's
  // size); every other field out of range is a plain bad value.
  EXPECT_EQ(decode(std::span<const std::byte>(encode(ConnectRequest{100, 64})), r),
            HandshakeStatus::kBufferTooSmall);
  for (std::uint32_t credits : {0u, 1u, 65536u}) {
    EXPECT_EQ(decode(std::span<const std::byte>(encode(ConnectRequest{16384, credits})), r),
              HandshakeStatus::kBadValue)
        << credits;
    // Even with a small buffer too: BUFFER_TOO_SMALL would send the client round in circles.
    EXPECT_EQ(decode(std::span<const std::byte>(encode(ConnectRequest{100, credits})), r),
              HandshakeStatus::kBadValue)
        << credits;
  }
  EXPECT_EQ(decode(std::span<const std::byte>(encode(ConnectRequest{kMaxBufferSize + 1, 64})), r),
            HandshakeStatus::kBadValue);
}

}  // namespace
}  // namespace rdmabroker::proto
