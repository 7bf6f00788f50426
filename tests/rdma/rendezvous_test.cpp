// SPDX-License-Identifier: Apache-2.0
// Large messages by rendezvous (proto/SPEC.md §3.8, §3.9), in the guest over
// RDMA: the broker READs an offered message from its publisher's region and
// WRITEs it into each version-9 subscriber's landing area; every subscriber
// gets it whole, librdmabroker's (landing, or with rendezvous off not), a raw
// one of version 4 (fragments) and a TCP one alike; a publisher that
// vanishes, or whose region is revoked, half-way costs only a counted ABORT
// and gives every pool buffer back; a subscriber that vanishes half-way, or
// revokes its landing area, costs the others nothing; every broken offer or
// RDV_READY rule closes only its sender (also over TCP, where there is no
// rendezvous).
#include <gtest/gtest.h>

#include <thread>

#include "harness.hpp"
#include "rdmabroker/client.hpp"

namespace rdmabroker::test {
namespace {

using namespace std::chrono_literals;
using proto::ErrorCode;
using proto::FrameType;

constexpr std::size_t kOfferedBig = RDMABROKER_SANITIZED ? (4u << 20) : (16u << 20);

class Rendezvous : public ::testing::TestWithParam<Via> {
 protected:
  void SetUp() override {
    if (GetParam() == Via::kRdma) require_rdma();
    // A subscriber answers a large message's first fragment with a landing
    // area before the broker sends it more (SPEC.md §3.9); under emulation
    // seven clients of one process registering 16 MiB each at once take
    // seconds: the write deadline (2 s by default) allows for that here.
    write_file(config_,
               "limits:\n  max_payload: 16MiB\n  rendezvous_min: 64KiB\nslow_consumer:\n  write_deadline_ms: "
               "8000\n");
    broker_ = std::make_unique<BrokerProcess>(next_port(), std::vector<std::string>{"--config", config_});
  }
  void TearDown() override {
    broker_.reset();
    ::unlink(config_.c_str());
  }

  static std::string pattern(std::size_t n, unsigned seed) {
    std::string out(n, '\0');
    for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<char>((i * 7 + seed + n) % 251);
    return out;
  }
  /// An RDV_OFFER of a `length`-byte message at `region`.
  static std::vector<std::byte> offer(std::string_view subject, std::uint32_t length,
                                      const proto::RendezvousRegion& region, std::uint64_t id = 1) {
    proto::FrameHeader h;
    h.type = FrameType::kRendezvousOffer;
    h.arg = length;
    h.sequence = id;
    const auto body = proto::encode(region);
    std::vector<std::byte> out(proto::align_up(proto::kHeaderSize + subject.size() + body.size()));
    proto::encode_frame(out, h, subject, {}, body);
    return out;
  }
  /// RDV_READY naming the landing area of the message whose first fragment
  /// came in DELIVER `sequence` on `sid`.
  static std::vector<std::byte> ready(std::uint32_t sid, std::uint64_t sequence,
                                      const proto::LandingArea& area) {
    proto::FrameHeader h;
    h.type = FrameType::kRendezvousReady;
    h.arg = sid;
    h.sequence = sequence;
    const auto body = proto::encode(area);
    std::vector<std::byte> out(proto::kHeaderSize + body.size());
    proto::encode_frame(out, h, {}, {}, body);
    return out;
  }
  /// The first fragment a raw subscriber receives: its DELIVER's sequence
  /// and subscription, the fragment's publisher and message length.
  struct FirstFragment {
    std::uint64_t sequence = 0;
    std::uint32_t sid = 0;
    std::uint64_t publisher = 0;
    std::uint32_t length = 0;
  };
  static std::optional<FirstFragment> first_fragment(RawPeer& peer) {
    const auto deadline = std::chrono::steady_clock::now() + 30s;
    while (std::chrono::steady_clock::now() < deadline) {
      auto got = peer.receive(200ms);
      if (!got) continue;
      for (const auto& f : frames(*got)) {
        if (f.header.type != FrameType::kDeliver) continue;
        std::optional<FirstFragment> out;
        proto::for_each_delivered(f, [&](const proto::Frame& m) {
          if (m.header.is_fragment() && m.header.offset == 0)
            out = FirstFragment{f.header.sequence, f.header.arg, m.header.sequence, m.header.arg};
        });
        if (out) return out;
      }
    }
    return std::nullopt;
  }
  /// Sends `frames` and a PING in one SEND (a raw peer has few credits) and
  /// waits for the PONG: the broker took them all.
  static bool send_then_pong(RawWire& w, std::vector<std::byte> frames) {
    const auto ping = frame(FrameType::kPing, 0, "");
    frames.insert(frames.end(), ping.begin(), ping.end());
    if (!w.send(frames)) return false;
    for (int i = 0; i < 50; ++i) {
      for (const auto& bytes : w.receive(200ms)) {
        proto::Frame f;
        if (proto::decode_frame(bytes, bytes.size(), f) == proto::DecodeStatus::kOk &&
            f.header.type == FrameType::kPong)
          return true;
      }
    }
    return false;
  }
  /// Pool buffers held beyond the receive queues' (idle: none).
  std::int64_t pool_held() const {
    auto s = broker_->stats();
    return s["pool.in_use"] - s["rdma.srq_posted"];
  }
  /// Waits until the pool holds no more than it did at `idle` (the READs'
  /// buffers came back).
  void expect_pool_back_to(std::int64_t idle) const {
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    std::int64_t held = pool_held();
    while (held > idle && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(50ms);
      held = pool_held();
    }
    EXPECT_LE(held, idle) << "pool buffers still held";
  }

