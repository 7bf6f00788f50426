// SPDX-License-Identifier: Apache-2.0
// The transport-neutral core of a worker (frames -> router -> connections'
// queues -> flush) driven without verbs or sockets: each connection's link is
// a FakeLink that decodes and records what would have been sent.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "broker/core.hpp"
#include "broker/send_blocks.hpp"
#include "connection/connections.hpp"
#include "frames/frame_handler.hpp"
#include "rdmabroker/proto/consumer.hpp"
#include "router/router.hpp"
#include "worker_data_path.hpp"

namespace rdmabroker::daemon {
namespace {

using proto::FrameType;

/// One frame as the client would have received it; a DELIVER is unpacked
/// into one Received per message it carries.
struct Received {
  FrameType type{};
  std::uint32_t arg = 0;  // sid for DELIVER, code for ERROR
  std::string subject;
  std::string payload;
  std::string headers;         // a PUBLISH's header block as text (zero padding included)
  std::uint64_t sequence = 0;  // ABORT: the publisher's id
  std::uint32_t fragment_offset = 0;
  bool fragment = false;
};

class FakeLink final : public Link {
 public:
  explicit FakeLink(Connections& connections) : connections_(connections) {}

  Transport transport() const override { return Transport::kTcp; }
  void flush() override {
    Connection& c = connection();
    while (c.can_send() && !c.outq.empty()) {
      Segment sge[kMaxSendSge];
      std::array<BufferRef, kMaxFramesPerSend> refs;
      PackedSend packed;
      const std::uint32_t block = connections_.pack_next(c, kMaxSendSge, 0, 0, sge, refs, packed);
      if (block == SendBlocks::kNone) return;
      std::vector<std::byte> bytes;
      for (std::uint32_t i = 0; i < packed.num_sge; ++i) {
        const auto* p = reinterpret_cast<const std::byte*>(sge[i].addr);
        bytes.insert(bytes.end(), p, p + sge[i].length);
      }
      decode(bytes);
      connections_.record_send(c, block, &refs, packed);
      // A stuck client accepts nothing: its sends never complete.
      if (!stuck) connections_.retire_send(c, true);
    }
  }
  void pause() override { paused = true; }
  void resume() override { paused = false; }
  bool input_paused() const override { return paused; }
  void add_send_credits(std::uint32_t) override {}
  void disconnect() override { disconnected = true; }
  void release() override {}
  std::string where() const override { return "in a unit test"; }

  std::vector<Received> sent;
  bool stuck = false;
  bool paused = false;
  bool disconnected = false;

 private:
  void decode(const std::vector<std::byte>& bytes) {
    std::size_t off = 0;
    while (off < bytes.size()) {
      proto::Frame f;
      ASSERT_EQ(proto::decode_frame(std::span(bytes).subspan(off), 1 << 20, f), proto::DecodeStatus::kOk);
      if (f.header.type == FrameType::kDeliver) {
        ASSERT_EQ(proto::for_each_delivered(
                      f,
                      [&](const proto::Frame& inner) {
                        sent.push_back({FrameType::kDeliver, f.header.arg, std::string(inner.subject),
                                        as_text(inner.payload), as_text(inner.headers), inner.header.sequence,
                                        inner.header.offset, inner.header.is_fragment()});
                      }),
                  proto::DecodeStatus::kOk);
      } else {
        sent.push_back(
            {f.header.type, f.header.arg, std::string(f.subject), as_text(f.payload), {}, f.header.sequence});
      }
      off += f.header.frame_len();
    }
  }
  static std::string as_text(std::span<const std::byte> p) {
    return std::string(reinterpret_cast<const char*>(p.data()), p.size());
  }

  Connections& connections_;
};

class RouterTest : public ::testing::Test {
 protected:
  // Worker 1 is someone else: its deliveries are batched.
  RouterTest() : path_(DataPathShape{.buffer_size = 4096, .max_connections = 16, .workers = 2}) {}

  /// An authenticated client whose link is a FakeLink.
  struct Client {
    Connection* c;
    FakeLink* link;
  };
  Client connect(std::uint8_t version = proto::kProtocolVersion) {
    auto link = std::make_unique<FakeLink>(*connections_);
    FakeLink* l = link.get();
    Connection& c = path_.accept(std::move(link), version, 4);
    send(c, frame(FrameType::kConnect, "", "", "", 0));
    EXPECT_EQ(c.state, ConnState::kOpen);
    return {&c, l};
  }

  static std::vector<std::byte> frame(FrameType type, std::string_view subject, std::string_view reply,
                                      std::string_view payload, std::uint32_t arg, std::uint16_t flags = 0) {
    proto::FrameHeader h;
    h.type = type;
    h.arg = arg;
    h.flags = flags;
    h.payload_len = static_cast<std::uint32_t>(payload.size());
    std::vector<std::byte> out(
        proto::align_up(proto::kHeaderSize + subject.size() + reply.size() + payload.size()));
    proto::encode_frame(out, h, subject, reply, std::as_bytes(std::span(payload.data(), payload.size())));
    return out;
  }
  /// Hands `bytes` (whole frames) to the frame handler as one receive, then
  /// ends the loop turn: batches posted, touched connections flushed.
  void send(Connection& c, const std::vector<std::byte>& bytes) { path_.receive(c, bytes); }
  void subscribe(Client& s, std::string_view pattern, std::uint32_t sid, std::string_view group = {}) {
    send(*s.c, frame(FrameType::kSubscribe, pattern, group, "", sid));
  }
  void publish(Client& p, std::string_view subject, std::string_view payload) {
    send(*p.c, frame(FrameType::kPublish, subject, "", payload, 0));
  }
  /// A PUBLISH fragment (SPEC.md §3.7) of `p`'s `length`-byte message.
  static std::vector<std::byte> fragment(const Client& p, std::uint32_t offset, std::uint32_t length,
                                         std::string_view subject, std::string_view payload) {
    std::vector<std::byte> out(proto::align_up(proto::kHeaderSize + subject.size() + payload.size()));
    proto::encode_frame(out, proto::FrameHeader::fragment(length, offset, p.c->id), subject, {},
                        std::as_bytes(std::span(payload.data(), payload.size())));
    return out;
  }
  std::uint64_t dropped(DropReason r) const { return ctx_->stats.dropped[static_cast<std::size_t>(r)].get(); }
  static std::vector<std::string> payloads(const FakeLink& l, std::uint32_t sid) {
    std::vector<std::string> out;
    for (const auto& r : l.sent) {
      if (r.type == FrameType::kDeliver && r.arg == sid) out.push_back(r.payload);
    }
    return out;
  }

