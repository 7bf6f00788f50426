// SPDX-License-Identifier: Apache-2.0
// The parts of the client's session, each on its own (client-lib/src/session.hpp):
// send buffers and batching, reassembly of fragments, multicast sequencing,
// requests. The library's own tests (tests/rdma) run them together.
#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "multicast_streams.hpp"
#include "reassembly.hpp"
#include "requests.hpp"
#include "send_buffers.hpp"

namespace rdmabroker {
namespace {

ByteView bytes(std::string_view s) { return {reinterpret_cast<const std::byte*>(s.data()), s.size()}; }
std::string text(std::span<const std::byte> b) { return {reinterpret_cast<const char*>(b.data()), b.size()}; }

/// The frames in `data`, decoded.
std::vector<proto::Frame> frames_in(std::span<const std::byte> data) {
  std::vector<proto::Frame> out;
  for (std::size_t off = 0; off < data.size();) {
    proto::Frame f;
    EXPECT_EQ(proto::decode_frame(data.subspan(off), data.size() - off, f), proto::DecodeStatus::kOk);
    out.push_back(f);
    off += f.header.frame_len();
  }
  return out;
}

proto::FrameHeader publish_header() {
  proto::FrameHeader h;
  h.type = proto::FrameType::kPublish;
  return h;
}

/// Encodes a PUBLISH of `payload` on `subject` into `buf` at `len` and appends it.
void append_publish(SendBuffers& s, std::string_view subject, std::string_view payload,
                    std::uint64_t seq = 0) {
  const std::size_t len = proto::align_up(proto::kHeaderSize + subject.size() + payload.size());
  ASSERT_TRUE(s.make_room(len));
  s.append(len, publish_header(), subject, {}, bytes(payload), seq, {});
}

TEST(SendBuffers, AnIdleConnectionSendsTheOpenBufferAtOnce) {
  SendBuffers s;
  s.init(1024, 2);
  append_publish(s, "a", "one");
  ASSERT_TRUE(s.has_ready());
  const auto [buf, len] = s.take_ready();
  ASSERT_NE(buf, SendBuffers::kNone);
  const auto frames = frames_in({s.buffer(buf), len});
  ASSERT_EQ(frames.size(), 1u);
  EXPECT_EQ(frames[0].subject, "a");
  EXPECT_EQ(text(frames[0].payload), "one");
  EXPECT_FALSE(s.has_ready());
  EXPECT_EQ(s.take_ready().first, SendBuffers::kNone);
}

TEST(SendBuffers, FramesBatchInOrderAndAFullBufferWaitsForTheNext) {
  SendBuffers s;
  s.init(1024, 2);
  const std::string big(400, 'x');
  append_publish(s, "a", big);  // frames of 440 bytes: two fit in 1,024
  append_publish(s, "b", big);
  append_publish(s, "c", big, 77);  // closes the first buffer, opens the second
  const auto [first, first_len] = s.take_ready();
  const auto batch = frames_in({s.buffer(first), first_len});
  ASSERT_EQ(batch.size(), 2u);
  EXPECT_EQ(batch[0].subject, "a");
  EXPECT_EQ(batch[1].subject, "b");
  EXPECT_EQ(batch[0].header.sequence, 1u);  // numbered in order
  EXPECT_EQ(batch[1].header.sequence, 2u);
  // Both buffers taken: no room until one comes back.
  EXPECT_FALSE(s.has_free());
  const auto [second, second_len] = s.take_ready();
  const auto last = frames_in({s.buffer(second), second_len});
  ASSERT_EQ(last.size(), 1u);
  EXPECT_EQ(last[0].header.sequence, 77u);  // a sequence given is kept
  EXPECT_FALSE(s.make_room(8));
  s.release(first);
  EXPECT_TRUE(s.make_room(8));
}

proto::Frame fragment_of(std::vector<std::byte>& storage, std::uint32_t length, std::uint32_t offset,
                         std::uint64_t publisher, std::string_view subject, std::string_view chunk) {
  storage.assign(proto::align_up(proto::kHeaderSize + subject.size() + chunk.size()), std::byte{});
  proto::encode_frame(storage, proto::FrameHeader::fragment(length, offset, publisher), subject, {},
                      bytes(chunk));
  proto::Frame f;
  EXPECT_EQ(proto::decode_frame(storage, storage.size(), f), proto::DecodeStatus::kOk);
  return f;
}

TEST(Reassembler, AMessageIsHandedOverWholeWithItsLastFragment) {
  Reassembler r;
  Deliveries d;
  std::vector<std::byte> b1, b2, b3;
  r.on_fragment(5, 1, fragment_of(b1, 12, 0, 9, "big", "abcd"), 0, d);
  r.on_fragment(5, 1, fragment_of(b2, 12, 4, 9, "", "efgh"), 0, d);
  EXPECT_TRUE(d.empty());
  r.on_fragment(5, 1, fragment_of(b3, 12, 8, 9, "", "ijkl"), 1234, d);
  ASSERT_EQ(d.entries.size(), 1u);
  const Message& m = d.owned[d.entries[0].owned];
  EXPECT_EQ(m.subject, "big");
  EXPECT_EQ(m.sid, 5u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(m.payload.data()), m.payload.size()), "abcdefghijkl");
  EXPECT_EQ(d.entries[0].view.relay_time, std::chrono::nanoseconds(1234));
  EXPECT_EQ(r.aborted(), 0u);
}

TEST(Reassembler, AFragmentOutOfPlaceOrAnAbortEndsTheMessageCounted) {
  Reassembler r;
  Deliveries d;
  std::vector<std::byte> b1, b2, b3, b4;
  r.on_fragment(5, 1, fragment_of(b1, 12, 0, 9, "big", "abcd"), 0, d);
  r.on_fragment(5, 1, fragment_of(b2, 12, 8, 9, "", "ijkl"), 0, d);  // skips 4..8
  EXPECT_EQ(r.aborted(), 1u);
  r.on_fragment(5, 1, fragment_of(b3, 12, 4, 9, "", "efgh"), 0, d);  // nothing begun now: ignored
  EXPECT_TRUE(d.empty());
  r.abort(5, 9);  // nothing open: not counted
  EXPECT_EQ(r.aborted(), 1u);
  r.on_fragment(6, 1, fragment_of(b4, 12, 0, 3, "other", "abcd"), 0, d);
  r.abort(6, 3);
  EXPECT_EQ(r.aborted(), 2u);
  EXPECT_TRUE(d.empty());
}

/// Registers in memory and records what it was asked, as the session over RDMA would.
struct FakeHost : LandingHost {
  std::optional<std::uint32_t> expose_for_write(std::uint32_t sid, std::uint64_t publisher, std::byte* data,
                                                std::size_t length) override {
    if (refuse) return std::nullopt;
    areas.push_back({sid, publisher, data, length});
    return 77;
  }
  void release_landing(std::uint32_t sid, std::uint64_t publisher) override {
    released.emplace_back(sid, publisher);
  }
  void send_ready(std::uint32_t sid, std::uint64_t sequence, const proto::LandingArea& area) override {
    readies.push_back({sid, sequence, area});
  }
  struct Area {
    std::uint32_t sid;
    std::uint64_t publisher;
    std::byte* data;
    std::size_t length;
  };
  struct Ready {
    std::uint32_t sid;
    std::uint64_t sequence;
    proto::LandingArea area;
  };
  bool refuse = false;
  std::vector<Area> areas;
  std::vector<std::pair<std::uint32_t, std::uint64_t>> released;
  std::vector<Ready> readies;
};

TEST(Reassembler, ALargeMessageLandsTheBrokerWritesTheMiddleAndTheLastCompletesIt) {
  FakeHost host;
  Reassembler r;
  r.set_landing(&host, 12);
  Deliveries d;
  std::vector<std::byte> b1, b2, b3;
  r.on_fragment(5, 40, fragment_of(b1, 16, 0, 9, "big", "abcd"), 0, d);
  ASSERT_EQ(host.areas.size(), 1u);
  ASSERT_EQ(host.readies.size(), 1u);
  EXPECT_EQ(host.areas[0].length, 16u);
  EXPECT_EQ(host.readies[0].sid, 5u);
  EXPECT_EQ(host.readies[0].sequence, 40u) << "RDV_READY names the first fragment's DELIVER";
  EXPECT_EQ(host.readies[0].area.publisher, 9u);
  EXPECT_EQ(host.readies[0].area.rkey, 77u);
  EXPECT_EQ(host.readies[0].area.address, reinterpret_cast<std::uint64_t>(host.areas[0].data))
      << "byte o of the message at address + o (no header block here)";
  // The first fragment's bytes are in place; the broker WRITEs 4..12.
  std::memcpy(host.areas[0].data + 4, "efghijkl", 8);
  r.on_fragment(5, 41, fragment_of(b3, 16, 12, 9, "", "mnop"), 0, d);
  ASSERT_EQ(d.entries.size(), 1u);
  const Message& m = d.owned[d.entries[0].owned];
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(m.payload.data()), m.payload.size()),
            "abcdefghijklmnop");
  ASSERT_EQ(host.released.size(), 1u) << "deregistered once whole";
  EXPECT_EQ(r.landed(), 1u);
  EXPECT_EQ(r.aborted(), 0u);
  (void)b2;
}

