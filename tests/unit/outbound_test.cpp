// SPDX-License-Identifier: Apache-2.0
// Packing subscriber queues into SENDs, checked against a fake transport: the
// SGE list is gathered exactly as a NIC would, and the gathered bytes must
// decode to the frames that were queued, in order.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "broker/outbound.hpp"

namespace rdmabroker::daemon {
namespace {

constexpr std::uint32_t kBlockKey = 1, kBodyKey = 2;

/// The PUBLISH frame at `off` of `buf`, decoded and validated as the frame
/// handler does it: what the router hands on.
RoutedFrame received(const BufferRef& buf, std::size_t off, std::size_t buffer_size) {
  proto::Frame f;
  const std::span<const std::byte> all(buf.data(), buffer_size);
  EXPECT_EQ(proto::decode_frame(all.subspan(off), buffer_size, f), proto::DecodeStatus::kOk);
  return RoutedFrame::of(f.header, off);
}

class OutboundTest : public ::testing::Test {
 protected:
  void SetUp() override { pool_ = std::move(BufferPool::create(64, 4096).value()); }

  /// A PUBLISH received into a pool buffer, as a delivery to `sid`.
  OutItem delivery(const std::string& subject, const std::string& payload, std::uint32_t sid) {
    std::uint32_t idx;
    EXPECT_EQ(pool_->acquire(&idx, 1), 1u);
    BufferRef buf(pool_.get(), idx);
    const std::size_t n = publish_at(buf, 0, subject, payload);
    EXPECT_EQ(received(buf, 0, 4096).len, n);
    return make_delivery(buf.clone(), sid, received(buf, 0, 4096));
  }
  static std::size_t publish_at(const BufferRef& buf, std::size_t off, const std::string& subject,
                                const std::string& payload, std::span<const proto::HeaderField> headers = {},
                                std::string_view reply = {}) {
    proto::FrameHeader h;
    h.type = proto::FrameType::kPublish;
    return proto::encode_frame({buf.data() + off, 4096 - off}, h, subject, reply,
                               std::as_bytes(std::span<const char>(payload.data(), payload.size())), headers);
  }
  /// The messages inside a DELIVER frame.
  static std::vector<std::string> inner_payloads(const proto::Frame& deliver) {
    std::vector<std::string> out;
    EXPECT_EQ(proto::for_each_delivered(deliver,
                                        [&](const proto::Frame& f) {
                                          out.emplace_back(reinterpret_cast<const char*>(f.payload.data()),
                                                           f.payload.size());
                                        }),
              proto::DecodeStatus::kOk);
    return out;
  }

  /// What the NIC would put on the wire.
  static std::vector<std::byte> gather(const Segment* sge, std::uint32_t n) {
    std::vector<std::byte> out;
    for (std::uint32_t i = 0; i < n; ++i) {
      EXPECT_TRUE(sge[i].lkey == kBlockKey || sge[i].lkey == kBodyKey);
      auto* p = reinterpret_cast<const std::byte*>(sge[i].addr);
      out.insert(out.end(), p, p + sge[i].length);
    }
    return out;
  }