  WorkerDataPath path_;
  BrokerCore& core_ = path_.core;
  std::unique_ptr<BufferPool>& pool_ = path_.pool;
  std::unique_ptr<WorkerContext>& ctx_ = path_.ctx;
  std::unique_ptr<Connections>& connections_ = path_.connections;
  std::unique_ptr<Router>& router_ = path_.router;
  std::unique_ptr<FrameHandler>& frames_ = path_.frames;
};

TEST_F(RouterTest, FansOutToEverySubscriptionThatMatches) {
  Client exact = connect(), star = connect(), tail = connect(), other = connect(), pub = connect();
  subscribe(exact, "orders.eu", 1);
  subscribe(star, "orders.*", 2);
  subscribe(tail, "orders.>", 3);
  subscribe(other, "trades.eu", 4);
  publish(pub, "orders.eu", "m1");
  EXPECT_EQ(payloads(*exact.link, 1), std::vector<std::string>{"m1"});
  EXPECT_EQ(payloads(*star.link, 2), std::vector<std::string>{"m1"});
  EXPECT_EQ(payloads(*tail.link, 3), std::vector<std::string>{"m1"});
  EXPECT_TRUE(other.link->sent.empty());
  EXPECT_TRUE(pub.link->sent.empty());
  EXPECT_EQ(ctx_->stats.routed.get(), 3u);
  EXPECT_EQ(ctx_->stats.deliveries.get(), 3u);
  EXPECT_EQ(exact.link->sent.front().subject, "orders.eu");
}

TEST_F(RouterTest, AQueueGroupGetsEachMessageOnceRoundRobin) {
  Client plain = connect(), pub = connect();
  std::vector<Client> members;
  for (std::uint32_t i = 0; i < 4; ++i) {
    members.push_back(connect());
    subscribe(members.back(), "jobs", 10 + i, "workers");
  }
  subscribe(plain, "jobs", 1);
  for (int m = 0; m < 8; ++m) publish(pub, "jobs", "j" + std::to_string(m));
  EXPECT_EQ(payloads(*plain.link, 1).size(), 8u);
  std::map<std::string, int> seen;
  for (std::uint32_t i = 0; i < 4; ++i) {
    const auto got = payloads(*members[i].link, 10 + i);
    EXPECT_EQ(got.size(), 2u) << "member " << i;  // round robin: each member gets its turn
    for (const auto& p : got) ++seen[p];
  }
  EXPECT_EQ(seen.size(), 8u);  // every message went to exactly one member
  for (const auto& [p, n] : seen) EXPECT_EQ(n, 1) << p;
}

// SPEC.md §3.6: headers reach subscribers of version 2 as published; one of
// version 1 gets the same messages without them (counted), in order; a
// client of version 1 that sends a header block breaks a reserved field.
TEST_F(RouterTest, HeadersReachVersionTwoAndAreLeftOutForVersionOne) {
  Client v2 = connect(), v1 = connect(1), pub = connect();
  subscribe(v2, "traced.>", 1);
  subscribe(v1, "traced.>", 2);
  const proto::HeaderField fields[] = {{"Trace-Id", "t-1"}};
  std::vector<std::byte> batch;
  for (int i = 0; i < 4; ++i) {
    const std::string payload = "m" + std::to_string(i);
    std::vector<std::byte> f(256);
    proto::FrameHeader h;
    h.type = FrameType::kPublish;
    f.resize(proto::encode_frame(f, h, "traced.a", {},
                                 std::as_bytes(std::span(payload.data(), payload.size())),
                                 i % 2 == 0 ? std::span(fields) : std::span<const proto::HeaderField>{}));
    batch.insert(batch.end(), f.begin(), f.end());
  }
  send(*pub.c, batch);
  const std::vector<std::string> all = {"m0", "m1", "m2", "m3"};
  EXPECT_EQ(payloads(*v2.link, 1), all);
  EXPECT_EQ(payloads(*v1.link, 2), all);
  ASSERT_EQ(v2.link->sent.size(), 4u);
  EXPECT_EQ(v2.link->sent[0].headers.substr(0, 15), "Trace-Id: t-1\r\n");
  EXPECT_TRUE(v2.link->sent[1].headers.empty());
  for (const auto& r : v1.link->sent) EXPECT_TRUE(r.headers.empty()) << r.payload;
  EXPECT_EQ(ctx_->stats.headers_stripped.get(), 2u);
  EXPECT_EQ(ctx_->stats.deliveries.get(), 8u);
  EXPECT_EQ(core_.slots->queued(v1.c->slot), 0) << "the queue accounting is the frames' as received";

  Client old_pub = connect(1);
  // m0: 32 + "traced.a" + a 16-byte block + "m0", padded to 64.
  send(*old_pub.c, std::vector<std::byte>(batch.begin(), batch.begin() + 64));
  ASSERT_FALSE(old_pub.link->sent.empty());
  EXPECT_EQ(old_pub.link->sent[0].type, FrameType::kError);
  EXPECT_EQ(old_pub.link->sent[0].arg, static_cast<std::uint32_t>(proto::ErrorCode::kMalformedFrame));
  EXPECT_NE(old_pub.link->sent[0].payload.find("needs protocol version 2"), std::string::npos);
  EXPECT_EQ(payloads(*v2.link, 1).size(), 4u) << "a refused frame goes nowhere";
}

TEST_F(RouterTest, ARequestNobodyServesIsAnsweredNoResponders) {
  Client req = connect(), pub = connect();
  send(*req.c, frame(FrameType::kPublish, "svc.echo", "_INBOX.7", "ping", 0, proto::kFlagRequest));
  ASSERT_EQ(req.link->sent.size(), 1u);
  EXPECT_EQ(req.link->sent[0].type, FrameType::kNoResponders);
  EXPECT_EQ(req.link->sent[0].subject, "_INBOX.7");
  EXPECT_EQ(ctx_->stats.no_responders.get(), 1u);
  // A plain publish to nobody is counted, not answered.
  publish(pub, "svc.echo", "x");
  EXPECT_TRUE(pub.link->sent.empty());
  EXPECT_EQ(ctx_->stats.messages_no_subscribers.get(), 2u);
}

TEST_F(RouterTest, EachPublishersMessagesArriveInTheOrderItSentThem) {
  Client sub = connect(), a = connect(), b = connect();
  subscribe(sub, "ticks", 1);
  for (int i = 0; i < 50; ++i) {
    // Interleaved, and several frames per receive: batching must not reorder.
    send(*a.c, frame(FrameType::kPublish, "ticks", "", "a" + std::to_string(i), 0));
    auto two = frame(FrameType::kPublish, "ticks", "", "b" + std::to_string(2 * i), 0);
    auto next = frame(FrameType::kPublish, "ticks", "", "b" + std::to_string(2 * i + 1), 0);
    two.insert(two.end(), next.begin(), next.end());
    send(*b.c, two);
  }
  int next_a = 0, next_b = 0;
  for (const auto& p : payloads(*sub.link, 1)) {
    if (p[0] == 'a') {
      EXPECT_EQ(p, "a" + std::to_string(next_a++));
    } else {
      EXPECT_EQ(p, "b" + std::to_string(next_b++));
    }
  }
  EXPECT_EQ(next_a, 50);
  EXPECT_EQ(next_b, 100);
}

TEST_F(RouterTest, ABackloggedSubscriberStallsItsPublisherThenIsCutOff) {
  ctx_->options.max_pending_bytes = 16 * 1024;
  ctx_->options.producer_stall_ms = 0;           // the next deadline check finds the stall waited in vain
  ctx_->now = std::chrono::steady_clock::now();  // check_deadlines() reads the clock
  Client sub = connect(), bystander = connect(), pub = connect();
  sub.link->stuck = true;  // takes its first sends and never completes them
  subscribe(sub, "feed", 1);
  subscribe(bystander, "feed", 2);
  const std::string payload(1000, 'x');
  int published = 0;
  while (!pub.link->paused && published < 100) {
    publish(pub, "feed", payload);
    ++published;
  }
  // Paused at three quarters of the bound: before the subscriber overflows.
  ASSERT_TRUE(pub.link->paused);
  EXPECT_TRUE(pub.c->stalled);
  EXPECT_EQ(ctx_->stats.producer_stalls.get(), 1u);
  EXPECT_TRUE(sub.c->is_up());
  // What it sends meanwhile (up to its credits) waits: the backlog grows no further.
  const std::int64_t queued = core_.slots->queued(sub.c->slot);
  for (int i = 0; i < 10; ++i) publish(pub, "feed", payload);
  EXPECT_EQ(core_.slots->queued(sub.c->slot), queued);
  EXPECT_EQ(pub.c->held_input.size(), 10u);
  // The subscriber took nothing within producer_stall_ms: the stall ends and
  // the held frames flow without waiting for it again; it overflows its
  // bound and is cut off (its queued messages counted as dropped), nobody else is.
  connections_->check_deadlines();
  EXPECT_FALSE(pub.c->stalled);
  EXPECT_TRUE(pub.c->held_input.empty());
  EXPECT_FALSE(pub.link->paused);
  EXPECT_EQ(ctx_->stats.producer_stalls.get(), 1u) << "what the stall held stalled it again";
  EXPECT_EQ(sub.c->reason, CloseReason::kSlowConsumer);
  EXPECT_FALSE(sub.c->is_up());
  EXPECT_GT(ctx_->stats.dropped[static_cast<std::size_t>(DropReason::kSlowConsumer)].get(), 0u);
  EXPECT_TRUE(pub.c->is_up());
  EXPECT_TRUE(bystander.c->is_up());
  EXPECT_EQ(payloads(*bystander.link, 2).size(), static_cast<std::size_t>(ctx_->stats.messages_in.get()));
}

// Each message in a receive buffer of its own, for a subscriber that takes
// nothing: before, each held its whole buffer until sent, and one slow
// subscriber of small messages took the pool (issue 48). Waiting, they are
// copied back to back into buffers of the subscriber's own; once it takes
// again, it gets every one, in order, in fewer DELIVERs.
TEST_F(RouterTest, WaitingSmallMessagesAreCopiedOutOfTheirReceiveBuffers) {
  core_.pool_shares.configure(pool_->count());
  Client sub = connect(), pub = connect();
  sub.link->stuck = true;
  subscribe(sub, "small", 1);
  const std::uint32_t baseline = pool_->in_use();
  constexpr int kMessages = 120;
  for (int i = 0; i < kMessages; ++i) {
    ctx_->now += std::chrono::milliseconds(1);  // what waited 2 ms is copied (Connections::kCompactAfter)
    publish(pub, "small", "m" + std::to_string(i));
  }
  EXPECT_TRUE(sub.c->is_up());
  // 120 receive buffers, or a few compact ones (and the few sends in flight).
  EXPECT_LE(pool_->in_use(), baseline + 12) << "waiting messages still hold their receive buffers";
  // A few left where they were (kCompactAbovePins), the two youngest, two compact buffers.
  EXPECT_LE(sub.c->pins, 8);
  EXPECT_EQ(core_.slots->pins(sub.c->slot), sub.c->pins);
  EXPECT_GT(ctx_->stats.compacted_messages.get(), 100u);
  // The subscriber takes again: its sends complete, the rest follows.
  sub.link->stuck = false;
  while (sub.c->inflight_count > 0) connections_->retire_send(*sub.c, true);
  connections_->touch(*sub.c);
  connections_->flush_touched();
  const auto got = payloads(*sub.link, 1);
  ASSERT_EQ(got.size(), static_cast<std::size_t>(kMessages));
  for (int i = 0; i < kMessages; ++i) EXPECT_EQ(got[i], "m" + std::to_string(i));
  EXPECT_EQ(sub.c->pins, 0);
  EXPECT_EQ(ctx_->stats.queue_pins.get(), 0);
  EXPECT_EQ(pool_->in_use(), baseline) << "a compact buffer outlived its messages";
}

// Messages too large to copy hold a buffer each: the subscriber's share of
// the pool (limits.pool_share_percent) bounds them. Its publisher is slowed
// at half the share, the subscriber cut at the share; the bytes bound
// (64 MiB) is nowhere near.
TEST_F(RouterTest, ASubscriberPastItsPoolShareStallsItsPublisherThenIsCutOff) {
  core_.pool_shares.configure(pool_->count());
  ctx_->options.pool_share_percent = 10;         // 25 of the 256 buffers
  ctx_->options.producer_stall_ms = 0;           // the next deadline check finds the stall waited in vain
  ctx_->now = std::chrono::steady_clock::now();  // check_deadlines() reads the clock
  Client sub = connect(), bystander = connect(), pub = connect();
  sub.link->stuck = true;
  subscribe(sub, "large", 1);
  subscribe(bystander, "large", 2);
  const std::string payload(3000, 'L');  // more than half a 4 KiB buffer: not copied
  int published = 0;
  while (!pub.link->paused && published < 100) {
    publish(pub, "large", payload);
    ++published;
  }
  ASSERT_TRUE(pub.link->paused);
  EXPECT_LE(sub.c->pins, 14);
  EXPECT_TRUE(sub.c->is_up());
  // What it sends meanwhile waits; once the stall has waited in vain it
  // flows, and the subscriber is cut at its share.
  for (int i = 0; i < 40 && sub.c->is_up(); ++i) {
    publish(pub, "large", payload);
    if (i == 0) {
      EXPECT_EQ(pub.c->held_input.size(), 1u);
    }
    connections_->check_deadlines();
  }
  EXPECT_EQ(sub.c->reason, CloseReason::kSlowConsumer);
  EXPECT_EQ(ctx_->stats.share_cuts[static_cast<std::size_t>(ShareScope::kConnection)].get(), 1u);
  EXPECT_GT(ctx_->stats.dropped[static_cast<std::size_t>(DropReason::kSlowConsumer)].get(), 0u);
  EXPECT_EQ(sub.c->pins, 0);
  EXPECT_TRUE(pub.c->is_up());
  EXPECT_TRUE(bystander.c->is_up());
  EXPECT_EQ(payloads(*bystander.link, 2).size(), static_cast<std::size_t>(ctx_->stats.messages_in.get()));
}

// One user's connections together are bounded too, once the pool runs
// short: two stuck subscribers of one tenant, each within its own share,
// pass the tenant's; one is cut when free buffers are down to twice the
// reserve (32 of 256), not before.
TEST_F(RouterTest, ATenantsConnectionsTogetherAreBoundedByItsShareWhenThePoolRunsShort) {
  core_.pool_shares.configure(pool_->count());
  ctx_->options.pool_share_percent = 50;         // 128 buffers each
  ctx_->options.user_pool_share_percent = 15;    // 38 for the tenant
  ctx_->options.producer_stall_ms = 0;           // stalls for stuck subscribers end at the next check
  ctx_->now = std::chrono::steady_clock::now();  // check_deadlines() reads the clock
  Client a = connect(), b = connect(), pub = connect();
  ASSERT_EQ(a.c->tenant, b.c->tenant) << "anonymous clients of one address are one tenant";
  a.link->stuck = b.link->stuck = true;
  subscribe(a, "t.a", 1);
  subscribe(b, "t.b", 2);
  const std::string payload(3000, 'T');  // not copied: a buffer each
  std::uint32_t free_at_cut = 0;
  for (int i = 0; i < 120 && a.c->is_up() && b.c->is_up(); ++i) {
    free_at_cut = pool_->count() - pool_->in_use();
    publish(pub, "t.a", payload);
    publish(pub, "t.b", payload);
    connections_->check_deadlines();
  }
  EXPECT_TRUE(!a.c->is_up() || !b.c->is_up());
  EXPECT_EQ(ctx_->stats.share_cuts[static_cast<std::size_t>(ShareScope::kUser)].get(), 1u);
  EXPECT_LE(free_at_cut, 2 * core_.pool_shares.reserve() + 2) << "cut before the pool ran short";
  EXPECT_GT(a.c->tenant->pins.load(), 38) << "the tenant's share alone does not cut while buffers are plenty";
}

TEST_F(RouterTest, AnotherWorkersSubscriberIsReachedThroughItsBatch) {
  Client pub = connect();
  // A subscription of a connection that worker 1 owns.
  core_.index.add("remote.subject", Subscriber{1, 999, 5, 7}, "");
  // Two messages in one receive: consecutive in one buffer, they share one DELIVER.
  auto two = frame(FrameType::kPublish, "remote.subject", "", "r1", 0);
  auto next = frame(FrameType::kPublish, "remote.subject", "", "r2", 0);
  two.insert(two.end(), next.begin(), next.end());
  send(*pub.c, two);
  const auto& batch = router_->batch_for(1);
  ASSERT_EQ(batch.size(), 1u);
  EXPECT_EQ(batch[0].connection, 999u);
  EXPECT_EQ(batch[0].item.messages, 2u);
  EXPECT_EQ(core_.slots->queued(7), static_cast<std::int64_t>(batch[0].item.body_len));
  core_.slots->add_queued(7, -static_cast<std::int64_t>(batch[0].item.body_len));
}

TEST_F(RouterTest, FramesBeforeConnectAndFramesOnlyTheBrokerSendsCloseTheConnection) {
  auto link = std::make_unique<FakeLink>(*connections_);
  FakeLink& l = *link;
  Connection& c =
      connections_->add(std::make_unique<Connection>(50, *core_.slots->acquire(), "early", std::move(link),
                                                     core_.options.buffer_size, 4, ConnState::kAccepting));
  connections_->establish(c);
  send(c, frame(FrameType::kPublish, "a", "", "too early", 0));
  EXPECT_EQ(c.reason, CloseReason::kAuthFailed);
  // ERROR with the reason, then CLOSE with the same code (SPEC.md §3.5).
  ASSERT_GE(l.sent.size(), 2u);
  const auto& error = l.sent[l.sent.size() - 2];
  EXPECT_EQ(error.type, FrameType::kError);
  EXPECT_EQ(error.arg, static_cast<std::uint32_t>(proto::ErrorCode::kAuthenticationRequired));
  EXPECT_EQ(l.sent.back().type, FrameType::kClose);
  EXPECT_EQ(l.sent.back().arg, static_cast<std::uint32_t>(proto::ErrorCode::kAuthenticationRequired));

  Client open = connect();
  send(*open.c, frame(FrameType::kPong, "", "", "", 0));
  EXPECT_EQ(open.c->reason, CloseReason::kProtocolError);
  EXPECT_EQ(open.link->sent.back().arg, static_cast<std::uint32_t>(proto::ErrorCode::kProtocolViolation));
}

TEST_F(RouterTest, AMessagesFragmentsFollowTheRecipientsOfItsFirstAsTheyArrive) {
  Client early = connect(), g1 = connect(), g2 = connect(), late = connect(), pub = connect(),
         other = connect();
  subscribe(early, "big.file", 1);
  subscribe(g1, "big.file", 2, "workers");
  subscribe(g2, "big.file", 3, "workers");
  send(*pub.c, fragment(pub, 0, 12, "big.file", "aaaa"));
  subscribe(late, "big.file", 4);  // after the first fragment: none of this message
  // Fragments go on as they arrive: another publisher's message is not held behind them.
  publish(other, "big.file", "small");
  send(*pub.c, fragment(pub, 4, 12, "", "bbbb"));
  send(*pub.c, fragment(pub, 8, 12, "", "cccc"));
  ASSERT_EQ(payloads(*early.link, 1), (std::vector<std::string>{"aaaa", "small", "bbbb", "cccc"}));
  EXPECT_EQ(early.link->sent[2].fragment_offset, 4u);
  EXPECT_EQ(early.link->sent[2].sequence, pub.c->id) << "a fragment names its publisher";
  // The queue group's member is chosen once for the whole message.
  const auto in_g1 = payloads(*g1.link, 2), in_g2 = payloads(*g2.link, 3);
  const auto& chosen = std::count(in_g1.begin(), in_g1.end(), "aaaa") == 1 ? in_g1 : in_g2;
  EXPECT_EQ(std::count(chosen.begin(), chosen.end(), "bbbb"), 1);
  EXPECT_EQ(std::count(chosen.begin(), chosen.end(), "cccc"), 1);
  EXPECT_EQ(in_g1.size() + in_g2.size(), 4u) << "three fragments and the small message, once each";
  EXPECT_EQ(payloads(*late.link, 4), std::vector<std::string>{"small"});
  EXPECT_FALSE(pub.c->open_message.open) << "complete";
  EXPECT_EQ(ctx_->stats.messages_in.get(), 2u) << "a message counts once, not per fragment";
  EXPECT_EQ(ctx_->stats.bytes_in.get(), 12u + 5u);
  // The next message of the same publisher starts afresh.
  send(*pub.c, fragment(pub, 0, 8, "big.file", "dddd"));
  send(*pub.c, fragment(pub, 4, 8, "", "eeee"));
  EXPECT_EQ(payloads(*late.link, 4), (std::vector<std::string>{"small", "dddd", "eeee"}));
}

TEST_F(RouterTest, AnOlderSubscriberIsSentNoFragmentsAndTheDropIsCounted) {
  Client v3 = connect(3), v4 = connect(), pub = connect();
  subscribe(v3, "big", 1);
  subscribe(v4, "big", 2);
  send(*pub.c, fragment(pub, 0, 8, "big", "abcd"));
  send(*pub.c, fragment(pub, 4, 8, "", "efgh"));
  publish(pub, "big", "fits");
  EXPECT_EQ(payloads(*v3.link, 1), std::vector<std::string>{"fits"});
  EXPECT_EQ(payloads(*v4.link, 2), (std::vector<std::string>{"abcd", "efgh", "fits"}));
  EXPECT_EQ(dropped(DropReason::kNeedsFragments), 1u) << "once per message, not per fragment";
  EXPECT_EQ(core_.slots->queued(v3.c->slot), 0) << "nothing left accounted as queued";
  // One abandoned half-way counts once too (with its ABORT, which it is not sent either).
  send(*pub.c, fragment(pub, 0, 8, "big", "abcd"));
  send(*pub.c, frame(FrameType::kAbort, "", "", "", 0));
  EXPECT_EQ(dropped(DropReason::kNeedsFragments), 2u);
  EXPECT_EQ(payloads(*v3.link, 1), std::vector<std::string>{"fits"});
  EXPECT_EQ(ctx_->stats.deliveries.get(), 3u)
      << "v4: the whole message and the one completed in fragments; v3: one";
}

/// What the workers hand the stream engine (broker/streams.hpp).
class FakeStreams final : public StreamCapture {
 public:
  void capture(std::vector<StreamPublish>&& batch) override {
    for (auto& p : batch) got.push_back(std::move(p));
  }
  void command(ConsumerCommand&&) override {}
  std::vector<StreamPublish> got;
};
/// The other workers, as the end of a loop turn posts to them (nothing to post here).
class NoOtherWorkers final : public WorkerDispatch {
 public:
  void post_deliveries(std::vector<std::vector<RemoteDelivery>>& per_worker, Handoff) override {
    for (auto& batch : per_worker) batch.clear();
  }
  void evict(const Admission::Eviction&) override {}
  std::int64_t pending_charge_total() const override { return 0; }
};

TEST_F(RouterTest, AStreamIsRoutedOncePerMessageInABatchAndItsBuffersCountAsTheEnginesBacklog) {
  FakeStreams streams;
  NoOtherWorkers others;
  core_.streams = &streams;
  core_.workers = &others;
  core_.stream_slot = 15;  // a slot none of this test's connections holds
  core_.index.add("orders.>", Subscriber{kStreamWorker, 3, 0, core_.stream_slot, 0});
  Client sub = connect(), pub = connect();
  subscribe(sub, "orders.>", 1);
  publish(pub, "orders.eu", "one");
  publish(pub, "other", "not for the stream");
  router_->post_batches();  // the end of the loop turn (the Worker's)
  ASSERT_EQ(streams.got.size(), 1u);
  EXPECT_EQ(streams.got[0].stream, 3u);
  proto::Frame f;
  const auto& p = streams.got[0];
  ASSERT_EQ(proto::decode_frame({p.buf.data() + p.frame.offset, p.frame.len}, p.frame.len, f),
            proto::DecodeStatus::kOk);
  EXPECT_EQ(f.subject, "orders.eu");
  EXPECT_EQ(payloads(*sub.link, 1), std::vector<std::string>{"one"}) << "the subscriber is served as always";
  EXPECT_EQ(core_.slots->queued(core_.stream_slot), 1) << "until the engine stored it";
  // A message in fragments is not the stream's: counted once.
  send(*pub.c, fragment(pub, 0, 8, "orders.big", "abcd"));
  send(*pub.c, fragment(pub, 4, 8, "", "efgh"));
  router_->post_batches();
  EXPECT_EQ(streams.got.size(), 1u);
  EXPECT_EQ(dropped(DropReason::kNeedsFragments), 1u);
  EXPECT_EQ(payloads(*sub.link, 1), (std::vector<std::string>{"one", "abcd", "efgh"}));
  // The backlog counts the receive buffers the messages pin: three
  // messages in one receive add one, the next receive one more.
  auto three = frame(FrameType::kPublish, "orders.a", "", "1", 0);
  for (const char* subject : {"orders.b", "orders.c"}) {
    const auto next = frame(FrameType::kPublish, subject, "", "1", 0);
    three.insert(three.end(), next.begin(), next.end());
  }
  send(*pub.c, three);
  publish(pub, "orders.d", "1");
  router_->post_batches();
  ASSERT_EQ(streams.got.size(), 5u);
  EXPECT_EQ(core_.slots->queued(core_.stream_slot), 3) << "one buffer before, two now";
  std::int64_t charged = 0;
  for (const auto& q : streams.got) charged += q.backlog_charge;
  EXPECT_EQ(charged, 3) << "what the engine gives back once it stored them";
  core_.slots->add_queued(core_.stream_slot, -charged);
  streams.got.clear();
  core_.streams = nullptr;
  core_.workers = nullptr;
}

/// Other workers whose queues hold `total` (pending_charge_total).
class BusyOtherWorkers final : public WorkerDispatch {
 public:
  void post_deliveries(std::vector<std::vector<RemoteDelivery>>& per_worker, Handoff) override {
    for (auto& batch : per_worker) batch.clear();
  }
  void evict(const Admission::Eviction&) override {}
  std::int64_t pending_charge_total() const override { return total; }
  std::int64_t total = 0;
};

// A publisher slowed by the stream engine's backlog resumes once the engine
// has taken it below half its bound, whatever the subscribers' queues hold
// together: the broker-wide bound on queued bytes (crowds_total) neither
// starts nor prolongs a stall for an engine's slot, whose count is not
// bytes. Before, the release asked it too, and a publisher to a stream
// waited for producer_stall_ms while other queues were full.
TEST_F(RouterTest, APublisherSlowedByTheStreamEngineResumesOnceItDrainsWhateverOtherQueuesHold) {
  FakeStreams streams;
  BusyOtherWorkers others;
  core_.streams = &streams;
  core_.workers = &others;
  core_.stream_slot = 15;
  core_.stream_backlog = 8;  // slowed above 6 buffers, resumed at 4
  ctx_->options.max_pending_bytes_total = 64 * 1024;
  ctx_->options.max_connections = 100000;        // a fair share of 0 bytes: any backlog is above it
  others.total = 60 * 1024;                      // the queues together near their bound
  ctx_->options.producer_stall_ms = 60'000;      // a release by draining, not by patience
  ctx_->now = std::chrono::steady_clock::now();  // check_deadlines() reads the clock
  core_.index.add("orders.>", Subscriber{kStreamWorker, 3, 0, core_.stream_slot, 0});
  Client pub = connect();
  for (int i = 0; i < 20 && !pub.link->paused; ++i) {
    publish(pub, "orders.x", "m");  // a receive each: a buffer each
    router_->post_batches();
  }
  ASSERT_TRUE(pub.c->stalled) << "slowed for the engine's backlog";
  ASSERT_GT(core_.slots->queued(core_.stream_slot), 6);
  // The engine stores all but two.
  const std::int64_t stored = core_.slots->queued(core_.stream_slot) - 2;
  core_.slots->add_queued(core_.stream_slot, -stored);
  connections_->check_deadlines();
  EXPECT_FALSE(pub.c->stalled) << "drained below half its bound: the stall ends";
  EXPECT_FALSE(pub.link->paused);
  core_.slots->add_queued(core_.stream_slot, -2);
  streams.got.clear();
  core_.streams = nullptr;
  core_.workers = nullptr;
}

TEST_F(RouterTest, APublisherThatLeavesOrAbortsMidMessageAbortsItForEveryRecipient) {
  Client sub = connect(), pub = connect(), quitter = connect();
  subscribe(sub, "big", 1);
  core_.index.add("big", Subscriber{1, 999, 5, 7}, "");  // and another worker's subscriber
  send(*pub.c, fragment(pub, 0, 8, "big", "abcd"));
  send(*pub.c, frame(FrameType::kAbort, "", "", "", 0));
  ASSERT_EQ(sub.link->sent.size(), 2u);
  EXPECT_EQ(sub.link->sent[1].type, FrameType::kAbort);
  EXPECT_EQ(sub.link->sent[1].arg, 1u);
  EXPECT_EQ(sub.link->sent[1].sequence, pub.c->id);
  const auto& batch = router_->batch_for(1);
  ASSERT_EQ(batch.size(), 2u) << "the other worker's ABORT follows its fragment";
  EXPECT_EQ(batch[1].item.header.type, FrameType::kAbort);
  EXPECT_TRUE(pub.c->is_up());
  EXPECT_EQ(dropped(DropReason::kIncomplete), 1u)
      << "counted where the ABORT is queued (worker 1 for its own)";
  core_.slots->add_queued(7, -static_cast<std::int64_t>(batch[0].item.body_len));

  send(*quitter.c, fragment(quitter, 0, 8, "big", "wxyz"));
  connections_->peer_gone(*quitter.c, CloseReason::kPeerDisconnected);
  connections_->flush_touched();
  EXPECT_EQ(sub.link->sent.back().type, FrameType::kAbort);
  EXPECT_EQ(sub.link->sent.back().sequence, quitter.c->id);
  EXPECT_EQ(dropped(DropReason::kIncomplete), 2u);
  publish(pub, "big", "after");
  EXPECT_EQ(payloads(*sub.link, 1).back(), "after") << "the others go on";
}

// SPEC.md §3.7 rule 4: an open message's next fragment is due within
// limits.fragment_timeout_ms, a clock that does not run while the broker
// holds the publisher back. (Time passes by moving the last fragment back.)
TEST_F(RouterTest, AMessageLeftOpenIsAbandonedAtItsDeadlineButNotWhileItsPublisherIsHeldBack) {
  Client sub = connect(), pub = connect();
  subscribe(sub, "big", 1);
  send(*pub.c, fragment(pub, 0, 8, "big", "abcd"));
  ASSERT_TRUE(pub.c->open_message.open);
  const auto long_ago = std::chrono::steady_clock::now() - std::chrono::hours(1);
  pub.c->open_message.waiting_since = long_ago;
  pub.link->paused = true;  // the broker does not take its frames (TCP: no pool buffer; RDMA: no credit)
  connections_->check_deadlines();
  EXPECT_TRUE(pub.c->is_up()) << "held back: not the publisher's delay";
  EXPECT_GT(pub.c->open_message.waiting_since, long_ago) << "the clock starts again from the hold";
  pub.link->paused = false;
  connections_->check_deadlines();
  EXPECT_TRUE(pub.c->is_up()) << "within the deadline since the hold ended";

  pub.c->open_message.waiting_since = long_ago;
  connections_->check_deadlines();
  connections_->flush_touched();
  EXPECT_FALSE(pub.c->is_up());
  ASSERT_FALSE(pub.link->sent.empty());
  const auto error = std::find_if(pub.link->sent.begin(), pub.link->sent.end(),
                                  [](const auto& r) { return r.type == FrameType::kError; });
  ASSERT_NE(error, pub.link->sent.end());
  EXPECT_EQ(error->arg, static_cast<std::uint32_t>(proto::ErrorCode::kProtocolViolation));
  EXPECT_NE(error->payload.find("limits.fragment_timeout_ms"), std::string::npos) << error->payload;
  EXPECT_EQ(sub.link->sent.back().type, FrameType::kAbort) << "its recipient discards the part it has";
  EXPECT_EQ(dropped(DropReason::kIncomplete), 1u);
}

TEST_F(RouterTest, EveryBrokenFragmentRuleClosesThatPublisherOnly) {
  using Frames = std::vector<std::vector<std::byte>>;
  Client sub = connect();
  subscribe(sub, "big", 1);
  struct Case {
    const char* what;
    std::function<Frames(const Client&)> frames;
    proto::ErrorCode code;
    const char* text;
  };
  const Case cases[] = {
      {"out of order",
       [](const Client& p) {
         return Frames{fragment(p, 0, 12, "big", "aaaa"), fragment(p, 8, 12, "", "cccc")};
       },
       proto::ErrorCode::kProtocolViolation, "offset 4"},
      {"duplicated",
       [](const Client& p) {
         return Frames{fragment(p, 0, 12, "big", "aaaa"), fragment(p, 4, 12, "", "bbbb"),
                       fragment(p, 4, 12, "", "bbbb")};
       },
       proto::ErrorCode::kProtocolViolation, "offset 8"},
      {"missing first", [](const Client& p) { return Frames{fragment(p, 4, 12, "", "bbbb")}; },
       proto::ErrorCode::kProtocolViolation, "of no message"},
      {"a new message over an open one",
       [](const Client& p) {
         return Frames{fragment(p, 0, 12, "big", "aaaa"), fragment(p, 0, 12, "big", "aaaa")};
       },
       proto::ErrorCode::kProtocolViolation, "a new message began"},
      {"a whole message over an open one",
       [](const Client& p) {
         return Frames{fragment(p, 0, 12, "big", "aaaa"), frame(FrameType::kPublish, "big", "", "x", 0)};
       },
       proto::ErrorCode::kProtocolViolation, "back to back"},
      {"another publisher's id",
       [](const Client& p) {
         auto f = fragment(p, 0, 12, "big", "aaaa");
         proto::store<std::uint64_t>(f.data() + 24, p.c->id + 1000);
         return Frames{f};
       },
       proto::ErrorCode::kProtocolViolation, "connection id"},
      {"over limits.max_payload",
       [](const Client& p) { return Frames{fragment(p, 0, (1u << 20) + 1, "big", "aaaa")}; },
       proto::ErrorCode::kPayloadTooLarge, "limits.max_payload"},
      {"ABORT of nothing", [](const Client&) { return Frames{frame(FrameType::kAbort, "", "", "", 0)}; },
       proto::ErrorCode::kProtocolViolation, "ABORT without"},
  };
  for (const Case& k : cases) {
    Client p = connect();
    for (const auto& f : k.frames(p)) send(*p.c, f);
    EXPECT_EQ(p.c->reason, CloseReason::kProtocolError) << k.what;
    ASSERT_GE(p.link->sent.size(), 2u) << k.what;
    const auto& error = p.link->sent[p.link->sent.size() - 2];
    EXPECT_EQ(error.arg, static_cast<std::uint32_t>(k.code)) << k.what;
    EXPECT_NE(error.payload.find(k.text), std::string::npos) << k.what << ": " << error.payload;
  }
  // A connection of version 3 has no fragments at all.
  Client old = connect(3);
  send(*old.c, fragment(old, 0, 12, "big", "aaaa"));
  EXPECT_EQ(old.c->reason, CloseReason::kProtocolError);
  EXPECT_NE(old.link->sent[old.link->sent.size() - 2].payload.find("version 4"), std::string::npos);
  Client pub = connect();
  publish(pub, "big", "still here");
  EXPECT_TRUE(sub.c->is_up());
  EXPECT_EQ(payloads(*sub.link, 1).back(), "still here");
}

// A route only subscribes (SPEC.md §8, §3.11): a PUBLISH, CONSUME, ACK or
// FETCH from one is PROTOCOL_VIOLATION and closes that route alone.
TEST_F(RouterTest, ARouteThatDoesMoreThanSubscribeIsClosedAlone) {
  Client sub = connect();
  subscribe(sub, "x", 1);
  const auto as_route = [&] {
    Client r = connect();
    auto identity = std::make_shared<Identity>(*r.c->identity);
    identity->route = true;
    identity->route_server = "peer";
    r.c->identity = std::move(identity);
    return r;
  };
  const auto with_sequence = [](std::vector<std::byte> bytes, std::uint64_t sequence) {
    proto::FrameHeader h = proto::load_header(bytes.data());
    h.sequence = sequence;
    proto::encode_header(bytes.data(), h);
    return bytes;
  };
  std::array<std::byte, proto::kConsumeConfigLen> config{};
  proto::encode_consumer_config({}, config);
  const std::string settings(reinterpret_cast<const char*>(config.data()), config.size());
  const std::vector<std::pair<std::string, std::vector<std::byte>>> cases = {
      {"PUBLISH", frame(FrameType::kPublish, "x", "", "from a route", 0)},
      {"CONSUME", frame(FrameType::kConsume, "ORDERS", "", settings, 1)},
      {"ACK", with_sequence(frame(FrameType::kAck, "", "", "", 1), 1)},
      {"FETCH", with_sequence(frame(FrameType::kFetch, "", "", std::string(4, '\0'), 1), 1)},
  };
  for (const auto& [what, bytes] : cases) {
    Client r = as_route();
    send(*r.c, bytes);
    EXPECT_EQ(r.c->reason, CloseReason::kProtocolError) << what;
    ASSERT_GE(r.link->sent.size(), 2u) << what;
    const auto& error = r.link->sent[r.link->sent.size() - 2];
    EXPECT_EQ(error.arg, static_cast<std::uint32_t>(proto::ErrorCode::kProtocolViolation)) << what;
    EXPECT_NE(error.payload.find(what + " on a route"), std::string::npos) << error.payload;
  }
  EXPECT_TRUE(payloads(*sub.link, 1).empty()) << "nothing a route published was routed";
  Client pub = connect();
  publish(pub, "x", "still served");
  EXPECT_EQ(payloads(*sub.link, 1), std::vector<std::string>{"still served"});
}

}  // namespace
}  // namespace rdmabroker::daemon
