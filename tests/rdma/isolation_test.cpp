// SPDX-License-Identifier: Apache-2.0
// Isolation (docs/security.md, "Pool shares"): no client can take the shared
// buffer pool from the others. A slow subscriber's waiting messages are
// copied out of the receive buffers they arrived in and bounded by its share
// of the pool, so an unrelated publisher and subscriber keep their latency;
// publishers whose broker has no buffer for them are held back, never taken
// for gone; and a client cannot make the broker's QP retry its SENDs for ever.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <thread>

#include "harness.hpp"
#include "rdmabroker/client.hpp"

namespace rdmabroker::test {
namespace {

using namespace std::chrono_literals;

/// `rdmabroker bench` on `subject` at `rate` messages/s for `seconds`, one
/// publisher and one subscriber: its aggregate report.
nlohmann::json bench(const BrokerProcess& broker, Via via, const std::string& subject, int rate,
                     int seconds) {
  std::vector<std::string> args = {
      cli_path(), "bench", subject,  "-r",     std::to_string(rate), "-d", std::to_string(seconds),
      "--size",   "64",    "--json", "--quiet"};
  for (const auto& w : cli_where(broker, via)) args.push_back(w);
  auto [rc, out] = run(args);
  EXPECT_EQ(rc, 0) << out;
  auto report = nlohmann::json::parse(out, nullptr, false);
  EXPECT_FALSE(report.is_discarded()) << out;
  return report.is_discarded() ? nlohmann::json{} : report["aggregate"];
}

/// The pair measured under one condition: `rounds` benches of `seconds`
/// each, every one losing nothing. Its p99 is the quietest round's: the
/// guest's emulated cores now and then stop a process for tens of
/// milliseconds whatever else runs (one 60 ms stall is a 6 s run's p99 by
/// itself, and CI saw such a run fail the comparison at 2.09x), and a stall
/// lands in one round, while what a slow subscriber did to the pair before
/// issue 48 (seconds of p99) is in every round.
class PairRuns {
 public:
  PairRuns(const BrokerProcess& broker, const std::string& subject, int rate, int seconds, int rounds) {
    for (int i = 0; i < rounds; ++i) {
      auto r = bench(broker, Via::kRdma, subject + "." + std::to_string(i), rate, seconds);
      EXPECT_EQ(r["lost"], 0) << r.dump();
      EXPECT_EQ(r["published"], r["received"]) << r.dump();
      runs_.push_back(std::move(r));
    }
  }
  double p99_us() const {
    double best = 0;
    for (const auto& r : runs_) {
      const double p = r["latency"]["p99_us"].is_number() ? r["latency"]["p99_us"].get<double>() : 1e12;
      best = (best == 0) ? p : std::min(best, p);
    }
    return best;
  }
  std::string dump() const {
    std::string out;
    for (const auto& r : runs_) out += r.dump() + "\n";
    return out;
  }

