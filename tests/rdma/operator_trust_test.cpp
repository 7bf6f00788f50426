// SPDX-License-Identifier: Apache-2.0
// What an operator relies on: flags win over the config file (on start, in
// --check-config, in `stat` and across reloads); the metrics endpoint answers
// while idle or slow sockets hold connections to it; broker-wide bounds on
// what clients can make the broker hold refuse only the client that hits
// them. The bounds run over RDMA (in the guest) and TCP; the rest is
// transport-independent and runs on the host (label tcp).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "harness.hpp"
#include "rdmabroker/client.hpp"
#include "rdmabroker/common/fd.hpp"

namespace rdmabroker::test {
namespace {

using namespace std::chrono_literals;

/// Whether a TCP connect to host:port succeeds.
bool can_connect(const std::string& host, std::uint16_t port) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  ::inet_pton(AF_INET, host.c_str(), &sa.sin_addr);
  return ::connect(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0;
}

UniqueFd tcp_socket_to(std::uint16_t port) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) fd.reset();
  return fd;
}

// The reported case: a file that puts TCP on 127.0.0.2 and `--listen
// 127.0.0.1`: the broker must listen on 127.0.0.1 only, say so, and a reload
// of an edited file must name only what really changes.
TEST(Tcp, ListenFlagWinsOverTheConfigFileOnStartAndOnReload) {
  const std::string path = "/tmp/rdmabroker-precedence-" + std::to_string(getpid()) + ".yaml";
  write_file(path, "listen:\n  tcp: 127.0.0.2:7471\nrdma: off\n");
  BrokerProcess broker(next_port(), {"--config", path, "--listen", "127.0.0.1"});
  ASSERT_TRUE(broker.running());
  EXPECT_TRUE(can_connect("127.0.0.1", broker.tcp_port()));
  EXPECT_FALSE(can_connect("127.0.0.2", broker.tcp_port())) << "listening beyond --listen";

  // `rdmabroker stat` says where each address came from.
  auto [rc, out] = run({cli_path(), "stat", "--admin-socket", broker.admin_socket()});
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("config file: " + path + " (--config)"), std::string::npos) << out;
  EXPECT_NE(out.find("listen.tcp 127.0.0.1:" + std::to_string(broker.tcp_port()) +
                     " (host: --listen; port: --tcp-port)"),
            std::string::npos)
      << out;

  // So does --check-config, with the same flags.
  auto check = run({broker_path(), "--config", path, "--listen", "127.0.0.1", "--check-config"});
  EXPECT_EQ(check.first, 0) << check.second;
  EXPECT_NE(check.second.find("listen.tcp 127.0.0.1:7471 (host: --listen; port: file " + path + ")"),
            std::string::npos)
      << check.second;

  // The file drops listen.tcp and changes a live key: the flags still win,
  // so listen.tcp is no change (named as overridden), and the reload applies.
  write_file(path, "rdma: off\nlogging: {level: debug}\n");
  auto reload =
      run({"/bin/sh", "-c", cli_path() + " reload --admin-socket " + broker.admin_socket() + " 2>&1"});
  EXPECT_EQ(reload.first, 0) << reload.second;
  EXPECT_NE(reload.second.find("logging.level info -> debug"), std::string::npos) << reload.second;
  EXPECT_NE(
      reload.second.find("listen.tcp (127.0.0.2:7471 -> 0.0.0.0:7471) overridden by --listen, --tcp-port"),
      std::string::npos)
      << reload.second;
  EXPECT_EQ(reload.second.find("refused"), std::string::npos) << reload.second;
  EXPECT_EQ(broker.stats()["reloads.ok"], 1);
  EXPECT_TRUE(can_connect("127.0.0.1", broker.tcp_port()));
  EXPECT_FALSE(can_connect("127.0.0.2", broker.tcp_port()));
  ::unlink(path.c_str());
}