TEST(Reassembler, FragmentsSentBeforeTheBrokerTookTheAreaAndAnAbortBothKeepItRight) {
  FakeHost host;
  Reassembler r;
  r.set_landing(&host, 12);
  Deliveries d;
  std::vector<std::byte> b1, b2, b3, b4, b5;
  r.on_fragment(5, 1, fragment_of(b1, 12, 0, 9, "big", "abcd"), 0, d);
  r.on_fragment(5, 2, fragment_of(b2, 12, 4, 9, "", "efgh"), 0, d);  // sent before READY arrived
  r.on_fragment(5, 3, fragment_of(b3, 12, 8, 9, "", "ijkl"), 0, d);
  ASSERT_EQ(d.entries.size(), 1u);
  const Message& m = d.owned[d.entries[0].owned];
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(m.payload.data()), m.payload.size()), "abcdefghijkl");
  // A middle fragment past a gap is no last one: the message is dropped, its area let go.
  r.on_fragment(5, 4, fragment_of(b4, 16, 0, 9, "big", "abcd"), 0, d);
  r.on_fragment(5, 5, fragment_of(b5, 16, 8, 9, "", "ijkl"), 0, d);
  EXPECT_EQ(r.aborted(), 1u);
  EXPECT_EQ(host.released.size(), 2u);
  // ABORT lets the area go too; a message below the minimum never lands.
  r.on_fragment(6, 6, fragment_of(b1, 12, 0, 3, "other", "abcd"), 0, d);
  r.abort(6, 3);
  EXPECT_EQ(host.released.size(), 3u);
  r.on_fragment(7, 7, fragment_of(b2, 8, 0, 3, "small", "abcd"), 0, d);
  EXPECT_EQ(host.areas.size(), 3u);
  // Refused by the host (no registration): answered with no area, and
  // fragments as ever.
  host.refuse = true;
  r.on_fragment(8, 8, fragment_of(b3, 12, 0, 4, "big", "abcd"), 0, d);
  r.on_fragment(8, 9, fragment_of(b4, 12, 4, 4, "", "efghijkl"), 0, d);
  EXPECT_EQ(d.entries.size(), 2u);
  ASSERT_EQ(host.readies.size(), 4u) << "every first fragment from the minimum on is answered";
  EXPECT_EQ(host.readies[3].area.address, 0u);
  EXPECT_EQ(host.readies[3].area.rkey, 0u);
  EXPECT_EQ(host.readies[3].area.publisher, 4u);
}