  std::unique_ptr<BufferPool> pool_;
  std::vector<std::byte> block_ = std::vector<std::byte>(kSendBlockSize);
  std::uint64_t seq_ = 1;
  Segment sge_[kMaxSendSge];
  BufferRef refs_[kMaxFramesPerSend];
};

TEST_F(OutboundTest, GatheredBytesDecodeToTheQueuedFrames) {
  std::deque<OutItem> q;
  q.push_back(delivery("a.b", "first", 7));
  q.push_back(make_control(proto::FrameType::kPong, 0));
  q.push_back(delivery("c", std::string(300, 'x'), 8));
  auto packed = pack_send(q, {4096, kMaxSendSge}, block_, kBlockKey, kBodyKey, seq_, sge_, refs_);
  EXPECT_EQ(packed.frames, 3u);
  EXPECT_EQ(packed.deliveries, 2u);
  EXPECT_EQ(packed.delivered_payload, 305u);
  EXPECT_TRUE(q.empty());
  // The PONG and the next delivery's header are adjacent in the block: merged.
  EXPECT_EQ(packed.num_sge, 4u);
  auto wire = gather(sge_, packed.num_sge);
  EXPECT_EQ(wire.size(), packed.bytes);

  proto::Frame f;
  std::size_t off = 0;
  ASSERT_EQ(proto::decode_frame(std::span(wire).subspan(off), 4096, f), proto::DecodeStatus::kOk);
  EXPECT_EQ(f.header.type, proto::FrameType::kDeliver);
  EXPECT_EQ(f.header.arg, 7u);
  EXPECT_EQ(inner_payloads(f), std::vector<std::string>{"first"});
  EXPECT_EQ(f.header.sequence, 1u);
  off += f.header.frame_len();
  ASSERT_EQ(proto::decode_frame(std::span(wire).subspan(off), 4096, f), proto::DecodeStatus::kOk);
  EXPECT_EQ(f.header.type, proto::FrameType::kPong);
  EXPECT_EQ(f.header.sequence, 2u);
  off += f.header.frame_len();
  ASSERT_EQ(proto::decode_frame(std::span(wire).subspan(off), 4096, f), proto::DecodeStatus::kOk);
  EXPECT_EQ(f.header.arg, 8u);
  EXPECT_EQ(inner_payloads(f), std::vector<std::string>{std::string(300, 'x')});
  off += f.header.frame_len();
  EXPECT_EQ(off, wire.size());
  // Zero-copy: the bodies are still referenced by the send.
  EXPECT_TRUE(refs_[0]);
  EXPECT_TRUE(refs_[2]);
}

TEST_F(OutboundTest, StampsEachDeliverWithItsRelayTimeForAVersion5Peer) {
  // SPEC.md §3.4: from its first message's arrival to the post, per DELIVER.
  auto early = delivery("a", "1", 7);
  early.received_at = 4'999'000'000;
  auto late = delivery("b", "2", 8);
  late.received_at = 4'999'900'000;
  auto unknown = delivery("c", "3", 9);  // received_at 0: not measured, sent as 0
  auto stale = delivery("d", "4", 10);
  stale.received_at = 1;  // longer than the word holds: saturates
  std::deque<OutItem> q;
  for (auto* item : {&early, &late, &unknown, &stale}) q.push_back(std::move(*item));
  q.push_back(make_control(proto::FrameType::kPong, 0));
  const std::int64_t posted_at = 5'000'000'000;  // 5 s: more than the word holds since `stale`
  auto packed = pack_send(q, {4096, kMaxSendSge, posted_at}, block_, kBlockKey, kBodyKey, seq_, sge_, refs_);
  ASSERT_EQ(packed.frames, 5u);
  auto wire = gather(sge_, packed.num_sge);
  std::vector<std::uint32_t> relay;
  proto::Frame f;
  for (std::size_t off = 0; off < wire.size(); off += f.header.frame_len()) {
    ASSERT_EQ(proto::decode_frame(std::span(wire).subspan(off), 4096, f), proto::DecodeStatus::kOk);
    relay.push_back(f.header.relay_ns());
  }
  EXPECT_EQ(relay, (std::vector<std::uint32_t>{1'000'000, 100'000, 0, proto::kMaxRelayNs, 0}));
  EXPECT_EQ(relay_ns(5, 5), 1u) << "0 would say 'not measured'";
  // A peer of an older version (posted_at 0) gets the word reserved, 0.
  q.push_back(delivery("e", "5", 11));
  q.back().received_at = 1'000'000;
  packed = pack_send(q, {4096, kMaxSendSge}, block_, kBlockKey, kBodyKey, seq_, sge_, refs_);
  wire = gather(sge_, packed.num_sge);
  ASSERT_EQ(proto::decode_frame(wire, 4096, f), proto::DecodeStatus::kOk);
  EXPECT_EQ(f.header.relay_ns(), 0u);
}

TEST_F(OutboundTest, StopsAtThePeerBufferSize) {
  std::deque<OutItem> q;
  for (int i = 0; i < 3; ++i) q.push_back(delivery("s", std::string(1000, 'y'), 1));
  // Each DELIVER is 32 + (32 + 1 + 1000 -> 1040) = 1072 bytes: two fit in 2500.
  auto packed = pack_send(q, {2500, kMaxSendSge}, block_, kBlockKey, kBodyKey, seq_, sge_, refs_);
  EXPECT_EQ(packed.frames, 2u);
  EXPECT_EQ(packed.bytes, 2144u);
  EXPECT_EQ(q.size(), 1u);
}

TEST_F(OutboundTest, StopsAtTheSgeLimitAndFrameLimit) {
  std::deque<OutItem> q;
  for (int i = 0; i < 20; ++i) q.push_back(delivery("s", "p", 1));
  auto packed = pack_send(q, {65536, 5}, block_, kBlockKey, kBodyKey, seq_, sge_, refs_);
  EXPECT_EQ(packed.frames, 2u);  // 2 SGEs each
  EXPECT_LE(packed.num_sge, 5u);
  for (auto& r : refs_) r.reset();
  packed = pack_send(q, {65536, kMaxSendSge}, block_, kBlockKey, kBodyKey, seq_, sge_, refs_);
  EXPECT_EQ(packed.frames, kMaxFramesPerSend);
  EXPECT_EQ(q.size(), 20u - 2u - kMaxFramesPerSend);
}

TEST_F(OutboundTest, ControlTextIsTruncatedToFitTheBlock) {
  auto item = make_control(proto::FrameType::kError, 1, std::string(5000, 'e'));
  EXPECT_EQ(item.control_text().size(), kMaxControlText);
  std::deque<OutItem> q;
  q.push_back(std::move(item));
  auto packed = pack_send(q, {4096, kMaxSendSge}, block_, kBlockKey, kBodyKey, seq_, sge_, refs_);
  ASSERT_EQ(packed.frames, 1u);
  auto wire = gather(sge_, packed.num_sge);
  proto::Frame f;
  ASSERT_EQ(proto::decode_frame(wire, 4096, f), proto::DecodeStatus::kOk);
  EXPECT_EQ(f.header.type, proto::FrameType::kError);
  EXPECT_EQ(f.payload.size(), kMaxControlText);
}

// Consecutive PUBLISH frames of one received buffer, routed to the same
// subscription, become one DELIVER: two SGEs however many messages.
TEST_F(OutboundTest, ContiguousFramesExtendOneDelivery) {
  std::uint32_t idx;
  ASSERT_EQ(pool_->acquire(&idx, 1), 1u);
  BufferRef buf(pool_.get(), idx);
  std::vector<std::pair<std::uint32_t, std::uint32_t>> at;  // offset, len
  std::size_t off = 0;
  for (int i = 0; i < 5; ++i) {
    const std::size_t n = publish_at(buf, off, "run", std::string("m").append(std::to_string(i)));
    at.emplace_back(static_cast<std::uint32_t>(off), static_cast<std::uint32_t>(n));
    off += n;
  }
  OutItem item = make_delivery(buf.clone(), 3, received(buf, at[0].first, 4096));
  EXPECT_TRUE(extend_delivery(item, buf, 3, received(buf, at[1].first, 4096), 4096));
  EXPECT_FALSE(extend_delivery(item, buf, 4, received(buf, at[2].first, 4096), 4096));  // other subscription
  EXPECT_FALSE(extend_delivery(item, buf, 3, received(buf, at[3].first, 4096), 4096));  // not adjacent
  EXPECT_TRUE(extend_delivery(item, buf, 3, received(buf, at[2].first, 4096), 4096));
  EXPECT_FALSE(
      extend_delivery(item, buf, 3, received(buf, at[3].first, 4096), 32 + item.body_len));  // too long
  EXPECT_EQ(item.messages, 3u);
  EXPECT_EQ(item.payload_bytes, 6u);
  std::deque<OutItem> q;
  q.push_back(std::move(item));
  auto packed = pack_send(q, {4096, kMaxSendSge}, block_, kBlockKey, kBodyKey, seq_, sge_, refs_);
  EXPECT_EQ(packed.frames, 1u);
  EXPECT_EQ(packed.deliveries, 3u);
  EXPECT_EQ(packed.num_sge, 2u);
  auto wire = gather(sge_, packed.num_sge);
  proto::Frame f;
  ASSERT_EQ(proto::decode_frame(wire, 4096, f), proto::DecodeStatus::kOk);
  EXPECT_EQ(inner_payloads(f), (std::vector<std::string>{"m0", "m1", "m2"}));
}

// The router decodes a PUBLISH frame once; what the queues and the
// accounting need of it travels with its item. Proven by wiping the frame's
// header in the buffer after the item is made: nothing changes.
TEST_F(OutboundTest, AFramesFactsTravelWithItsItemSoItsHeaderIsNotReadAgain) {
  std::uint32_t idx;
  ASSERT_EQ(pool_->acquire(&idx, 1), 1u);
  BufferRef buf(pool_.get(), idx);
  const std::string part(100, 'f');
  const proto::HeaderField trace[] = {{"Trace", "t"}};
  const std::size_t first = proto::encode_frame({buf.data(), 4096}, proto::FrameHeader::fragment(300, 0, 77),
                                                "big", "", std::as_bytes(std::span(part)), trace);
  const std::size_t last =
      proto::encode_frame({buf.data() + first, 4096 - first}, proto::FrameHeader::fragment(300, 200, 77), "",
                          "", std::as_bytes(std::span(part)));
  const std::size_t whole = publish_at(buf, first + last, "small", "w", trace);
  OutItem opening = make_delivery(buf.clone(), 3, received(buf, 0, 4096));
  OutItem closing = make_delivery(buf.clone(), 3, received(buf, first, 4096));
  OutItem plain = make_delivery(buf.clone(), 3, received(buf, first + last, 4096));
  std::memset(buf.data(), 0, first + last + whole);

  EXPECT_TRUE(opening.fragment);
  EXPECT_EQ(opening.publisher, 77u);
  EXPECT_EQ(opening.messages, 0u);  // its message completes with a later fragment
  EXPECT_EQ(messages_begun(opening), 1u);
  EXPECT_TRUE(carries_headers(opening));
  EXPECT_TRUE(closing.fragment);
  EXPECT_TRUE(closing.ends);
  EXPECT_EQ(closing.messages, 1u);
  EXPECT_EQ(messages_begun(closing), 0u);  // its message was counted with its first fragment
  EXPECT_FALSE(carries_headers(closing));
  EXPECT_FALSE(plain.fragment);
  EXPECT_EQ(messages_begun(plain), 1u);
  EXPECT_TRUE(carries_headers(plain));
  // A fragment travels alone: nothing joins it, and it joins nothing.
  EXPECT_FALSE(extend_delivery(closing, plain, 4096));
  EXPECT_FALSE(extend_delivery(opening, closing, 4096));
}

// A client of protocol version 1 gets a batch's messages in order, those
// with a header block without it (SPEC.md §3.6): valid version-1 PUBLISH
// frames carrying only the payload, with the frames around them untouched
// and the queue accounting (body_len) unchanged.
TEST_F(OutboundTest, HeaderBlocksAreLeftOutForVersionOneClients) {
  std::uint32_t idx;
  ASSERT_EQ(pool_->acquire(&idx, 1), 1u);
  BufferRef buf(pool_.get(), idx);
  const proto::HeaderField trace[] = {{"Trace-Id", "abc"}, {"Content-Type", "text/plain"}};
  struct Sent {
    std::string payload;
    bool headers;
    std::string reply;
  };
  const std::vector<Sent> sent = {{"plain0", false, ""},   {"with1", true, "_INBOX.x.1"},
                                  {"plain2", false, ""},   {"plain3", false, ""},
                                  {"with4", true, ""},     {"", true, ""},
                                  {"plain6", false, "r.7"}};
  std::size_t off = 0;
  OutItem item;
  for (std::size_t i = 0; i < sent.size(); ++i) {
    const std::size_t n =
        publish_at(buf, off, "h.s", sent[i].payload,
                   sent[i].headers ? std::span(trace) : std::span<const proto::HeaderField>{}, sent[i].reply);
    ASSERT_EQ(received(buf, off, 4096).len, n);
    if (i == 0) {
      item = make_sequenced_delivery(buf.clone(), 9, 100, received(buf, 0, 4096));
    } else {
      ASSERT_TRUE(extend_delivery(item, buf, 9, received(buf, off, 4096), 4096, 100 + i));
    }
    off += n;
  }
  ASSERT_TRUE(carries_headers(item));
  const std::uint32_t body_len = item.body_len;
  auto pieces = split_without_headers(std::move(item));
  // [plain0] [with1] [plain2 plain3] [with4] [""] [plain6]
  ASSERT_EQ(pieces.size(), 6u);
  std::uint32_t sum = 0;
  for (const auto& p : pieces) sum += p.body_len;
  EXPECT_EQ(sum, body_len);
  EXPECT_EQ(pieces[2].messages, 2u);
  EXPECT_FALSE(carries_headers(pieces[2]));
  EXPECT_NE(pieces[1].strip, 0u);

  std::deque<OutItem> q(std::make_move_iterator(pieces.begin()), std::make_move_iterator(pieces.end()));
  std::vector<std::string> payloads, replies;
  std::vector<std::uint64_t> sequences;
  while (!q.empty()) {
    for (auto& r : refs_) r.reset();
    auto packed = pack_send(q, {4096, kMaxSendSge}, block_, kBlockKey, kBodyKey, seq_, sge_, refs_);
    ASSERT_GT(packed.frames, 0u);
    auto wire = gather(sge_, packed.num_sge);
    ASSERT_EQ(wire.size(), packed.bytes);
    for (std::size_t at = 0; at < wire.size();) {
      proto::Frame f;
      ASSERT_EQ(proto::decode_frame(std::span(wire).subspan(at), 4096, f), proto::DecodeStatus::kOk);
      std::uint64_t seq = f.header.sequence;
      ASSERT_EQ(proto::for_each_delivered(f,
                                          [&](const proto::Frame& inner) {
                                            EXPECT_EQ(inner.header.header_len, 0u);
                                            EXPECT_TRUE(inner.headers.empty());
                                            payloads.emplace_back(
                                                reinterpret_cast<const char*>(inner.payload.data()),
                                                inner.payload.size());
                                            replies.emplace_back(inner.reply);
                                            sequences.push_back(seq++);
                                          }),
                proto::DecodeStatus::kOk);
      at += f.header.frame_len();
    }
  }
  std::vector<std::string> want_payloads, want_replies;
  for (const auto& s : sent) {
    want_payloads.push_back(s.payload);
    want_replies.push_back(s.reply);
  }
  EXPECT_EQ(payloads, want_payloads);
  EXPECT_EQ(replies, want_replies);
  EXPECT_EQ(sequences, (std::vector<std::uint64_t>{100, 101, 102, 103, 104, 105, 106}));
}

TEST_F(OutboundTest, NothingFitsMeansNothingPacked) {
  std::deque<OutItem> q;
  q.push_back(delivery("s", std::string(2000, 'z'), 1));
  auto packed = pack_send(q, {1024, kMaxSendSge}, block_, kBlockKey, kBodyKey, seq_, sge_, refs_);
  EXPECT_EQ(packed.frames, 0u);
  EXPECT_EQ(q.size(), 1u);
  EXPECT_EQ(seq_, 1u);
}

// A subscriber whose receive buffers are smaller than the broker's
// (SPEC.md §3.7, "Smaller receive buffers"): every SEND it gets fits them,
// and what it reassembles from the fragments is what was published.
class CutToFitTest : public OutboundTest {
 protected:
  static constexpr std::uint32_t kFrame = 1024;  // the subscriber's receive buffer: the protocol's least

  /// Packs every piece, as the broker would for that subscriber, and decodes
  /// what it receives: each inner frame, in order.
  std::vector<proto::Frame> receive(std::vector<OutItem> pieces) {
    std::deque<OutItem> q(std::make_move_iterator(pieces.begin()), std::make_move_iterator(pieces.end()));
    std::vector<proto::Frame> frames;
    while (!q.empty()) {
      for (auto& r : refs_) r.reset();
      auto packed = pack_send(q, {kFrame, kMaxSendSge}, block_, kBlockKey, kBodyKey, seq_, sge_, refs_);
      EXPECT_GT(packed.frames, 0u);
      if (packed.frames == 0) break;
      wires_.push_back(gather(sge_, packed.num_sge));
      const auto& wire = wires_.back();
      EXPECT_LE(wire.size(), kFrame);
      for (std::size_t at = 0; at < wire.size();) {
        proto::Frame f;
        EXPECT_EQ(proto::decode_frame(std::span(wire).subspan(at), kFrame, f), proto::DecodeStatus::kOk);
        EXPECT_EQ(f.header.type, proto::FrameType::kDeliver);
        EXPECT_EQ(proto::for_each_delivered(f, [&](const proto::Frame& inner) { frames.push_back(inner); }),
                  proto::DecodeStatus::kOk);
        at += f.header.frame_len();
      }
    }
    for (auto& r : refs_) r.reset();  // before big_, which the fixture's refs_ outlive, goes
    return frames;
  }
  static std::string text(std::span<const std::byte> b) {
    return {reinterpret_cast<const char*>(b.data()), b.size()};
  }

  /// A 16 KiB buffer: room for frames larger than the subscriber's.
  BufferRef big_buffer() {
    std::uint32_t idx = 0;
    EXPECT_EQ(big_->acquire(&idx, 1), 1u);
    return BufferRef(big_.get(), idx);
  }

  std::unique_ptr<BufferPool> big_ = std::move(BufferPool::create(4, 16384).value());
  std::deque<std::vector<std::byte>> wires_;  // what was received (the frames' views point here)
};

TEST_F(CutToFitTest, AWholeMessageArrivesAsFragmentsThatReassembleToIt) {
  BufferRef buf = big_buffer();
  const proto::HeaderField trace[] = {{"Trace-Id", "abc"}};
  std::string payload(5001, 'p');
  for (std::size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<char>('a' + i % 26);
  proto::FrameHeader h;
  h.type = proto::FrameType::kPublish;
  h.flags = proto::kFlagRequest;
  h.sequence = 12345;  // the publisher's frame counter: not a fragment's publisher id
  const std::size_t small = publish_at(buf, 0, "s.before", "tiny");
  const std::size_t n = proto::encode_frame({buf.data() + small, 16384 - small}, h, "big.subject", "_INBOX.r",
                                            std::as_bytes(std::span<const char>(payload)), trace);
  const std::size_t tail = publish_at(buf, small + n, "s.after", "tail");
  OutItem item = make_delivery(buf.clone(), 5, received(buf, 0, 16384));
  ASSERT_TRUE(extend_delivery(item, buf, 5, received(buf, small, 16384), 16384));
  ASSERT_TRUE(extend_delivery(item, buf, 5, received(buf, small + n, 16384), 16384));
  ASSERT_EQ(item.body_len, small + n + tail);
  const std::uint32_t body_len = item.body_len;
  const std::uint64_t payload_bytes = item.payload_bytes;

  auto pieces = cut_to_fit(std::move(item), kFrame);
  std::uint32_t sum = 0, messages = 0;
  std::uint64_t payload_sum = 0;
  for (const auto& p : pieces) {
    EXPECT_LE(p.wire_len(), kFrame);
    sum += p.body_len;
    messages += p.messages;
    payload_sum += p.payload_bytes;
  }
  EXPECT_EQ(sum, body_len);  // the queue bounds count what they counted before
  EXPECT_EQ(messages, 3u);
  EXPECT_EQ(payload_sum, payload_bytes);

  const auto frames = receive(std::move(pieces));
  ASSERT_GE(frames.size(), 3u + 5u);
  EXPECT_EQ(text(frames.front().payload), "tiny");
  EXPECT_EQ(text(frames.back().payload), "tail");
  EXPECT_FALSE(frames.back().header.is_fragment());
  // The fragments in between: SPEC.md §3.7's rules 1 to 3, as a subscriber reads them.
  const proto::Frame& first = frames[1];
  ASSERT_TRUE(first.header.is_fragment());
  EXPECT_EQ(first.subject, "big.subject");
  EXPECT_EQ(first.reply, "_INBOX.r");
  EXPECT_NE(first.header.flags & proto::kFlagRequest, 0);
  EXPECT_EQ(first.headers.size(), 16u);
  const std::uint32_t length = first.header.arg;
  EXPECT_EQ(length, payload.size() + 16);
  std::string got;
  std::uint32_t next = 0;
  for (std::size_t i = 1; i + 1 < frames.size(); ++i) {
    const auto& f = frames[i].header;
    ASSERT_TRUE(f.is_fragment()) << i;
    EXPECT_EQ(f.arg, length);
    EXPECT_EQ(f.sequence, 0u) << "a message the broker cut carries no publisher id";
    EXPECT_EQ(f.offset, next) << i;
    if (i > 1) {
      EXPECT_TRUE(frames[i].subject.empty() && frames[i].reply.empty());
      EXPECT_EQ(f.flags & proto::kFlagRequest, 0) << "REQUEST goes with the reply, in the first fragment";
    }
    got += text(frames[i].payload);
    next += f.payload_len;
  }
  EXPECT_EQ(next, length);
  EXPECT_EQ(got, payload);
}

// SPEC.md §3.7, "Smaller receive buffers": each piece carries at most
// recv_buffer_size - 64 bytes of the frame rounded down to a multiple of 8,
// and every piece but the frame's last a multiple of 8 bytes of it (subject,
// reply, header block and payload together), so a later piece's payload
// offset is the first piece's payload bytes plus multiples of 8. Subjects and
// replies of odd lengths, payloads around the boundaries.
TEST_F(CutToFitTest, EveryCutPieceButTheLastIsAMultipleOfEightBytesOfTheFrame) {
  const std::uint32_t bound = (kFrame - 64) / 8 * 8;
  for (const auto& [subject, reply] :
       {std::pair<std::string, std::string>{"a", ""}, {"odd.subject", "_INBOX.xyz"}, {"s.7chars", "r"}}) {
    for (const std::size_t size :
         {std::size_t{bound}, std::size_t{bound + 1}, std::size_t{3 * bound - 5}, std::size_t{5001}}) {
      BufferRef buf = big_buffer();
      std::string payload(size, 'p');
      for (std::size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<char>('a' + i % 26);
      proto::FrameHeader h;
      h.type = proto::FrameType::kPublish;
      const std::size_t n = proto::encode_frame({buf.data(), 16384}, h, subject, reply,
                                                std::as_bytes(std::span<const char>(payload)));
      auto pieces = cut_to_fit(make_delivery(buf.clone(), 3, received(buf, 0, 16384)), kFrame);
      ASSERT_EQ(received(buf, 0, 16384).len, n);
      const auto frames = receive(std::move(pieces));
      ASSERT_GE(frames.size(), 2u) << subject << " " << size;
      const std::uint32_t first_payload = frames.front().header.payload_len;
      std::string got;
      for (std::size_t i = 0; i < frames.size(); ++i) {
        const auto& f = frames[i];
        const std::size_t frame_bytes =
            f.subject.size() + f.reply.size() + f.headers.size() + f.header.payload_len;
        EXPECT_LE(frame_bytes, bound) << subject << " " << size << " piece " << i;
        if (i + 1 < frames.size()) {
          EXPECT_EQ(frame_bytes % 8, 0u) << subject << " " << size << " piece " << i;
        }
        if (i > 0) {
          EXPECT_EQ((f.header.offset - first_payload) % 8, 0u) << subject << " " << size << " piece " << i;
        }
        got += text(f.payload);
      }
      EXPECT_EQ(got, payload) << subject << " " << size;
    }
  }
}

TEST_F(CutToFitTest, APublishersFragmentIsCutFurtherAndKeepsItsOffsetsAndPublisher) {
  BufferRef buf = big_buffer();
  const std::string part(3000, 'q');
  // A middle fragment of a 100,000-byte message of the publisher whose connection id is 77.
  const std::size_t n =
      proto::encode_frame({buf.data(), 16384}, proto::FrameHeader::fragment(100000, 40000, 77), "", "",
                          std::as_bytes(std::span(part)));
  auto pieces = cut_to_fit(make_delivery(buf.clone(), 3, received(buf, 0, 16384)), kFrame);
  ASSERT_EQ(received(buf, 0, 16384).len, n);
  ASSERT_GT(pieces.size(), 3u);
  EXPECT_EQ(pieces.back().messages, 0u);  // not the message's last fragment: nothing completes
  const auto frames = receive(std::move(pieces));
  std::uint32_t next = 40000;
  std::string got;
  for (const auto& f : frames) {
    ASSERT_TRUE(f.header.is_fragment());
    EXPECT_EQ(f.header.sequence, 77u);
    EXPECT_EQ(f.header.arg, 100000u);
    EXPECT_EQ(f.header.offset, next);
    next += f.header.payload_len;
    got += text(f.payload);
  }
  EXPECT_EQ(got, part);
}

TEST_F(CutToFitTest, AFrameWhoseHeadersFillTheBufferStaysWholeForTheCallerToDrop) {
  BufferRef buf = big_buffer();
  const std::string value(1000, 'v');
  const proto::HeaderField fat[] = {{"Fat", value}};
  proto::FrameHeader h;
  h.type = proto::FrameType::kPublish;
  const std::string payload(2000, 'x');
  const std::size_t n =
      proto::encode_frame({buf.data(), 16384}, h, "s", "", std::as_bytes(std::span(payload)), fat);
  auto pieces = cut_to_fit(make_delivery(buf.clone(), 3, received(buf, 0, 16384)), kFrame);
  ASSERT_EQ(received(buf, 0, 16384).len, n);
  ASSERT_EQ(pieces.size(), 1u);
  EXPECT_GT(pieces[0].wire_len(), kFrame);
  EXPECT_EQ(pieces[0].cut_start, 0u);
  EXPECT_EQ(pieces[0].messages, 1u);
}

}  // namespace
}  // namespace rdmabroker::daemon