// What a service manager and an operator's terminal rely on: `rdmabrokerd
// --reload` (the unit's ExecReload) reloads the running broker through its
// admin socket and fails, saying why, when the broker refuses the file or
// cannot be reached; --check-config warns about a file that admits nobody;
// NO_COLOR turns the colours of a terminal's log off.
TEST(Tcp, TheDaemonReloadsItselfChecksWhoIsAdmittedAndHonoursNoColor) {
  const std::string path = "/tmp/rdmabroker-selfreload-" + std::to_string(getpid()) + ".yaml";
  write_file(path, "rdma: off\nauth: {anonymous: true}\n");
  BrokerProcess broker(next_port(), {"--config", path});
  ASSERT_TRUE(broker.running());
  auto reload = [&] {
    return run(
        {"/bin/sh", "-c", broker_path() + " --reload --admin-socket " + broker.admin_socket() + " 2>&1"});
  };
  write_file(path, "rdma: off\nauth: {anonymous: true}\nlogging: {level: debug}\n");
  auto ok = reload();
  EXPECT_EQ(ok.first, 0) << ok.second;
  EXPECT_NE(ok.second.find("logging.level info -> debug"), std::string::npos) << ok.second;
  write_file(path, "rdma: off\nauth: {anonymous: true}\nlogging: {level: loud}\n");
  auto refused = reload();
  EXPECT_EQ(refused.first, 1) << refused.second;
  EXPECT_NE(refused.second.find("logging.level"), std::string::npos) << refused.second;
  EXPECT_EQ(broker.stats()["reloads.ok"], 1);
  auto nobody = run({"/bin/sh", "-c", broker_path() + " --reload --admin-socket /nonexistent.sock 2>&1"});
  EXPECT_EQ(nobody.first, 1) << nobody.second;
  EXPECT_NE(nobody.second.find("cannot reach the broker's admin socket /nonexistent.sock"), std::string::npos)
      << nobody.second;

  write_file(path, "rdma: off\n");
  auto check = run({"/bin/sh", "-c", broker_path() + " --check-config " + path + " 2>&1"});
  EXPECT_EQ(check.first, 0) << check.second;
  EXPECT_NE(
      check.second.find("warning: auth: no users and anonymous access off: every client will be refused"),
      std::string::npos)
      << check.second;
  write_file(path, "rdma: off\nauth: {anonymous: true}\n");
  check = run({"/bin/sh", "-c", broker_path() + " --check-config " + path + " 2>&1"});
  EXPECT_EQ(check.second.find("warning"), std::string::npos) << check.second;
  ::unlink(path.c_str());

  // On a terminal (script(1) gives it one) the log has colours; not with NO_COLOR.
  // The broker runs until its admin socket is there (opened just before it
  // logs "listening on"), however long a sanitized start takes on a busy host.
  auto on_a_terminal = [&](const std::string& env) {
    const std::string sock = "/tmp/rdmabroker-tty-" + std::to_string(getpid()) + ".sock";
    const std::string broker_command = env + " " + broker_path() +
                                       " --no-config --allow-anonymous --tcp-port " +
                                       std::to_string(next_port()) + " --admin-socket " + sock +
                                       " --metrics-listen '' & b=$!; for i in $(seq 300); do [ -S " + sock +
                                       " ] && break; sleep 0.1; done; sleep 0.2; kill -TERM $b; wait $b";
    return run({"/usr/bin/script", "-qfec", broker_command, "/dev/null"}).second;
  };
  const std::string coloured = on_a_terminal("NO_COLOR=");
  EXPECT_NE(coloured.find("listening on"), std::string::npos) << coloured;
  EXPECT_NE(coloured.find('\x1b'), std::string::npos) << "no colours on a terminal: " << coloured;
  const std::string plain = on_a_terminal("NO_COLOR=1");
  EXPECT_NE(plain.find("listening on"), std::string::npos) << plain;
  EXPECT_EQ(plain.find('\x1b'), std::string::npos) << "colours despite NO_COLOR: " << plain;
}

// Idle sockets and slow requests hold connections to the metrics port; a
// scrape is answered within 1 s all the same, and every socket is released.
TEST(Tcp, MetricsAreServedWhileIdleSocketsHoldConnections) {
  const std::uint16_t metrics_port = next_port();
  BrokerProcess broker(next_port(), {"--metrics-listen", "127.0.0.1:" + std::to_string(metrics_port)});
  ASSERT_TRUE(broker.running());
  ASSERT_FALSE(http_get(metrics_port, "/metrics").empty());
  const std::size_t baseline_fds = open_fds(broker.pid());

  std::vector<UniqueFd> idle;
  for (int i = 0; i < 200; ++i) {
    idle.push_back(tcp_socket_to(metrics_port));
    ASSERT_TRUE(idle.back());
    // Every fourth one sends half a request and stops (a slow client).
    if (i % 4 == 0) {
      ASSERT_EQ(::send(idle.back().get(), "GET /metr", 9, MSG_NOSIGNAL), 9);
    }
  }
  for (int round = 0; round < 5; ++round) {
    const std::string body = http_get(metrics_port, "/metrics", 1s);
    EXPECT_NE(body.find("rdmabroker_build_info"), std::string::npos)
        << "round " << round << ": no answer within 1 s";
    // And new idle sockets keep arriving between scrapes.
    for (int i = 0; i < 20; ++i) idle.push_back(tcp_socket_to(metrics_port));
  }
  EXPECT_NE(http_get(metrics_port, "/nothing", 1s).find("only /metrics"), std::string::npos);
  idle.clear();
  std::size_t fds = 0;
  for (int i = 0; i < 200 && (fds = open_fds(broker.pid())) != baseline_fds; ++i)
    std::this_thread::sleep_for(50ms);
  EXPECT_EQ(fds, baseline_fds);
}

