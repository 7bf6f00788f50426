// SPDX-License-Identifier: Apache-2.0
// Fault injection (daemon/fault/fault.hpp; built only into the test trees
// that have RDMABROKER_FAULT_INJECTION, the ASan and TSan ones). Each test
// breaks one thing on purpose, in the Soft-RoCE guest: a failed work
// completion, a QP forced into the error state, RNR from a peer without
// receives, CM events handled twice or late, an exhausted buffer pool, a
// stuck worker, a stream's failed sync, a CQ too small for every
// connection. Each proves the same four things: the
// broker keeps serving, the affected client gets a clear error or
// reconnects, every other client gets every message, and nothing is left
// behind (connections, pool buffers; the ASan tree's LeakSanitizer fails the
// broker's exit status on a leak).
#include <gtest/gtest.h>
#include <signal.h>

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <thread>

#include "harness.hpp"
#include "rdmabroker/client.hpp"

namespace rdmabroker::test {
namespace {

using namespace std::chrono_literals;
using Kind = ConnectionEvent::Kind;

/// A payload for message `seq`: its number, padded to `size` bytes.
std::string numbered(std::uint64_t seq, std::size_t size = 0) {
  std::string s = std::to_string(seq);
  if (s.size() < size) s.append(size - s.size(), 'x');
  return s;
}

using Events = ConnectionEvents;

/// What every test checks at its end: the broker is back at its baseline
/// (no connection, every pool buffer either free or posted as a receive)
/// and exits cleanly (under ASan, LeakSanitizer turns a leak into a failure).
void expect_clean_shutdown(BrokerProcess& broker) {
  auto s = broker.wait_stats(
      [](auto& s) { return s["connections.current"] == 0 && s["pool.in_use"] == s["rdma.srq_posted"]; }, 30s);
  EXPECT_EQ(s["connections.current"], 0);
  EXPECT_EQ(s["pool.in_use"], s["rdma.srq_posted"]) << "pool buffers neither free nor posted";
  EXPECT_EQ(broker.stop(SIGTERM, 60s), 0);
}

bool armed(const BrokerProcess& broker, const std::string& fault) {
  const std::string reply = broker.admin("fault " + fault);
  EXPECT_NE(reply.find("\"ok\":true"), std::string::npos) << "fault " << fault << ": " << reply;
  return reply.find("\"ok\":true") != std::string::npos;
}

// ---------------------------------------------------------------- one connection's QP

struct QpFault {
  const char* name;
  const char* fault;      // the admin command, without the connection id
  bool victim_publishes;  // the failing completion is a receive of the victim's publish
};

void PrintTo(const QpFault& f, std::ostream* os) { *os << f.name; }

class QpFaults : public ::testing::TestWithParam<QpFault> {
 protected:
  void SetUp() override { require_rdma(); }
};

TEST_P(QpFaults, OnlyTheFaultedClientIsAffectedAndItReconnects) {
  const QpFault& fc = GetParam();
  BrokerProcess broker(next_port());
  ASSERT_TRUE(broker.running());
  Events victim_events;
  auto victim = connect_via(broker, Via::kRdma, victim_events.options());
  ASSERT_TRUE(victim);
  const auto ids = broker.connection_ids();
  ASSERT_EQ(ids.size(), 1u);
  const std::uint64_t victim_id = ids[0];
  SeqSink victim_got, bystander_got;
  ASSERT_TRUE(victim->subscribe("fault.feed", victim_got.handler()));
  auto bystander = connect_via(broker, Via::kRdma);
  auto publisher = connect_via(broker, Via::kRdma);
  ASSERT_TRUE(bystander && publisher);
  ASSERT_TRUE(bystander->subscribe("fault.feed", bystander_got.handler()));
  ASSERT_TRUE(victim->flush(10s) && bystander->flush(10s));

  ASSERT_TRUE(armed(broker, std::string(fc.fault) + " " + std::to_string(victim_id)));
  if (fc.victim_publishes) {
    ASSERT_TRUE(victim->publish("fault.trigger", "x"));
  }
  constexpr std::uint64_t kFirst = 2000;
  for (std::uint64_t i = 0; i < kFirst; ++i) ASSERT_TRUE(publisher->publish("fault.feed", numbered(i)));
  ASSERT_TRUE(publisher->flush(30s));

  // The bystander misses nothing; the victim's connection failed and came back.
  EXPECT_TRUE(wait_until([&] { return bystander_got.size() >= kFirst; }, 60s)) << bystander_got.describe();
  EXPECT_TRUE(bystander_got.exactly(0, kFirst)) << bystander_got.describe();
  ASSERT_TRUE(wait_until([&] { return victim_events.saw(Kind::kReconnected); }, 60s));
  EXPECT_TRUE(victim_events.saw(Kind::kDisconnected));
  auto s = broker.stats();
  EXPECT_EQ(s["connections.closed.wc_error"] + s["connections.closed.qp_fatal"], 1);
  if (std::string_view(fc.fault) == "wc-error") {
    EXPECT_GE(s["rdma.wc_errors"], 1);
  }

  // After the reconnect the victim's subscription is back: it gets what follows.
  ASSERT_TRUE(victim->flush(10s));
  const std::size_t victim_before = victim_got.size();
  constexpr std::uint64_t kSecond = 300;
  for (std::uint64_t i = kFirst; i < kFirst + kSecond; ++i)
    ASSERT_TRUE(publisher->publish("fault.feed", numbered(i)));
  ASSERT_TRUE(publisher->flush(30s));
  EXPECT_TRUE(wait_until([&] { return victim_got.size() >= victim_before + kSecond; }, 60s))
      << victim_got.describe();
  EXPECT_TRUE(victim_got.exactly(kFirst, kFirst + kSecond, victim_before)) << victim_got.describe();
  EXPECT_TRUE(wait_until([&] { return bystander_got.size() >= kFirst + kSecond; }, 60s));
  EXPECT_TRUE(bystander_got.exactly(0, kFirst + kSecond)) << bystander_got.describe();

  victim->close();
  bystander->close();
  publisher->close();
  expect_clean_shutdown(broker);
}

INSTANTIATE_TEST_SUITE_P(Faults, QpFaults,
                         ::testing::Values(QpFault{"FailedReceive", "wc-error", true},
                                           QpFault{"FailedSend", "wc-error", false},
                                           QpFault{"QpInError", "qp-error", false}),
                         [](const auto& info) { return std::string(info.param.name); });

// ---------------------------------------------------------------- RNR

class Faults : public ::testing::Test {
 protected:
  void SetUp() override { require_rdma(); }
};

TEST_F(Faults, RnrFromAPeerWithoutReceivesEndsOnlyThatPeer) {
  // Not injected: provoked for real. The peer advertises 16 receive credits
  // but posts none, and asks for no RNR retries (its connect parameters set
  // the broker's QP's RNR retry count): the broker's first SEND to it (the
  // credits it grants once the CONNECT is accepted, SPEC.md §5) fails with
  // "RNR retry counter exceeded". The peer's SUBSCRIBE travels in the same
  // SEND as its CONNECT: afterwards its QP is in error.
  BrokerProcess broker(next_port());
  ASSERT_TRUE(broker.running());
  SeqSink bystander_got;
  auto bystander = connect_via(broker, Via::kRdma);
  auto publisher = connect_via(broker, Via::kRdma);
  ASSERT_TRUE(bystander && publisher);
  ASSERT_TRUE(bystander->subscribe("fault.rnr", bystander_got.handler()));
  ASSERT_TRUE(bystander->flush(10s));

  RawPeer peer;
  peer.rnr_retry_count = 0;
  peer.receives_posted = 0;
  ASSERT_TRUE(connect_and_subscribe(peer, broker, "fault.rnr"));

  constexpr std::uint64_t kCount = 1000;
  for (std::uint64_t i = 0; i < kCount; ++i) ASSERT_TRUE(publisher->publish("fault.rnr", numbered(i)));
  ASSERT_TRUE(publisher->flush(30s));
  EXPECT_TRUE(peer.wait_disconnected(30s));
  EXPECT_TRUE(wait_until([&] { return bystander_got.size() >= kCount; }, 60s)) << bystander_got.describe();
  EXPECT_TRUE(bystander_got.exactly(0, kCount)) << bystander_got.describe();
  auto s = broker.wait_stats([](auto& s) { return s["connections.closed.wc_error"] == 1; }, 10s);
  EXPECT_EQ(s["connections.closed.wc_error"], 1);
  EXPECT_GE(s["rdma.wc_errors"], 1);

  bystander->close();
  publisher->close();
  expect_clean_shutdown(broker);
}

// ---------------------------------------------------------------- CM events

TEST_F(Faults, DuplicateAndLateCmEventsAreHarmless) {
  BrokerProcess broker(next_port());
  ASSERT_TRUE(broker.running());
  auto round = [&](const std::string& subject) {
    SeqSink got;
    auto sub = connect_via(broker, Via::kRdma);
    auto pub = connect_via(broker, Via::kRdma);
    ASSERT_TRUE(sub && pub);
    ASSERT_TRUE(sub->subscribe(subject, got.handler()));
    ASSERT_TRUE(sub->flush(10s));
    for (std::uint64_t i = 0; i < 200; ++i) ASSERT_TRUE(pub->publish(subject, numbered(i)));
    ASSERT_TRUE(pub->flush(30s));
    EXPECT_TRUE(wait_until([&] { return got.size() >= 200; }, 30s)) << got.describe();
    EXPECT_TRUE(got.exactly(0, 200)) << got.describe();
    sub->close();
    pub->close();
    auto s = broker.wait_stats([](auto& s) { return s["connections.current"] == 0; }, 30s);
    EXPECT_EQ(s["connections.current"], 0);
  };
  // Every event of two connections' lives (ESTABLISHED, DISCONNECTED, ...)
  // handled twice, then held back 400 ms each: the client's first frames
  // arrive before its ESTABLISHED does, and its DISCONNECTED comes after the
  // broker is done waiting for it.
  ASSERT_TRUE(armed(broker, "cm-duplicate 6"));
  round("cm.twice");
  ASSERT_TRUE(armed(broker, "cm-delay 400 6"));
  round("cm.late");
  round("cm.normal");
  auto s = broker.stats();
  EXPECT_EQ(s["connections.accepted"], 6);
  std::int64_t closed = 0;
  for (const auto& [k, v] : s) {
    if (k.starts_with("connections.closed.")) closed += v;
  }
  EXPECT_EQ(closed, 6) << "each connection closed once, whatever its events did";
  EXPECT_EQ(s["messages.dropped.subscriber_closed"] + s["messages.dropped.slow_consumer"], 0);
  expect_clean_shutdown(broker);
}

// ---------------------------------------------------------------- buffer pool

class PoolFaults : public ::testing::TestWithParam<Via> {
 protected:
  void SetUp() override {
    if (GetParam() == Via::kRdma) require_rdma();
  }
};

TEST_P(PoolFaults, AnExhaustedPoolStallsPublishersAndLosesNothing) {
  // Small receive queues, so that the receives already posted run out soon.
  BrokerProcess broker(next_port(), {"--srq-depth", "64", "--credits", "8"});
  ASSERT_TRUE(broker.running());
  SeqSink got;
  auto sub = connect_via(broker, GetParam());
  ClientOptions popt;
  popt.publish_timeout = 120s;  // a publish waits through the shortage
  auto pub = connect_via(broker, GetParam(), popt);
  ASSERT_TRUE(sub && pub);
  ASSERT_TRUE(sub->subscribe("pool.t", got.handler()));
  ASSERT_TRUE(sub->flush(10s));

  ASSERT_TRUE(armed(broker, "pool-exhaust"));
  constexpr std::uint64_t kCount = 3000;
  std::atomic<bool> publish_failed{false};
  std::jthread publisher([&] {
    for (std::uint64_t i = 0; i < kCount; ++i) {
      if (!pub->publish("pool.t", numbered(i, 2048))) {
        publish_failed = true;
        return;
      }
    }
  });
  auto s = broker.wait_stats([](auto& s) { return s["pool.exhausted"] >= 1; }, 30s);
  EXPECT_GE(s["pool.exhausted"], 1) << "the broker never noticed the empty pool";
  if (GetParam() == Via::kRdma) {
    // Nothing refills the receive queue, so the publisher's sends take it
    // below a refill batch (16 of 64): the device says so.
    s = broker.wait_stats([](auto& s) { return s["rdma.srq_limit_events"] >= 1; }, 30s);
    EXPECT_EQ(s["rdma.srq_limit_events"], 1) << "IBV_EVENT_SRQ_LIMIT_REACHED, once per shortage";
  }
  std::this_thread::sleep_for(1s);
  EXPECT_LT(got.size(), kCount) << "the publisher was not held back";

  ASSERT_TRUE(armed(broker, "pool-release"));
  publisher.join();
  EXPECT_FALSE(publish_failed);
  ASSERT_TRUE(pub->flush(60s));
  EXPECT_TRUE(wait_until([&] { return got.size() >= kCount; }, 120s)) << got.describe();
  EXPECT_TRUE(got.exactly(0, kCount)) << got.describe();
  s = broker.stats();
  EXPECT_EQ(s["messages.dropped.subscriber_closed"] + s["messages.dropped.slow_consumer"], 0);
  EXPECT_EQ(s["rdma.srq_limit_events"], GetParam() == Via::kRdma ? 1 : 0);

  if (GetParam() == Via::kRdma) {
    // The refill after the shortage armed the limit again: a second shortage
    // is reported too. The publisher goes on until it is: how many receives
    // a number of messages takes depends on how many the library batched
    // into one SEND while it waited for credits.
    ASSERT_TRUE(armed(broker, "pool-exhaust"));
    std::atomic<bool> enough{false};
    std::uint64_t sent = kCount;
    std::jthread more([&] {
      for (; !enough && sent < 4 * kCount; ++sent) {
        if (!pub->publish("pool.t", numbered(sent, 2048))) {
          publish_failed = true;
          return;
        }
      }
    });
    s = broker.wait_stats([](auto& s) { return s["rdma.srq_limit_events"] >= 2; }, 60s);
    EXPECT_EQ(s["rdma.srq_limit_events"], 2);
    enough = true;
    ASSERT_TRUE(armed(broker, "pool-release"));
    more.join();
    EXPECT_FALSE(publish_failed);
    ASSERT_TRUE(pub->flush(60s));
    EXPECT_TRUE(wait_until([&] { return got.size() >= sent; }, 60s)) << got.describe();
    EXPECT_TRUE(got.exactly(0, sent)) << got.describe();
  }

  sub->close();
  pub->close();
  expect_clean_shutdown(broker);
}

INSTANTIATE_TEST_SUITE_P(Faults, PoolFaults, ::testing::Values(Via::kRdma, Via::kTcp),
                         [](const auto& info) { return to_string(info.param); });

// ---------------------------------------------------------------- a stuck worker

// A worker loop stuck for seconds (here: asleep, as in a hung system call)
// fails /healthz and /readyz, naming the worker, for as long as it is stuck:
// an orchestrator restarts such a broker (systemd's watchdog stops being fed
// by the same test). Once it runs again the probes pass, and what was
// published meanwhile is delivered.
class WorkerFaults : public PoolFaults {};

TEST_P(WorkerFaults, AStuckWorkerFailsTheHealthProbesUntilItRunsAgain) {
  const std::uint16_t metrics_port = next_port();
  BrokerProcess broker(next_port(),
                       {"--metrics-listen", "127.0.0.1:" + std::to_string(metrics_port), "--workers", "1"});
  ASSERT_TRUE(broker.running());
  SeqSink got;
  auto sub = connect_via(broker, GetParam());
  auto pub = connect_via(broker, GetParam());
  ASSERT_TRUE(sub && pub);
  ASSERT_TRUE(sub->subscribe("stall.t", got.handler()));
  ASSERT_TRUE(sub->flush(10s));
  HttpReply live;
  ASSERT_TRUE(wait_until([&] { return (live = http_request(metrics_port, "/healthz")).status == 200; }, 20s))
      << live.body;

  ASSERT_TRUE(armed(broker, "worker-stall 8000"));
  // Failing from 2 s into the stall until it ends at 8 s.
  ASSERT_TRUE(
      wait_until([&] { return (live = http_request(metrics_port, "/healthz", 2s)).status == 503; }, 10s))
      << live.status << " " << live.body;
  EXPECT_NE(live.body.find("[-]workers failed: worker 0 has not gone round for "), std::string::npos)
      << live.body;
  EXPECT_TRUE(live.body.ends_with("healthz check failed\n")) << live.body;
  const auto ready = http_request(metrics_port, "/readyz", 2s);  // not ready either
  EXPECT_EQ(ready.status, 503) << ready.body;
  EXPECT_NE(ready.body.find("[-]workers failed"), std::string::npos) << ready.body;
  for (std::uint64_t i = 0; i < 100; ++i) ASSERT_TRUE(pub->publish("stall.t", numbered(i, 64)));

  EXPECT_TRUE(
      wait_until([&] { return (live = http_request(metrics_port, "/healthz", 2s)).status == 200; }, 30s))
      << live.status << " " << live.body;
  ASSERT_TRUE(pub->flush(30s));
  EXPECT_TRUE(wait_until([&] { return got.size() >= 100; }, 30s)) << got.describe();
  EXPECT_TRUE(got.exactly(0, 100)) << got.describe();
  sub->close();
  pub->close();
  expect_clean_shutdown(broker);
}

INSTANTIATE_TEST_SUITE_P(Faults, WorkerFaults, ::testing::Values(Via::kRdma, Via::kTcp),
                         [](const auto& info) { return to_string(info.param); });

// ---------------------------------------------------------------- a failed sync

// A stream's sync that fails (an fdatasync reporting EIO) acknowledges
// nothing it was to make durable: a failed fdatasync reports its error once
// and may leave the pages unwritten, so a later sync proves nothing for
// them. The durable publisher waiting on it gets INTERNAL_ERROR at once,
// counted and logged; its Msg-Id is forgotten, so publishing it again
// stores it again and is acknowledged; and the stream goes on syncing.
class SyncFaults : public PoolFaults {};

TEST_P(SyncFaults, AFailedSyncAcknowledgesNothingInDoubtAndTheStreamGoesOn) {
  const std::string dir = "/tmp/rdmabroker-syncfault-" + std::to_string(::getpid());
  const std::string config = dir + ".yaml";
  std::filesystem::create_directories(dir);
  write_file(config, "storage:\n  directory: " + dir +
                         "\n  sync: group\n  sync_interval_ms: 50\n"
                         "streams:\n  - {name: S, subjects: [\"s.>\"]}\n");
  BrokerProcess broker(next_port(), {"--config", config});
  ASSERT_TRUE(broker.running());
  auto pub = connect_via(broker, GetParam());
  ASSERT_TRUE(pub);
  ASSERT_TRUE(pub->publish_acked("s.x", "durable", 10s)) << "a first one, synced";
  ASSERT_TRUE(armed(broker, "sync-fail 1"));
  const Headers id{{"Msg-Id", "order-1"}};
  auto refused = pub->publish_acked("s.x", id, as_payload(std::string_view("in doubt")), 10s);
  ASSERT_FALSE(refused) << "acknowledged after a failed sync, as sequence " << refused->sequence;
  EXPECT_EQ(refused.error().kind, ErrorKind::kBrokerError);
  EXPECT_NE(refused.error().message.find("I/O error"), std::string::npos) << refused.error().message;
  auto again = pub->publish_acked("s.x", id, as_payload(std::string_view("in doubt")), 10s);
  ASSERT_TRUE(again) << "the stream syncs again after a failure: " << again.error().message;
  EXPECT_FALSE(again->duplicate) << "the Msg-Id of a message in doubt is forgotten: stored again";
  EXPECT_EQ(again->sequence, 3u);
  auto dup = pub->publish_acked("s.x", id, as_payload(std::string_view("in doubt")), 10s);
  ASSERT_TRUE(dup) << dup.error().message;
  EXPECT_TRUE(dup->duplicate) << "the durable copy's Msg-Id is remembered";
  EXPECT_EQ(dup->sequence, 3u);
  const auto s = broker.stats();
  EXPECT_EQ(s.at("stream.S.write_errors"), 1) << "the failed sync is counted";
  EXPECT_EQ(s.at("stream.S.last_sequence"), 3) << "the copy in doubt is kept (at least once)";
  pub->close();
  expect_clean_shutdown(broker);
  ::unlink(config.c_str());
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Faults, SyncFaults, ::testing::Values(Via::kRdma, Via::kTcp),
                         [](const auto& info) { return to_string(info.param); });

// ---------------------------------------------------------------- completion queue

TEST_F(Faults, AFullCompletionQueueRefusesNewConnectionsNotOldOnes) {
  // One worker whose send CQ has 28 entries: room for the send windows
  // (8 + 1 entries) of three connections. A fourth would let the CQ
  // overrun, which breaks every QP on it; it must be refused instead.
  setenv("RDMABROKER_FAULT_CQ_ENTRIES", "28", 1);
  BrokerProcess broker(next_port(), {"--workers", "1", "--srq-depth", "32", "--credits", "4"});
  unsetenv("RDMABROKER_FAULT_CQ_ENTRIES");
  ASSERT_TRUE(broker.running());
  std::vector<std::unique_ptr<Client>> clients;
  Result<std::unique_ptr<Client>> refused = Error{ErrorKind::kClosed, ""};
  while (clients.size() < 8) {
    auto c = try_connect_via(broker, Via::kRdma);
    if (!c) {
      refused = std::move(c);
      break;
    }
    clients.push_back(std::move(c.value()));
  }
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().kind, ErrorKind::kRejected) << refused.error().message;
  EXPECT_NE(refused.error().message.find("out of resources"), std::string::npos) << refused.error().message;
  ASSERT_GE(clients.size(), 2u);
  ASSERT_LT(clients.size(), 8u);
  EXPECT_GE(broker.stats()["rdma.cq_full"], 1);

  // Those admitted relay at full speed: their send windows fit.
  SeqSink got;
  ASSERT_TRUE(clients.front()->subscribe("cq.t", got.handler()));
  ASSERT_TRUE(clients.front()->flush(10s));
  constexpr std::uint64_t kCount = 2000;
  for (std::uint64_t i = 0; i < kCount; ++i) ASSERT_TRUE(clients.back()->publish("cq.t", numbered(i)));
  ASSERT_TRUE(clients.back()->flush(30s));
  EXPECT_TRUE(wait_until([&] { return got.size() >= kCount; }, 60s)) << got.describe();
  EXPECT_TRUE(got.exactly(0, kCount)) << got.describe();

  // A closed connection gives its room back.
  const auto admitted = clients.size();
  clients.back()->close();
  clients.pop_back();
  broker.wait_stats(
      [&](auto& s) { return s["connections.current"] == static_cast<std::int64_t>(admitted - 1); }, 30s);
  auto again = try_connect_via(broker, Via::kRdma);
  EXPECT_TRUE(again.ok()) << again.error().message;
  if (again) {
    again.value()->close();
  }
  for (auto& c : clients) c->close();
  expect_clean_shutdown(broker);
}

}  // namespace
}  // namespace rdmabroker::test