 private:
  std::vector<nlohmann::json> runs_;
};

/// A shell line, run in the background until the test ends it.
class Background {
 public:
  explicit Background(const std::string& line) {
    pid_ = ::fork();
    if (pid_ == 0) {
      ::setpgid(0, 0);
      ::execl("/bin/sh", "sh", "-c", line.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
  }
  ~Background() {
    if (pid_ > 0) {
      ::kill(-pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  Background(const Background&) = delete;
  Background& operator=(const Background&) = delete;

 private:
  pid_t pid_ = -1;
};

class Isolation : public ::testing::Test {
 protected:
  void SetUp() override { require_rdma(); }
};

/// The traffic beside the measured pair: a 3,000 msg/s source on `hot` with
/// one subscriber, and `rdmabroker sub 'victim.>'` fed by two `yes |
/// rdmabroker pub`. `slow`: the hot subscriber takes a message every 30 ms
/// and the CLI subscriber writes into a pipe nobody reads (issue 48, §1);
/// otherwise both keep up. The programs run at the lowest CPU priority: in
/// the guest every client shares the broker's two emulated cores, and what
/// is measured is what the broker does to the pair, not what the other
/// clients' own processes take from its bench.
class SideTraffic {
 public:
  SideTraffic(const BrokerProcess& broker, bool slow, int hot_rate) {
    const std::string where = " -s " + broker.url(guest_addr1()) + " -b " + guest_addr2();
    sub_ = std::make_unique<Background>("nice -n 19 " + cli_path() + " sub 'victim.>'" + where +
                                        (slow ? " | sleep 600" : " > /dev/null"));
    for (const char* subject : {"victim.x", "victim.y"}) {
      pubs_.push_back(std::make_unique<Background>("yes hello | nice -n 19 " + cli_path() + " pub " +
                                                   subject + " -" + where + " 2>/dev/null"));
    }
    hot_sub_ = connect_via(broker, Via::kRdma);
    hot_pub_ = connect_via(broker, Via::kRdma);
    if (!hot_sub_ || !hot_pub_) return;
    ok_ = static_cast<bool>(hot_sub_->subscribe("hot", [this, slow](const Message&) {
      ++hot_got_;
      // Holds the client's I/O thread, so its receives come back slowly (until the end).
      if (slow && !ending_) std::this_thread::sleep_for(30ms);
    }));
    ok_ = ok_ && hot_sub_->flush(10s);
    source_ = std::jthread([this, hot_rate](std::stop_token stop) {
      ::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 19);
      const auto period = std::chrono::nanoseconds(1'000'000'000 / hot_rate);
      auto next = std::chrono::steady_clock::now();
      while (!stop.stop_requested()) {
        if (!hot_pub_->publish("hot", "a message of about fifty-six bytes for the hot subject")) break;
        next += period;
        std::this_thread::sleep_until(next);
      }
    });
  }
  ~SideTraffic() {
    ending_ = true;
    source_ = {};  // stops and joins
    pubs_.clear();
    sub_.reset();
    if (hot_sub_) hot_sub_->close();
    if (hot_pub_) hot_pub_->close();
  }
  bool ok() const { return ok_; }
  std::uint64_t hot_got() const { return hot_got_; }

 private:
  // What the handler and the source read first: they outlive the clients.
  std::atomic<std::uint64_t> hot_got_{0};
  std::atomic<bool> ending_{false};
  bool ok_ = false;
  std::unique_ptr<Background> sub_;
  std::vector<std::unique_ptr<Background>> pubs_;
  std::unique_ptr<Client> hot_sub_, hot_pub_;
  std::jthread source_;  // last: stopped first
};

// Issue 48, §1, over RDMA: a slow subscriber of a hot subject (one message
// per 30 ms of 3,000 msg/s) and the ordinary-client version of it. Before,
// their queues pinned one receive buffer per message until the pool was
// empty, every RDMA client's receives went unposted, and an unrelated pair's
// p99 rose from milliseconds to seconds (14-25 s measured). Now the pool never
// runs dry and the pair, measured under three conditions in one boot (alone;
// beside the same traffic to subscribers that keep up; beside the slow ones;
// three rounds each, PairRuns), loses nothing and its p99 beside the slow ones stays within twice the larger
// of the other two: a slow subscriber costs others no more than a fast one.
TEST_F(Isolation, SlowSubscribersLeaveAnUnrelatedPairAlone) {
  BrokerProcess broker(next_port());
  ASSERT_TRUE(broker.running());
  const int pair_rate = RDMABROKER_SANITIZED ? 500 : 2000;
  const int hot_rate = RDMABROKER_SANITIZED ? 750 : 3000;
  const int seconds = RDMABROKER_SANITIZED ? 1 : 2;
  const int rounds = 3;

  const PairRuns alone(broker, "pair.alone", pair_rate, seconds, rounds);
  std::optional<PairRuns> beside_fast, beside_slow;
  {
    SideTraffic fast(broker, false, hot_rate);
    ASSERT_TRUE(fast.ok());
    std::this_thread::sleep_for(2s);
    beside_fast.emplace(broker, "pair.fast", pair_rate, seconds, rounds);
    EXPECT_GT(fast.hot_got(), 0u);
  }
  ASSERT_EQ(
      broker.wait_stats([](auto& s) { return s["connections.current"] == 0; }, 30s)["connections.current"],
      0);
  {
    SideTraffic slow(broker, true, hot_rate);
    ASSERT_TRUE(slow.ok());
    // Time for the slow ones to fill what they may before the pair measures.
    std::this_thread::sleep_for(3s);
    beside_slow.emplace(broker, "pair.slow", pair_rate, seconds, rounds);
    auto s = broker.stats();
    EXPECT_EQ(s["pool.exhausted"], 0) << "the pool ran dry: every RDMA client's receives waited";
    EXPECT_LE(s["pool.held.out_queues"], s["pool.out_queue_budget"]);
    EXPECT_GT(s["messages.compacted"], 0) << "the slow ones' messages stayed in their receive buffers";
    EXPECT_GT(slow.hot_got(), 0u);
  }
  std::printf(
      "pair p99 (us, quietest of %d rounds): alone %.0f, beside subscribers that keep up %.0f, "
      "beside slow ones %.0f\n",
      rounds, alone.p99_us(), beside_fast->p99_us(), beside_slow->p99_us());
  // Timing under a sanitizer says nothing about the broker's.
  if (!RDMABROKER_SANITIZED) {
    EXPECT_LE(beside_slow->p99_us(), 2 * std::max(alone.p99_us(), beside_fast->p99_us()))
        << alone.dump() << beside_fast->dump() << beside_slow->dump();
  }
}

// A client chooses the broker's QP's RNR retry count in its connect request
// (7: for ever). This one asks for 7, grants credits it has no receives
// for, and subscribes: the broker's SENDs to it must fail after a bounded
// number of retries (RdmaLink::kMaxRnrRetry) and close it, rather than retry
// until a write deadline (here a minute) while its messages pile up.
TEST_F(Isolation, TheBrokersRnrRetriesAreBoundedWhateverTheClientAsks) {
  BrokerProcess broker(next_port(), {"--write-deadline-ms", "60000"});
  ASSERT_TRUE(broker.running());
  RawPeer peer;
  peer.rnr_retry_count = 7;
  peer.receives_posted = 0;
  ASSERT_TRUE(connect_and_subscribe(peer, broker, "rnr.clamp"));
  // Routed to it only once its worker has the subscription (the SEND's
  // completion says only that the broker's device took it).
  ASSERT_EQ(broker.wait_stats([](auto& s) { return s["subscriptions"] == 1; }, 30s)["subscriptions"], 1);
  auto publisher = connect_via(broker, Via::kRdma);
  ASSERT_TRUE(publisher);
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(publisher->publish("rnr.clamp", "x"));
  ASSERT_TRUE(publisher->flush(30s));
  const auto started = std::chrono::steady_clock::now();
  auto s = broker.wait_stats([](auto& s) { return s["connections.closed.wc_error"] >= 1; }, 30s);
  EXPECT_EQ(s["connections.closed.wc_error"], 1)
      << "the broker still retries its SENDs to a client without receives";
  EXPECT_EQ(s["connections.closed.slow_consumer"], 0);
  EXPECT_LT(std::chrono::steady_clock::now() - started, 30s);
  publisher->close();
}

// Issue 49: 300 connects abandoned right after rdma_connect make the broker
// fail accepts and see CM errors; it logs each kind at most 10 times per
// 10 s (docs/security.md), saying how many it left out, and serves on.
TEST_F(Isolation, AbandonedConnectsAreLoggedWithinTheThrottle) {
  const std::string log = "/tmp/rdmabroker-abandoned-" + std::to_string(::getpid()) + ".log";
  // The broker inherits the test's stderr: pointed at a file while it starts.
  const int saved = ::dup(2);
  const int file = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  ASSERT_GE(file, 0);
  ::dup2(file, 2);
  auto broker = std::make_unique<BrokerProcess>(next_port());
  ::dup2(saved, 2);
  ::close(saved);
  ::close(file);
  ASSERT_TRUE(broker->running());
  const auto request = proto::encode(proto::ConnectRequest{16384, 16});
  for (int i = 0; i < 300; ++i) {
    RawPeer peer;
    peer.abandon_after_connect = true;
    auto r = peer.connect(guest_addr1(), broker->port(), "", request);
    ASSERT_TRUE(r) << r.error().message;
  }
  std::this_thread::sleep_for(2s);  // the broker has seen what follows
  auto client = connect_via(*broker, Via::kRdma);
  ASSERT_TRUE(client);
  ASSERT_TRUE(client->publish("still.served", "x") && client->flush(10s));
  client.reset();
  broker.reset();  // flushed and stopped
  std::ifstream in(log);
  std::string line;
  std::map<std::string, int> by_kind;
  for (const std::string kind : {"refused", "rdma_accept", "RDMA_CM_EVENT"}) by_kind[kind] = 0;
  int warnings = 0;
  while (std::getline(in, line)) {
    if (line.find("warning") == std::string::npos) continue;
    ++warnings;
    for (auto& [kind, n] : by_kind) n += line.find(kind) != std::string::npos ? 1 : 0;
  }
  ::unlink(log.c_str());
  for (const auto& [kind, n] : by_kind) EXPECT_LE(n, 10) << kind;
  EXPECT_LE(warnings, 40) << "of 300 abandoned connects";
}

// Issue 49: an RDMA WRITE with a made-up rkey puts the broker's QP in the
// error state (its QPs grant no remote access), and rxe raises no async
// event for it. The broker finds it from its next send's completion
// (wc_error) or, on a connection it has nothing to send to, by asking
// (RdmaPort::check_idle_qps: qp_fatal), and closes the connection within
// seconds: its slot and subscription go.
TEST_F(Isolation, AQpBrokenByItsPeerIsClosedWithoutAnEvent) {
  BrokerProcess broker(next_port());
  ASSERT_TRUE(broker.running());
  RawPeer peer;
  ASSERT_TRUE(connect_and_subscribe(peer, broker, "dead.qp"));
  // The SEND completed when the broker's device took it, not when its worker
  // had the connection: before that, "no connection" would pass for "closed".
  ASSERT_EQ(broker.wait_stats([](auto& s) { return s["subscriptions"] == 1; }, 30s)["subscriptions"], 1);
  EXPECT_FALSE(peer.write_remote(0x10000, 0xdeadbeef).ok()) << "the broker allowed a remote write";
  const auto started = std::chrono::steady_clock::now();
  auto s = broker.wait_stats([](auto& s) { return s["connections.current"] == 0; }, 15s);
  EXPECT_LT(std::chrono::steady_clock::now() - started, 6s);
  EXPECT_EQ(s["connections.closed.qp_fatal"] + s["connections.closed.wc_error"], 1);
  EXPECT_EQ(s["connections.current"], 0);
  EXPECT_EQ(s["subscriptions"], 0);
  auto client = connect_via(broker, Via::kRdma);
  ASSERT_TRUE(client);
  auto sub = client->subscribe(std::string_view("dead.qp"));
  ASSERT_TRUE(sub && client->flush(10s));
  ASSERT_TRUE(client->publish("dead.qp", "alive"));
  auto m = sub.value()->next(10s);
  ASSERT_TRUE(m) << m.error().message;
}

// Issue 49, SPEC.md §5: a peer that sends without credits and returns none
// of the broker's is closed and counted (protocol_error); the broker sends
// it nothing beyond the two credits it granted (its ERROR only if one is
// left: otherwise the disconnect alone says it).
TEST_F(Isolation, AFlooderWithoutCreditsIsClosedWithinItsCredits) {
  BrokerProcess broker(next_port());
  ASSERT_TRUE(broker.running());
  RawPeer peer;
  auto accepted = peer.connect(guest_addr1(), broker.port(), guest_addr2(),
                               proto::encode(proto::ConnectRequest{16384, 2}), 16384, 2);
  ASSERT_TRUE(accepted && accepted->accepted);
  ASSERT_TRUE(peer.send(frame(proto::FrameType::kConnect, 0, "", "")));
  // Far more SENDs than the broker granted, none returning its credits.
  for (int i = 0; i < 64 && peer.send(frame(proto::FrameType::kPing, 0, "")); ++i) {
  }
  // Counted when the connection is gone: after its drain (up to
  // flow.drain_timeout_ms) when the peer does not answer the disconnect, so
  // a loaded guest may take a while.
  auto s = broker.wait_stats([](auto& s) { return s["connections.closed.protocol_error"] == 1; }, 30s);
  EXPECT_EQ(s["connections.closed.protocol_error"], 1);
  EXPECT_TRUE(peer.wait_disconnected(30s));
  // The two receives it posted took whatever came (an RNR would have shown
  // as a retry error on the broker's side, closing it as wc_error instead).
  int received = 0;
  while (received < 3 && peer.receive(100ms, false)) ++received;
  EXPECT_LE(received, 2);
  EXPECT_EQ(broker.stats()["connections.closed.wc_error"], 0);
}

// A subscriber that reads nothing, fed large messages, holds pool buffers
// until it is cut; meanwhile publishers find no buffer for what they send.
// They are held back (TCP: their socket is not read; RDMA: their credits
// wait), never closed as if they had hung up (issue 48, §2: a read of zero
// bytes into a full buffer was taken for the end of the stream).
class PoolShortage : public ::testing::TestWithParam<Via> {
 protected:
  void SetUp() override {
    if (GetParam() == Via::kRdma) require_rdma();
  }
};

TEST_P(PoolShortage, PublishersAreHeldBackNeverCut) {
  // A small pool, so that three subscribers' shares fill it quickly.
  BrokerProcess broker(next_port(), {"--pool-buffers", "1024", "--pool-share-percent", "30",
                                     "--user-pool-share-percent", "50", "--write-deadline-ms", "3000"});
  ASSERT_TRUE(broker.running());
  constexpr int kStuck = 3;
  // Subscribers that never read: a TCP socket with a 4 KiB receive buffer,
  // or an RDMA peer that never reposts a receive.
  std::vector<std::unique_ptr<RawTcp>> tcp_stuck;
  std::vector<std::unique_ptr<RawPeer>> rdma_stuck;
  for (int i = 0; i < kStuck; ++i) {
    const auto sub = frame(proto::FrameType::kSubscribe, 1, "stuck." + std::to_string(i));
    if (GetParam() == Via::kTcp) {
      tcp_stuck.push_back(std::make_unique<RawTcp>(broker.tcp_port(), 4096));
      tcp_stuck.back()->handshake();
      tcp_stuck.back()->send(sub);
    } else {
      rdma_stuck.push_back(std::make_unique<RawPeer>());
      ASSERT_TRUE(rdma_stuck.back()->connect_ok(guest_addr1(), broker.port(), guest_addr2()));
      ASSERT_TRUE(rdma_stuck.back()->send(sub));
    }
  }
  ASSERT_EQ(broker.wait_stats([](auto& s) { return s["subscriptions"] == kStuck; }, 30s)["subscriptions"],
            kStuck);
  // A healthy pair beside them.
  SeqSink healthy_got;
  auto healthy_sub = connect_via(broker, GetParam());
  auto healthy_pub = connect_via(broker, GetParam());
  ASSERT_TRUE(healthy_sub && healthy_pub);
  ASSERT_TRUE(healthy_sub->subscribe("healthy", healthy_got.handler()));
  ASSERT_TRUE(healthy_sub->flush(10s));

  const int messages = GetParam() == Via::kTcp ? 60 : (RDMABROKER_SANITIZED ? 6 : 20);
  const std::string mib(1 << 20, 'm');
  std::vector<std::unique_ptr<Client>> pubs;
  for (int i = 0; i < kStuck; ++i) {
    pubs.push_back(connect_via(broker, GetParam()));
    ASSERT_TRUE(pubs.back());
  }
  std::vector<std::jthread> publishing;
  std::atomic<int> finished{0};
  for (int i = 0; i < kStuck; ++i) {
    publishing.emplace_back([&, i] {
      for (int m = 0; m < messages; ++m) {
        auto r = pubs[i]->publish("stuck." + std::to_string(i), mib);
        ASSERT_TRUE(r) << "publisher " << i << ", message " << m << ": " << r.error().message;
      }
      auto f = pubs[i]->flush(120s);
      ASSERT_TRUE(f) << "publisher " << i << ": " << f.error().message;
      ++finished;
    });
  }
  constexpr std::uint64_t kHealthy = 2000;
  for (std::uint64_t i = 0; i < kHealthy; ++i)
    ASSERT_TRUE(healthy_pub->publish("healthy", std::to_string(i)));
  ASSERT_TRUE(healthy_pub->flush(60s));
  publishing.clear();  // joins
  EXPECT_EQ(finished.load(), kStuck);
  EXPECT_TRUE(wait_until([&] { return healthy_got.size() >= kHealthy; }, 60s)) << healthy_got.describe();
  EXPECT_TRUE(healthy_got.exactly(0, kHealthy)) << healthy_got.describe();
  auto s = broker.wait_stats([](auto& s) { return s["connections.closed.slow_consumer"] >= kStuck; }, 60s);
  EXPECT_EQ(s["connections.closed.slow_consumer"], kStuck) << "the subscribers that read nothing are cut";
  // Every connection the broker closed was a stuck subscriber: no publisher
  // was taken for gone (peer_disconnected) or for a protocol error.
  std::int64_t closed = 0;
  for (const auto& [key, value] : s) {
    if (key.starts_with("connections.closed.")) closed += value;
  }
  EXPECT_EQ(closed, kStuck) << "peer_disconnected " << s["connections.closed.peer_disconnected"];
  for (auto& pub : pubs) EXPECT_TRUE(pub->flush(10s)) << "a publisher's connection did not survive";
  healthy_sub->close();
  healthy_pub->close();
}

// Issue 49, §5: what a dropped queue leaves behind. A subscriber that reads
// nothing gathers a deep queue of small messages (their bytes copied into
// pool buffers, their entries on the worker's heap), then vanishes. The
// heap its queue took is given back (ops/memory_trim.hpp); what stays is the
// pool's pages, resident from the start where a device registered the pool
// and committed as first touched on a TCP-only broker: bounded by
// buffers.pool × buffers.size (docs/operations.md, "What is given back").
TEST_P(PoolShortage, AVanishedSubscribersQueueLeavesOnlyPoolPages) {
  // A sanitizer's allocator keeps freed memory in quarantine: RSS says nothing there.
  if (RDMABROKER_SANITIZED) GTEST_SKIP() << "RSS under a sanitizer's allocator";
  BrokerProcess broker(next_port(),
                       {"--workers", "1", "--max-pending-bytes", "67108864", "--pool-share-percent", "50",
                        "--user-pool-share-percent", "50", "--write-deadline-ms", "60000"});
  ASSERT_TRUE(broker.running());
  // The pool is one mapping of 128 MiB (8,192 × 16 KiB), larger than any arena.
  constexpr std::uint64_t kPoolBytes = std::uint64_t{8192} * 16384;
  auto pub = connect_via(broker, GetParam());
  ASSERT_TRUE(pub);
  const std::string message(200, 'q');
  const auto publish = [&](int count) {
    for (int i = 0; i < count; ++i) ASSERT_TRUE(pub->publish("flood", message));
    ASSERT_TRUE(pub->flush(60s));
  };
  publish(1000);  // the publisher's path warm: its tables at their size
  const long heap_before = rss_below_kib(broker.pid(), kPoolBytes);
  const long before = rss_kib(broker.pid());
  {
    std::unique_ptr<RawTcp> tcp;
    std::unique_ptr<RawPeer> rdma;
    const auto sub = frame(proto::FrameType::kSubscribe, 1, "flood");
    if (GetParam() == Via::kTcp) {
      tcp = std::make_unique<RawTcp>(broker.tcp_port(), 4096);
      tcp->handshake();
      tcp->send(sub);
    } else {
      rdma = std::make_unique<RawPeer>();
      ASSERT_TRUE(rdma->connect_ok(guest_addr1(), broker.port(), guest_addr2()));
      ASSERT_TRUE(rdma->send(sub));
    }
    ASSERT_EQ(broker.wait_stats([](auto& s) { return s["subscriptions"] == 1; }, 30s)["subscriptions"], 1);
    publish(64'000);  // 13 MB queued for a subscriber that reads nothing
    auto s = broker.wait_stats([](auto& s) { return s["messages.pending_bytes"] >= (10 << 20); }, 30s);
    ASSERT_GE(s["messages.pending_bytes"], 10 << 20) << "the queue was deep";
    std::cout << "queued " << s["messages.pending_bytes"] << " bytes; RSS +" << rss_kib(broker.pid()) - before
              << " KiB, outside the pool +" << rss_below_kib(broker.pid(), kPoolBytes) - heap_before
              << " KiB\n";
  }  // vanishes without a word
  auto s = broker.wait_stats(
      [](auto& s) { return s["messages.pending_bytes"] == 0 && s["connections.current"] == 1; }, 30s);
  EXPECT_EQ(s["connections.current"], 1);
  EXPECT_GT(s["messages.dropped.subscriber_closed"], 40'000) << "its queue, dropped as it vanished";
  std::this_thread::sleep_for(4s);  // the trimmer looks about once a second
  const long heap_after = rss_below_kib(broker.pid(), kPoolBytes);
  const long after = rss_kib(broker.pid());
  std::cout << "after: RSS +" << after - before << " KiB, outside the pool +" << heap_after - heap_before
            << " KiB\n";
  EXPECT_LT(heap_after - heap_before, 3072) << "the queue's heap is given back";
  // Registered for the device, the pool was resident before the queue.
  if (GetParam() == Via::kRdma) {
    EXPECT_LT(after - before, 3072) << "nothing stays over RDMA";
  }
  pub->close();
}

INSTANTIATE_TEST_SUITE_P(Via, PoolShortage, ::testing::Values(Via::kRdma, Via::kTcp),
                         [](const auto& info) { return std::string(to_string(info.param)); });

}  // namespace
}  // namespace rdmabroker::test