class Bounds : public ::testing::TestWithParam<Via> {
 protected:
  void SetUp() override {
    if (GetParam() == Via::kRdma) require_rdma();
  }
  /// Rewrites the config file and reloads `broker` with it.
  void reload_with(const BrokerProcess& broker, const std::string& yaml) {
    write_file(path_, yaml);
    auto [rc, out] = run({cli_path(), "reload", "--admin-socket", broker.admin_socket()});
    ASSERT_EQ(rc, 0) << out;
  }
  std::string path_ = "/tmp/rdmabroker-bounds-" + std::to_string(getpid()) + ".yaml";
};

/// A subscriber whose handler blocks until released: it stops reading.
struct StuckSubscriber {
  std::unique_ptr<Client> client;
  std::mutex mu;
  std::condition_variable cv;
  bool released = false;
  void release() {
    std::lock_guard l(mu);
    released = true;
    cv.notify_all();
  }
};

TEST_P(Bounds, BrokerWideSubscriptionLimitsRefuseOnlyTheSubscribeThatHitsThem) {
  // Both clients are anonymous from one address, one tenant: its quota is the whole budget here.
  write_file(
      path_,
      "logging: {level: warn}\nlimits: {max_subscriptions_total: 6, user_subscription_share_percent: 100}\n");
  BrokerProcess broker(next_port(), {"--config", path_, "--max-subscriptions", "1000"});
  ASSERT_TRUE(broker.running());
  std::mutex mu;
  std::vector<Error> errors;
  ClientOptions opt;
  opt.on_error = [&](const Error& e) {
    std::lock_guard l(mu);
    errors.push_back(e);
  };
  auto a = connect_via(broker, GetParam(), opt);
  auto b = connect_via(broker, GetParam());
  ASSERT_TRUE(a && b);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(b->subscribe(std::string_view("b." + std::to_string(i))));
  ASSERT_TRUE(b->flush(10s));
  std::vector<std::shared_ptr<Subscription>> subs;
  for (int i = 0; i < 4; ++i) {
    auto s = a->subscribe(std::string_view("a." + std::to_string(i)));
    ASSERT_TRUE(s);
    subs.push_back(std::move(s.value()));
  }
  ASSERT_TRUE(a->flush(10s));
  {
    std::lock_guard l(mu);
    ASSERT_EQ(errors.size(), 1u);
    EXPECT_NE(errors[0].message.find("broker-wide limit of 6 subscriptions"), std::string::npos)
        << errors[0].message;
  }
  // The refused one ended in the client; the others work.
  auto refused = subs.back()->next(2s);
  EXPECT_FALSE(refused.ok());
  auto s = broker.stats();
  EXPECT_EQ(s["subscriptions"], 6);
  EXPECT_EQ(s["limits.refused.subscriptions_total"], 1);
  ASSERT_TRUE(b->publish("a.0", std::string_view("still served")));
  auto m = subs[0]->next(10s);
  ASSERT_TRUE(m) << m.error().message;
  // What was given back can be taken again.
  ASSERT_TRUE(a->unsubscribe(subs[1]->sid()));
  ASSERT_TRUE(a->flush(10s));  // the broker has given it back
  auto again = b->subscribe(std::string_view("b.again"));
  ASSERT_TRUE(again) << again.error().message;
  ASSERT_TRUE(b->flush(10s));
  EXPECT_EQ(broker.stats()["limits.refused.subscriptions_total"], 1);

  // The memory bound, lowered live: of 100 more, only what fits its budget.
  reload_with(
      broker,
      "logging: {level: warn}\nlimits: {max_subscriptions_total: 100000, max_subscription_memory: 64KiB, "
      "user_subscription_share_percent: 100}\n");
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(b->subscribe(std::string_view("m." + std::to_string(i))));
  ASSERT_TRUE(b->flush(10s));
  s = broker.stats();
  EXPECT_GT(s["limits.refused.subscription_memory"], 0);
  EXPECT_LE(s["subscriptions.memory_bytes"], 64 * 1024);
  EXPECT_GT(s["subscriptions.memory_bytes"], 60 * 1024);
  EXPECT_EQ(s["subscriptions"], 6 + 100 - s["limits.refused.subscription_memory"]);
  // Connections closing give everything back.
  a->close();
  b->close();
  s = broker.wait_stats([](auto& s) { return s["connections.current"] == 0; }, 10s);
  EXPECT_EQ(s["subscriptions"], 0);
  EXPECT_EQ(s["subscriptions.memory_bytes"], 0);
  ::unlink(path_.c_str());
}

