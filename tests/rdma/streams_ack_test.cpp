// SPDX-License-Identifier: Apache-2.0
// Acknowledged publishing (proto/SPEC.md §3.10, docs/streams.md) as users
// meet it, over RDMA (in the guest) and TCP (on the host): a PUB_ACK names
// the stream and sequence once the message is durable; every refusal is
// typed; a Msg-Id sent again is stored once, even across a restart; a run
// of messages is answered by one PUB_ACK range (version 12), one each for
// an older client; a write the disk cuts short is answered in order; a subscriber of an older version never
// sees the ACK flag; every broken rule closes only its sender; and a broker killed with SIGKILL in the middle
// of a storm of acknowledged publishes has every acknowledged message once, in each publisher's order, when
// it comes back.
#include <gtest/gtest.h>
#include <signal.h>

#include <array>
#include <atomic>
#include <filesystem>
#include <map>
#include <set>
#include <mutex>
#include <thread>

#include "harness.hpp"
#include "rdmabroker/proto/pub_ack.hpp"
#include "rdmabroker/client.hpp"
#include "stream_files.hpp"

namespace rdmabroker::test {
namespace {

using namespace std::chrono_literals;
using proto::ErrorCode;
using proto::FrameType;
namespace fs = std::filesystem;

class StreamAcks : public StreamTest {};

TEST_P(StreamAcks, APubAckNamesTheStreamAndSequenceAndEveryRefusalIsTyped) {
  start(
      "  - {name: ORDERS, subjects: [\"orders.>\"]}\n"
      "  - {name: FULL, subjects: [full], max_msgs: 1, discard: new}\n"
      "  - {name: SMALL, subjects: [small], max_msg_size: 16}\n");
  auto c = connect_via(*broker_, GetParam());
  auto watcher = connect_via(*broker_, GetParam());
  ASSERT_TRUE(c && watcher);
  auto elsewhere = watcher->subscribe(std::string_view("elsewhere"));
  ASSERT_TRUE(elsewhere && watcher->flush(10s));

  auto first = c->publish_acked("orders.eu", "one", 10s);
  ASSERT_TRUE(first) << first.error().message;
  EXPECT_EQ(first->stream, "ORDERS");
  EXPECT_EQ(first->sequence, 1u);
  EXPECT_FALSE(first->duplicate);
  const Headers id{{"Msg-Id", "order-7"}};
  auto seven = c->publish_acked("orders.eu", id, as_payload(std::string_view("seven")), 10s);
  ASSERT_TRUE(seven) << seven.error().message;
  EXPECT_EQ(seven->sequence, 2u);
  auto again = c->publish_acked("orders.eu", id, as_payload(std::string_view("seven")), 10s);
  ASSERT_TRUE(again) << again.error().message;
  EXPECT_EQ(again->sequence, 2u) << "a retry of the same Msg-Id is the first one";
  EXPECT_TRUE(again->duplicate);

  auto none = c->publish_acked("elsewhere", "x", 10s);
  ASSERT_FALSE(none);
  EXPECT_EQ(none.error().kind, ErrorKind::kNoStream) << none.error().message;
  auto relayed = elsewhere.value()->next(10s);
  ASSERT_TRUE(relayed) << "a subject without a stream is relayed all the same";
  EXPECT_EQ(relayed->data(), "x");

  ASSERT_TRUE(c->publish_acked("full", "fits", 10s));
  auto full = c->publish_acked("full", "does not", 10s);
  ASSERT_FALSE(full);
  EXPECT_EQ(full.error().kind, ErrorKind::kStreamFull) << full.error().message;
  auto large = c->publish_acked("small", std::string(100, 'x'), 10s);
  ASSERT_FALSE(large);
  EXPECT_EQ(large.error().kind, ErrorKind::kPayloadTooLarge) << large.error().message;

  // The CLI prints the stream and sequence.
  auto [rc, out] = run({cli_path(), "pub", "orders.cli", "from the CLI", "--ack",
                        cli_where(*broker_, GetParam())[0], cli_where(*broker_, GetParam())[1]});
  EXPECT_EQ(rc, 0);
  EXPECT_EQ(out, "ORDERS 3\n");
  auto s = broker_->stats();
  EXPECT_EQ(s["stream.ORDERS.messages"], 3);
  EXPECT_EQ(s["stream.ORDERS.duplicates"], 1);
  EXPECT_EQ(s["stream.FULL.refused_full"], 1);
  EXPECT_EQ(s["stream.SMALL.refused_too_large"], 1);
}

TEST_P(StreamAcks, AnOlderSubscriberNeverSeesTheAckFlag) {
  start("  - {name: S, subjects: [\"s.>\"]}\n");
  auto old = raw_wire(*broker_, GetParam(), true, proto::ConnectRequest{16384, 16, 0, /*max_version=*/9});
  ASSERT_TRUE(old);
  EXPECT_EQ(old->accept.version, 9);
  ASSERT_TRUE(old->send(frame(FrameType::kSubscribe, 1, "s.>")));
  auto c = connect_via(*broker_, GetParam());
  ASSERT_TRUE(c);
  ASSERT_TRUE(c->flush(10s));
  std::this_thread::sleep_for(200ms);  // the raw SUBSCRIBE is in before the publish
  ASSERT_TRUE(c->publish_acked("s.x", "acked", 10s));
  std::uint16_t flags = 0xffff;
  EXPECT_EQ(read_delivered(*old, 1, 10s, [&](const proto::Frame& f) { flags = f.header.flags; }), 1u);
  EXPECT_EQ(flags, 0) << "the inner PUBLISH is relayed without ACK";
}

// SPEC.md §3.10, "Ranges": a client of version 12 that sends a run of
// acknowledged publishes in one go is answered by a PUB_ACK with RANGE per
// run (one per sync, not one per message), every id once with its own
// sequence; a client of version 11 still gets one PUB_ACK per message.
TEST_P(StreamAcks, ARunOfStoredMessagesIsAnsweredByOneRangeAndAnOlderClientByOneEach) {
  start("  - {name: S, subjects: [\"s.>\"]}\n");
  constexpr std::uint64_t kRun = 20;
  std::uint64_t next_sequence = 1;
  for (const std::uint8_t version : {proto::kAckRangesVersion, proto::kConsumersVersion}) {
    SCOPED_TRACE("version " + std::to_string(version));
    auto w = raw_wire(*broker_, GetParam(), true, proto::ConnectRequest{16384, 16, 0, version});
    ASSERT_TRUE(w);
    ASSERT_EQ(w->accept.version, version);
    std::vector<std::byte> run;  // ids 101..120, in one SEND
    for (std::uint64_t id = 101; id < 101 + kRun; ++id) {
      const auto f = publish_frame("s.run", proto::kFlagAck, id);
      run.insert(run.end(), f.begin(), f.end());
    }
    ASSERT_TRUE(w->send(run));
    std::map<std::uint64_t, std::uint64_t> sequence_of;  // id -> stream sequence
    std::size_t frames = 0, ranges = 0, answers = 0;
    const auto deadline = std::chrono::steady_clock::now() + 20s;
    while (answers < kRun && std::chrono::steady_clock::now() < deadline) {
      for (const auto& bytes : w->receive(1s)) {
        proto::Frame f;
        ASSERT_EQ(proto::decode_frame(bytes, bytes.size(), f), proto::DecodeStatus::kOk);
        if (f.header.type != FrameType::kPubAck) continue;
        ++frames;
        ranges += (f.header.flags & proto::kFlagRange) != 0 ? 1 : 0;
        const auto a = proto::pub_ack_answer(f);
        EXPECT_EQ(f.header.arg, 0u);
        EXPECT_EQ(a.stream, "S");
        for (std::uint32_t i = 0; i < a.count; ++i) {
          EXPECT_TRUE(sequence_of.emplace(a.first_id + i, a.first_sequence + i).second)
              << "id " << a.first_id + i << " answered twice";
          ++answers;
        }
      }
    }
    ASSERT_EQ(answers, kRun);
    for (std::uint64_t id = 101; id < 101 + kRun; ++id) {
      EXPECT_EQ(sequence_of[id], next_sequence++) << "id " << id;
    }
    if (version >= proto::kAckRangesVersion) {
      EXPECT_GE(ranges, 1u);
      EXPECT_LT(frames, kRun) << "a run is answered in ranges";
    } else {
      EXPECT_EQ(ranges, 0u) << "a version-11 client knows no RANGE";
      EXPECT_EQ(frames, kRun);
    }
  }
  auto s = broker_->stats();
  EXPECT_EQ(s["stream.S.acks"], static_cast<std::int64_t>(2 * kRun));
  EXPECT_LT(s["stream.S.ack_frames"], static_cast<std::int64_t>(2 * kRun));
  EXPECT_EQ(s["stream.S.messages"], static_cast<std::int64_t>(2 * kRun));
}

// SPEC.md §3.10 rule 1 when the disk fills in the middle of a batch: a run
// of acknowledged publishes in one SEND, of which the file system has room
// for the first few. Those are stored and acknowledged once synced, the rest
// refused with DISK_FULL, and the publisher gets every answer in the order
// of its PUBLISHes: the refusals after the acknowledgements of the stored
// messages before them, not ahead of them.
TEST_P(StreamAcks, AWriteCutShortByAFullDiskIsAnsweredInThePublishersOrder) {
  if (::geteuid() != 0) GTEST_SKIP() << "mounting a tmpfs needs root (CI and the guest have it)";
  ASSERT_NO_FATAL_FAILURE(mount_small_disk("512k"));
  start("  - {name: S, subjects: [\"s.>\"]}\n");
  auto w = raw_wire(*broker_, GetParam(), true, proto::ConnectRequest{16384, 16, 0, proto::kProtocolVersion});
  ASSERT_TRUE(w);
  // Fill the file system a page at a time, then free two pages: room for
  // about seven of the messages below.
  const auto pages = fill_small_disk();
  ASSERT_GE(pages.size(), 2u);
  fs::remove(pages.back());
  fs::remove(pages[pages.size() - 2]);

  constexpr std::uint64_t kRun = 14;  // 14 x ~1 KiB: one SEND, one batch
  const std::string payload(1000, 'p');
  std::vector<std::byte> run;
  for (std::uint64_t id = 1; id <= kRun; ++id) {
    const auto f = publish_frame("s.x", proto::kFlagAck, id, payload);
    run.insert(run.end(), f.begin(), f.end());
  }
  ASSERT_TRUE(w->send(run));
  std::vector<std::pair<std::uint64_t, ErrorCode>> answers;  // in the order they came
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while (answers.size() < kRun && std::chrono::steady_clock::now() < deadline) {
    for (const auto& bytes : w->receive(1s)) {
      proto::Frame f;
      ASSERT_EQ(proto::decode_frame(bytes, bytes.size(), f), proto::DecodeStatus::kOk);
      if (f.header.type != FrameType::kPubAck) continue;
      const auto a = proto::pub_ack_answer(f);
      for (std::uint32_t i = 0; i < a.count; ++i) {
        answers.emplace_back(a.first_id + i, static_cast<ErrorCode>(f.header.arg));
      }
    }
  }
  ASSERT_EQ(answers.size(), kRun);
  std::size_t stored = 0;
  for (std::size_t i = 0; i < answers.size(); ++i) {
    EXPECT_EQ(answers[i].first, i + 1) << "answer " << i << " of " << kRun << ": PUBLISH order";
    if (answers[i].second == ErrorCode::kNone) {
      EXPECT_EQ(stored, i) << "id " << answers[i].first << " stored after a refused one";
      ++stored;
    } else {
      EXPECT_EQ(answers[i].second, ErrorCode::kDiskFull) << "id " << answers[i].first;
    }
  }
  EXPECT_GT(stored, 0u) << "the disk had room for some";
  EXPECT_LT(stored, kRun) << "the disk had room for all: nothing was cut short";
  const auto st = broker_->stats();
  EXPECT_EQ(st.at("stream.S.stored"), static_cast<std::int64_t>(stored));
  EXPECT_EQ(st.at("stream.S.refused_disk_full"), static_cast<std::int64_t>(kRun - stored));
}

// A REQUEST keeps its meaning beside ACK (SPEC.md §3.10 rule 2): stored by
// the stream, but with nobody subscribed the requester hears NO_RESPONDERS
// as well as its PUB_ACK, instead of waiting for its timeout.
TEST_P(StreamAcks, ARequestToAStreamNobodySubscribesToGetsNoRespondersBesideItsPubAck) {
  start("  - {name: S, subjects: [\"s.>\"]}\n");
  auto w = raw_wire(*broker_, GetParam(), true, proto::ConnectRequest{16384, 16, 0, proto::kProtocolVersion});
  ASSERT_TRUE(w);
  std::vector<std::byte> request(proto::kHeaderSize + 64);
  proto::FrameHeader h;
  h.type = FrameType::kPublish;
  h.flags = proto::kFlagAck | proto::kFlagRequest;
  h.sequence = 7;
  request.resize(
      proto::encode_frame(request, h, "s.question", "_INBOX.me.1", std::as_bytes(std::span("?", 1))));
  ASSERT_TRUE(w->send(request));
  std::set<FrameType> got;
  for (int i = 0; i < 20 && got.size() < 2; ++i) {
    for (const auto& bytes : w->receive(500ms)) {
      proto::Frame f;
      ASSERT_EQ(proto::decode_frame(bytes, bytes.size(), f), proto::DecodeStatus::kOk);
      got.insert(f.header.type);
      if (f.header.type == FrameType::kPubAck) {
        EXPECT_EQ(f.header.sequence, 7u);
        EXPECT_EQ(f.header.arg, 0u) << "stored";
      }
    }
  }
  EXPECT_TRUE(got.contains(FrameType::kPubAck));
  EXPECT_TRUE(got.contains(FrameType::kNoResponders));
}

TEST_P(StreamAcks, EveryBrokenAckRuleClosesOnlyItsSender) {
  start("  - {name: S, subjects: [\"s.>\"]}\n");
  const auto publish = [](std::uint16_t flags, std::uint64_t sequence) {
    return publish_frame("s.x", flags, sequence);
  };
  expect_each_closes_its_sender(
      *broker_, GetParam(),
      {
          {"ACK on a version-9 connection", 9, publish(proto::kFlagAck, 5), ErrorCode::kMalformedFrame,
           "ACK needs protocol version 10"},
          {"ACK without an id", 10, publish(proto::kFlagAck, 0), ErrorCode::kMalformedFrame, "flag"},
          {"ACK on a fragment", 10, publish(proto::kFlagAck | proto::kFlagFragment, 5),
           ErrorCode::kMalformedFrame, "flag"},
          {"a PUB_ACK from the client", 10, frame(FrameType::kPubAck, 0, "", std::string(8, '\0')),
           ErrorCode::kProtocolViolation, "sent by the broker, never to it"},
      });
  auto ok = connect_via(*broker_, GetParam());
  ASSERT_TRUE(ok && ok->publish_acked("s.after", "fine", 10s)) << "everyone else is served";
}

// Four publishers publish with acknowledgements (each message with a Msg-Id)
// until the broker is killed with SIGKILL, once each has 50 acknowledged.
// After the restart each sends its first unacknowledged message again, with
// the same Msg-Id: the stream then holds every acknowledged message exactly
// once, each publisher's in the order it sent them, and the re-sent one once
// whether or not it had been stored before the kill.
TEST_P(StreamAcks, ABrokerKilledMidStormKeepsEveryAcknowledgedMessageOnceInOrder) {
  const std::string streams = "  - {name: STORM, subjects: [\"storm.>\"]}\n";
  start(streams);
  constexpr int kPublishers = 4;
  std::vector<std::vector<std::uint64_t>> acked(kPublishers);  // per publisher: the sequence of message i
  std::array<std::atomic<int>, kPublishers> progress{};        // acknowledged so far (read while they run)
  std::atomic<int> running{kPublishers};
  {
    std::vector<std::jthread> publishers;
    for (int p = 0; p < kPublishers; ++p) {
      publishers.emplace_back([&, p] {
        auto c = connect_via(*broker_, GetParam());
        for (int i = 0; c; ++i) {
          const std::string id = std::to_string(p) + "-" + std::to_string(i);
          auto r = c->publish_acked("storm." + std::to_string(p), Headers{{"Msg-Id", id}},
                                    as_payload(std::string_view(id)), 5s);
          if (!r) break;  // the broker is gone
          acked[p].push_back(r->sequence);
          ++progress[p];
        }
        --running;
      });
    }
    const auto deadline = std::chrono::steady_clock::now() + 20s;
    while (std::chrono::steady_clock::now() < deadline &&
           !std::all_of(progress.begin(), progress.end(), [](const auto& n) { return n >= 50; })) {
      std::this_thread::sleep_for(20ms);
    }
    EXPECT_EQ(broker_->stop(SIGKILL, 10s), 128 + SIGKILL);
  }
  EXPECT_EQ(running, 0);
  start(streams);
  auto c = connect_via(*broker_, GetParam());
  ASSERT_TRUE(c);
  for (int p = 0; p < kPublishers; ++p) {
    ASSERT_GE(acked[p].size(), 50u) << "publisher " << p;
    const std::string id = std::to_string(p) + "-" + std::to_string(acked[p].size());
    auto r = c->publish_acked("storm." + std::to_string(p), Headers{{"Msg-Id", id}},
                              as_payload(std::string_view(id)), 10s);
    ASSERT_TRUE(r) << r.error().message;
    acked[p].push_back(r->sequence);
  }
  c.reset();
  broker_.reset();

  std::map<std::string, int> seen;         // payload -> how many times stored
  std::vector<int> last(kPublishers, -1);  // the last index of each publisher met in stream order
  for (const auto& m : read_stream(data_ + "/STORM")) {
    const std::string& payload = m.payload;
    ++seen[payload];
    const int p = std::stoi(payload.substr(0, payload.find('-')));
    const int i = std::stoi(payload.substr(payload.find('-') + 1));
    EXPECT_GT(i, last[p]) << "publisher " << p << "'s messages out of order";
    last[p] = i;
  }
  for (int p = 0; p < kPublishers; ++p) {
    for (std::size_t i = 0; i < acked[p].size(); ++i) {
      EXPECT_EQ(seen[std::to_string(p) + "-" + std::to_string(i)], 1)
          << "publisher " << p << ", message " << i;
    }
  }
}

// Acknowledged publishes without waiting for each: every one is answered,
// in order, and many share each fdatasync (group commit); a handler left
// without an answer when the client closes hears kClosed.
TEST_P(StreamAcks, AsynchronousAcknowledgedPublishesShareTheirSyncs) {
  start("  - {name: S, subjects: [\"s.>\"]}\n");
  auto c = connect_via(*broker_, GetParam());
  ASSERT_TRUE(c);
  const int n = static_cast<int>(volume(2000));
  std::mutex mu;
  std::vector<std::uint64_t> sequences;
  std::atomic<int> failed{0};
  for (int i = 0; i < n; ++i) {
    ASSERT_TRUE(c->publish_acked_async("s.x", {}, as_payload("m"), [&](Result<PubAck> r) {
      if (!r) return void(++failed);
      std::lock_guard lock(mu);
      sequences.push_back(r->sequence);
    }));
  }
  ASSERT_TRUE(wait_until(
      [&] {
        std::lock_guard lock(mu);
        return static_cast<int>(sequences.size()) + failed == n;
      },
      60s));
  EXPECT_EQ(failed, 0);
  for (int i = 0; i < n; ++i) ASSERT_EQ(sequences[i], static_cast<std::uint64_t>(i + 1));
  const auto syncs = broker_->stats()["stream.S.syncs"];
  EXPECT_LT(syncs, n / 4) << "group commit: " << syncs << " syncs for " << n << " messages";
  // Closed with answers outstanding: each handler hears of it.
  std::atomic<int> closed{0}, answered{0};
  for (int i = 0; i < 50; ++i) {
    ASSERT_TRUE(c->publish_acked_async("s.y", {}, as_payload("m"),
                                       [&](Result<PubAck> r) { ++(r ? answered : closed); }));
  }
  c->close();
  EXPECT_EQ(closed + answered, 50);
}

INSTANTIATE_TEST_SUITE_P(Via, StreamAcks, ::testing::Values(Via::kRdma, Via::kTcp),
                         [](const auto& info) { return info.param == Via::kRdma ? "rdma" : "tcp"; });

}  // namespace
}  // namespace rdmabroker::test
