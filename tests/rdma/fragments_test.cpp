// SPDX-License-Identifier: Apache-2.0
// Messages larger than a frame (proto/SPEC.md §3.7) as users meet them, over
// RDMA (in the guest, label rdma) and TCP (on the host, label tcp): they
// arrive whole and byte for byte, across transports both ways; the broker
// forwards each fragment as it comes, so another publisher's small message
// is not held behind a big one; a publisher that leaves half-way costs its
// subscribers nothing but a counted drop, as does one that leaves a message
// open past limits.fragment_timeout_ms; a client of version 3 is sent no
// fragment (counted); every broken fragment rule closes only its sender.
#include <gtest/gtest.h>

#include <fstream>
#include <thread>

#include "harness.hpp"
#include "rdmabroker/client.hpp"

namespace rdmabroker::test {
namespace {

using namespace std::chrono_literals;
using proto::ErrorCode;
using proto::FrameType;

/// The largest message of these tests: 16 MiB where the broker runs at full
/// speed, less under the sanitizers (the guest's emulated CPUs).
constexpr std::size_t kBig = RDMABROKER_SANITIZED ? (4u << 20) : (16u << 20);

class Fragments : public ::testing::TestWithParam<Via> {
 protected:
  void SetUp() override {
    if (GetParam() == Via::kRdma) require_rdma();
    write_file(config_, "limits:\n  max_payload: 16MiB\n");
    broker_ = std::make_unique<BrokerProcess>(next_port(), std::vector<std::string>{"--config", config_});
  }
  void TearDown() override {
    broker_.reset();
    ::unlink(config_.c_str());
  }

  /// `n` bytes that differ from those of any other length or seed.
  static std::vector<std::byte> pattern(std::size_t n, unsigned seed) {
    std::vector<std::byte> out(n);
    for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<std::byte>((i * 7 + seed + n) % 251);
    return out;
  }
  /// A PUBLISH fragment of a `length`-byte message by the connection `w` is.
  static std::vector<std::byte> fragment(const RawWire& w, std::uint32_t offset, std::uint32_t length,
                                         std::string_view subject, std::string_view payload) {
    std::vector<std::byte> out(proto::align_up(proto::kHeaderSize + subject.size() + payload.size()));
    proto::encode_frame(out, proto::FrameHeader::fragment(length, offset, w.accept.connection_id), subject,
                        {}, std::as_bytes(std::span(payload.data(), payload.size())));
    return out;
  }

  /// Memory a process has pinned (registered for RDMA), in KiB.
  static long pinned_kib(pid_t pid) { return status_kib(pid, "VmPin:"); }

  const std::string config_ = "/tmp/rdmabroker-fragments-" + std::to_string(getpid()) + ".yaml";
  std::unique_ptr<BrokerProcess> broker_;
};

TEST_P(Fragments, LargeMessagesArriveWholeOnEitherTransportAndAcrossThem) {
  auto pub = connect_via(*broker_, GetParam());
  auto sub = connect_via(*broker_, GetParam());
  ASSERT_TRUE(pub && sub);
  EXPECT_EQ(pub->max_payload(5), 16u << 20) << "the broker's limits.max_payload, from its accept";
  auto s = sub->subscribe(std::string_view("big.>"));
  ASSERT_TRUE(s && sub->flush(10s));
  // The other transport's client, where the guest has both: an RDMA
  // publisher's message reaches a TCP subscriber and the other way round.
  std::unique_ptr<Client> other;
  std::shared_ptr<Subscription> other_sub;
  if (GetParam() == Via::kRdma) {
    other = connect_via(*broker_, Via::kTcp);
    ASSERT_TRUE(other);
    auto os = other->subscribe(std::string_view("big.>"));
    ASSERT_TRUE(os && other->flush(10s));
    other_sub = os.value();
  }

  // Pinned memory, now that every connection exists: a message of any size
  // must not change the broker's (its pool) nor need more of the clients'.
  const long broker_pinned = pinned_kib(broker_->pid());

  // Just over one 16 KiB frame, a megabyte with headers and a reply, the largest.
  const std::vector<std::size_t> sizes = {20000, 1u << 20, kBig};
  const Headers headers{{"Content-Type", "application/octet-stream"}};
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    const auto body = pattern(sizes[i], static_cast<unsigned>(i));
    if (i == 1) {
      ASSERT_TRUE(pub->publish("big.b1", headers, body, "reply.here"));
    } else {
      ASSERT_TRUE(pub->publish("big.b" + std::to_string(i), body));
    }
  }
  ASSERT_TRUE(pub->publish("big.small", std::string_view("after them")));
  auto expect_all = [&](Subscription& from, const std::string& who) {
    SCOPED_TRACE(who);
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      auto m = from.next(60s);
      ASSERT_TRUE(m) << m.error().message;
      EXPECT_EQ(m->subject, "big.b" + std::to_string(i));
      EXPECT_TRUE(m->payload == pattern(sizes[i], static_cast<unsigned>(i)))
          << "message " << i << " of " << sizes[i] << " bytes arrived as " << m->payload.size();
      if (i == 1) {
        EXPECT_EQ(m->reply, "reply.here");
        EXPECT_EQ(m->headers, headers);
      }
    }
    auto last = from.next(10s);
    ASSERT_TRUE(last) << last.error().message;
    EXPECT_EQ(last->data(), "after them") << "in order after the big ones";
  };
  expect_all(**s, "same transport");
  if (other_sub) {
    expect_all(*other_sub, "RDMA publisher, TCP subscriber");
    const auto body = pattern(kBig, 9);
    ASSERT_TRUE(other->publish("big.from_tcp", body));
    auto m = (*s)->next(60s);
    ASSERT_TRUE(m) << m.error().message;
    EXPECT_EQ(m->subject, "big.from_tcp");
    EXPECT_TRUE(m->payload == body) << "TCP publisher, RDMA subscriber: " << m->payload.size() << " bytes";
  }

