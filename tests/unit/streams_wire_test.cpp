// SPDX-License-Identifier: Apache-2.0
// Protocol versions 10 and 12 on the wire (proto/SPEC.md §3.10): the ACK
// flag's place, PUB_ACK's shape and its ranges; and a stream's duplicate window
// (daemon/stream/duplicates.hpp).
#include <gtest/gtest.h>

#include <cstring>

#include "broker/outbound.hpp"
#include "rdmabroker/proto/headers.hpp"
#include "rdmabroker/proto/pub_ack.hpp"
#include "rdmabroker/proto/wire.hpp"
#include "stream/duplicates.hpp"

namespace rdmabroker {
namespace {

using proto::DecodeStatus;
using proto::FrameType;

std::vector<std::byte> encode(proto::FrameHeader h, std::string_view subject, std::string_view payload) {
  h.payload_len = static_cast<std::uint32_t>(payload.size());
  std::vector<std::byte> out(proto::align_up(proto::kHeaderSize + subject.size() + payload.size()));
  proto::encode_frame(out, h, subject, "", std::as_bytes(std::span(payload.data(), payload.size())));
  return out;
}

DecodeStatus decode(const std::vector<std::byte>& bytes) {
  proto::Frame f;
  return proto::decode_frame(bytes, bytes.size(), f);
}

TEST(WireStreams, AckIsOnlyOnAWholePublishWithAnId) {
  proto::FrameHeader h;
  h.type = FrameType::kPublish;
  h.flags = proto::kFlagAck;
  h.sequence = 9;
  EXPECT_EQ(decode(encode(h, "s.x", "m")), DecodeStatus::kOk);
  h.sequence = 0;
  EXPECT_EQ(decode(encode(h, "s.x", "m")), DecodeStatus::kBadFlags) << "no id to answer";
  h.sequence = 9;
  h.type = FrameType::kSubscribe;
  EXPECT_EQ(decode(encode(h, "s.x", "")), DecodeStatus::kBadFlags) << "only a PUBLISH";
  h.type = FrameType::kPublish;
  h.flags = proto::kFlagDuplicate;
  EXPECT_EQ(decode(encode(h, "s.x", "m")), DecodeStatus::kBadFlags) << "DUPLICATE is a PUB_ACK's";
  h.flags = proto::kFlagAck | proto::kFlagStream;
  EXPECT_EQ(decode(encode(h, "s.x", "m")), DecodeStatus::kBadFlags)
      << "STREAM is a consumer's, never with ACK";
  h.flags = proto::kFlagRange;
  EXPECT_EQ(decode(encode(h, "s.x", "m")), DecodeStatus::kBadFlags) << "RANGE is a PUB_ACK's";
  h.flags = 512;
  EXPECT_EQ(decode(encode(h, "s.x", "m")), DecodeStatus::kBadReserved);
}

TEST(WireStreams, APubAckCarriesTheSequenceAndTheStreamName) {
  auto item = daemon::make_pub_ack(77, proto::ErrorCode::kNone, 1234, "ORDERS", true);
  ASSERT_TRUE(item.text);
  proto::FrameHeader h = item.header;
  const auto bytes = encode(h, "", *item.text);
  proto::Frame f;
  ASSERT_EQ(proto::decode_frame(bytes, bytes.size(), f), DecodeStatus::kOk);
  EXPECT_EQ(f.header.type, FrameType::kPubAck);
  EXPECT_EQ(f.header.sequence, 77u);
  EXPECT_EQ(f.header.arg, 0u);
  EXPECT_EQ(f.header.flags, proto::kFlagDuplicate);
  std::uint64_t seq = 0;
  std::memcpy(&seq, f.payload.data(), sizeof seq);
  EXPECT_EQ(seq, 1234u);
  EXPECT_EQ(std::string_view(reinterpret_cast<const char*>(f.payload.data()) + 8, f.payload.size() - 8),
            "ORDERS");
  EXPECT_TRUE(item.fixed_sequence) << "the publisher's id, not the connection's frame counter";

  // Shorter than the sequence, longer than a name may be, or with a subject: malformed.
  h = {};
  h.type = FrameType::kPubAck;
  EXPECT_EQ(decode(encode(h, "", "1234567")), DecodeStatus::kBadLength);
  EXPECT_EQ(decode(encode(h, "", std::string(8 + 65, 'n'))), DecodeStatus::kBadLength);
  EXPECT_EQ(decode(encode(h, "x", std::string(8, '\0'))), DecodeStatus::kBadLength);
  EXPECT_EQ(decode(encode(h, "", std::string(8, '\0'))), DecodeStatus::kOk);
}

std::string range_payload(std::uint64_t first, std::uint32_t count, std::uint32_t reserved,
                          std::string_view name) {
  std::string p(16, '\0');
  std::memcpy(p.data(), &first, 8);
  std::memcpy(p.data() + 8, &count, 4);
  std::memcpy(p.data() + 12, &reserved, 4);
  return p.append(name);
}

TEST(WireStreams, APubAckRangeAnswersARunOfMessagesStoredOneAfterTheOther) {
  auto item = daemon::make_pub_ack_range(100, 5, 40, "ORDERS");
  ASSERT_TRUE(item.text);
  EXPECT_TRUE(item.fixed_sequence) << "the first PUBLISH's id, not the connection's frame counter";
  const auto bytes = encode(item.header, "", *item.text);
  proto::Frame f;
  ASSERT_EQ(proto::decode_frame(bytes, bytes.size(), f), DecodeStatus::kOk);
  EXPECT_EQ(f.header.flags, proto::kFlagRange);
  const auto a = proto::pub_ack_answer(f);
  EXPECT_EQ(a.first_id, 100u);
  EXPECT_EQ(a.count, 5u);
  EXPECT_EQ(a.first_sequence, 40u);
  EXPECT_EQ(a.stream, "ORDERS");

  // A single PUB_ACK answers one.
  auto one = daemon::make_pub_ack(7, proto::ErrorCode::kStreamFull, 0, "ORDERS");
  const auto one_bytes = encode(one.header, "", *one.text);
  ASSERT_EQ(proto::decode_frame(one_bytes, one_bytes.size(), f), DecodeStatus::kOk);
  EXPECT_EQ(proto::pub_ack_answer(f).count, 1u);
  EXPECT_EQ(proto::pub_ack_answer(f).stream, "ORDERS");

  // SPEC.md §3.10, "Ranges": at least two, reserved 0, a stream's name,
  // stored messages only (no refusal, no DUPLICATE).
  proto::FrameHeader h;
  h.type = FrameType::kPubAck;
  h.flags = proto::kFlagRange;
  h.sequence = 100;
  EXPECT_EQ(decode(encode(h, "", range_payload(40, 2, 0, "S"))), DecodeStatus::kOk);
  EXPECT_EQ(decode(encode(h, "", range_payload(40, 1, 0, "S"))), DecodeStatus::kBadLength);
  EXPECT_EQ(decode(encode(h, "", range_payload(40, 0, 0, "S"))), DecodeStatus::kBadLength);
  EXPECT_EQ(decode(encode(h, "", range_payload(40, 2, 9, "S"))), DecodeStatus::kBadReserved);
  EXPECT_EQ(decode(encode(h, "", range_payload(40, 2, 0, ""))), DecodeStatus::kBadLength) << "no name";
  EXPECT_EQ(decode(encode(h, "", range_payload(40, 2, 0, std::string(65, 'n')))), DecodeStatus::kBadLength);
  h.arg = static_cast<std::uint32_t>(proto::ErrorCode::kStreamFull);
  EXPECT_EQ(decode(encode(h, "", range_payload(40, 2, 0, "S"))), DecodeStatus::kBadFlags);
  h.arg = 0;
  h.flags = proto::kFlagRange | proto::kFlagDuplicate;
  EXPECT_EQ(decode(encode(h, "", range_payload(40, 2, 0, "S"))), DecodeStatus::kBadFlags);
}

std::vector<std::byte> block(std::initializer_list<proto::HeaderField> fields) {
  std::vector<std::byte> out(proto::header_block_len(fields));
  proto::encode_header_block(out.data(), fields);
  return out;
}

TEST(DuplicateWindow, RemembersMsgIdsForItsWindowOnly) {
  EXPECT_EQ(daemon::msg_id_of(block({{"Trace-Id", "t"}, {"Msg-Id", "order-7"}})), "order-7");
  EXPECT_EQ(daemon::msg_id_of(block({{"Trace-Id", "t"}})), "");
  EXPECT_EQ(daemon::msg_id_of({}), "");

  constexpr std::int64_t s = 1'000'000'000;
  daemon::DuplicateWindow w(10 * s);
  w.add("a", 1, 100 * s);
  w.add("b", 2, 105 * s);
  EXPECT_EQ(w.find("a", 109 * s), 1u);
  EXPECT_EQ(w.find("b", 109 * s), 2u);
  EXPECT_FALSE(w.find("c", 109 * s));
  EXPECT_FALSE(w.find("a", 111 * s)) << "past its window";
  EXPECT_EQ(w.find("b", 111 * s), 2u);
  // Stored again after its window: remembered from then on, not forgotten
  // when the first entry's time passes.
  w.add("a", 3, 112 * s);
  EXPECT_EQ(w.find("a", 116 * s), 3u);
  EXPECT_EQ(w.size(), 1u) << "b's window has passed";

  daemon::DuplicateWindow off(0);
  off.add("a", 1, 0);
  EXPECT_FALSE(off.find("a", 0));

  // A batch the disk refused: its ids are forgotten, so that the
  // publisher's retry is stored rather than called a duplicate of nothing.
  w.add("c", 4, 117 * s);
  w.add("d", 5, 117 * s);
  w.forget_from(4);
  EXPECT_FALSE(w.find("c", 118 * s));
  EXPECT_FALSE(w.find("d", 118 * s));
  EXPECT_EQ(w.find("a", 118 * s), 3u);
}

TEST(DuplicateWindow, ASnapshotBringsBackWhatIsStillWithinTheWindowAndADamagedOneNothing) {
  constexpr std::int64_t s = 1'000'000'000;
  daemon::DuplicateWindow w(60 * s);
  w.add("old", 1, 10 * s);
  w.add(std::string("bin\x01\xff", 5), 2, 50 * s);  // any bytes but NUL, CR and LF
  w.add("new", 3, 100 * s);
  const std::string snap = w.snapshot();
  daemon::DuplicateWindow back(60 * s);
  ASSERT_TRUE(back.restore(snap, 105 * s));
  EXPECT_FALSE(back.contains("old")) << "past its window by then";
  EXPECT_EQ(back.find(std::string("bin\x01\xff", 5), 105 * s), 2u);
  EXPECT_EQ(back.find("new", 105 * s), 3u);
  std::string flipped = snap;
  flipped[10] = static_cast<char>(flipped[10] ^ 1);
  daemon::DuplicateWindow none(60 * s);
  EXPECT_FALSE(none.restore(flipped, 105 * s));
  EXPECT_FALSE(none.restore(snap.substr(0, snap.size() - 3), 105 * s));
  EXPECT_EQ(none.size(), 0u);
}

TEST(DuplicateWindow, AFloodOfDistinctIdsKeepsAtMostItsCountTheOldestGoingFirst) {
  constexpr std::int64_t s = 1'000'000'000;
  daemon::DuplicateWindow w(120 * s, 1000);
  for (int i = 0; i < 5000; ++i) w.add("id-" + std::to_string(i), static_cast<std::uint64_t>(i) + 1, s);
  EXPECT_EQ(w.size(), 1000u);
  EXPECT_EQ(w.take_evicted(), 4000u);
  EXPECT_EQ(w.take_evicted(), 0u) << "counted once";
  EXPECT_FALSE(w.find("id-3999", 2 * s)) << "the oldest went first";
  EXPECT_EQ(w.find("id-4000", 2 * s), 4001u);
  EXPECT_EQ(w.find("id-4999", 2 * s), 5000u);
  // A lower bound (a reload) applies at once.
  w.set_window(120 * s, 10);
  EXPECT_EQ(w.size(), 10u);
  EXPECT_EQ(w.take_evicted(), 990u);
  EXPECT_EQ(w.find("id-4990", 2 * s), 4991u);
}

}  // namespace
}  // namespace rdmabroker