// Issue 49: one tenant (a user's connections, an anonymous address's) that
// subscribes without end stops at its quota, a part of the broker-wide
// bounds; the refusal names the quota, and everyone else still subscribes.
TEST_P(Bounds, OneTenantAtItsSubscriptionQuotaLeavesRoomForOthers) {
  const std::string users =
      "logging: {level: warn}\nauth:\n  anonymous: true\n  users:\n"
      "    - {name: alice, password: '" +
      hash_secret("alice-pw") +
      "'}\n"
      "    - {name: bob, password: '" +
      hash_secret("bob-pw") + "'}\n";
  write_file(path_, users + "limits: {max_subscriptions_total: 100, user_subscription_share_percent: 20}\n");
  BrokerProcess broker(next_port(), {"--config", path_, "--max-subscriptions", "1000"});
  ASSERT_TRUE(broker.running());
  struct Errors {
    std::mutex mu;
    std::vector<std::string> texts;
    ClientOptions options(std::string user = {}, std::string password = {}) {
      ClientOptions o;
      o.user = std::move(user);
      o.password = std::move(password);
      o.on_error = [this](const Error& e) {
        std::lock_guard l(mu);
        texts.push_back(e.message);
      };
      return o;
    }
    std::vector<std::string> get() {
      std::lock_guard l(mu);
      return texts;
    }
  } anon_errors, alice_errors, bob_errors;
  // Two anonymous connections from one address share its quota (20).
  auto anon1 = connect_via(broker, GetParam(), anon_errors.options());
  auto anon2 = connect_via(broker, GetParam(), anon_errors.options());
  auto alice = connect_via(broker, GetParam(), alice_errors.options("alice", "alice-pw"));
  auto bob = connect_via(broker, GetParam(), bob_errors.options("bob", "bob-pw"));
  ASSERT_TRUE(anon1 && anon2 && alice && bob);
  for (int i = 0; i < 15; ++i) ASSERT_TRUE(anon1->subscribe(std::string_view("anon1." + std::to_string(i))));
  for (int i = 0; i < 15; ++i) ASSERT_TRUE(anon2->subscribe(std::string_view("anon2." + std::to_string(i))));
  for (int i = 0; i < 30; ++i) ASSERT_TRUE(alice->subscribe(std::string_view("alice." + std::to_string(i))));
  ASSERT_TRUE(anon1->flush(10s) && anon2->flush(10s) && alice->flush(10s));
  auto s = broker.stats();
  EXPECT_EQ(s["limits.refused.user_subscriptions"], 10 + 10);
  EXPECT_EQ(s["subscriptions"], 40);
  const auto anon = anon_errors.get();
  ASSERT_EQ(anon.size(), 10u);
  EXPECT_NE(anon[0].find("subscription quota of anonymous clients of address"), std::string::npos) << anon[0];
  EXPECT_NE(anon[0].find("limits.user_subscription_share_percent"), std::string::npos) << anon[0];
  const auto of_alice = alice_errors.get();
  ASSERT_EQ(of_alice.size(), 10u);
  EXPECT_NE(of_alice[0].find("subscription quota of user 'alice' reached: 20 subscriptions"),
            std::string::npos)
      << of_alice[0];
  // Bob is another tenant: his subscriptions are taken, and served.
  std::vector<std::shared_ptr<Subscription>> bobs;
  for (int i = 0; i < 20; ++i) {
    auto sub = bob->subscribe(std::string_view("bob." + std::to_string(i)));
    ASSERT_TRUE(sub);
    bobs.push_back(std::move(sub.value()));
  }
  ASSERT_TRUE(bob->flush(10s));
  EXPECT_TRUE(bob_errors.get().empty());
  ASSERT_TRUE(alice->publish("bob.7", std::string_view("to bob")));
  auto m = bobs[7]->next(10s);
  ASSERT_TRUE(m) << m.error().message;
  // A closed connection gives its tenant's part back.
  anon1->close();
  broker.wait_stats([](auto& s) { return s["subscriptions"] == 45; }, 10s);
  for (int i = 0; i < 5; ++i)
    ASSERT_TRUE(anon2->subscribe(std::string_view("anon2.more." + std::to_string(i))));
  ASSERT_TRUE(anon2->flush(10s));
  EXPECT_EQ(anon_errors.get().size(), 10u);

  // The memory quota, set live: a quarter of 64 KiB each.
  reload_with(broker, users +
                          "limits: {max_subscriptions_total: 100000, max_subscription_memory: 64KiB, "
                          "user_subscription_share_percent: 25}\n");
  for (int i = 0; i < 40; ++i) ASSERT_TRUE(bob->subscribe(std::string_view("bob.m." + std::to_string(i))));
  ASSERT_TRUE(bob->flush(10s));
  s = broker.stats();
  EXPECT_GT(s["limits.refused.user_subscription_memory"], 0);
  EXPECT_EQ(s["limits.refused.subscription_memory"], 0);
  const auto of_bob = bob_errors.get();
  ASSERT_FALSE(of_bob.empty());
  EXPECT_NE(of_bob[0].find("subscription memory quota of user 'bob' reached: 16384 bytes"), std::string::npos)
      << of_bob[0];
  ::unlink(path_.c_str());
}