  if (GetParam() == Via::kRdma) {
    EXPECT_EQ(pinned_kib(broker_->pid()), broker_pinned)
        << "the broker's pinned memory is its pool, whatever the messages' size";
    EXPECT_LE(pinned_kib(getpid()), 2 * 4096)
        << "two RDMA clients pin a few MiB each, with max_payload 16 MiB";
  }

  // Over the limit: refused by the library, before anything leaves; the connection stays.
  const auto too_big = pattern((16u << 20) + 1, 0);
  auto refused = pub->publish("big.too", too_big);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().kind, ErrorKind::kPayloadTooLarge) << refused.error().message;
  ASSERT_TRUE(pub->publish("big.small", std::string_view("still open")));
  auto m = (*s)->next(10s);
  ASSERT_TRUE(m) << m.error().message;
  EXPECT_EQ(m->data(), "still open");
  EXPECT_EQ(broker_->stats()["messages.dropped.incomplete"], 0);
}

TEST_P(Fragments, SmallMessagesGoOnWhileABigOneIsOpenAndAPublisherThatLeavesCostsNothingElse) {
  auto sub = connect_via(*broker_, GetParam());
  auto pub = connect_via(*broker_, GetParam());
  ASSERT_TRUE(sub && pub);
  auto s = sub->subscribe(std::string_view("feed"));
  ASSERT_TRUE(s && sub->flush(10s));
  // A version-3 subscriber (a raw one): it is sent no fragment, only whole messages.
  auto old = raw_wire(*broker_, GetParam(), true, proto::ConnectRequest{16384, 16, 0, /*max_version=*/3});
  ASSERT_TRUE(old);
  ASSERT_EQ(old->accept.version, 3);
  auto subscribe = frame(FrameType::kSubscribe, 1, "feed"), ping = frame(FrameType::kPing, 0, "");
  subscribe.insert(subscribe.end(), ping.begin(), ping.end());
  ASSERT_TRUE(old->send(subscribe));
  bool ponged = false;  // PONG: the subscription is in place
  for (int i = 0; i < 10 && !ponged; ++i) {
    for (const auto& bytes : old->receive(1s)) {
      proto::Frame f;
      ponged |= proto::decode_frame(bytes, bytes.size(), f) == proto::DecodeStatus::kOk &&
                f.header.type == FrameType::kPong;
    }
  }
  ASSERT_TRUE(ponged);

  // A raw publisher sends the first half of a message and pauses.
  auto big = raw_wire(*broker_, GetParam());
  ASSERT_TRUE(big);
  const std::string head(3000, 'h'), tail(2000, 't');
  ASSERT_TRUE(big->send(fragment(*big, 0, 5000, "feed", head)));
  ASSERT_TRUE(pub->publish("feed", std::string_view("small, while the big one is open")));
  auto m = (*s)->next(10s);
  ASSERT_TRUE(m) << m.error().message;
  EXPECT_EQ(m->data(), "small, while the big one is open") << "not held behind the open message";
  // The second half completes it.
  ASSERT_TRUE(big->send(fragment(*big, 3000, 5000, "", tail)));
  m = (*s)->next(10s);
  ASSERT_TRUE(m) << m.error().message;
  EXPECT_EQ(m->data(), head + tail);

  // A publisher that vanishes half-way: its subscribers never see a part of
  // it, the broker counts one incomplete message per recipient.
  ASSERT_TRUE(big->send(fragment(*big, 0, 5000, "feed", head)));
  ASSERT_TRUE(pub->flush(10s));
  big.reset();
  auto st = broker_->wait_stats([](auto& s) { return s["messages.dropped.incomplete"] >= 1; }, 10s);
  EXPECT_EQ(st["messages.dropped.incomplete"], 1);
  ASSERT_TRUE(pub->publish("feed", std::string_view("after the quitter")));
  m = (*s)->next(10s);
  ASSERT_TRUE(m) << m.error().message;
  EXPECT_EQ(m->data(), "after the quitter") << "nothing of the abandoned message came first";
  EXPECT_EQ(sub->stats().aborted_messages, 1u);

  // The version-3 subscriber got the whole messages and nothing of the fragmented ones.
  std::vector<std::string> old_got;
  read_delivered(*old, 2, 10s, [&](const proto::Frame& f) {
    EXPECT_FALSE(f.header.is_fragment());
    old_got.emplace_back(reinterpret_cast<const char*>(f.payload.data()), f.payload.size());
  });
  EXPECT_EQ(old_got, (std::vector<std::string>{"small, while the big one is open", "after the quitter"}));
  const auto stats = broker_->stats();
  std::string counts;
  for (const auto& [k, v] : stats)
    if (k.rfind("messages.", 0) == 0 || k.rfind("deliver", 0) == 0)
      counts += k + "=" + std::to_string(v) + " ";
  EXPECT_EQ(stats.at("messages.dropped.needs_fragments"), 2)
      << "each fragmented message, once: " << counts << broker_->admin("connections");
}

