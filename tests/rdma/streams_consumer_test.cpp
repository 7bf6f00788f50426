// SPDX-License-Identifier: Apache-2.0
// Stream consumers (proto/SPEC.md §3.11, docs/streams.md "Consumers") as
// users meet them, over RDMA (in the guest) and TCP (on the host): every
// stored message in order with its sequence; each start policy; a message
// not acknowledged in time delivered again, then given up with an advisory;
// members of one durable consumer sharing its messages, and what one left
// unacknowledged when it died delivered to the other; a durable consumer
// resuming after a restart of the broker, and after a kill -9 of its own
// process; pull consumers; flow control; a damaged record skipped and
// counted while the rest is served; and every broken rule refused for its
// sender alone.
#include <gtest/gtest.h>
#include <signal.h>

#include <fcntl.h>
#include <sys/wait.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "harness.hpp"
#include "rdmabroker/client.hpp"
#include "rdmabroker/consumer.hpp"
#include "rdmabroker/proto/consumer.hpp"
#include "stream_files.hpp"

namespace rdmabroker::test {
namespace {

using namespace std::chrono_literals;
using proto::ErrorCode;
using proto::FrameType;

class Consumers : public StreamTest {
 protected:
  void start_orders() { start("  - {name: ORDERS, subjects: [\"orders.>\"]}\n"); }
  /// Publishes `n` messages "m<i>" with acknowledgements, on `subject` (i from `first`).
  void publish(Client& c, int n, const std::string& subject = "orders.new", int first = 1) {
    for (int i = first; i < first + n; ++i) {
      ASSERT_TRUE(c.publish_acked(subject, "m" + std::to_string(i), 10s)) << i;
    }
  }
  std::shared_ptr<Consumer> consume(Client& c, ConsumerOptions o) {
    auto r = c.consume("ORDERS", o, 10s);
    EXPECT_TRUE(r) << (r ? "" : r.error().message);
    return r ? r.value() : nullptr;
  }
  std::int64_t stat(const std::string& key) { return broker_->stats()[key]; }
};

TEST_P(Consumers, APushConsumerGetsEveryStoredMessageInOrderWithItsSequence) {
  start_orders();
  auto c = connect_via(*broker_, GetParam());
  ASSERT_TRUE(c);
  publish(*c, 200);
  auto k = consume(*c, {});
  ASSERT_TRUE(k);
  EXPECT_EQ(k->pending_at_open(), 200u);
  for (std::uint64_t i = 1; i <= 200; ++i) {
    auto m = k->next(10s);
    ASSERT_TRUE(m) << i << ": " << m.error().message;
    EXPECT_EQ(m->stream_sequence, i);
    EXPECT_EQ(m->deliveries, 1u);
    EXPECT_EQ(m->subject, "orders.new");
    EXPECT_EQ(m->data(), "m" + std::to_string(i));
    ASSERT_TRUE(k->ack(*m));
  }
  publish(*c, 1, "orders.late", 201);  // stored after it opened: delivered as well
  auto late = k->next(10s);
  ASSERT_TRUE(late);
  EXPECT_EQ(late->stream_sequence, 201u);
  ASSERT_TRUE(c->flush(10s));
  // Waited for together: the statistics are read one by one, not at one instant.
  auto s = broker_->wait_stats(
      [](auto& s) {
        return s["stream.ORDERS.consumer_acks"] == 200 && s["stream.ORDERS.delivered"] == 201 &&
               s["stream.ORDERS.consumer_pending"] == 1;
      },
      10s);
  EXPECT_EQ(s["stream.ORDERS.consumer_acks"], 200);
  EXPECT_EQ(s["stream.ORDERS.delivered"], 201);
  EXPECT_EQ(s["stream.ORDERS.consumer_pending"], 1);
  // What the engine handed to the worker's queue left none of its charge
  // behind (limits.max_pending_bytes_total's total, messages.pending_charge).
  s = broker_->wait_stats(
      [](auto& s) { return s["messages.pending"] == 0 && s["messages.pending_charge"] == 0; }, 10s);
  EXPECT_EQ(s["messages.pending_charge"], 0);
}

// A consumer is a subscription to the broker-wide bounds
// (limits.max_subscriptions_total): charged when it opens, given back when
// it closes. Before, it was never charged but given back, and a broker
// whose consumers had closed twice more than its clients held
// subscriptions refused every SUBSCRIBE ("broker-wide limit reached").
TEST_P(Consumers, AConsumerCountsInTheSubscriptionBoundsAndGivesBackWhatItTook) {
  start("  - {name: ORDERS, subjects: [\"orders.>\"]}\n", "",
        "limits:\n  max_subscriptions_total: 2\n  user_subscription_share_percent: 100\n");
  auto c = connect_via(*broker_, GetParam());
  ASSERT_TRUE(c);
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    auto a = consume(*c, {});
    auto b = consume(*c, {});
    ASSERT_TRUE(a && b);
    auto third = c->consume("ORDERS", {}, 10s);
    ASSERT_FALSE(third) << "two consumers hold the broker's two subscriptions";
    EXPECT_NE(third.error().message.find("broker-wide limit"), std::string::npos) << third.error().message;
    ASSERT_TRUE(a->close());
    ASSERT_TRUE(b->close());
    ASSERT_TRUE(c->flush(10s));
    EXPECT_TRUE(broker_->wait_stats([](auto& s) { return s["subscriptions.memory_bytes"] == 0; },
                                    10s)["subscriptions.memory_bytes"] == 0);
  }
  // What the consumers took is back: two plain subscriptions fit, a third does not.
  auto one = c->subscribe(std::string_view("orders.one"));
  auto two = c->subscribe(std::string_view("orders.two"));
  ASSERT_TRUE(one && two) << (one ? two.error().message : one.error().message);
  ASSERT_TRUE(c->flush(10s));
  auto three = c->subscribe(std::string_view("orders.three"));
  (void)c->flush(10s);
  const auto s =
      broker_->wait_stats([](auto& s) { return s["limits.refused.subscriptions_total"] >= 4; }, 10s);
  EXPECT_EQ(s.at("limits.refused.subscriptions_total"), 4) << "three consumers, then the third subscription";
  EXPECT_EQ(s.at("subscriptions"), 2);
}

TEST_P(Consumers, EachStartPolicyStartsWhereItSays) {
  start_orders();
  auto c = connect_via(*broker_, GetParam());
  ASSERT_TRUE(c);
  publish(*c, 3, "orders.a");
  const auto mid = std::chrono::system_clock::now();
  std::this_thread::sleep_for(20ms);
  publish(*c, 2, "orders.b", 4);
  publish(*c, 1, "orders.a", 6);
  const auto first = [&](ConsumerOptions o) {
    o.ack = ConsumerOptions::Ack::kNone;
    auto k = consume(*c, o);
    std::vector<std::uint64_t> got;
    while (k) {
      auto m = k->next(300ms);
      if (!m) break;
      got.push_back(m->stream_sequence);
    }
    return got;
  };
  using S = ConsumerOptions::Start;
  EXPECT_EQ(first({.start = S::kAll}), (std::vector<std::uint64_t>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(first({.start = S::kNew}), std::vector<std::uint64_t>{});
  EXPECT_EQ(first({.start = S::kLast}), std::vector<std::uint64_t>{6});
  EXPECT_EQ(first({.start = S::kLastPerSubject}), (std::vector<std::uint64_t>{5, 6}));
  EXPECT_EQ(first({.start = S::kSequence, .start_sequence = 5}), (std::vector<std::uint64_t>{5, 6}));
  EXPECT_EQ(first({.start = S::kTime, .start_time = mid}), (std::vector<std::uint64_t>{4, 5, 6}));
}

TEST_P(Consumers, AMessageNotAcknowledgedInTimeComesAgainThenIsGivenUpWithAnAdvisory) {
  start_orders();
  auto c = connect_via(*broker_, GetParam());
  auto watcher = connect_via(*broker_, GetParam());
  ASSERT_TRUE(c && watcher);
  auto advisories = watcher->subscribe("$RB.ADVISORY.MAX_DELIVERIES.ORDERS.>");
  ASSERT_TRUE(advisories && watcher->flush(10s));
  publish(*c, 2);
  auto k = consume(*c, {.durable = "slow", .ack_wait = 300ms, .max_deliver = 2});
  ASSERT_TRUE(k);
  std::vector<std::pair<std::uint64_t, std::uint32_t>> seen;
  for (int i = 0; i < 3; ++i) {
    auto m = k->next(10s);
    ASSERT_TRUE(m) << i;
    seen.emplace_back(m->stream_sequence, m->deliveries);
    if (m->stream_sequence == 2) {
      ASSERT_TRUE(k->ack(*m));  // 1 is never acknowledged
    }
  }
  EXPECT_EQ(seen, (std::vector<std::pair<std::uint64_t, std::uint32_t>>{{1, 1}, {2, 1}, {1, 2}}));
  auto advisory = advisories.value()->next(10s);
  ASSERT_TRUE(advisory);
  EXPECT_EQ(advisory->subject, "$RB.ADVISORY.MAX_DELIVERIES.ORDERS.slow");
  EXPECT_EQ(advisory->data(), R"({"stream":"ORDERS","consumer":"slow","sequence":1,"deliveries":2})");
  EXPECT_FALSE(k->next(500ms)) << "given up: not delivered a third time";
  auto s = broker_->wait_stats([](auto& s) { return s["stream.ORDERS.max_deliveries"] == 1; }, 10s);
  EXPECT_EQ(s["stream.ORDERS.redelivered"], 1);
  // A NAK asks for it again at once.
  publish(*c, 1, "orders.new", 3);
  auto m = k->next(10s);
  ASSERT_TRUE(m && m->stream_sequence == 3u);
  ASSERT_TRUE(k->nak(*m));
  auto again = k->next(10s);
  ASSERT_TRUE(again);
  EXPECT_EQ(again->stream_sequence, 3u);
  EXPECT_EQ(again->deliveries, 2u);
}

TEST_P(Consumers, AReplayAtTheOriginalPaceKeepsTheGapsBetweenMessages) {
  start_orders();
  auto c = connect_via(*broker_, GetParam());
  ASSERT_TRUE(c);
  for (int i = 1; i <= 3; ++i) {
    publish(*c, 1, "orders.new", i);
    if (i < 3) std::this_thread::sleep_for(400ms);
  }
  auto k = consume(*c, {.ack = ConsumerOptions::Ack::kNone, .original_pace = true});
  ASSERT_TRUE(k);
  std::vector<std::chrono::steady_clock::time_point> at;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(k->next(10s)) << i;
    at.push_back(std::chrono::steady_clock::now());
  }
  EXPECT_GE(at[1] - at[0], 350ms);
  EXPECT_GE(at[2] - at[1], 350ms);
  EXPECT_LT(at[2] - at[0], 3s);
}

// Two members of one durable consumer share its messages; one dies in the
// middle of its batch, with messages delivered and not acknowledged: they
// go to the other member, counted as redelivered, and nothing is lost.
TEST_P(Consumers, MembersShareADurableConsumerAndADeadMembersMessagesGoToTheOther) {
  start_orders();
  auto pub = connect_via(*broker_, GetParam());
  auto a = connect_via(*broker_, GetParam());
  auto b = connect_via(*broker_, GetParam());
  ASSERT_TRUE(pub && a && b);
  const ConsumerOptions work{.durable = "work", .max_ack_pending = 16};
  auto ka = consume(*a, work);
  auto kb = consume(*b, work);
  ASSERT_TRUE(ka && kb);
  publish(*pub, 40);
  std::set<std::uint64_t> done;
  int a_unacked = 0;
  for (int i = 0; i < 5; ++i) {  // a takes some, acknowledges none, and dies
    if (auto m = ka->next(5s)) ++a_unacked;
  }
  ASSERT_GT(a_unacked, 0);
  a.reset();  // the connection ends: what it had goes to b
  while (done.size() < 40) {
    auto m = kb->next(10s);
    ASSERT_TRUE(m) << done.size() << " of 40 acknowledged";
    done.insert(m->stream_sequence);
    ASSERT_TRUE(kb->ack(*m));
  }
  EXPECT_EQ(*done.begin(), 1u);
  EXPECT_EQ(*done.rbegin(), 40u);
  EXPECT_GE(stat("stream.ORDERS.redelivered"), a_unacked);
}

// The broker restarts; a durable consumer resumes after what it had
// acknowledged and gets every later message, at least once.
TEST_P(Consumers, ADurableConsumerResumesAfterABrokerKilledWithSigkill) {
  start_orders();
  {
    auto c = connect_via(*broker_, GetParam());
    ASSERT_TRUE(c);
    publish(*c, 30);
    auto k = consume(*c, {.durable = "audit"});
    ASSERT_TRUE(k);
    for (std::uint64_t i = 1; i <= 12; ++i) {
      auto m = k->next(10s);
      ASSERT_TRUE(m && m->stream_sequence == i);
      ASSERT_TRUE(k->ack(*m));
    }
    ASSERT_TRUE(c->flush(10s));
    std::this_thread::sleep_for(300ms);  // the consumer's state is saved every 50 ms
  }
  ASSERT_EQ(broker_->restart(SIGKILL), 128 + SIGKILL);
  auto c = connect_via(*broker_, GetParam());
  ASSERT_TRUE(c);
  publish(*c, 5, "orders.new", 31);
  auto k = consume(*c, {.durable = "audit"});
  ASSERT_TRUE(k);
  std::set<std::uint64_t> got;
  for (int i = 0; i < 23; ++i) {
    auto m = k->next(10s);
    ASSERT_TRUE(m) << i;
    if (i == 0) {
      EXPECT_EQ(m->stream_sequence, 13u) << "resumes after the last acknowledged";
    }
    got.insert(m->stream_sequence);
    ASSERT_TRUE(k->ack(*m));
  }
  EXPECT_EQ(got.size(), 23u);
  // After a crash the stream goes on past the sequences it had reserved, so
  // that none a consumer may have seen is given to another message.
  EXPECT_EQ(*got.rbegin(), (1u << 20) + 5) << "sequences 31.. were reserved when the broker was killed";
}

// A consumer with a large window of small messages whose client stops
// reading is slowed by the broker, never cut as a slow consumer for what the
// broker itself sent it: the engine keeps a member within half its
// connection's pool share (SPEC.md §3.11), not only within half its queue
// bound, which the pool share is below (8,192 buffers at 12 %: 983 buffers,
// 16 MiB, against 32 MiB of queue).
TEST_P(Consumers, ALargeWindowOfSmallMessagesIsPacedByThePoolShareNeverCut) {
  // A share of 3 % (245 buffers, 4 MiB) so that what TCP's socket buffers
  // take on loopback does not hide it.
  start("  - {name: ORDERS, subjects: [\"orders.>\"]}\n", "", "limits: {pool_share_percent: 3}\n");
  auto c = connect_via(*broker_, GetParam());
  ASSERT_TRUE(c);
  const int n = static_cast<int>(volume(24000));
  const std::string kilobyte(1000, 'k');
  std::atomic<int> failed{0};
  for (int i = 0; i < n; ++i) {
    ASSERT_TRUE(c->publish_acked_async("orders.k", {}, as_payload(kilobyte), [&](Result<PubAck> r) {
      if (!r) failed.fetch_add(1);
    }));
  }
  ASSERT_TRUE(c->flush(60s));
  ASSERT_EQ(failed.load(), 0);
  // A client that opens the consumer with a window of 65,536 and reads
  // nothing for a second (within slow_consumer.write_deadline_ms, 2 s).
  proto::ConsumerConfig wide;
  wide.max_ack_pending = 65536;
  std::array<std::byte, proto::kConsumeConfigLen> config{};
  proto::encode_consumer_config(wide, config);
  auto w = raw_wire(*broker_, GetParam(), true, proto::ConnectRequest{16384, 16, 0, 11});
  ASSERT_TRUE(w);
  ASSERT_TRUE(w->send(frame(FrameType::kConsume, 1, "ORDERS",
                            std::string(reinterpret_cast<const char*>(config.data()), config.size()))));
  EXPECT_FALSE(w->closed_by_peer(1s)) << "cut as a slow consumer for what the broker sent it";
  EXPECT_EQ(stat("connections.closed.slow_consumer"), 0);
  EXPECT_GT(broker_->stats()["stream.ORDERS.delivered"], 0) << "it was sent what its share holds";
}

// A durable consumer whose stream lost its files (segments and meta.json
// gone, the consumer's state kept) stands beyond everything the stream
// will hold for a while: it starts again from the first message, counted
// and logged, instead of silently skipping what comes until it catches up.
TEST_P(Consumers, ADurableConsumerAheadOfItsStreamStartsAgainFromItsFirstMessage) {
  start_orders();
  {
    auto c = connect_via(*broker_, GetParam());
    ASSERT_TRUE(c);
    publish(*c, 10);
    auto k = consume(*c, {.durable = "d1", .ack = ConsumerOptions::Ack::kCumulative});
    ASSERT_TRUE(k);
    for (int i = 1; i <= 10; ++i) {
      auto m = k->next(10s);
      ASSERT_TRUE(m) << i;
      if (i == 10) {
        ASSERT_TRUE(k->ack(*m));
      }
    }
    ASSERT_TRUE(c->flush(10s));
  }
  broker_.reset();  // stopped in order: the consumer's state is saved
  for (const auto& f : std::filesystem::directory_iterator(data_ + "/ORDERS")) {
    if (f.is_regular_file()) std::filesystem::remove(f.path());  // segments and meta.json; consumers/ stays
  }
  start_orders();
  EXPECT_EQ(stat("stream.ORDERS.consumer_resets"), 1);
  auto c = connect_via(*broker_, GetParam());
  ASSERT_TRUE(c);
  publish(*c, 3, "orders.new", 101);
  auto k = consume(*c, {.durable = "d1", .ack = ConsumerOptions::Ack::kCumulative});
  ASSERT_TRUE(k);
  EXPECT_EQ(k->pending_at_open(), 3u);
  for (int i = 1; i <= 3; ++i) {
    auto m = k->next(10s);
    ASSERT_TRUE(m) << i;
    EXPECT_EQ(m->stream_sequence, static_cast<std::uint64_t>(i));
    EXPECT_EQ(m->data(), "m" + std::to_string(100 + i));
  }
}

// A durable consumer's state that cannot be saved (a full disk) is saved
// once there is room again, with nothing else happening: a broker killed
// after that resumes the consumer where it was, not where the disk filled.
TEST_P(Consumers, ADurableConsumersStateUnsavedOnAFullDiskIsSavedWhenRoomReturns) {
  if (::geteuid() != 0) GTEST_SKIP() << "mounting a tmpfs needs root (CI and the guest have it)";
  ASSERT_NO_FATAL_FAILURE(mount_small_disk("512k"));
  start_orders();
  auto c = connect_via(*broker_, GetParam());
  ASSERT_TRUE(c);
  publish(*c, 20);
  auto k = consume(*c, {.durable = "audit"});
  ASSERT_TRUE(k);
  // The first unacknowledged sequence its saved state records (0: none).
  const std::string saved = data_ + "/ORDERS/consumers/audit.json";
  const auto first_pending = [&]() -> std::uint64_t {
    std::ifstream in(saved);
    const auto j = nlohmann::json::parse(in, nullptr, false);
    if (j.is_discarded() || !j.contains("pending") || j["pending"].empty()) return 0;
    return j["pending"][0][0].get<std::uint64_t>();
  };
  const auto take_and_ack = [&](std::uint64_t from, std::uint64_t to) {
    for (std::uint64_t i = from; i <= to; ++i) {
      auto m = k->next(10s);
      ASSERT_TRUE(m && m->stream_sequence == i) << i;
      ASSERT_TRUE(k->ack(*m));
    }
    ASSERT_TRUE(c->flush(10s));
  };
  ASSERT_NO_FATAL_FAILURE(take_and_ack(1, 5));
  ASSERT_TRUE(wait_until([&] { return first_pending() == 6; }, 10s)) << first_pending();
  const auto pages = fill_small_disk();
  ASSERT_NO_FATAL_FAILURE(take_and_ack(6, 10));
  std::this_thread::sleep_for(500ms);  // saved every 50 ms: ten tries on a full disk
  EXPECT_EQ(first_pending(), 6u) << "the disk was full: nothing newer could be saved";
  const auto failed = broker_->stats()["stream.ORDERS.consumer_save_errors"];
  EXPECT_GE(failed, 1) << "each failed write is counted";
  for (const auto& p : pages) std::filesystem::remove(p);
  EXPECT_TRUE(wait_until([&] { return first_pending() == 11; }, 10s))
      << "saved once there is room, without another acknowledgement: " << first_pending();
  // Saved: no more failures are counted.
  const auto after = broker_->stats()["stream.ORDERS.consumer_save_errors"];
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(broker_->stats()["stream.ORDERS.consumer_save_errors"], after);
  EXPECT_GE(after, failed);
}

// A reconnecting client's consumers outlive its connection (docs/streams.md,
// "Consumers and reconnects"): after the broker restarts, a durable one goes
// on where the broker has it (what was not acknowledged comes again) and an
// ephemeral one from the message after the last it handed out.
TEST_P(Consumers, AReconnectingClientsConsumersGoOnAfterTheBrokerRestarts) {
  start_orders();
  ClientOptions opt;
  opt.reconnect = true;
  opt.reconnect_delay = 50ms;
  auto r = connect_via(*broker_, GetParam(), opt);
  ASSERT_TRUE(r);
  publish(*r, 4);
  auto durable = consume(*r, {.durable = "billing"});
  auto ephemeral = consume(*r, {.ack = ConsumerOptions::Ack::kNone});
  ASSERT_TRUE(durable && ephemeral);
  for (std::uint64_t i = 1; i <= 4; ++i) {
    auto m = durable->next(10s);
    ASSERT_TRUE(m && m->stream_sequence == i) << i;
    if (i <= 2) {
      ASSERT_TRUE(durable->ack(*m));
    }
    auto e = ephemeral->next(10s);
    ASSERT_TRUE(e && e->stream_sequence == i) << i;
  }
  ASSERT_TRUE(r->flush(10s));  // the acknowledgements are at the broker
  ASSERT_EQ(broker_->restart(SIGTERM), 0);
  publish(*r, 2, "orders.new", 5);  // once reconnected
  std::vector<std::uint64_t> got;
  while (got.size() < 4) {
    auto m = durable->next(20s);
    ASSERT_TRUE(m) << m.error().message;
    got.push_back(m->stream_sequence);
    ASSERT_TRUE(durable->ack(*m));
  }
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, (std::vector<std::uint64_t>{3, 4, 5, 6})) << "the two not acknowledged, then the new";
  std::vector<std::uint64_t> seen;
  for (int i = 0; i < 2; ++i) {
    auto e = ephemeral->next(20s);
    ASSERT_TRUE(e) << e.error().message;
    seen.push_back(e->stream_sequence);
  }
  EXPECT_EQ(seen, (std::vector<std::uint64_t>{5, 6})) << "after the last it handed out";
  auto more = ephemeral->next(300ms);
  ASSERT_FALSE(more);
  EXPECT_EQ(more.error().kind, ErrorKind::kTimeout);
}

// `rdmabroker consume --durable --ack` killed with SIGKILL: the next one
// resumes where it stood (not from the start), and between them every
// message was printed at least once.
TEST_P(Consumers, AConsumerProcessKilledIsResumedByTheNext) {
  start_orders();
  auto c = connect_via(*broker_, GetParam());
  ASSERT_TRUE(c);
  publish(*c, 100);
  const std::string out1 = data_ + "/out1", out2 = data_ + "/out2";
  std::vector<std::string> argv = {cli_path(), "consume", "ORDERS", "--durable", "cli", "--ack", "--raw"};
  for (const auto& a : cli_where(*broker_, GetParam())) argv.push_back(a);
  const auto lines = [](const std::string& file) {
    std::ifstream in(file);
    std::set<std::string> s;
    for (std::string l; std::getline(in, l);) s.insert(l);
    return s;
  };
  const auto launch = [&](const std::vector<std::string>& args, const std::string& out) {
    const int fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    const pid_t pid = spawn(args, -1, fd);
    ::close(fd);
    return pid;
  };
  const pid_t first = launch(argv, out1);
  ASSERT_TRUE(wait_until([&] { return lines(out1).size() == 100; }, 30s)) << lines(out1).size();
  std::this_thread::sleep_for(300ms);  // its acknowledgements reach the broker, which saves them
  ::kill(first, SIGKILL);
  ::waitpid(first, nullptr, 0);
  publish(*c, 200, "orders.new", 101);
  auto second_argv = argv;
  second_argv.insert(second_argv.end(), {"--count", "200", "--timeout", "60"});
  const pid_t second = launch(second_argv, out2);
  int status = -1;
  ::waitpid(second, &status, 0);
  EXPECT_EQ(status, 0) << "printed its 200 and exited";
  const auto resumed = lines(out2);
  EXPECT_FALSE(resumed.contains("m1")) << "it resumed where the first stood";
  auto all = lines(out1);
  all.merge(lines(out2));
  EXPECT_EQ(all.size(), 300u);
  for (int i = 101; i <= 300; ++i) EXPECT_TRUE(resumed.contains("m" + std::to_string(i))) << i;
}

TEST_P(Consumers, APullConsumerGetsWhatItFetchesAndAnAckNoneConsumerIsPacedByWhatItTakes) {
  start_orders();
  auto c = connect_via(*broker_, GetParam());
  ASSERT_TRUE(c);
  publish(*c, 25);
  auto k = consume(*c, {.pull = true});
  ASSERT_TRUE(k);
  EXPECT_FALSE(k->next(10ms)) << "a pull consumer's messages come by fetch()";
  auto batch = k->fetch(10, 5s);
  ASSERT_TRUE(batch);
  ASSERT_EQ(batch->size(), 10u);
  for (std::size_t i = 0; i < 10; ++i) {
    EXPECT_EQ((*batch)[i].stream_sequence, i + 1);
    ASSERT_TRUE(k->ack((*batch)[i]));
  }
  auto rest = k->fetch(100, 500ms);
  ASSERT_TRUE(rest);
  EXPECT_EQ(rest->size(), 15u) << "what there is, when the request's time is up";
  auto none = k->fetch(5, 200ms);
  ASSERT_TRUE(none);
  EXPECT_TRUE(none->empty());
  // Ack none with a window of 8: 2,000 messages flow as the application takes them.
  const int n = static_cast<int>(volume(2000));
  for (int i = 0; i < n; ++i) ASSERT_TRUE(c->publish("orders.bulk", "x"));
  ASSERT_TRUE(c->publish_acked("orders.bulk", "last", 10s));
  auto fast = consume(*c, {.start = ConsumerOptions::Start::kSequence,
                           .start_sequence = 26,
                           .ack = ConsumerOptions::Ack::kNone,
                           .max_ack_pending = 8});
  ASSERT_TRUE(fast);
  for (int i = 0; i <= n; ++i) {
    auto m = fast->next(10s);
    ASSERT_TRUE(m) << i;
    ASSERT_EQ(m->stream_sequence, static_cast<std::uint64_t>(26 + i));
  }
}

// Bytes flipped in a segment while the broker is down: found by the CRC at
// start, counted and logged; a consumer gets every other message.
TEST_P(Consumers, ADamagedRecordIsSkippedAndCountedAndTheRestServed) {
  start_orders();
  {
    auto c = connect_via(*broker_, GetParam());
    ASSERT_TRUE(c);
    publish(*c, 5);
  }
  ASSERT_EQ(broker_->stop(SIGTERM, 10s), 0);
  std::string segment;
  for (const auto& e : std::filesystem::directory_iterator(data_ + "/ORDERS")) {
    if (e.path().extension() == ".seg") segment = e.path();
  }
  ASSERT_FALSE(segment.empty());
  std::string bytes;
  {
    std::ifstream in(segment, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  // The record's subject and payload lie side by side; "m3" alone may also
  // occur in a record's binary header (a time, a CRC) and damage another.
  const std::string subject_and_payload = "orders.newm3";
  const auto at = bytes.find(subject_and_payload);
  ASSERT_NE(at, std::string::npos);
  ASSERT_EQ(bytes.find(subject_and_payload, at + 1), std::string::npos);
  bytes[at + subject_and_payload.size() - 1] = '9';  // the payload of message 3, its CRC unchanged
  std::ofstream(segment, std::ios::binary | std::ios::trunc) << bytes;
  start_orders();
  auto c = connect_via(*broker_, GetParam());
  ASSERT_TRUE(c);
  auto k = consume(*c, {});
  ASSERT_TRUE(k);
  std::vector<std::string> got;
  for (auto m = k->next(2s); m; m = k->next(500ms)) got.push_back(std::string(m->data()));
  EXPECT_EQ(got, (std::vector<std::string>{"m1", "m2", "m4", "m5"}));
  EXPECT_EQ(stat("stream.ORDERS.corrupt_records"), 1);
}

TEST_P(Consumers, RefusalsAreTypedAndEveryBrokenRuleClosesOnlyItsSender) {
  start_orders();
  auto c = connect_via(*broker_, GetParam());
  ASSERT_TRUE(c);
  auto missing = c->consume("NOPE", {}, 10s);
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().kind, ErrorKind::kNoStream) << missing.error().message;
  auto first = c->consume("ORDERS", {.durable = "d"}, 10s);
  ASSERT_TRUE(first);
  auto other = c->consume("ORDERS", {.durable = "d", .ack = ConsumerOptions::Ack::kNone}, 10s);
  ASSERT_FALSE(other);
  EXPECT_EQ(other.error().kind, ErrorKind::kConsumerInvalid) << other.error().message;
  auto bad = c->consume("ORDERS", {.durable = "../x"}, 10s);
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().kind, ErrorKind::kInvalidArgument);

  std::array<std::byte, proto::kConsumeConfigLen> config{};
  proto::encode_consumer_config({}, config);
  const std::string settings(reinterpret_cast<const char*>(config.data()), config.size());
  auto ack = [](std::uint32_t sid, std::uint64_t sequence) {
    std::vector<std::byte> out(proto::kHeaderSize);
    proto::FrameHeader h;
    h.type = FrameType::kAck;
    h.arg = sid;
    h.sequence = sequence;
    proto::encode_header(out.data(), h);
    return out;
  };
  expect_each_closes_its_sender(
      *broker_, GetParam(),
      {
          {"CONSUME on a version-10 connection", 10, frame(FrameType::kConsume, 1, "ORDERS", settings),
           ErrorCode::kMalformedFrame, "needs protocol version 11"},
          {"CONSUME without settings", 11, frame(FrameType::kConsume, 1, "ORDERS", ""),
           ErrorCode::kMalformedFrame, ""},
          {"an ACK of sequence 0", 11, ack(1, 0), ErrorCode::kMalformedFrame, ""},
          {"a PUBLISH with STREAM", 11, publish_frame("orders.x", proto::kFlagStream, 1),
           ErrorCode::kMalformedFrame, "STREAM"},
          {"a CONSUMER_READY from the client", 11, frame(FrameType::kConsumerReady, 1, ""),
           ErrorCode::kProtocolViolation, "sent by the broker"},
          {"a FETCH_DONE from the client", 11, frame(FrameType::kFetchDone, 1, ""),
           ErrorCode::kProtocolViolation, "sent by the broker"},
          {"a FETCH of no messages", 11, frame(FrameType::kFetch, 1, "", std::string(4, '\0')),
           ErrorCode::kMalformedFrame, ""},
      });
  // Settings out of range, and an ACK for an id that is no consumer: an
  // error for that id each, and the connection stays.
  proto::ConsumerConfig zero_window;
  zero_window.max_ack_pending = 1;
  proto::encode_consumer_config(zero_window, config);
  config[4] = std::byte{0};  // max_ack_pending 0
  auto w = raw_wire(*broker_, GetParam(), true, proto::ConnectRequest{16384, 16, 0, 11});
  ASSERT_TRUE(w);
  // One SEND: the raw wire keeps no credit count, and the broker grants a
  // new connection two (SPEC.md §5.1), its CONNECT's and this one.
  auto frames = frame(FrameType::kConsume, 3, "ORDERS",
                      std::string(reinterpret_cast<const char*>(config.data()), config.size()));
  // A durable name that breaks the naming rule (a path, a space): the
  // client's mistake, answered CONSUMER_INVALID for that id (SPEC.md §3.11).
  std::array<std::byte, proto::kConsumeConfigLen> fine{};
  proto::encode_consumer_config({}, fine);
  std::vector<std::byte> bad_name(proto::kHeaderSize + 64);
  proto::FrameHeader consume;
  consume.type = FrameType::kConsume;
  consume.arg = 4;
  bad_name.resize(proto::encode_frame(bad_name, consume, "ORDERS", "../a b", fine));
  for (const auto& more : {bad_name, ack(7, 1), frame(FrameType::kPing, 0, "")})
    frames.insert(frames.end(), more.begin(), more.end());
  ASSERT_TRUE(w->send(frames));
  std::vector<std::pair<FrameType, std::uint32_t>> answers;  // type, arg
  for (int i = 0; i < 10 && answers.size() < 4; ++i) {
    for (const auto& bytes : w->receive(2s)) {
      const auto h = proto::load_header(bytes.data());
      answers.emplace_back(h.type, h.arg);
    }
  }
  EXPECT_EQ(answers, (std::vector<std::pair<FrameType, std::uint32_t>>{
                         {FrameType::kError, static_cast<std::uint32_t>(ErrorCode::kConsumerInvalid)},
                         {FrameType::kError, static_cast<std::uint32_t>(ErrorCode::kConsumerInvalid)},
                         {FrameType::kError, static_cast<std::uint32_t>(ErrorCode::kUnknownSubscription)},
                         {FrameType::kPong, 0}}))
      << "an ERROR, and the connection still answers";
  ASSERT_TRUE(c->publish_acked("orders.after", "fine", 10s)) << "everyone else is served";
  if (GetParam() == Via::kRdma) {
    // Receive buffers smaller than the broker's frames: a stored message could
    // reach them only in fragments, which carry no stream sequence.
    ClientOptions small;
    small.recv_buffer_size = 4096;
    auto s = connect_via(*broker_, GetParam(), small);
    ASSERT_TRUE(s);
    auto refused = s->consume("ORDERS", {}, 10s);
    ASSERT_FALSE(refused);
    EXPECT_EQ(refused.error().kind, ErrorKind::kConsumerInvalid);
    EXPECT_NE(refused.error().message.find("buffers.size 16384"), std::string::npos)
        << refused.error().message;
    ASSERT_TRUE(s->publish_acked("orders.small", "still served", 10s));
  }
}

// Which streams a user may read is streams.read (docs/security.md): a client
// without that permission is refused with PERMISSION_DENIED for that
// consumer, counted, and its connection and other streams stay its own.
TEST_P(Consumers, AConsumerOfAStreamTheUserMayNotReadIsRefused) {
  start("  - {name: ORDERS, subjects: [\"orders.>\"]}\n  - {name: SECRET, subjects: [\"secret.>\"]}\n", "",
        "auth:\n  anonymous_permissions:\n    streams: {read: {deny: [SECRET]}}\n");
  auto c = connect_via(*broker_, GetParam());
  ASSERT_TRUE(c);
  publish(*c, 2);
  ASSERT_TRUE(c->publish_acked("secret.plans", "hidden", 10s));
  auto refused = c->consume("SECRET", {}, 10s);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().kind, ErrorKind::kPermissionDenied) << refused.error().message;
  EXPECT_NE(refused.error().message.find("consume to 'SECRET' denied"), std::string::npos)
      << refused.error().message;
  EXPECT_EQ(stat("permissions.denied.subscribe"), 1);
  auto k = consume(*c, {});
  ASSERT_TRUE(k);
  for (int i = 1; i <= 2; ++i) {
    auto m = k->next(10s);
    ASSERT_TRUE(m) << i;
    EXPECT_EQ(m->stream_sequence, static_cast<std::uint64_t>(i));
  }
  EXPECT_FALSE(k->next(200ms)) << "nothing of SECRET reached the consumer it may read";
}