// Three subscribers stop reading; each stays within its own bound (1 MiB),
// but together they pass the broker-wide one (1 MiB): the ones above their
// share of it are cut off as slow consumers (counted), and a healthy
// subscriber gets every message.
TEST_P(Bounds, BrokerWideQueueBoundCutsTheLargestHoldersOnly) {
  write_file(path_,
             "logging: {level: warn}\nlimits: {max_connections: 5, max_pending_bytes: 1MiB, "
             "max_pending_bytes_total: 1MiB}\nslow_consumer: {write_deadline_ms: 120000}\n");
  BrokerProcess broker(next_port(), {"--config", path_});
  ASSERT_TRUE(broker.running());
  std::vector<std::unique_ptr<StuckSubscriber>> stuck;
  for (int i = 0; i < 3; ++i) {
    auto st = std::make_unique<StuckSubscriber>();
    st->client = connect_via(broker, GetParam());
    ASSERT_TRUE(st->client);
    StuckSubscriber* raw = st.get();
    ASSERT_TRUE(st->client->subscribe("q", [raw](const Message&) {
      std::unique_lock l(raw->mu);
      raw->cv.wait(l, [raw] { return raw->released; });
    }));
    ASSERT_TRUE(st->client->flush(10s));
    stuck.push_back(std::move(st));
  }
  auto healthy = connect_via(broker, GetParam());
  auto pub = connect_via(broker, GetParam());
  ASSERT_TRUE(healthy && pub);
  std::atomic<std::uint64_t> got{0};
  ASSERT_TRUE(healthy->subscribe("q", [&](const Message&) { got.fetch_add(1); }));
  ASSERT_TRUE(healthy->flush(10s));
  ASSERT_TRUE(broker.wait_stats([](auto& s) { return s["subscriptions"] == 4; }, 10s)["subscriptions"] == 4);

  // Publish in rounds that the healthy subscriber keeps up with (it is never
  // more than a round behind: well within its share), until the three stuck
  // ones are cut off; their own receive buffers (RDMA credits, socket
  // buffers) absorb an unknown amount first. At most 40 MB.
  const std::string payload(1000, 'q');
  std::uint64_t sent = 0;
  for (int round = 0; round < 400 && broker.stats()["connections.closed.slow_consumer"] < 3; ++round) {
    for (int i = 0; i < 100; ++i, ++sent) ASSERT_TRUE(pub->publish("q", payload));
    ASSERT_TRUE(pub->flush(60s));
    ASSERT_TRUE(broker.wait_stats([&](auto&) { return got.load() == sent; }, 60s).size() > 0);
    ASSERT_EQ(got.load(), sent) << "the healthy subscriber fell behind: " << broker.admin("connections");
  }
  // A close is counted when it starts; the connection leaves
  // connections.current when its teardown ends: wait for both.
  auto s = broker.wait_stats(
      [](auto& s) { return s["connections.closed.slow_consumer"] == 3 && s["connections.current"] == 2; },
      30s);
  EXPECT_GT(s["limits.refused.pending_total"], 0) << "the broker-wide bound cut nobody";
  EXPECT_EQ(s["connections.closed.slow_consumer"], 3);
  EXPECT_EQ(s["connections.current"], 2)
      << "the healthy subscriber or the publisher was cut: " << broker.admin("connections");
  EXPECT_LE(s["messages.pending_charge"], 2 * (1 << 20))
      << "the bound is the limit plus each connection's share";
  EXPECT_EQ(got.load(), sent);
  for (auto& st : stuck) st->release();
  for (auto& st : stuck) st->client->close();
  s = broker.wait_stats(
      [](auto& s) { return s["messages.pending_bytes"] == 0 && s["messages.pending"] == 0; }, 30s);
  EXPECT_EQ(s["messages.pending_bytes"], 0);
  // Nothing lost silently: every routed copy was delivered or dropped by a stated policy.
  const std::int64_t dropped = dropped_total(s);
  EXPECT_EQ(s["messages.delivered"] + dropped, s["messages.routed"]);
  ::unlink(path_.c_str());
}