  const std::string config_ = "/tmp/rdmabroker-rendezvous-" + std::to_string(getpid()) + ".yaml";
  std::unique_ptr<BrokerProcess> broker_;
};

class RendezvousRdma : public Rendezvous {};

TEST_P(RendezvousRdma, LargeMessagesAreReadAndArriveWholeAtEverySubscriber) {
  // Eight subscribers of version 8, one of version 4 (raw: fragments), one over TCP.
  std::vector<std::unique_ptr<Client>> subs;
  std::vector<std::shared_ptr<Subscription>> streams;
  // The last of the eight has rendezvous off: its messages come in fragments.
  ClientOptions no_rdv;
  no_rdv.rendezvous = false;
  for (int i = 0; i < 8; ++i) {
    subs.push_back(i < 7 ? connect_via(*broker_, Via::kRdma) : connect_via(*broker_, Via::kRdma, no_rdv));
    ASSERT_TRUE(subs.back());
    auto s = subs.back()->subscribe(std::string_view("big.>"));
    ASSERT_TRUE(s && subs.back()->flush(10s));
    streams.push_back(*s);
  }
  auto tcp = connect_via(*broker_, Via::kTcp);
  ASSERT_TRUE(tcp);
  auto tcp_stream = tcp->subscribe(std::string_view("big.>"));
  ASSERT_TRUE(tcp_stream && tcp->flush(10s));
  auto old = raw_wire(*broker_, Via::kRdma, true, proto::ConnectRequest{16384, 16, 0, 4});
  ASSERT_TRUE(old);
  // A raw peer returns no credits: it takes the 64 KiB message only (5 SENDs).
  // One SEND: before its login's credits come, a raw peer has the 2 of the
  // accept (SPEC.md §5), and CONNECT took one.
  ASSERT_TRUE(send_then_pong(*old, frame(FrameType::kSubscribe, 7, "big.two")))
      << "the version-4 subscriber's SUBSCRIBE is in effect";

  auto pub = connect_via(*broker_, Via::kRdma);
  ASSERT_TRUE(pub && pub->flush(10s));
  const std::string one = pattern(1u << 20, 1), two = pattern(64u << 10, 2), three = pattern(kOfferedBig, 3);
  ASSERT_TRUE(pub->publish("big.one", Headers{{"Trace-Id", "t-1"}}, one, "reply.to"));
  ASSERT_TRUE(pub->publish("big.small", std::string_view("small between")));
  ASSERT_TRUE(pub->publish("big.two", two));
  ASSERT_TRUE(pub->publish("big.three", three));
  // The version-4 subscriber got the same bytes, as fragments in SENDs (read
  // first: a raw client reads only when the test does).
  std::map<std::string, std::string> got;
  std::string open_subject;
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (got["big.two"].size() < two.size() && std::chrono::steady_clock::now() < deadline) {
    for (const auto& bytes : old->receive(200ms)) {
      proto::Frame f;
      ASSERT_EQ(proto::decode_frame(bytes, bytes.size(), f), proto::DecodeStatus::kOk);
      if (f.header.type != FrameType::kDeliver) continue;
      proto::for_each_delivered(f, [&](const proto::Frame& m) {
        if (m.header.starts_message()) open_subject = std::string(m.subject);
        auto& body = got[open_subject];
        body.append(reinterpret_cast<const char*>(m.headers.data()), m.headers.size());
        body.append(reinterpret_cast<const char*>(m.payload.data()), m.payload.size());
      });
    }
  }
  EXPECT_EQ(got.size(), 1u);
  EXPECT_TRUE(got["big.two"] == two);

  ASSERT_TRUE(pub->flush(60s));
  // By rendezvous (the three at or above 64 KiB), not fragments.
  EXPECT_EQ(broker_->stats()["rdma.rendezvous.offers"], 3);

  auto check = [&](Subscription& s, const std::string& who) {
    SCOPED_TRACE(who);
    auto m = s.next(60s);
    ASSERT_TRUE(m) << m.error().message;
    EXPECT_EQ(m->subject, "big.one");
    EXPECT_EQ(m->reply, "reply.to");
    EXPECT_EQ(m->headers.get("Trace-Id").value_or(""), "t-1");
    EXPECT_TRUE(m->data() == one);
    for (const auto& [subject, want] : {std::pair<std::string, const std::string*>{"big.small", nullptr},
                                        {"big.two", &two},
                                        {"big.three", &three}}) {
      m = s.next(60s);
      ASSERT_TRUE(m) << m.error().message;
      EXPECT_EQ(m->subject, subject);
      if (want != nullptr) {
        EXPECT_TRUE(m->data() == *want) << m->payload.size() << " bytes";
      } else {
        EXPECT_EQ(m->data(), "small between");
      }
    }
  };
  for (std::size_t i = 0; i < streams.size(); ++i) check(*streams[i], "rdma subscriber " + std::to_string(i));
  check(**tcp_stream, "tcp subscriber");
  // Each version-9 subscriber took the three large ones into landing areas
  // (the broker WROTE into them what it had not sent before their RDV_READY
  // came); the one with rendezvous off, none.
  for (int i = 0; i < 7; ++i) EXPECT_EQ(subs[i]->stats().landed_messages, 3u) << "subscriber " << i;
  EXPECT_EQ(subs[7]->stats().landed_messages, 0u);
  auto st = broker_->stats();
  EXPECT_GE(st["rdma.landing.areas"], 7) << "at least the 16 MiB one's, each";
  EXPECT_GE(st["rdma.landing.writes"], 7);
  EXPECT_EQ(st["rdma.landing.write_errors"], 0);
  // A client that does not offer (ClientOptions::rendezvous false) still
  // publishes large messages, as fragments.
  auto frag = connect_via(*broker_, Via::kRdma, no_rdv);
  ASSERT_TRUE(frag && frag->publish("big.four", two) && frag->flush(30s));
  auto m = streams[0]->next(30s);
  ASSERT_TRUE(m) << m.error().message;
  EXPECT_TRUE(m->data() == two);
  EXPECT_EQ(broker_->stats()["rdma.rendezvous.offers"], 3);
}

TEST_P(RendezvousRdma, APublisherThatVanishesOrRevokesItsRegionCostsAtMostACountedAbort) {
  auto sub = connect_via(*broker_, Via::kRdma);
  ASSERT_TRUE(sub);
  auto s = sub->subscribe(std::string_view("feed"));
  ASSERT_TRUE(s && sub->flush(10s));
  auto pub = connect_via(*broker_, Via::kRdma);
  ASSERT_TRUE(pub && pub->flush(10s));
  const std::int64_t idle = pool_held();
  std::string bytes = pattern(kOfferedBig, 9);
  auto region_of = [&](RawPeer& peer, std::size_t exposed) {
    auto r = peer.expose(std::as_writable_bytes(std::span(bytes.data(), exposed)));
    EXPECT_TRUE(r) << r.error().message;
    return r ? *r : proto::RendezvousRegion{};
  };

  // 1. A region shorter than the message it offers: the READ past its end fails.
  {
    RawPeer peer;
    ASSERT_TRUE(peer.connect_ok(guest_addr1(), broker_->port(), ""));
    ASSERT_TRUE(
        peer.send(offer("feed", static_cast<std::uint32_t>(bytes.size()), region_of(peer, 1u << 20))));
    EXPECT_TRUE(peer.wait_disconnected(30s)) << "the broker closes the publisher whose region it cannot read";
  }
  auto st = broker_->wait_stats([](auto& x) { return x["rdma.rendezvous.read_errors"] >= 1; }, 10s);
  EXPECT_EQ(st["rdma.rendezvous.read_errors"], 1);
  // 2. A region revoked before the broker read it (the rkey it offered is stale).
  {
    RawPeer peer;
    ASSERT_TRUE(peer.connect_ok(guest_addr1(), broker_->port(), ""));
    const auto region = region_of(peer, bytes.size());
    peer.revoke();
    ASSERT_TRUE(peer.send(offer("feed", static_cast<std::uint32_t>(bytes.size()), region)));
    EXPECT_TRUE(peer.wait_disconnected(30s));
  }
  st = broker_->wait_stats([](auto& x) { return x["rdma.rendezvous.read_errors"] >= 2; }, 10s);
  EXPECT_EQ(st["rdma.rendezvous.read_errors"], 2);
  // 3. A publisher that vanishes while the broker reads (perhaps before its
  // first READ: then nothing was routed and nobody gets ABORT).
  {
    RawPeer peer;
    ASSERT_TRUE(peer.connect_ok(guest_addr1(), broker_->port(), ""));
    ASSERT_TRUE(
        peer.send(offer("feed", static_cast<std::uint32_t>(bytes.size()), region_of(peer, bytes.size()))));
  }  // QP, region and cm_id gone

  // The subscriber saw no part of any of them as a message; the next one is whole.
  ASSERT_TRUE(pub->publish("feed", std::string_view("after the three")));
  auto m = (*s)->next(30s);
  ASSERT_TRUE(m) << m.error().message;
  EXPECT_EQ(m->data(), "after the three");
  st = broker_->wait_stats([&](auto& x) { return x["connections.current"] == 2; }, 30s);
  EXPECT_EQ(st["connections.current"], 2);
  EXPECT_GE(st["messages.dropped.incomplete"], 1) << "one ABORT per message begun (the first, at least)";
  EXPECT_EQ(static_cast<std::uint64_t>(st["messages.dropped.incomplete"]), sub->stats().aborted_messages);
  expect_pool_back_to(idle);
}

TEST_P(RendezvousRdma, ASubscriberThatVanishesHalfWayCostsTheOthersNothing) {
  auto sub = connect_via(*broker_, Via::kRdma);
  ASSERT_TRUE(sub);
  auto s = sub->subscribe(std::string_view("feed"));
  ASSERT_TRUE(s && sub->flush(10s));
  auto quitter = std::make_unique<RawPeer>();
  ASSERT_TRUE(connect_and_subscribe(*quitter, *broker_, "feed"));
  // And one that vanishes while the broker WRITEs into its landing area.
  auto lander = connect_via(*broker_, Via::kRdma);
  ASSERT_TRUE(lander);
  auto landing = lander->subscribe(std::string_view("feed"));
  ASSERT_TRUE(landing && lander->flush(10s));
  auto pub = connect_via(*broker_, Via::kRdma);
  ASSERT_TRUE(pub && pub->flush(10s));
  const std::int64_t idle = pool_held();
  const std::string big = pattern(kOfferedBig, 4);
  ASSERT_TRUE(pub->publish("feed", big));
  ASSERT_TRUE(quitter->receive(30s)) << "the quitter's first fragment";
  quitter.reset();  // gone, with the rest of the message on its way
  // Both library subscribers name landing areas; one is enough to go on.
  ASSERT_GE(
      broker_->wait_stats([](auto& x) { return x["rdma.landing.areas"] >= 1; }, 30s)["rdma.landing.areas"],
      1);
  lander.reset();
  ASSERT_TRUE(pub->publish("feed", big));
  ASSERT_TRUE(pub->flush(60s)) << "both offers read and released";
  for (int i = 0; i < 2; ++i) {
    auto m = (*s)->next(60s);
    ASSERT_TRUE(m) << m.error().message;
    EXPECT_TRUE(m->data() == big);
  }
  EXPECT_EQ(broker_->stats()["rdma.rendezvous.offers"], 2);
  broker_->wait_stats([](auto& x) { return x["connections.current"] == 2; }, 30s);
  expect_pool_back_to(idle);
}

TEST_P(RendezvousRdma, ASubscriberThatRevokesItsLandingAreaIsClosedAndCostsTheOthersNothing) {
  auto sub = connect_via(*broker_, Via::kRdma);
  ASSERT_TRUE(sub);
  auto s = sub->subscribe(std::string_view("feed"));
  ASSERT_TRUE(s && sub->flush(10s));
  RawPeer revoker;
  ASSERT_TRUE(connect_and_subscribe(revoker, *broker_, "feed"));
  ASSERT_TRUE(revoker.send(frame(FrameType::kPing, 0, "")));
  bool ponged = false;
  for (int i = 0; i < 50 && !ponged; ++i) {
    auto got = revoker.receive(200ms);
    if (!got) continue;
    for (const auto& f : frames(*got)) ponged |= f.header.type == FrameType::kPong;
  }
  ASSERT_TRUE(ponged) << "the revoker's SUBSCRIBE is in effect";
  auto pub = connect_via(*broker_, Via::kRdma);
  ASSERT_TRUE(pub && pub->flush(10s));
  const std::int64_t idle = pool_held();
  const std::string big = pattern(kOfferedBig, 6);
  ASSERT_TRUE(pub->publish("feed", big));
  const auto first = first_fragment(revoker);
  ASSERT_TRUE(first) << "the revoker's first fragment";
  EXPECT_EQ(first->length, big.size());
  // It registers an area for the message, names it, and deregisters it at
  // once: the fragments the broker holds for it (it returns no credits)
  // go by WRITE, and the first fails.
  std::vector<std::byte> area(first->length);
  auto region = revoker.expose(area, true);
  ASSERT_TRUE(region) << region.error().message;
  revoker.revoke();
  ASSERT_TRUE(
      revoker.send(ready(first->sid, first->sequence, {first->publisher, region->address, region->rkey})));
  EXPECT_TRUE(revoker.wait_disconnected(30s)) << "closed: its landing area could not be written";
  auto st = broker_->wait_stats([](auto& x) { return x["rdma.landing.write_errors"] >= 1; }, 30s);
  EXPECT_EQ(st["rdma.landing.write_errors"], 1);
  EXPECT_GE(st["rdma.landing.areas"], 1);
  // The other subscriber got it whole (into a landing area of its own), and the next one.
  auto m = (*s)->next(60s);
  ASSERT_TRUE(m) << m.error().message;
  EXPECT_TRUE(m->data() == big);
  EXPECT_EQ(sub->stats().landed_messages, 1u);
  ASSERT_TRUE(pub->publish("feed", std::string_view("after")));
  m = (*s)->next(30s);
  ASSERT_TRUE(m) << m.error().message;
  EXPECT_EQ(m->data(), "after");
  broker_->wait_stats([](auto& x) { return x["connections.current"] == 2; }, 30s);
  expect_pool_back_to(idle);
}

TEST_P(RendezvousRdma, ALandingClientIsWaitedForAndOneThatNeverAnswersIsCutAsSlow) {
  auto sub = connect_via(*broker_, Via::kRdma);
  ASSERT_TRUE(sub);
  auto s = sub->subscribe(std::string_view("feed"));
  ASSERT_TRUE(s && sub->flush(10s));
  // Two raw subscribers whose connect requests say LANDING, with receives
  // for a whole 1 MiB message in fragments (a raw peer returns no credits).
  auto landing_peer = [&](RawPeer& peer) -> ::testing::AssertionResult {
    auto accepted =
        peer.connect(guest_addr1(), broker_->port(), guest_addr2(),
                     proto::encode(proto::ConnectRequest{16384, 128, proto::kConnectLanding}), 16384, 128);
    if (!accepted || !accepted->accepted) return ::testing::AssertionFailure() << "not accepted";
    auto frames_out = frame(FrameType::kConnect, 0, "", "");
    for (const auto& f : {frame(FrameType::kSubscribe, 1, "feed"), frame(FrameType::kPing, 0, "")})
      frames_out.insert(frames_out.end(), f.begin(), f.end());
    if (!peer.send(frames_out)) return ::testing::AssertionFailure() << "send";
    for (int i = 0; i < 50; ++i) {
      auto got = peer.receive(200ms);
      if (!got) continue;
      for (const auto& f : frames(*got))
        if (f.header.type == FrameType::kPong) return ::testing::AssertionSuccess();
    }
    return ::testing::AssertionFailure() << "no PONG";
  };
  RawPeer silent, declines;
  ASSERT_TRUE(landing_peer(silent));
  ASSERT_TRUE(landing_peer(declines));
  auto pub = connect_via(*broker_, Via::kRdma);
  ASSERT_TRUE(pub && pub->flush(10s));
  const std::string big = pattern(1u << 20, 7);
  ASSERT_TRUE(pub->publish("feed", big));
  // One answers with no area: the rest comes as fragments, whole.
  const auto first = first_fragment(declines);
  ASSERT_TRUE(first);
  ASSERT_TRUE(declines.send(ready(first->sid, first->sequence, {first->publisher, 0, 0})));
  std::string got;
  std::uint64_t end = 0;
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (end < big.size() && std::chrono::steady_clock::now() < deadline) {
    auto bytes = declines.receive(200ms);
    if (!bytes) continue;
    for (const auto& f : frames(*bytes)) {
      if (f.header.type != FrameType::kDeliver) continue;
      proto::for_each_delivered(f, [&](const proto::Frame& m) {
        got.append(reinterpret_cast<const char*>(m.payload.data()), m.payload.size());
        end = std::uint64_t{m.header.offset} + m.header.payload_len;
      });
    }
  }
  EXPECT_EQ(end, big.size()) << "its last fragment came";
  EXPECT_GT(got.size(), big.size() - 16384) << "everything after the first fragment";
  EXPECT_TRUE(big.ends_with(got)) << "in order, byte for byte";
  // The other never answers: nothing more of the message reaches it, and it
  // is cut when the write deadline passes; the library subscriber had it all.
  EXPECT_TRUE(silent.wait_disconnected(30s)) << "cut as a slow consumer";
  auto st = broker_->wait_stats([](auto& x) { return x["connections.closed.slow_consumer"] >= 1; }, 10s);
  EXPECT_EQ(st["connections.closed.slow_consumer"], 1);
  EXPECT_EQ(st["rdma.landing.write_errors"], 0);
  auto m = (*s)->next(30s);
  ASSERT_TRUE(m) << m.error().message;
  EXPECT_TRUE(m->data() == big);
}

TEST_P(Rendezvous, EveryBrokenReadyRuleClosesOnlyItsSenderAndALateOneIsIgnored) {
  auto sub = connect_via(*broker_, GetParam());
  ASSERT_TRUE(sub);
  auto s = sub->subscribe(std::string_view("big"));
  ASSERT_TRUE(s && sub->flush(10s));
  const proto::LandingArea nowhere{1, 0x10000, 1};
  auto expect_closed = [&](RawWire& w, const std::vector<std::byte>& bytes, ErrorCode want,
                           std::string text) {
    SCOPED_TRACE(text);
    ASSERT_TRUE(w.send(bytes));
    auto [code, got] = expect_error_then_close(w, 10s);
    EXPECT_EQ(code, want) << got;
    EXPECT_NE(got.find(text), std::string::npos) << got;
  };
  if (GetParam() == Via::kTcp) {
    auto w = raw_wire(*broker_, Via::kTcp);
    ASSERT_TRUE(w);
    expect_closed(*w, ready(1, 1, nowhere), ErrorCode::kMalformedFrame, "version 9 over RDMA");
  } else {
    auto old = raw_wire(*broker_, Via::kRdma, true, proto::ConnectRequest{16384, 16, 0, 8});
    ASSERT_TRUE(old);
    expect_closed(*old, ready(1, 1, nowhere), ErrorCode::kMalformedFrame, "version 9");
    auto w = raw_wire(*broker_, Via::kRdma);
    ASSERT_TRUE(w);
    auto reserved = ready(1, 1, nowhere);
    reserved.back() = std::byte{1};
    expect_closed(*w, reserved, ErrorCode::kMalformedFrame, "reserved");
    // A READY that names no message in progress (one that ended, or never
    // was) is ignored: the connection stays.
    auto late = raw_wire(*broker_, Via::kRdma);
    ASSERT_TRUE(late);
    EXPECT_TRUE(send_then_pong(*late, ready(7, 12345, nowhere))) << "a late RDV_READY costs nothing";
    // Two READYs for one message: the second closes it. (The two closed
    // above have finished closing first, each after its drain, so that the
    // count below is this one's.)
    broker_->wait_stats([](auto& x) { return x["connections.closed.protocol_error"] >= 2; }, 15s);
    RawPeer twice;
    ASSERT_TRUE(connect_and_subscribe(twice, *broker_, "big"));
    ASSERT_TRUE(twice.send(frame(FrameType::kPing, 0, "")));
    ASSERT_TRUE(twice.receive(10s)) << "its PONG";
    auto pub = connect_via(*broker_, Via::kRdma);
    ASSERT_TRUE(pub && pub->publish("big", pattern(1u << 20, 8)));
    const auto first = first_fragment(twice);
    ASSERT_TRUE(first);
    std::vector<std::byte> area(first->length);
    auto region = twice.expose(area, true);
    ASSERT_TRUE(region) << region.error().message;
    auto both = ready(first->sid, first->sequence, {first->publisher, region->address, region->rkey});
    const auto again = both;
    both.insert(both.end(), again.begin(), again.end());
    ASSERT_TRUE(twice.send(both));
    // Its credits are spent on fragments (a raw peer returns none): the
    // ERROR cannot reach it, the close does.
    EXPECT_TRUE(twice.wait_disconnected(15s));
    const auto closed =
        broker_->wait_stats([](auto& x) { return x["connections.closed.protocol_error"] >= 3; }, 15s);
    EXPECT_EQ(closed.at("connections.closed.protocol_error"), 3) << "closed for the second RDV_READY";
    auto m = (*s)->next(30s);
    ASSERT_TRUE(m) << m.error().message;
    EXPECT_EQ(m->payload.size(), 1u << 20);
  }
  // The subscriber is untouched.
  auto pub = connect_via(*broker_, GetParam());
  ASSERT_TRUE(pub && pub->publish("big", std::string_view("fine")));
  auto m = (*s)->next(10s);
  ASSERT_TRUE(m) << m.error().message;
  EXPECT_EQ(m->data(), "fine");
}

TEST_P(Rendezvous, EveryBrokenOfferRuleClosesOnlyItsSender) {
  auto sub = connect_via(*broker_, GetParam());
  ASSERT_TRUE(sub);
  auto s = sub->subscribe(std::string_view("big"));
  ASSERT_TRUE(s && sub->flush(10s));
  struct Case {
    std::string what;
    std::vector<std::byte> bytes;
    ErrorCode code;
    std::string text;
  };
  const proto::RendezvousRegion anywhere{0x10000, 1, 0};
  std::vector<Case> cases;
  if (GetParam() == Via::kTcp) {
    cases.push_back({"an offer over TCP", offer("big", 1u << 20, anywhere), ErrorCode::kMalformedFrame,
                     "version 8 over RDMA"});
  } else {
    cases.push_back({"below the accept's rendezvous_min", offer("big", 60000, anywhere),
                     ErrorCode::kProtocolViolation, "allows offers from 65536"});
    cases.push_back({"over limits.max_payload", offer("big", (16u << 20) + 1, anywhere),
                     ErrorCode::kPayloadTooLarge, "limits.max_payload"});
    auto reserved = offer("big", 1u << 20, anywhere);
    reserved[proto::kHeaderSize + 3 + 15] = std::byte{1};  // the payload's last reserved byte
    cases.push_back({"reserved bytes", reserved, ErrorCode::kMalformedFrame, "reserved"});
    cases.push_back({"a header_len not a multiple of 8", offer("big", 1u << 20, {0x10000, 1, 12}),
                     ErrorCode::kMalformedFrame, "header_len"});
  }
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    auto w = raw_wire(*broker_, GetParam());
    ASSERT_TRUE(w);
    ASSERT_TRUE(w->send(c.bytes));
    auto [code, text] = expect_error_then_close(*w, 10s);
    EXPECT_EQ(code, c.code) << text;
    EXPECT_NE(text.find(c.text), std::string::npos) << text;
  }
  if (GetParam() == Via::kRdma) {
    // An offer on a connection of version 7.
    auto old = raw_wire(*broker_, Via::kRdma, true, proto::ConnectRequest{16384, 16, 0, 7});
    ASSERT_TRUE(old);
    ASSERT_TRUE(old->send(offer("big", 1u << 20, anywhere)));
    auto [code, text] = expect_error_then_close(*old, 10s);
    EXPECT_EQ(code, ErrorCode::kMalformedFrame);
    EXPECT_NE(text.find("version 8"), std::string::npos) << text;
    // A region whose header block breaks §3.6: found when read.
    std::string bytes = pattern(1u << 20, 5);
    std::memcpy(bytes.data(), "no colon\r\n\0\0\0\0\0\0", 16);
    RawPeer peer;
    ASSERT_TRUE(peer.connect_ok(guest_addr1(), broker_->port(), ""));
    auto region = peer.expose(std::as_writable_bytes(std::span(bytes)));
    ASSERT_TRUE(region) << region.error().message;
    region->header_len = 16;
    ASSERT_TRUE(peer.send(offer("big", static_cast<std::uint32_t>(bytes.size()), *region)));
    bool error = false;
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (!error && std::chrono::steady_clock::now() < deadline) {
      auto got = peer.receive(200ms);
      if (!got) continue;
      for (const auto& f : frames(*got))
        error |= f.header.type == FrameType::kError &&
                 f.header.arg == static_cast<std::uint32_t>(ErrorCode::kMalformedFrame);
    }
    EXPECT_TRUE(error) << "MALFORMED_FRAME for the header block";
    EXPECT_TRUE(peer.wait_disconnected(10s));
  }
  // The subscriber is untouched.
  auto pub = connect_via(*broker_, GetParam());
  ASSERT_TRUE(pub && pub->publish("big", std::string_view("fine")));
  auto m = (*s)->next(10s);
  ASSERT_TRUE(m) << m.error().message;
  EXPECT_EQ(m->data(), "fine");
}

INSTANTIATE_TEST_SUITE_P(Via, Rendezvous, ::testing::Values(Via::kRdma, Via::kTcp),
                         [](const auto& info) { return info.param == Via::kRdma ? "rdma" : "tcp"; });
INSTANTIATE_TEST_SUITE_P(Via, RendezvousRdma, ::testing::Values(Via::kRdma),
                         [](const auto&) { return std::string("rdma"); });

}  // namespace
}  // namespace rdmabroker::test