TEST(Reassembler, AtMostFourMessagesLandAtOnce) {
  FakeHost host;
  Reassembler r;
  r.set_landing(&host, 12);
  Deliveries d;
  std::vector<std::vector<std::byte>> b(6);
  for (std::uint32_t i = 0; i < 6; ++i)
    r.on_fragment(i, i + 1, fragment_of(b[i], 12, 0, 9, "big", "abcd"), 0, d);
  EXPECT_EQ(host.areas.size(), Reassembler::kMaxLandings);
  ASSERT_EQ(host.readies.size(), 6u) << "the two beyond the bound are answered with no area";
  EXPECT_EQ(host.readies[5].area.address, 0u);
}

Message numbered(int n) {
  Message m;
  m.subject = "m" + std::to_string(n);
  return m;
}

std::vector<std::string> subjects(Deliveries& d) {
  std::vector<std::string> out;
  for (const auto& e : d.entries) out.push_back(d.owned[e.owned].subject);
  d.clear();
  return out;
}

TEST(SequencedStreams, EachMessageOnceInOrderWhicheverPathBroughtIt) {
  SequencedStreams s;
  Deliveries d;
  s.joined(1, 7, 10);
  s.add(1, 11, numbered(11), d, true);  // early: waits for 10
  EXPECT_TRUE(d.empty());
  s.add(1, 10, numbered(10), d, false);
  EXPECT_EQ(subjects(d), (std::vector<std::string>{"m10", "m11"}));
  s.add(1, 10, numbered(10), d, true);  // the other path's copy
  s.add(1, 11, numbered(11), d, false);
  EXPECT_TRUE(d.empty());
  EXPECT_EQ(s.duplicates.load(), 2u);
  EXPECT_EQ(s.multicast_messages.load(), 1u);  // the group's copies that were delivered
}