// A subscriber whose receive buffers are smaller than the broker's (SPEC.md
// §3.7, "Smaller receive buffers"): every message reaches it whole and in
// order, cut by the broker to fit; one whose subject, reply and header block
// alone fill such a buffer does not (counted), and holds up nothing else.
TEST_P(Fragments, ASubscriberWithSmallerBuffersGetsEveryMessageCutToFit) {
  ClientOptions small;
  small.recv_buffer_size = 2048;
  auto sub = connect_via(*broker_, GetParam(), small);
  auto pub = connect_via(*broker_, GetParam());
  auto whole = connect_via(*broker_, GetParam());  // the broker's buffer size: everything as published
  ASSERT_TRUE(sub && pub && whole);
  auto s = sub->subscribe(std::string_view("cut.>"));
  auto w = whole->subscribe(std::string_view("cut.>"));
  ASSERT_TRUE(s && w && sub->flush(10s) && whole->flush(10s));

  struct Sent {
    std::string subject;
    std::size_t size;
    Headers headers;
    std::string reply;
  };
  const Headers trace{{"Trace-Id", "t-1"}};
  const Headers fat{{"Fat", std::string(2000, 'f')}};  // a block larger than a 2 KiB buffer's payload room
  // Around the small buffer, one broker frame, a message in the publisher's fragments (each cut again).
  const std::vector<Sent> sent = {
      {"cut.a", 100, {}, ""},         {"cut.b", 1900, trace, "r.b"}, {"cut.c", 2100, {}, ""},
      {"cut.fat", 5000, fat, ""},     {"cut.d", 16000, trace, ""},   {"cut.e", 100000, trace, "r.e"},
      {"cut.fatter", 50000, fat, ""}, {"cut.f", 10, {}, ""},
  };
  for (std::size_t i = 0; i < sent.size(); ++i) {
    ASSERT_TRUE(pub->publish(sent[i].subject, sent[i].headers,
                             pattern(sent[i].size, static_cast<unsigned>(i)), sent[i].reply));
  }
  auto expect = [&](Subscription& from, bool small_buffers) {
    SCOPED_TRACE(small_buffers ? "2 KiB buffers" : "16 KiB buffers");
    for (std::size_t i = 0; i < sent.size(); ++i) {
      if (small_buffers && sent[i].headers == fat) continue;
      auto m = from.next(30s);
      ASSERT_TRUE(m) << m.error().message;
      EXPECT_EQ(m->subject, sent[i].subject);
      EXPECT_EQ(m->headers, sent[i].headers);
      EXPECT_EQ(m->reply, sent[i].reply);
      EXPECT_TRUE(m->payload == pattern(sent[i].size, static_cast<unsigned>(i)))
          << sent[i].subject << " arrived as " << m->payload.size() << " bytes";
    }
  };
  expect(**s, true);
  expect(**w, false);
  // The two fat messages, each once (the fragmented one: none of its fragments went).
  EXPECT_EQ(broker_->stats().at("messages.dropped.buffer_too_small"), 2);
  EXPECT_EQ(sub->stats().aborted_messages, 0u);
  ASSERT_TRUE(pub->publish("cut.last", std::string_view("still served")));
  auto m = (*s)->next(10s);
  ASSERT_TRUE(m) << m.error().message;
  EXPECT_EQ(m->data(), "still served");
}