// The C API's streams (tests/rdma/c_api_smoke.c --streams): acknowledged
// publishes, a durable consumer, a NAK, typed refusals, from a C program.
TEST_P(Consumers, TheCApiPublishesWithAcknowledgementsAndConsumes) {
  start("  - {name: C, subjects: [\"c.stream.>\"]}\n");
  auto [rc, out] = run({c_api_smoke_path(), url_via(*broker_, GetParam()), "--streams"});
  EXPECT_EQ(rc, 0) << out;
  EXPECT_EQ(out, "c_api_smoke: streams ok\n");
}

// `rdmabroker stream`: a stream added at run time takes its subjects at
// once, is listed, survives a restart, is purged and removed (its files
// with it); one that overlaps another or is declared in the file is refused.
TEST_P(Consumers, StreamsAreManagedAtRunTime) {
  start_orders();
  const auto cli = [&](const std::string& args) {
    return run({"/bin/sh", "-c",
                cli_path() + " stream " + args + " --admin-socket " + broker_->admin_socket() + " 2>&1"});
  };
  auto [added, added_text] = cli("add AUDIT --subjects 'audit.>' --max-msgs 100");
  ASSERT_EQ(added, 0) << added_text;
  auto [overlap, overlap_text] = cli("add MORE --subjects 'audit.x'");
  EXPECT_EQ(overlap, 1);
  EXPECT_NE(overlap_text.find("overlaps 'audit.>' of stream AUDIT"), std::string::npos) << overlap_text;
  auto [declared, declared_text] = cli("rm ORDERS");
  EXPECT_EQ(declared, 1);
  EXPECT_NE(declared_text.find("configuration file"), std::string::npos) << declared_text;
  {
    auto c = connect_via(*broker_, GetParam());
    ASSERT_TRUE(c);
    auto ack = c->publish_acked("audit.login", "alice", 10s);
    ASSERT_TRUE(ack) << ack.error().message;
    EXPECT_EQ(ack->stream, "AUDIT");
  }
  // A reload that declares a stream on its subjects leaves that one out.
  write_config(
      "  - {name: ORDERS, subjects: [\"orders.>\"]}\n"
      "  - {name: CLASH, subjects: [audit.x]}\n");
  auto [reloaded, reload_text] =
      run({"/bin/sh", "-c", cli_path() + " reload --admin-socket " + broker_->admin_socket() + " 2>&1"});
  EXPECT_EQ(reloaded, 0) << reload_text;
  EXPECT_EQ(stat("streams.count"), 2) << "CLASH left out: audit.x is AUDIT's";
  write_config("  - {name: ORDERS, subjects: [\"orders.>\"]}\n");
  ASSERT_EQ(broker_->restart(SIGTERM), 0);
  auto [info, info_text] = cli("info AUDIT --json");
  ASSERT_EQ(info, 0) << info_text;
  EXPECT_NE(info_text.find("\"messages\": 1"), std::string::npos) << "kept across the restart: " << info_text;
  EXPECT_NE(info_text.find("\"runtime\": true"), std::string::npos) << info_text;
  auto [ls, ls_text] = cli("ls");
  EXPECT_NE(ls_text.find("ORDERS"), std::string::npos);
  EXPECT_NE(ls_text.find("AUDIT (added at run time)"), std::string::npos) << ls_text;
  auto [purged, purged_text] = cli("purge AUDIT");
  EXPECT_EQ(purged, 0);
  EXPECT_NE(purged_text.find("1 messages purged"), std::string::npos) << purged_text;
  auto [removed, removed_text] = cli("rm AUDIT");
  EXPECT_EQ(removed, 0) << removed_text;
  EXPECT_FALSE(std::filesystem::exists(data_ + "/AUDIT")) << "its files are deleted";
  auto c = connect_via(*broker_, GetParam());
  ASSERT_TRUE(c);
  auto gone = c->publish_acked("audit.login", "bob", 10s);
  ASSERT_FALSE(gone);
  EXPECT_EQ(gone.error().kind, ErrorKind::kNoStream);
}

INSTANTIATE_TEST_SUITE_P(Via, Consumers, ::testing::Values(Via::kRdma, Via::kTcp),
                         [](const auto& info) { return to_string(info.param); });

}  // namespace
}  // namespace rdmabroker::test