TEST(SequencedStreams, AGapIsAskedForAfterAWhileAndALossIsReported) {
  SequencedStreams s;
  Deliveries d;
  s.joined(1, 7, 1);
  s.add(1, 1, numbered(1), d, true);
  s.add(1, 3, numbered(3), d, true);  // 2 is missing
  EXPECT_EQ(subjects(d), (std::vector<std::string>{"m1"}));
  std::vector<SequencedStreams::Repair> repairs;
  const auto now = Clock::now();
  EXPECT_GT(s.due_repairs(now, repairs), 0);  // not yet: it may be on the other path
  EXPECT_TRUE(repairs.empty());
  s.due_repairs(now + std::chrono::milliseconds(50), repairs);
  ASSERT_EQ(repairs.size(), 1u);
  EXPECT_EQ(repairs[0].sid, 1u);
  EXPECT_EQ(repairs[0].first, 2u);
  EXPECT_EQ(repairs[0].count, 1u);
  std::vector<Error> errors;
  s.lost(1, 2, 1, d, errors);  // beyond the broker's window
  EXPECT_EQ(subjects(d), (std::vector<std::string>{"m3"}));
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].kind, ErrorKind::kMessagesLost);
  EXPECT_EQ(s.messages_lost.load(), 1u);
  EXPECT_EQ(s.forget_ended([](std::uint32_t) { return false; }), std::vector<std::uint32_t>{1});
  EXPECT_TRUE(s.empty());
}

TEST(PendingRequests, EachRequestGetsTheAnswerToItsOwnSubjectOnce) {
  PendingRequests r;
  r.set_inbox(PendingRequests::new_inbox());
  EXPECT_EQ(r.inbox().rfind("_INBOX.", 0), 0u);
  EXPECT_EQ(r.inbox().size(), 7u + 16u);
  const std::string a = r.open();
  const std::string b = r.open();
  EXPECT_NE(a, b);
  Message reply;
  reply.subject = a;
  reply.payload = {std::byte{'y'}};
  const MessageView view(reply);
  EXPECT_TRUE(r.answer(a, view));
  EXPECT_FALSE(r.answer(a, view));  // a duplicate
  EXPECT_TRUE(r.done(a));
  EXPECT_FALSE(r.done(b));
  EXPECT_TRUE(r.no_responders(b));
  const auto got = r.close(a);
  EXPECT_TRUE(got.done);
  EXPECT_FALSE(got.no_responders);
  EXPECT_EQ(got.reply.payload.size(), 1u);
  EXPECT_TRUE(r.close(b).no_responders);
  EXPECT_FALSE(r.answer(a, view));  // closed: late
}

}  // namespace
}  // namespace rdmabroker