TEST_P(Fragments, EveryBrokenFragmentRuleClosesOnlyItsSender) {
  auto sub = connect_via(*broker_, GetParam());
  ASSERT_TRUE(sub);
  auto s = sub->subscribe(std::string_view("big"));
  ASSERT_TRUE(s && sub->flush(10s));
  struct Case {
    std::string what;
    std::function<std::vector<std::vector<std::byte>>(const RawWire&)> sends;
    ErrorCode code;
    std::string text;
  };
  using Sends = std::vector<std::vector<std::byte>>;
  const std::vector<Case> cases = {
      {"a fragment out of order",
       [](const RawWire& w) {
         return Sends{fragment(w, 0, 300, "big", std::string(100, 'a')),
                      fragment(w, 200, 300, "", std::string(100, 'c'))};
       },
       ErrorCode::kProtocolViolation, "offset 100"},
      {"a fragment twice",
       [](const RawWire& w) {
         return Sends{fragment(w, 0, 300, "big", std::string(100, 'a')),
                      fragment(w, 100, 300, "", std::string(100, 'b')),
                      fragment(w, 100, 300, "", std::string(100, 'b'))};
       },
       ErrorCode::kProtocolViolation, "offset 200"},
      {"no first fragment", [](const RawWire& w) { return Sends{fragment(w, 100, 300, "", "b")}; },
       ErrorCode::kProtocolViolation, "of no message"},
      {"over limits.max_payload",
       [](const RawWire& w) { return Sends{fragment(w, 0, (16u << 20) + 1, "big", "a")}; },
       ErrorCode::kPayloadTooLarge, "limits.max_payload"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    auto w = raw_wire(*broker_, GetParam());
    ASSERT_TRUE(w);
    // One send each, waiting for the broker's credit updates in between (RDMA).
    for (const auto& bytes : c.sends(*w)) {
      ASSERT_TRUE(w->send(bytes));
      std::this_thread::sleep_for(50ms);
    }
    auto [code, text] = expect_error_then_close(*w, 10s);
    EXPECT_EQ(code, c.code) << text;
    EXPECT_NE(text.find(c.text), std::string::npos) << text;
  }
  // A fragment on a connection of version 3.
  auto old = raw_wire(*broker_, GetParam(), true, proto::ConnectRequest{16384, 16, 0, 3});
  ASSERT_TRUE(old);
  ASSERT_TRUE(old->send(fragment(*old, 0, 300, "big", "a")));
  auto [code, text] = expect_error_then_close(*old, 10s);
  EXPECT_EQ(code, ErrorCode::kMalformedFrame);
  EXPECT_NE(text.find("version 4"), std::string::npos) << text;
  // The subscriber is untouched; the aborted messages of the closed publishers are counted.
  auto pub = connect_via(*broker_, GetParam());
  ASSERT_TRUE(pub && pub->publish("big", std::string_view("fine")));
  auto m = (*s)->next(10s);
  ASSERT_TRUE(m) << m.error().message;
  EXPECT_EQ(m->data(), "fine");
  EXPECT_EQ(sub->stats().aborted_messages, 2u) << "the two whose first fragment it had";
}

// SPEC.md §3.7 rule 4: a message is not left open. The deadline is between
// fragments, not for the whole message: a publisher that sends slowly but
// steadily finishes; one that stops half-way is closed at the deadline, and
// its subscribers get ABORT, never a part of it.
TEST_P(Fragments, AMessageLeftOpenIsAbandonedAtItsDeadlineASlowOneIsNot) {
  write_file(config_, "limits:\n  max_payload: 16MiB\n  fragment_timeout_ms: 1000\n");  // live
  const std::string reloaded = broker_->admin("reload");
  ASSERT_NE(reloaded.find("\"ok\":true"), std::string::npos) << reloaded;
  auto sub = connect_via(*broker_, GetParam());
  ASSERT_TRUE(sub);
  auto s = sub->subscribe(std::string_view("slow"));
  ASSERT_TRUE(s && sub->flush(10s));

  // Six fragments 200 ms apart: 1.2 s in all, each well within the deadline.
  auto slow = raw_wire(*broker_, GetParam());
  ASSERT_TRUE(slow);
  std::string whole;
  for (std::uint32_t i = 0; i < 6; ++i) {
    const std::string part(500, static_cast<char>('a' + i));
    ASSERT_TRUE(slow->send(fragment(*slow, i * 500, 3000, i == 0 ? "slow" : "", part)));
    whole += part;
    if (i < 5) std::this_thread::sleep_for(200ms);
  }
  auto m = (*s)->next(10s);
  ASSERT_TRUE(m) << m.error().message;
  EXPECT_EQ(m->data(), whole);

  // Half a message, then nothing: closed at the deadline, the subscriber gets ABORT.
  auto stuck = raw_wire(*broker_, GetParam());
  ASSERT_TRUE(stuck);
  const auto sent = std::chrono::steady_clock::now();
  ASSERT_TRUE(stuck->send(fragment(*stuck, 0, 3000, "slow", std::string(1500, 's'))));
  auto [code, text] = expect_error_then_close(*stuck, 10s);
  const auto after = std::chrono::steady_clock::now() - sent;
  EXPECT_EQ(code, ErrorCode::kProtocolViolation) << text;
  EXPECT_NE(text.find("limits.fragment_timeout_ms"), std::string::npos) << text;
  EXPECT_NE(text.find("1500 of its 3000 bytes"), std::string::npos) << text;
  EXPECT_GE(after, 1s) << "not before the deadline";
  stuck.reset();  // a close is counted once the peer has gone too
  auto st = broker_->wait_stats(
      [](auto& s) {
        return s["messages.dropped.incomplete"] >= 1 && s["connections.closed.fragment_timeout"] >= 1;
      },
      10s);
  EXPECT_EQ(st["messages.dropped.incomplete"], 1);
  EXPECT_EQ(st["connections.closed.fragment_timeout"], 1) << "the stuck publisher only";
  auto pub = connect_via(*broker_, GetParam());
  ASSERT_TRUE(pub && pub->publish("slow", std::string_view("after the stuck one")));
  m = (*s)->next(10s);
  ASSERT_TRUE(m) << m.error().message;
  EXPECT_EQ(m->data(), "after the stuck one") << "nothing of the abandoned message came first";
  EXPECT_EQ(sub->stats().aborted_messages, 1u);
}

// Issue 49: a subscriber of messages in fragments that stops reading is cut
// as a slow consumer in the middle of one: that message counts once, as
// dropped.slow_consumer (SPEC.md §6), not as subscriber_closed when its last
// fragment finds the subscriber gone.
TEST_P(Fragments, AMessageInFragmentsCutWithItsSlowSubscriberCountsAsSlowConsumer) {
  write_file(config_,
             "limits:\n  max_payload: 16MiB\n  max_pending_bytes: 64KiB\n"
             "slow_consumer: {write_deadline_ms: 500}\n");
  const std::string reloaded = broker_->admin("reload");
  ASSERT_NE(reloaded.find("\"ok\":true"), std::string::npos) << reloaded;
  auto stuck = raw_wire(*broker_, GetParam());
  ASSERT_TRUE(stuck);
  ASSERT_TRUE(stuck->send(frame(FrameType::kSubscribe, 1, "frag.slow", "")));
  broker_->wait_stats([](auto& s) { return s["subscriptions"] == 1; }, 10s);
  auto pub = connect_via(*broker_, GetParam());
  ASSERT_TRUE(pub);
  // 16 MiB whatever the build: more than a loopback socket's buffers take
  // (a sanitizer build's 4 MiB fitted whole and nothing was cut).
  ASSERT_TRUE(pub->publish("frag.slow", pattern(16u << 20, 9)));
  ASSERT_TRUE(pub->flush(60s));
  auto st = broker_->wait_stats(
      [](auto& s) {
        return s["connections.closed.slow_consumer"] >= 1 &&
               s["messages.dropped.slow_consumer"] + s["messages.dropped.subscriber_closed"] >= 1;
      },
      30s);
  EXPECT_EQ(st["connections.closed.slow_consumer"], 1);
  EXPECT_EQ(st["messages.dropped.slow_consumer"], 1);
  EXPECT_EQ(st["messages.dropped.subscriber_closed"], 0);
  EXPECT_EQ(st["messages.dropped.incomplete"], 0);
}

INSTANTIATE_TEST_SUITE_P(Via, Fragments, ::testing::Values(Via::kRdma, Via::kTcp),
                         [](const auto& info) { return info.param == Via::kRdma ? "rdma" : "tcp"; });

}  // namespace
}  // namespace rdmabroker::test