// Sixteen subscribers that keep reading, fed flat out by one publisher: one
// publish becomes sixteen queued copies, so the broker's queues together
// pass a small broker-wide bound long before any one subscriber nears its
// own. The publisher is slowed instead (the stall watermark counts the
// broker-wide bound too, and a stall holds its input from the next frame
// on): nobody that reads is cut, and every subscriber gets every message.
TEST_P(Bounds, BrokerWideQueueBoundSlowsPublishersOfSubscribersThatRead) {
  write_file(path_,
             "logging: {level: warn}\nlimits: {max_connections: 32, max_pending_bytes: 1MiB, "
             "max_pending_bytes_total: 1MiB}\n");
  BrokerProcess broker(next_port(), {"--config", path_});
  ASSERT_TRUE(broker.running());
  constexpr int kSubscribers = 16;
  constexpr std::uint64_t kMessages = 5000;  // 80,000 copies: the bound's 1 MiB holds about 4,600
  std::vector<std::unique_ptr<Client>> subs;
  std::vector<std::unique_ptr<std::atomic<std::uint64_t>>> got;
  for (int i = 0; i < kSubscribers; ++i) {
    auto c = connect_via(broker, GetParam());
    ASSERT_TRUE(c);
    got.push_back(std::make_unique<std::atomic<std::uint64_t>>(0));
    auto* n = got.back().get();
    ASSERT_TRUE(c->subscribe("fan", [n](const Message&) { n->fetch_add(1); }));
    ASSERT_TRUE(c->flush(10s));
    subs.push_back(std::move(c));
  }
  auto pub = connect_via(broker, GetParam());
  ASSERT_TRUE(pub);
  ASSERT_TRUE(broker.wait_stats([](auto& s) { return s["subscriptions"] == kSubscribers; }, 10s).size() > 0);
  const std::string payload(64, 'f');
  for (std::uint64_t i = 0; i < kMessages; ++i) ASSERT_TRUE(pub->publish("fan", payload));
  ASSERT_TRUE(pub->flush(120s));
  auto all_in = [&] {
    return std::all_of(got.begin(), got.end(), [](auto& n) { return n->load() == kMessages; });
  };
  auto s = broker.wait_stats([&](auto&) { return all_in(); }, 120s);
  ASSERT_TRUE(all_in()) << broker.admin("connections") << "\n" << describe_stats(s);
  // A delivery is counted when its send completes, which may be after the
  // subscriber has it: wait for the broker's count too.
  s = broker.wait_stats(
      [](auto& s) { return s["messages.pending"] == 0 && s["messages.delivered"] == s["messages.routed"]; },
      30s);
  EXPECT_EQ(s["connections.closed.slow_consumer"], 0) << broker.admin("connections");
  EXPECT_EQ(s["limits.refused.pending_total"], 0);
  EXPECT_GT(s["producer_stalls"], 0) << "the bound never slowed the publisher: the test proves nothing";
  EXPECT_EQ(s["messages.delivered"], s["messages.routed"]);
  // Every copy routed between workers arrived: nothing left charged in transit.
  EXPECT_EQ(s["messages.pending_charge"], 0);
  ::unlink(path_.c_str());
}

INSTANTIATE_TEST_SUITE_P(Via, Bounds, ::testing::Values(Via::kRdma, Via::kTcp),
                         [](const auto& info) { return to_string(info.param); });

}  // namespace
}  // namespace rdmabroker::test
