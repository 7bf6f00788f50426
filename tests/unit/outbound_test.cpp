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

class OutboundTest : public ::testing::Test {
 protected:
  void SetUp() override { pool_ = std::move(BufferPool::create(64, 4096).value()); }

  /// A PUBLISH received into a pool buffer, as a delivery to `sid`.
  OutItem delivery(const std::string& subject, const std::string& payload, std::uint32_t sid) {
    std::uint32_t idx;
    EXPECT_EQ(pool_->acquire(&idx, 1), 1u);
    BufferRef buf(pool_.get(), idx);
    proto::FrameHeader h;
    h.type = proto::FrameType::kPublish;
    const std::size_t n = proto::encode_frame({buf.data(), 4096}, h, subject, {},
                                              std::as_bytes(std::span<const char>(payload.data(), payload.size())));
    OutItem item;
    item.header.type = proto::FrameType::kDeliver;
    item.header.arg = sid;
    item.header.subject_len = static_cast<std::uint16_t>(subject.size());
    item.header.payload_len = static_cast<std::uint32_t>(payload.size());
    item.body = std::move(buf);
    item.body_offset = proto::kHeaderSize;
    item.body_len = static_cast<std::uint32_t>(n - proto::kHeaderSize);
    return item;
  }

  /// What the NIC would put on the wire.
  static std::vector<std::byte> gather(const ibv_sge* sge, std::uint32_t n) {
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
  ibv_sge sge_[kMaxSendSge];
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
  EXPECT_EQ(f.subject, "a.b");
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(f.payload.data()), f.payload.size()), "first");
  EXPECT_EQ(f.header.sequence, 1u);
  off += f.header.frame_len();
  ASSERT_EQ(proto::decode_frame(std::span(wire).subspan(off), 4096, f), proto::DecodeStatus::kOk);
  EXPECT_EQ(f.header.type, proto::FrameType::kPong);
  EXPECT_EQ(f.header.sequence, 2u);
  off += f.header.frame_len();
  ASSERT_EQ(proto::decode_frame(std::span(wire).subspan(off), 4096, f), proto::DecodeStatus::kOk);
  EXPECT_EQ(f.header.arg, 8u);
  EXPECT_EQ(f.payload.size(), 300u);
  off += f.header.frame_len();
  EXPECT_EQ(off, wire.size());
  // Zero-copy: the bodies are still referenced by the send.
  EXPECT_TRUE(refs_[0]);
  EXPECT_TRUE(refs_[2]);
}

TEST_F(OutboundTest, StopsAtThePeerBufferSize) {
  std::deque<OutItem> q;
  for (int i = 0; i < 3; ++i) q.push_back(delivery("s", std::string(1000, 'y'), 1));
  // Each frame is 32 + 1 + 1000 -> 1040 bytes: two fit in 2500.
  auto packed = pack_send(q, {2500, kMaxSendSge}, block_, kBlockKey, kBodyKey, seq_, sge_, refs_);
  EXPECT_EQ(packed.frames, 2u);
  EXPECT_EQ(packed.bytes, 2080u);
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
  EXPECT_EQ(item.text.size(), kMaxControlText);
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

TEST_F(OutboundTest, NothingFitsMeansNothingPacked) {
  std::deque<OutItem> q;
  q.push_back(delivery("s", std::string(2000, 'z'), 1));
  auto packed = pack_send(q, {1024, kMaxSendSge}, block_, kBlockKey, kBodyKey, seq_, sge_, refs_);
  EXPECT_EQ(packed.frames, 0u);
  EXPECT_EQ(q.size(), 1u);
  EXPECT_EQ(seq_, 1u);
}

}  // namespace
}  // namespace rdmabroker::daemon
