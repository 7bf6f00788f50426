// SPDX-License-Identifier: Apache-2.0
// A cluster of three brokers in a full mesh of routes (docs/cluster.md,
// SPEC.md §8), run over each transport: "/rdma" in the Soft-RoCE guest (the
// routes and the clients over RDMA), "/tcp" on the host. RouteListeners:
// brokers that take routes on ports of their own, over RDMA the mixed
// cluster too (one route over RDMA, the other over TCP, RDMA clients).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <numeric>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "harness.hpp"
#include "rdmabroker/consumer.hpp"
#include "rdmabroker/proto/info.hpp"
#include "rdmabroker/client.hpp"
#include "rdmabroker/rdmabroker.h"

namespace rdmabroker::test {
namespace {

using namespace std::chrono_literals;

/// What one subscription received, in order (readable from the test thread).
/// Declared before the clients that feed it: they close first.
class Received {
 public:
  MessageHandler handler() {
    return [this](const Message& m) {
      std::uint64_t seq = 0;
      if (m.payload.size() >= 8) std::memcpy(&seq, m.payload.data(), 8);
      std::lock_guard l(mu_);
      seqs_.push_back(seq);
      subjects_.push_back(m.subject);
      count_.fetch_add(1);
    };
  }
  std::size_t count() const { return count_.load(); }
  std::vector<std::uint64_t> seqs() const {
    std::lock_guard l(mu_);
    return seqs_;
  }

 private:
  mutable std::mutex mu_;
  std::vector<std::uint64_t> seqs_;
  std::vector<std::string> subjects_;
  std::atomic<std::size_t> count_{0};
};

std::span<const std::byte> seq_payload(const std::uint64_t& seq) { return std::as_bytes(std::span(&seq, 1)); }

/// A broker of cluster "test" with its config file (rewritten to add routes);
/// with `route_listeners`, it takes routes on listeners of their own
/// (cluster.listen_rdma and cluster.listen_tcp) and only there. With
/// `announce`, it announces where routes and clients reach it over that
/// transport (cluster.advertise, cluster.client_advertise: its listeners are
/// on 0.0.0.0, which says nothing). `extra`: more of the config (a section).
struct Member {
  explicit Member(const std::string& name, const std::string& cluster = "test", bool route_listeners = false,
                  std::optional<Via> announce = std::nullopt, std::string extra = {})
      : extra_yaml(std::move(extra)),
        file("/tmp/rdmabroker-cluster-" + std::to_string(getpid()) + "-" + name + ".yaml"),
        route_rdma_port(route_listeners ? next_port() : 0),
        route_tcp_port(route_listeners ? next_port() : 0),
        client_rdma_port(next_port()),
        client_tcp_port(next_port()),
        announce_via(announce) {
    write(cluster, {});
    broker = std::make_unique<BrokerProcess>(client_rdma_port, std::vector<std::string>{"--config", file},
                                             true, client_tcp_port);
  }
  ~Member() {
    broker.reset();
    unlink(file.c_str());
  }
  void write(const std::string& cluster, const std::vector<std::string>& routes) const {
    std::ofstream out(file);
    // What the harness sets without a file: quiet logs, a small pool (and
    // SRQs that leave most of it free), patient deadlines (emulation, sanitizers).
    out << "logging: {level: warn}\nbuffers: {pool: 2048, srq_depth: 256}\n"
        << "auth: {anonymous: true, timeout_ms: 30000}\nslow_consumer: {write_deadline_ms: 30000}\n"
        << extra_yaml << "cluster:\n  name: " << cluster << "\n  user: route\n  password: s3cret-route\n";
    if (route_rdma_port != 0)
      out << "  listen_rdma: 0.0.0.0:" << route_rdma_port << "\n  listen_tcp: 0.0.0.0:" << route_tcp_port
          << "\n";
    if (announce_via) {
      const std::string route = route_rdma_port != 0 ? route_url(*announce_via) : client_url(*announce_via);
      out << "  advertise: [" << route;
      for (const auto& u : extra_advertise) out << ", " << u;
      out << "]\n  client_advertise: [" << client_url(*announce_via);
      for (const auto& u : extra_advertise) out << ", " << u;
      for (const auto& u : extra_client_advertise) out << ", " << u;
      out << "]\n";
    }
    out << "  routes: [";
    for (std::size_t i = 0; i < routes.size(); ++i) out << (i ? ", " : "") << routes[i];
    out << "]\n";
  }
  std::int64_t stat(const std::string& key) const {
    auto s = broker->stats();
    auto it = s.find(key);
    return it == s.end() ? 0 : it->second;
  }
  /// Where its clients of transport `via` reach it (url_via, before the broker runs).
  std::string client_url(Via via) const {
    return via == Via::kRdma ? "rdma://" + guest_addr1() + ":" + std::to_string(client_rdma_port)
                             : "tcp://127.0.0.1:" + std::to_string(client_tcp_port);
  }
  /// Where its route listener of transport `via` is reached.
  std::string route_url(Via via) const {
    return via == Via::kRdma ? "rdma://" + guest_addr1() + ":" + std::to_string(route_rdma_port)
                             : "tcp://127.0.0.1:" + std::to_string(route_tcp_port);
  }
  std::string extra_yaml;
  /// Announced after its own URL, as a route URL and a client URL (never dialed in the tests).
  std::vector<std::string> extra_advertise;
  /// Announced after those as client URLs only (a route login has room for few route URLs).
  std::vector<std::string> extra_client_advertise;
  std::string file;
  std::uint16_t route_rdma_port;
  std::uint16_t route_tcp_port;
  std::uint16_t client_rdma_port;
  std::uint16_t client_tcp_port;
  std::optional<Via> announce_via;
  std::unique_ptr<BrokerProcess> broker;
};

/// Gives `m` these routes (a reload: the live way to change them).
void route(Member& m, const std::vector<std::string>& urls) {
  m.write("test", urls);
  const std::string reply = m.broker->admin("reload");
  ASSERT_NE(reply.find("\"ok\":true"), std::string::npos) << reply;
}
void await_routes_up(Member& m, std::int64_t n) {
  ASSERT_TRUE(wait_until([&] { return m.stat("cluster.routes_up") == n; }, 60s))
      << "routes up: " << m.stat("cluster.routes_up") << " of " << m.stat("cluster.routes") << ", expected "
      << n;
}

class Cluster : public ::testing::TestWithParam<Via> {
 protected:
  void SetUp() override {
    if (GetParam() == Via::kRdma) require_rdma();
    mesh(GetParam());
  }
  /// Every broker routes to all three (itself included, as a StatefulSet's
  /// seed list would: a route to itself is recognised and not used), over `via`.
  void mesh(Via via) {
    for (auto* m : all()) {
      std::vector<std::string> urls;
      for (auto* to : all()) urls.push_back(url_via(*to->broker, via));
      route(*m, urls);
    }
    for (auto* m : all()) await_routes_up(*m, 2);
  }
  std::vector<Member*> all() { return {&a_, &b_, &c_}; }
  std::unique_ptr<Client> client(Member& m) { return connect_via(*m.broker, GetParam()); }
  /// Waits until `m` holds `n` subscriptions (its clients' and the routes'):
  /// interest travels asynchronously, like NATS's.
  static void await_subscriptions(Member& m, std::int64_t n) {
    ASSERT_TRUE(wait_until([&] { return m.stat("subscriptions") >= n; }, 60s))
        << m.stat("subscriptions") << " subscriptions, expected " << n;
  }

  Member a_{"a"};
  Member b_{"b"};
  Member c_{"c"};
};

TEST_P(Cluster, EveryMessageOnceAndInOrderOnEveryBrokerThatWantsIt) {
  constexpr std::uint64_t kMessages = 300;
  Received on_b, on_c_star, on_c_all, on_a, elsewhere;
  auto sub_b = client(b_);
  auto sub_c = client(c_);
  auto sub_a = client(a_);
  ASSERT_TRUE(sub_b && sub_c && sub_a);
  ASSERT_TRUE(sub_b->subscribe("orders.>", on_b.handler()).ok());
  // Two patterns on one broker: each subscription gets its own copy, none twice.
  ASSERT_TRUE(sub_c->subscribe("orders.*", on_c_star.handler()).ok());
  ASSERT_TRUE(sub_c->subscribe("orders.>", on_c_all.handler()).ok());
  ASSERT_TRUE(sub_a->subscribe("orders.new", on_a.handler()).ok());
  // A's index: its client's one, B's route's one, C's route's two.
  await_subscriptions(a_, 4);
  auto pub = client(a_);
  ASSERT_TRUE(pub);
  for (std::uint64_t i = 1; i <= kMessages; ++i) ASSERT_TRUE(pub->publish("orders.new", seq_payload(i)).ok());
  ASSERT_TRUE(pub->flush(30s).ok());
  for (Received* r : {&on_b, &on_c_star, &on_c_all, &on_a})
    ASSERT_TRUE(wait_until([&] { return r->count() >= kMessages; }, 60s)) << r->count();
  std::this_thread::sleep_for(300ms);  // a duplicate would arrive by now
  std::vector<std::uint64_t> expected(kMessages);
  for (std::uint64_t i = 0; i < kMessages; ++i) expected[i] = i + 1;
  EXPECT_EQ(on_b.seqs(), expected) << "B: every message once, in order";
  EXPECT_EQ(on_c_star.seqs(), expected) << "C, orders.*";
  EXPECT_EQ(on_c_all.seqs(), expected) << "C, orders.>";
  EXPECT_EQ(on_a.seqs(), expected) << "A's own subscriber";
  // What crossed the routes: to B once per message, to C once per pattern.
  EXPECT_EQ(b_.stat("cluster.route_messages_in"), static_cast<std::int64_t>(kMessages));
  EXPECT_EQ(c_.stat("cluster.route_messages_in"), static_cast<std::int64_t>(2 * kMessages));
  EXPECT_EQ(a_.stat("cluster.route_messages_in"), 0) << "nobody published on B or C";
  EXPECT_TRUE(wait_until(
      [&] { return a_.stat("cluster.route_messages_out") == static_cast<std::int64_t>(3 * kMessages); }, 30s))
      << "A sent B's route one copy and C's route two: " << a_.stat("cluster.route_messages_out");

  // One hop: a broker whose clients want nothing of a subject gets none of it.
  auto pub_b = client(b_);
  ASSERT_TRUE(pub_b);
  for (std::uint64_t i = 1; i <= 20; ++i) ASSERT_TRUE(pub_b->publish("nobody.wants", seq_payload(i)).ok());
  ASSERT_TRUE(pub_b->flush(30s).ok());
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(a_.stat("cluster.route_messages_in"), 0);
  EXPECT_EQ(c_.stat("cluster.route_messages_in"), static_cast<std::int64_t>(2 * kMessages));
  EXPECT_EQ(
      a_.stat("cluster.route_dropped") + b_.stat("cluster.route_dropped") + c_.stat("cluster.route_dropped"),
      0);
}

TEST_P(Cluster, AQueueGroupSpanningTheClusterGetsEachMessageOncePreferringLocalMembers) {
  constexpr std::uint64_t kMessages = 120;
  Received member_a, member_b, member_c;
  auto on_b = client(b_);
  auto on_c = client(c_);
  ASSERT_TRUE(on_b && on_c);
  ASSERT_TRUE(on_b->queue_subscribe("jobs", "workers", member_b.handler()).ok());
  ASSERT_TRUE(on_c->queue_subscribe("jobs", "workers", member_c.handler()).ok());
  await_subscriptions(a_, 2);
  // No member on A: A chooses among the routes, each message to one of them.
  auto pub = client(a_);
  ASSERT_TRUE(pub);
  for (std::uint64_t i = 1; i <= kMessages; ++i) ASSERT_TRUE(pub->publish("jobs", seq_payload(i)).ok());
  ASSERT_TRUE(pub->flush(30s).ok());
  ASSERT_TRUE(wait_until([&] { return member_b.count() + member_c.count() >= kMessages; }, 60s));
  std::this_thread::sleep_for(300ms);
  std::vector<std::uint64_t> all = member_b.seqs();
  const auto from_c = member_c.seqs();
  all.insert(all.end(), from_c.begin(), from_c.end());
  std::sort(all.begin(), all.end());
  ASSERT_EQ(all.size(), kMessages) << "each message to exactly one member in the cluster";
  for (std::uint64_t i = 0; i < kMessages; ++i) ASSERT_EQ(all[i], i + 1);
  EXPECT_GT(member_b.count(), 0u);
  EXPECT_GT(member_c.count(), 0u);

  // A member on A: A's own member gets every message published on A.
  auto on_a = client(a_);
  ASSERT_TRUE(on_a);
  ASSERT_TRUE(on_a->queue_subscribe("jobs", "workers", member_a.handler()).ok());
  ASSERT_TRUE(on_a->flush(30s).ok());
  for (std::uint64_t i = 1; i <= kMessages; ++i) ASSERT_TRUE(pub->publish("jobs", seq_payload(i)).ok());
  ASSERT_TRUE(pub->flush(30s).ok());
  ASSERT_TRUE(wait_until([&] { return member_a.count() >= kMessages; }, 60s)) << member_a.count();
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(member_b.count() + member_c.count(), kMessages) << "nothing more left A";
}

TEST_P(Cluster, ARequestOnOneBrokerIsAnsweredOnAnotherTheFirstOneToo) {
  auto responder = client(c_);
  ASSERT_TRUE(responder);
  Client* raw = responder.get();
  ASSERT_TRUE(responder
                  ->subscribe("svc.time",
                              [raw](const Message& m) {
                                (void)raw->publish(m.reply, std::as_bytes(std::span("noon", 4)));
                              })
                  .ok());
  await_subscriptions(a_, 1);
  auto requester = client(a_);
  ASSERT_TRUE(requester);
  // The requester's inbox, made by its first request, is interest like any
  // other: it travels to C on A's route there, while the request goes on C's
  // route here. A's PONG to the inbox's SUBSCRIBE waits until C has it
  // (SPEC.md §8, "Interest in effect"), and request() waits for that PONG,
  // so the very first reply finds its way back. Where fault injection is
  // built in, A's route thread is held up 600 ms first: without that rule
  // the reply would reach C before the inbox's interest and be lost.
  const bool stalled = a_.broker->admin("fault route-stall 600").find("\"ok\":true") != std::string::npos;
  const auto asked = std::chrono::steady_clock::now();
  auto reply = requester->request("svc.time", std::as_bytes(std::span("now?", 4)), 30s);
  ASSERT_TRUE(reply.ok()) << reply.error().message;
  EXPECT_EQ(reply.value().data(), "noon");
  if (stalled) {
    EXPECT_GE(std::chrono::steady_clock::now() - asked, 600ms) << "the PONG did not wait for the route";
  }
  // A subject nobody in the cluster subscribes to: NO_RESPONDERS at once.
  auto nobody = requester->request("svc.nobody", std::as_bytes(std::span("?", 1)), 30s);
  ASSERT_FALSE(nobody.ok());
  EXPECT_EQ(nobody.error().kind, ErrorKind::kNoResponders) << nobody.error().message;
}

TEST_P(Cluster, MessagesLargerThanAFrameCrossARouteWholeWithTheirHeaders) {
  // Up to limits.max_payload (1 MiB by default), on the default 16 KiB
  // frames: the route's broker sends them in fragments, this one passes them
  // on in fragments of its own (SPEC.md §3.7), the library reassembles.
  std::mutex mu;
  std::vector<Message> got;
  auto sub = client(b_);
  ASSERT_TRUE(sub);
  ASSERT_TRUE(sub->subscribe("big.>",
                             [&](const Message& m) {
                               std::lock_guard l(mu);
                               got.push_back(m);
                             })
                  .ok());
  await_subscriptions(a_, 1);
  // The last just under the 1 MiB limit with its header block.
  const std::vector<std::size_t> sizes = {16 * 1024, 100 * 1000 + 3, (1u << 20) - 64};
  auto pub = client(a_);
  ASSERT_TRUE(pub);
  std::vector<std::vector<std::byte>> sent;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    std::vector<std::byte> payload(sizes[i]);
    for (std::size_t j = 0; j < payload.size(); ++j)
      payload[j] = std::byte(static_cast<unsigned char>(j * 31 + i));
    const Headers headers{{"trace-id", "t-" + std::to_string(i)}};
    ASSERT_TRUE(pub->publish("big." + std::to_string(i), headers, payload).ok()) << sizes[i];
    sent.push_back(std::move(payload));
  }
  ASSERT_TRUE(pub->flush(60s).ok());
  const bool all = wait_until(
      [&] {
        std::lock_guard l(mu);
        return got.size() >= sizes.size();
      },
      30s);
  std::lock_guard l(mu);
  // Issue 49, §6: when they do not all arrive, which did, and what each
  // broker counted of them.
  ASSERT_TRUE(all) << got.size() << " of " << sizes.size() << " arrived (" <<
      [&] {
        std::string s;
        for (const auto& m : got) s += m.subject + " ";
        return s;
      }() << "); A: in "
                   << a_.stat("messages.in") << " routed " << a_.stat("messages.routed") << " delivered "
                   << a_.stat("messages.delivered") << "; B: route in "
                   << b_.stat("cluster.route_messages_in") << " delivered " << b_.stat("messages.delivered")
                   << " incomplete " << b_.stat("messages.dropped.incomplete") << " route dropped "
                   << b_.stat("cluster.route_dropped");
  ASSERT_EQ(got.size(), sizes.size());
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    EXPECT_EQ(got[i].subject, "big." + std::to_string(i));
    EXPECT_EQ(got[i].headers.get("trace-id"), "t-" + std::to_string(i));
    EXPECT_TRUE(got[i].payload == sent[i]) << "message " << i << " of " << sizes[i] << " bytes differs";
  }
  EXPECT_EQ(b_.stat("cluster.route_dropped"), 0);
}

TEST_P(Cluster, MessagesInFragmentsOfTwoPublishersAtOnceCrossARouteWhole) {
  // The route passes each fragment on as it arrives (no copy, nothing held
  // whole): two publishers' messages interleave on it, and each keeps an id
  // of this broker's so that the subscriber reassembles them apart.
  constexpr int kEach = 4;
  constexpr std::size_t kSize = 150 * 1000;
  std::mutex mu;
  std::vector<Message> got;
  auto sub = client(b_);
  ASSERT_TRUE(sub);
  ASSERT_TRUE(sub->subscribe("frag.>",
                             [&](const Message& m) {
                               std::lock_guard l(mu);
                               got.push_back(m);
                             })
                  .ok());
  await_subscriptions(a_, 1);
  auto payload_of = [](int p, int i) {
    std::vector<std::byte> v(kSize + static_cast<std::size_t>(i));
    for (std::size_t j = 0; j < v.size(); ++j)
      v[j] = std::byte(static_cast<unsigned char>(j * 7 + p * 13 + i));
    return v;
  };
  std::vector<std::thread> publishers;
  std::atomic<int> failures{0};
  for (int p = 0; p < 2; ++p) {
    publishers.emplace_back([&, p] {
      auto pub = client(a_);
      if (!pub) return failures.fetch_add(1), void();
      for (int i = 0; i < kEach; ++i) {
        if (!pub->publish("frag." + std::to_string(p), payload_of(p, i)).ok()) failures.fetch_add(1);
      }
      if (!pub->flush(60s).ok()) failures.fetch_add(1);
    });
  }
  for (auto& t : publishers) t.join();
  ASSERT_EQ(failures.load(), 0);
  ASSERT_TRUE(wait_until(
      [&] {
        std::lock_guard l(mu);
        return got.size() >= 2 * kEach;
      },
      30s))
      << "B: route in " << b_.stat("cluster.route_messages_in") << ", incomplete "
      << b_.stat("messages.dropped.incomplete");
  std::lock_guard l(mu);
  ASSERT_EQ(got.size(), 2u * kEach);
  int next[2] = {0, 0};
  for (const auto& m : got) {
    const int p = m.subject == "frag.0" ? 0 : 1;
    const int i = next[p]++;  // each publisher's in its order
    EXPECT_TRUE(m.payload == payload_of(p, i)) << m.subject << " #" << i << " differs";
  }
  EXPECT_EQ(b_.stat("messages.dropped.incomplete"), 0);
  EXPECT_EQ(b_.stat("cluster.route_dropped"), 0);
}

TEST_P(Cluster, ARouteIsAConnectionOfAWorkerWithNoThreadOfItsOwn) {
  // A broker with two routes up has the threads of one without routes: its
  // routes are connections of its workers, which `stat` lists like any.
  Member lone("lone", "alone");
  const long routed = status_kib(a_.broker->pid(), "Threads:");
  const long alone = status_kib(lone.broker->pid(), "Threads:");
  ASSERT_GT(alone, 0);
  EXPECT_EQ(routed, alone) << "broker A (2 routes up) has " << routed << " threads, one without routes "
                           << alone << ":\n"
                           << thread_stacks(a_.broker->pid());
  // Among A's connections: its route out to B (the peer it dialed), beside B's route in.
  const std::string listed = a_.broker->admin("connections");
  const std::string dialed = url_via(*b_.broker, GetParam()).substr(GetParam() == Via::kRdma ? 7 : 6);
  EXPECT_NE(listed.find("\"peer\":\"" + dialed + "\""), std::string::npos) << listed;
}

TEST_P(Cluster, ClientsOfAKilledBrokerMoveToAnotherAndTheOthersLoseNothing) {
  // A publisher on A, subscribers on A and C, and a client given the list
  // "B, C" that lands on B. B is killed mid-stream (SIGKILL: no CLOSE, its
  // routes just vanish): A and C drop its interest and go on; the client
  // moves to C and, its subscription restored there, gets what A publishes.
  Received on_a, on_c, moving;
  ConnectionEvents events;
  ClientOptions opt = events.options();
  opt.connect_timeout = 15s;
  opt.publish_timeout = 10s;
  if (GetParam() == Via::kRdma) opt.bind_address = guest_addr2();
  auto mover = Client::connect(url_via(*b_.broker, GetParam()) + "," + url_via(*c_.broker, GetParam()), opt);
  ASSERT_TRUE(mover.ok()) << mover.error().message;
  auto port_of = [&](Member& m) {
    return std::to_string(GetParam() == Via::kRdma ? m.broker->port() : m.broker->tcp_port());
  };
  EXPECT_NE(mover.value()->transport_description().find(port_of(b_)), std::string::npos)
      << "the first server of the list serves: " << mover.value()->transport_description();
  auto sub_a = client(a_);
  auto sub_c = client(c_);
  ASSERT_TRUE(sub_a && sub_c);
  ASSERT_TRUE(mover.value()->subscribe("ticks", moving.handler()).ok());
  ASSERT_TRUE(sub_a->subscribe("ticks", on_a.handler()).ok());
  ASSERT_TRUE(sub_c->subscribe("ticks", on_c.handler()).ok());
  await_subscriptions(a_, 3);  // its own, B's route's, C's route's
  auto pub = client(a_);
  ASSERT_TRUE(pub);
  std::uint64_t seq = 0;
  auto publish = [&](std::uint64_t n) {
    for (std::uint64_t i = 0; i < n; ++i) {
      ++seq;
      ASSERT_TRUE(pub->publish("ticks", seq_payload(seq)).ok());
      std::this_thread::sleep_for(1ms);
    }
  };
  publish(100);
  ASSERT_TRUE(wait_until([&] { return moving.count() >= 100; }, 60s)) << moving.count();
  EXPECT_EQ(b_.broker->stop(SIGKILL, 10s), 128 + SIGKILL);
  publish(100);
  // The client notices, moves to C, restores its subscription; C's route to
  // A carries it, and what A publishes from then on reaches it.
  ASSERT_TRUE(wait_until([&] { return events.reconnected.load() >= 1; }, 60s));
  EXPECT_NE(mover.value()->transport_description().find(port_of(c_)), std::string::npos)
      << mover.value()->transport_description();
  // B's routes are gone from A and C; C's interest in "ticks" (its own
  // subscriber's entry, which the moved client's joins) is already at A.
  ASSERT_TRUE(wait_until(
      [&] { return a_.stat("cluster.routes_up") == 1 && c_.stat("cluster.routes_up") == 1; }, 60s));
  const std::uint64_t before_last = seq;
  publish(100);
  ASSERT_TRUE(pub->flush(30s).ok());
  for (Received* r : {&on_a, &on_c})
    ASSERT_TRUE(wait_until([&] { return r->count() >= seq; }, 60s)) << r->count() << " of " << seq;
  ASSERT_TRUE(wait_until([&] { return !moving.seqs().empty() && moving.seqs().back() == seq; }, 60s));
  std::this_thread::sleep_for(300ms);
  std::vector<std::uint64_t> all(seq);
  for (std::uint64_t i = 0; i < seq; ++i) all[i] = i + 1;
  EXPECT_EQ(on_a.seqs(), all) << "A's subscriber lost nothing";
  EXPECT_EQ(on_c.seqs(), all) << "C's subscriber lost nothing";
  // The client missed what was published while it moved (SPEC: at most
  // once), never twice, always in order, and everything after it moved.
  const auto got = moving.seqs();
  EXPECT_TRUE(std::is_sorted(got.begin(), got.end()) &&
              std::adjacent_find(got.begin(), got.end()) == got.end());
  EXPECT_GE(std::count_if(got.begin(), got.end(), [&](std::uint64_t s) { return s > before_last; }), 100);
}

TEST_P(Cluster, APartitionHealsWithTheInterestResyncedAndNothingDeliveredTwice) {
  // Subscribers on B and C, a publisher on A. A and B stop routing to each
  // other (both sides: a partition between them; C still talks to both),
  // B's clients change their interest meanwhile, then the routes come back.
  Received on_b, on_c, on_b_later;
  auto sub_b = client(b_);
  auto sub_c = client(c_);
  auto pub = client(a_);
  ASSERT_TRUE(sub_b && sub_c && pub);
  ASSERT_TRUE(sub_b->subscribe("p.>", on_b.handler()).ok());
  ASSERT_TRUE(sub_c->subscribe("p.>", on_c.handler()).ok());
  await_subscriptions(a_, 2);
  std::uint64_t seq = 0;
  auto publish = [&](const std::string& subject, std::uint64_t n) {
    for (std::uint64_t i = 0; i < n; ++i) {
      ++seq;
      ASSERT_TRUE(pub->publish(subject, seq_payload(seq)).ok());
    }
    ASSERT_TRUE(pub->flush(30s).ok());
  };
  publish("p.x", 50);
  ASSERT_TRUE(wait_until([&] { return on_b.count() >= 50 && on_c.count() >= 50; }, 60s))
      << "B got " << on_b.count() << ", C " << on_c.count() << " of 50; A routed "
      << a_.stat("messages.routed") << " delivered " << a_.stat("messages.delivered") << " subscriptions "
      << a_.stat("subscriptions") << "; route messages in: B " << b_.stat("cluster.route_messages_in")
      << " C " << c_.stat("cluster.route_messages_in") << "; delivered: B " << b_.stat("messages.delivered")
      << " C " << c_.stat("messages.delivered");

  // The partition: A's route to B and B's to A go; A drops B's interest.
  const Via via = GetParam();
  route(a_, {url_via(*a_.broker, via), url_via(*c_.broker, via)});
  route(b_, {url_via(*b_.broker, via), url_via(*c_.broker, via)});
  await_routes_up(a_, 1);
  await_routes_up(b_, 1);
  ASSERT_TRUE(wait_until([&] { return a_.stat("subscriptions") == 1; }, 60s))
      << "A still holds " << a_.stat("subscriptions") << " subscriptions; only C's route's is left";
  auto sub_b_later = client(b_);
  ASSERT_TRUE(sub_b_later);
  ASSERT_TRUE(sub_b_later->subscribe("q.>", on_b_later.handler()).ok());
  // What A publishes now reaches C, not B: C never passes on what a route
  // brought (one hop), and nothing waits to be replayed (at most once).
  publish("p.x", 50);
  ASSERT_TRUE(wait_until([&] { return on_c.count() >= 100; }, 60s)) << on_c.count();

  // The heal: the routes come back with a full sync of the interest,
  // B's new subscription included.
  mesh(via);
  await_subscriptions(a_, 3);  // C's p.>, B's p.> and q.>
  const std::uint64_t healed_at = seq;
  publish("p.x", 50);
  publish("q.x", 10);
  ASSERT_TRUE(wait_until([&] { return on_b.count() >= 100 && on_c.count() >= 150; }, 60s))
      << on_b.count() << " " << on_c.count();
  ASSERT_TRUE(wait_until([&] { return on_b_later.count() >= 10; }, 60s)) << on_b_later.count();
  std::this_thread::sleep_for(300ms);  // a duplicate would arrive by now
  std::vector<std::uint64_t> expected_b, expected_c;
  for (std::uint64_t i = 1; i <= healed_at + 50; ++i) {
    expected_c.push_back(i);
    if (i <= 50 || i > healed_at) expected_b.push_back(i);
  }
  EXPECT_EQ(on_b.seqs(), expected_b) << "B: before the partition and after the heal, each once, in order";
  EXPECT_EQ(on_c.seqs(), expected_c) << "C lost nothing";
  EXPECT_EQ(on_b_later.count(), 10u);
}

TEST_P(Cluster, ARestartedBrokerIsRoutedAgainWithItsPeersInterestRestored) {
  // A's subscriber wants what B's clients publish: A's route to B holds that
  // interest at B. B is killed and started again on the same ports: A's
  // route reconnects (back-off) and subscribes again there; B's own routes
  // log in with its new id.
  Received on_a, on_b;
  auto sub_a = client(a_);
  ASSERT_TRUE(sub_a);
  ASSERT_TRUE(sub_a->subscribe("r.>", on_a.handler()).ok());
  await_subscriptions(b_, 1);
  EXPECT_EQ(b_.broker->restart(SIGKILL), 128 + SIGKILL);
  ASSERT_TRUE(wait_until([&] { return a_.stat("cluster.route_reconnects") >= 1; }, 60s))
      << "A's route to B did not come back";
  await_routes_up(a_, 2);
  await_routes_up(b_, 2);
  await_subscriptions(b_, 1);  // A's r.>, restored by A's route
  auto sub_b = client(b_);
  ASSERT_TRUE(sub_b);
  ASSERT_TRUE(sub_b->subscribe("r.>", on_b.handler()).ok());
  await_subscriptions(a_, 2);  // B's new route's r.>, and A's own
  auto pub_b = client(b_);
  auto pub_a = client(a_);
  ASSERT_TRUE(pub_b && pub_a);
  constexpr std::uint64_t kMessages = 50;
  for (std::uint64_t i = 1; i <= kMessages; ++i) ASSERT_TRUE(pub_b->publish("r.b", seq_payload(i)).ok());
  for (std::uint64_t i = kMessages + 1; i <= 2 * kMessages; ++i)
    ASSERT_TRUE(pub_a->publish("r.a", seq_payload(i)).ok());
  ASSERT_TRUE(pub_b->flush(30s).ok() && pub_a->flush(30s).ok());
  for (Received* r : {&on_a, &on_b})
    ASSERT_TRUE(wait_until([&] { return r->count() >= 2 * kMessages; }, 60s)) << r->count();
  std::this_thread::sleep_for(300ms);
  for (Received* r : {&on_a, &on_b}) {
    auto got = r->seqs();
    std::sort(got.begin(), got.end());  // two publishers: in order per publisher, checked below
    ASSERT_EQ(got.size(), 2 * kMessages) << "each message once";
    for (std::uint64_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], i + 1);
    const auto seqs = r->seqs();
    std::vector<std::uint64_t> from_b, from_a;
    for (auto s : seqs) (s <= kMessages ? from_b : from_a).push_back(s);
    EXPECT_TRUE(std::is_sorted(from_b.begin(), from_b.end()) && std::is_sorted(from_a.begin(), from_a.end()));
  }
}

INSTANTIATE_TEST_SUITE_P(Via, Cluster, ::testing::Values(Via::kRdma, Via::kTcp),
                         [](const auto& info) { return to_string(info.param); });

class ClusterStreams : public ::testing::TestWithParam<Via> {
 protected:
  void SetUp() override {
    if (GetParam() == Via::kRdma) require_rdma();
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  const std::string dir_ = "/tmp/rdmabroker-cluster-" + std::to_string(getpid()) + "-streams.d";
};

// A stream is interest like a client's subscription (docs/cluster.md): what
// clients of another broker publish on its subjects crosses the route and is
// stored in their order, and a consumer at the stream's broker reads it. The
// acknowledgement comes from a stream of the publisher's own broker only.
TEST_P(ClusterStreams, AStreamStoresWhatClientsOfTheOtherBrokersPublish) {
  constexpr std::uint64_t kMessages = 50;
  Member a("sa", "test", false, std::nullopt,
           "storage: {directory: " + dir_ + "}\nstreams: [{name: LEDGER, subjects: [\"ledger.>\"]}]\n");
  Member b("sb");
  for (Member* m : {&a, &b}) route(*m, {url_via(*a.broker, GetParam()), url_via(*b.broker, GetParam())});
  await_routes_up(a, 1);
  await_routes_up(b, 1);
  ASSERT_TRUE(wait_until([&] { return b.stat("subscriptions") >= 1; }, 60s))
      << "B holds A's route's subscription for the stream's subjects";
  auto pub = connect_via(*b.broker, GetParam());
  ASSERT_TRUE(pub);
  for (std::uint64_t i = 1; i <= kMessages; ++i) ASSERT_TRUE(pub->publish("ledger.entry", seq_payload(i)));
  ASSERT_TRUE(pub->flush(30s));
  auto acked = pub->publish_acked("ledger.entry", {}, seq_payload(kMessages + 1), 10s);
  ASSERT_FALSE(acked);
  EXPECT_EQ(acked.error().kind, ErrorKind::kNoStream) << "B has no stream: " << acked.error().message;
  auto reader = connect_via(*a.broker, GetParam());
  ASSERT_TRUE(reader);
  auto k = reader->consume("LEDGER", {}, 10s);
  ASSERT_TRUE(k) << k.error().message;
  for (std::uint64_t i = 1; i <= kMessages + 1; ++i) {
    auto m = k.value()->next(20s);
    ASSERT_TRUE(m) << i << ": " << m.error().message;
    EXPECT_EQ(m->stream_sequence, i);
    std::uint64_t seq = 0;
    ASSERT_EQ(m->payload.size(), sizeof seq);
    std::memcpy(&seq, m->payload.data(), sizeof seq);
    EXPECT_EQ(seq, i) << "in the publisher's order, the unacknowledged one stored too";
    ASSERT_TRUE(k.value()->ack(*m));
  }
  EXPECT_EQ(a.stat("cluster.route_messages_in"), static_cast<std::int64_t>(kMessages + 1));
}

INSTANTIATE_TEST_SUITE_P(Via, ClusterStreams, ::testing::Values(Via::kRdma, Via::kTcp),
                         [](const auto& info) { return to_string(info.param); });

class RouteListeners : public ::testing::TestWithParam<Via> {
 protected:
  void SetUp() override {
    if (GetParam() == Via::kRdma) require_rdma();
  }
};

TEST_P(RouteListeners, RoutesAndClientsEachHaveTheirOwnPortAndARouteMayTakeTheOtherTransport) {
  const Via via = GetParam();
  Member a("a", "test", true);
  Member b("b", "test", true);
  ClientOptions route_login;
  route_login.route_cluster = "test";
  route_login.route_server = "0123456789abcdef";
  route_login.user = "route";
  route_login.password = "s3cret-route";
  // A client at a route port and a route at a client port are refused, each
  // told where to go: a firewall between the two means what it says.
  auto client_at_route_port = try_connect_url(a.route_url(via), via);
  ASSERT_FALSE(client_at_route_port.ok());
  EXPECT_EQ(client_at_route_port.error().kind, ErrorKind::kAuthenticationFailed);
  EXPECT_NE(client_at_route_port.error().message.find("takes routes only"), std::string::npos)
      << client_at_route_port.error().message;
  auto route_at_client_port = try_connect_via(*a.broker, via, route_login);
  ASSERT_FALSE(route_at_client_port.ok());
  EXPECT_NE(route_at_client_port.error().message.find("on its route listener"), std::string::npos)
      << route_at_client_port.error().message;
  EXPECT_EQ(a.stat("auth.failed"), 2);
  ASSERT_TRUE(try_connect_url(a.route_url(via), via, route_login).ok()) << "the route port takes the route";

  // A's route to B over `via`; B's route to A over TCP whatever the clients
  // use (in the guest: RDMA clients on brokers, one route each way, one of
  // them TCP).
  a.write("test", {b.route_url(via)});
  b.write("test", {a.route_url(Via::kTcp)});
  for (Member* m : {&a, &b}) {
    const std::string reply = m->broker->admin("reload");
    ASSERT_NE(reply.find("\"ok\":true"), std::string::npos) << reply;
  }
  for (Member* m : {&a, &b})
    ASSERT_TRUE(wait_until([&] { return m->stat("cluster.routes_up") == 1; }, 60s)) << m->file;
  constexpr std::uint64_t kMessages = 100;
  Received on_a, on_b;
  auto sub_a = connect_via(*a.broker, via);
  auto sub_b = connect_via(*b.broker, via);
  ASSERT_TRUE(sub_a && sub_b);
  ASSERT_TRUE(sub_a->subscribe("east.>", on_a.handler()).ok());
  ASSERT_TRUE(sub_b->subscribe("west.>", on_b.handler()).ok());
  // Each broker: its client's subscription and the other's route's.
  for (Member* m : {&a, &b})
    ASSERT_TRUE(wait_until([&] { return m->stat("subscriptions") >= 2; }, 60s)) << m->stat("subscriptions");
  auto pub_a = connect_via(*a.broker, via);
  auto pub_b = connect_via(*b.broker, via);
  ASSERT_TRUE(pub_a && pub_b);
  for (std::uint64_t i = 1; i <= kMessages; ++i) {
    ASSERT_TRUE(pub_b->publish("east.x", seq_payload(i)).ok());  // to A over A's route (`via`)
    ASSERT_TRUE(pub_a->publish("west.x", seq_payload(i)).ok());  // to B over B's route (TCP)
  }
  ASSERT_TRUE(pub_a->flush(30s).ok() && pub_b->flush(30s).ok());
  for (Received* r : {&on_a, &on_b})
    ASSERT_TRUE(wait_until([&] { return r->count() >= kMessages; }, 60s)) << r->count();
  std::this_thread::sleep_for(300ms);  // a duplicate would arrive by now
  std::vector<std::uint64_t> expected(kMessages);
  for (std::uint64_t i = 0; i < kMessages; ++i) expected[i] = i + 1;
  EXPECT_EQ(on_a.seqs(), expected);
  EXPECT_EQ(on_b.seqs(), expected);
  EXPECT_EQ(a.stat("cluster.route_messages_in"), static_cast<std::int64_t>(kMessages));
  EXPECT_EQ(b.stat("cluster.route_messages_in"), static_cast<std::int64_t>(kMessages));
  // Each way: what one broker brought over its route, the other sent.
  for (Member* m : {&a, &b}) {
    EXPECT_TRUE(wait_until(
        [&] { return m->stat("cluster.route_messages_out") == static_cast<std::int64_t>(kMessages); }, 30s))
        << m->stat("cluster.route_messages_out");
    EXPECT_EQ(m->stat("cluster.route_bytes_out"), static_cast<std::int64_t>(8 * kMessages));
  }
  // `rdmabroker stat`: one row for B, both ways: what A's route brought from
  // B and what A sent to B's route here (the same broker, by its id).
  auto [rc, out] = run({cli_path(), "stat", "--admin-socket", a.broker->admin_socket()});
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("1 route(s)\n"), std::string::npos) << out;
  const auto at = out.find(b.route_url(via) + " ");
  ASSERT_NE(at, std::string::npos) << out;
  std::istringstream row(out.substr(at, out.find('\n', at) - at));
  std::string url, state, broker, from;
  std::uint64_t interest = 0, msgs_in = 0, bytes_in = 0, msgs_out = 0, bytes_out = 0;
  row >> url >> state >> broker >> from >> interest >> msgs_in >> bytes_in >> msgs_out >> bytes_out;
  EXPECT_EQ(state, "up");
  EXPECT_EQ(broker.size(), 16u) << out;
  EXPECT_EQ(from, "config");
  EXPECT_EQ(msgs_in, kMessages) << out;
  EXPECT_EQ(msgs_out, kMessages) << out;
  EXPECT_EQ(bytes_out, 8 * kMessages) << out;
  EXPECT_EQ(out.find("from other brokers only"), std::string::npos) << "B is routed to: no row of its own\n"
                                                                    << out;
  EXPECT_NE(out.find("cluster.listen_tcp 0.0.0.0:" + std::to_string(a.route_tcp_port)), std::string::npos)
      << "the route listeners are listed with the others\n"
      << out;
}

TEST_P(RouteListeners, ASubscriberThatStopsReadingBehindARouteIsCutAndTheRouteCarriesOn) {
  // What a route brings is routed here in place, like a publish: a
  // backlogged subscriber holds the route as it would a local publisher
  // (its broker stops at the credits or the socket's window) for
  // slow_consumer.producer_stall_ms at most, then overflows its queue and is
  // cut. The route stays up and the subscriber that reads gets everything.
  const Via via = GetParam();
  Member a("a");
  // A bound above what a route's window brings in one burst (32 credits of
  // 16 KiB), so that the subscriber that reads keeps up.
  Member b("b", "test", false, std::nullopt, "limits: {max_pending_bytes: 2097152}\n");
  a.write("test", {url_via(*b.broker, via)});
  b.write("test", {url_via(*a.broker, via)});
  for (Member* m : {&a, &b}) {
    const std::string reply = m->broker->admin("reload");
    ASSERT_NE(reply.find("\"ok\":true"), std::string::npos) << reply;
  }
  for (Member* m : {&a, &b})
    ASSERT_TRUE(wait_until([&] { return m->stat("cluster.routes_up") == 1; }, 60s)) << m->file;
  auto stuck = raw_wire(*b.broker, via);  // subscribes and never reads
  ASSERT_TRUE(stuck);
  ASSERT_TRUE(stuck->send(frame(proto::FrameType::kSubscribe, 1, "flood")).ok());
  SeqSink reader;
  auto sub = connect_via(*b.broker, via);
  ASSERT_TRUE(sub && sub->subscribe("flood", reader.handler()).ok());
  ASSERT_TRUE(sub->flush(30s).ok());
  ASSERT_TRUE(wait_until([&] { return a.stat("subscriptions") >= 1; }, 30s));
  // Far more than the stuck one's queue and its socket's buffers hold.
  constexpr std::uint64_t kMessages = 8000;
  auto pub = connect_via(*a.broker, via);
  ASSERT_TRUE(pub);
  std::string body(2000, 'x');
  for (std::uint64_t i = 0; i < kMessages; ++i) {
    const std::string n = std::to_string(i);
    std::memcpy(body.data(), n.c_str(), n.size() + 1);
    ASSERT_TRUE(pub->publish("flood", std::as_bytes(std::span(body.data(), body.size()))).ok()) << i;
  }
  ASSERT_TRUE(pub->flush(60s).ok());
  ASSERT_TRUE(wait_until([&] { return reader.size() >= kMessages; }, 60s)) << reader.describe();
  EXPECT_TRUE(reader.exactly(0, kMessages)) << reader.describe();
  EXPECT_GT(b.stat("messages.dropped.slow_consumer"), 0) << "the subscriber that stopped reading was cut";
  EXPECT_EQ(b.stat("cluster.routes_up"), 1);
  EXPECT_EQ(b.stat("cluster.route_reconnects"), 0) << "the route never went down";
  EXPECT_EQ(b.stat("cluster.route_messages_in"), static_cast<std::int64_t>(kMessages));
}

INSTANTIATE_TEST_SUITE_P(Via, RouteListeners, ::testing::Values(Via::kRdma, Via::kTcp),
                         [](const auto& info) { return to_string(info.param); });

/// Brokers with multicast channels in a cluster (docs/cluster.md,
/// docs/multicast.md): what a route brings for a multicast-backed subject
/// goes to the subject's channel there, which sends it to the group; what a
/// channel's subject gets published crosses the routes like any message.
TEST(ClusterMulticast, RouteMessagesReachAChannelsGroupAndAChannelsPublishesCrossTheRoutes) {
  require_rdma();
  const std::string multicast =
      "multicast: {enabled: true, subjects: ['mc.>'], threshold: 1, leave_below: 1}\n";
  Member a("a", "test", false, std::nullopt, multicast);
  Member c("c", "test", false, std::nullopt, multicast);
  route(a, {c.client_url(Via::kRdma)});
  route(c, {a.client_url(Via::kRdma)});
  await_routes_up(a, 1);
  await_routes_up(c, 1);
  // Declared before the clients: destroyed after them (their threads write here).
  Received on_a;
  Received on_c1;
  Received on_c2;
  Received on_c_tcp;
  auto rdma = [](Member& m) {
    ClientOptions opt;
    opt.bind_address = guest_addr1();  // the device its group is joined on
    auto cl = Client::connect(m.client_url(Via::kRdma), opt);
    EXPECT_TRUE(cl.ok()) << (cl.ok() ? "" : cl.error().message);
    return cl.ok() ? std::move(cl).value() : nullptr;
  };
  auto sub_a = rdma(a);
  auto sub_c1 = rdma(c);
  auto sub_c2 = rdma(c);
  auto sub_c_tcp = connect_via(*c.broker, Via::kTcp);  // served by the channel over its connection
  ASSERT_TRUE(sub_a && sub_c1 && sub_c2 && sub_c_tcp);
  ASSERT_TRUE(sub_a->subscribe("mc.feed", on_a.handler()));
  ASSERT_TRUE(sub_c1->subscribe("mc.feed", on_c1.handler()));
  ASSERT_TRUE(sub_c2->subscribe("mc.feed", on_c2.handler()));
  ASSERT_TRUE(sub_c_tcp->subscribe("mc.feed", on_c_tcp.handler()));
  // Each PONG comes once the other broker has the subscription's interest
  // (SPEC.md §8, "Interest in effect").
  for (Client* s : {sub_a.get(), sub_c1.get(), sub_c2.get(), sub_c_tcp.get()}) ASSERT_TRUE(s->flush(30s));
  auto joined = c.broker->wait_stats([](auto& s) { return s["multicast.members_joined"] == 2; }, 60s);
  ASSERT_EQ(joined["multicast.members_joined"], 2) << "C's RDMA subscribers did not join the group";
  ASSERT_EQ(joined["multicast.members"], 3);
  joined = a.broker->wait_stats([](auto& s) { return s["multicast.members_joined"] == 1; }, 60s);
  ASSERT_EQ(joined["multicast.members_joined"], 1) << "A's subscriber did not join the group";

  // Published on A: A's channel and the route to C; C's channel sends it to its group.
  const std::uint64_t n = RDMABROKER_SANITIZED ? 300 : 2'000;
  auto pub_a = connect_via(*a.broker, Via::kRdma);
  ASSERT_TRUE(pub_a);
  for (std::uint64_t i = 0; i < n; ++i) ASSERT_TRUE(pub_a->publish("mc.feed", seq_payload(i)));
  ASSERT_TRUE(pub_a->flush(30s));
  for (Received* got : {&on_a, &on_c1, &on_c2, &on_c_tcp})
    ASSERT_TRUE(wait_until([&] { return got->count() >= n; }, 120s)) << got->count() << " of " << n;
  // Published on C: C's channel and the route to A, never back to C.
  auto pub_c = connect_via(*c.broker, Via::kRdma);
  ASSERT_TRUE(pub_c);
  for (std::uint64_t i = n; i < 2 * n; ++i) ASSERT_TRUE(pub_c->publish("mc.feed", seq_payload(i)));
  ASSERT_TRUE(pub_c->flush(30s));

  std::vector<std::uint64_t> all(2 * n);
  std::iota(all.begin(), all.end(), 0);
  for (Received* got : {&on_a, &on_c1, &on_c2, &on_c_tcp}) {
    EXPECT_TRUE(wait_until([&] { return got->count() >= 2 * n; }, 120s)) << got->count() << " of " << 2 * n;
  }
  std::this_thread::sleep_for(300ms);  // a duplicate would show now
  for (Received* got : {&on_a, &on_c1, &on_c2, &on_c_tcp}) {
    const auto seqs = got->seqs();
    std::size_t at = 0;
    while (at < seqs.size() && at < all.size() && seqs[at] == all[at]) ++at;
    EXPECT_EQ(seqs, all) << "size " << seqs.size() << ", first difference at " << at << ": "
                         << (at < seqs.size() ? std::to_string(seqs[at]) : "none") << " (subscriber "
                         << (got == &on_a    ? "a"
                             : got == &on_c1 ? "c1"
                             : got == &on_c2 ? "c2"
                                             : "c_tcp")
                         << ")";
  }
  auto s = c.broker->stats();
  EXPECT_EQ(s["multicast.messages"], static_cast<std::int64_t>(2 * n)) << "C's channel: A's and C's messages";
  EXPECT_GE(s["multicast.group_messages"], static_cast<std::int64_t>(2 * n));
  EXPECT_EQ(s["multicast.losses"], 0);
  EXPECT_EQ(s["cluster.route_messages_in"], static_cast<std::int64_t>(n));
  EXPECT_EQ(s["cluster.route_dropped"], 0);
  EXPECT_EQ(a.stat("cluster.route_messages_in"), static_cast<std::int64_t>(n));
  EXPECT_GT(sub_c1->stats().multicast_messages, n)
      << "C's subscriber got most messages over RC, not the group";
}

/// Routes are authenticated against cluster.* only (TCP on the host: the
/// rules are the frame handler's, the same for both transports).
TEST(ClusterRoutes, OnlyTheClustersCredentialsAndNameOpenARoute) {
  Member a("a", "prod");
  auto attempt = [&](const std::string& cluster, const std::string& user, const std::string& password) {
    ClientOptions opt;
    opt.route_cluster = cluster;
    opt.route_server = "0123456789abcdef";
    opt.user = user;
    opt.password = password;
    return try_connect_via(*a.broker, Via::kTcp, opt);
  };
  auto wrong_cluster = attempt("staging", "route", "s3cret-route");
  ASSERT_FALSE(wrong_cluster.ok());
  EXPECT_EQ(wrong_cluster.error().kind, ErrorKind::kAuthenticationFailed);
  EXPECT_NE(wrong_cluster.error().message.find("cluster 'staging'"), std::string::npos)
      << wrong_cluster.error().message;
  auto wrong_password = attempt("prod", "route", "guess");
  ASSERT_FALSE(wrong_password.ok());
  EXPECT_EQ(wrong_password.error().kind, ErrorKind::kAuthenticationFailed);
  auto right = attempt("prod", "route", "s3cret-route");
  ASSERT_TRUE(right.ok()) << right.error().message;
  auto route = std::move(right).value();
  // One route per broker: a second login of the same broker (listed twice
  // under two names) would double its subscribers' messages; it is refused
  // while the first is open.
  auto second = attempt("prod", "route", "s3cret-route");
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.error().message.find("already has a route here"), std::string::npos)
      << second.error().message;
  // A route only subscribes: a PUBLISH on it closes it (PROTOCOL_VIOLATION)...
  (void)route->publish("x", std::as_bytes(std::span("1", 1)));
  EXPECT_FALSE(route->flush(10s).ok());
  EXPECT_EQ(a.stat("auth.failed"), 3);
  // ... and frees its broker's place for the next.
  ASSERT_TRUE(wait_until([&] { return attempt("prod", "route", "s3cret-route").ok(); }, 10s));
}

TEST(ClusterRoutes, ARouteLoginMayAnnounceOnlyRouteUrls) {
  Member a("a", "prod");
  ClientOptions opt;
  opt.route_cluster = "prod";
  opt.route_server = "0123456789abcdef";
  opt.user = "route";
  opt.password = "s3cret-route";
  // Version 7 (SPEC.md §8, "Gossip"): what follows the id must be route
  // URLs, which the broker will dial; anything else closes the login.
  for (const std::string bad : {"tls://b:7471", "http://b", "tcp://user:pw@b:7471"}) {
    opt.route_announce = {bad};
    auto refused = try_connect_via(*a.broker, Via::kTcp, opt);
    ASSERT_FALSE(refused.ok()) << bad;
    EXPECT_NE(refused.error().message.find("not a route URL"), std::string::npos) << refused.error().message;
  }
  // Issue 49: the broker id is 16 hex digits (SPEC.md §8); another, with the
  // right secret, is refused and nothing it announces is dialed.
  for (const std::string bad : {"zzzz", "0123456789abcdeg", "0123456789abcdef0"}) {
    ClientOptions wrong_id = opt;
    wrong_id.route_server = bad;
    wrong_id.route_announce = {"tcp://127.0.0.1:" + std::to_string(next_port())};
    auto refused = try_connect_via(*a.broker, Via::kTcp, wrong_id);
    ASSERT_FALSE(refused.ok()) << bad;
    EXPECT_NE(refused.error().message.find("broker id is 16 hex digits, not '" + bad + "'"),
              std::string::npos)
        << refused.error().message;
  }
  EXPECT_EQ(a.broker->stats()["cluster.routes"], 0) << "nothing a refused login announced is dialed";
  // The broker serves on, and dials back what a right login announces: a
  // broker there is none of, so the dial fails and it is forgotten.
  opt.route_announce = {"tcp://127.0.0.1:" + std::to_string(next_port())};
  auto route = try_connect_via(*a.broker, Via::kTcp, opt);
  ASSERT_TRUE(route.ok()) << route.error().message;
  ServerInfo info = route.value()->server_info();
  EXPECT_EQ(info.cluster, "prod") << "a route gets INFO like a client";
  EXPECT_EQ(info.self.id.size(), 16u);
  EXPECT_TRUE(info.self.urls.empty()) << "listeners on 0.0.0.0 announce nothing";
}

/// Gossip (SPEC.md §8, protocol version 7): brokers that announce where they
/// are reached form a full mesh from partial lists, and clients learn every
/// broker of the cluster from the one they connect to.
class Gossip : public ::testing::TestWithParam<Via> {
 protected:
  void SetUp() override {
    if (GetParam() == Via::kRdma) require_rdma();
    // B lists nobody, A and C list only B: B learns both from their route
    // logins and dials back; A and C learn of each other from B's INFO.
    route(a_, {b_.client_url(GetParam())});
    route(c_, {b_.client_url(GetParam())});
    for (Member* m : {&a_, &b_, &c_}) await_routes_up(*m, 2);
  }
  /// `m`'s routes by URL, as its admin socket lists them.
  static std::map<std::string, nlohmann::json> routes_of(const Member& m) {
    std::map<std::string, nlohmann::json> out;
    const auto stats = nlohmann::json::parse(m.broker->admin("stats"));
    for (const auto& r : stats["routes"]) out[r["url"]] = r;
    return out;
  }
  std::unique_ptr<Client> client(Member& m, ClientOptions opt = {}) {
    return connect_via(*m.broker, GetParam(), std::move(opt));
  }
  Member a_{"a", "test", false, GetParam()};
  Member b_{"b", "test", false, GetParam()};
  Member c_{"c", "test", false, GetParam()};
};

TEST_P(Gossip, AFullMeshFormsFromPartialListsAndClientsLearnEveryBroker) {
  const Via via = GetParam();
  // Each broker's routes: the one it lists and those it discovered, each
  // naming the broker it leads to (the same id whoever dialed it).
  auto on_a = routes_of(a_), on_b = routes_of(b_), on_c = routes_of(c_);
  ASSERT_EQ(on_a.size(), 2u);
  ASSERT_EQ(on_b.size(), 2u);
  ASSERT_EQ(on_c.size(), 2u);
  EXPECT_EQ(on_a[b_.client_url(via)]["discovered"], false);
  EXPECT_EQ(on_a[c_.client_url(via)]["discovered"], true);
  EXPECT_EQ(on_b[a_.client_url(via)]["discovered"], true);
  EXPECT_EQ(on_b[c_.client_url(via)]["discovered"], true);
  EXPECT_EQ(on_c[a_.client_url(via)]["discovered"], true);
  const std::string id_of_c = on_a[c_.client_url(via)]["broker"];
  EXPECT_EQ(id_of_c.size(), 16u);
  EXPECT_EQ(on_b[c_.client_url(via)]["broker"], id_of_c);
  EXPECT_NE(on_b[a_.client_url(via)]["broker"], id_of_c);

  // One hop over the discovered route: what A publishes reaches C's
  // subscriber once and in order, and B, with no subscriber, gets nothing.
  constexpr std::uint64_t kMessages = 200;
  Received got;
  auto sub = client(c_);
  ASSERT_TRUE(sub && sub->subscribe("g.>", got.handler()).ok());
  ASSERT_TRUE(wait_until([&] { return a_.stat("subscriptions") >= 1; }, 60s));
  auto pub = client(a_);
  ASSERT_TRUE(pub);
  for (std::uint64_t i = 1; i <= kMessages; ++i) ASSERT_TRUE(pub->publish("g.x", seq_payload(i)).ok());
  ASSERT_TRUE(pub->flush(30s).ok());
  ASSERT_TRUE(wait_until([&] { return got.count() >= kMessages; }, 60s)) << got.count();
  std::this_thread::sleep_for(300ms);  // a duplicate would arrive by now
  std::vector<std::uint64_t> expected(kMessages);
  for (std::uint64_t i = 0; i < kMessages; ++i) expected[i] = i + 1;
  EXPECT_EQ(got.seqs(), expected);
  EXPECT_EQ(c_.stat("cluster.route_messages_in"), static_cast<std::int64_t>(kMessages));
  EXPECT_EQ(b_.stat("cluster.route_messages_in"), 0);

  // A client of A learns the whole cluster from A's INFO (before connect() returns).
  ServerInfo info = pub->server_info();
  EXPECT_EQ(info.cluster, "test");
  EXPECT_EQ(info.self.urls, std::vector<std::string>{a_.client_url(via)});
  EXPECT_EQ(info.self.routes, std::vector<std::string>{a_.client_url(via)});
  auto urls = info.client_urls();
  std::sort(urls.begin(), urls.end());
  std::vector<std::string> all = {a_.client_url(via), b_.client_url(via), c_.client_url(via)};
  std::sort(all.begin(), all.end());
  EXPECT_EQ(urls, all);
  ASSERT_EQ(info.peers.size(), 2u);
  EXPECT_TRUE(info.peers[0].id == id_of_c || info.peers[1].id == id_of_c);

  // The C API (rdmabroker.h) shows the same: the callback, then rb_server_info_get.
  std::atomic<int> c_infos{0};
  rb_options o;
  rb_options_init(&o);
  const std::string bind = guest_addr2();
  if (via == Via::kRdma) o.bind_address = bind.c_str();
  o.connect_timeout_ms = 15'000;
  o.on_server_info = [](const rb_server_info* i, void* user) {
    if (i->self.id[0] != '\0' && i->peer_count == 2) static_cast<std::atomic<int>*>(user)->fetch_add(1);
  };
  o.on_server_info_user = &c_infos;
  rb_client* c_client = nullptr;
  ASSERT_EQ(rb_connect_with(a_.client_url(via).c_str(), &o, &c_client), RB_OK) << rb_last_error();
  EXPECT_GE(c_infos.load(), 1) << "no INFO before rb_connect_with returned";
  rb_server_info* c_info = nullptr;
  ASSERT_EQ(rb_server_info_get(c_client, &c_info), RB_OK);
  EXPECT_STREQ(c_info->cluster, "test");
  EXPECT_EQ(std::string(c_info->self.id), info.self.id);
  ASSERT_EQ(c_info->self.url_count, 1u);
  EXPECT_EQ(c_info->self.urls[0], a_.client_url(via));
  ASSERT_EQ(c_info->self.route_count, 1u);
  EXPECT_EQ(c_info->self.routes[0], a_.client_url(via));
  ASSERT_EQ(c_info->peer_count, 2u);
  for (std::size_t i = 0; i < c_info->peer_count; ++i) {
    EXPECT_EQ(std::string(c_info->peers[i].id), info.peers[i].id);
    ASSERT_EQ(c_info->peers[i].url_count, 1u);
    EXPECT_EQ(c_info->peers[i].urls[0], info.peers[i].urls[0]);
  }
  std::vector<std::string> c_urls(c_info->client_urls, c_info->client_urls + c_info->client_url_count);
  std::sort(c_urls.begin(), c_urls.end());
  EXPECT_EQ(c_urls, all);
  rb_server_info_free(c_info);
  rb_close(c_client);
}

TEST_P(Gossip, AClientGivenOneBrokerFailsOverToAnAnnouncedOne) {
  const Via via = GetParam();
  // A client given only A's URL; A is killed: it moves to a broker A
  // announced, restores its subscription there, and gets what C publishes.
  Received moving;
  ConnectionEvents events;
  ClientOptions opt = events.options();
  opt.connect_timeout = 15s;
  opt.publish_timeout = 10s;
  std::atomic<int> infos{0};
  opt.on_server_info = [&](const ServerInfo&) { infos.fetch_add(1); };
  if (via == Via::kRdma) opt.bind_address = guest_addr2();
  auto connected = Client::connect(a_.client_url(via), opt);
  ASSERT_TRUE(connected.ok()) << connected.error().message;
  auto mover = std::move(connected).value();
  EXPECT_GE(infos.load(), 1);
  ASSERT_TRUE(mover->subscribe("t", moving.handler()).ok());
  ASSERT_TRUE(wait_until([&] { return c_.stat("subscriptions") >= 1; }, 60s));  // A's route's
  auto pub = client(c_);
  ASSERT_TRUE(pub);
  std::uint64_t seq = 0;
  auto publish = [&](std::uint64_t n) {
    for (std::uint64_t i = 0; i < n; ++i) ASSERT_TRUE(pub->publish("t", seq_payload(++seq)).ok());
    ASSERT_TRUE(pub->flush(30s).ok());
  };
  publish(50);
  ASSERT_TRUE(wait_until([&] { return moving.count() >= 50; }, 60s)) << moving.count();
  EXPECT_EQ(a_.broker->stop(SIGKILL, 10s), 128 + SIGKILL);
  ASSERT_TRUE(wait_until([&] { return events.reconnected.load() >= 1; }, 60s)) << "never reconnected";
  const std::string now = mover->transport_description();
  const auto port = [&](Member& m) {
    return ":" + std::to_string(via == Via::kRdma ? m.client_rdma_port : m.client_tcp_port);
  };
  EXPECT_TRUE(now.find(port(b_)) != std::string::npos || now.find(port(c_)) != std::string::npos) << now;
  // A's routes were discovered on B and C: forgotten, not redialed forever.
  ASSERT_TRUE(
      wait_until([&] { return b_.stat("cluster.routes") == 1 && c_.stat("cluster.routes") == 1; }, 60s))
      << b_.stat("cluster.routes") << " " << c_.stat("cluster.routes");
  // Its new broker's INFO no longer names A.
  ASSERT_TRUE(wait_until([&] { return mover->server_info().client_urls().size() == 2; }, 60s));
  ASSERT_TRUE(mover->flush(30s).ok());
  ASSERT_TRUE(wait_until([&] { return b_.stat("subscriptions") + c_.stat("subscriptions") >= 2; }, 60s));
  const std::uint64_t before = seq;
  publish(100);
  ASSERT_TRUE(wait_until([&] { return !moving.seqs().empty() && moving.seqs().back() == seq; }, 60s))
      << moving.count();
  std::this_thread::sleep_for(300ms);
  const auto seqs = moving.seqs();
  EXPECT_TRUE(std::is_sorted(seqs.begin(), seqs.end()) &&
              std::adjacent_find(seqs.begin(), seqs.end()) == seqs.end());
  EXPECT_EQ(std::count_if(seqs.begin(), seqs.end(), [&](std::uint64_t s) { return s > before; }), 100);
}

TEST_P(Gossip, AClientOfVersion7GetsInfoBeforeItsLoginsPongAndAnOlderClientNone) {
  const Via via = GetParam();
  auto ping = frame(proto::FrameType::kPing, 0, "");
  auto first_frame = [&](RawWire& w) {
    EXPECT_TRUE(w.send(ping).ok());
    const auto sends = w.receive(30s);
    const auto decoded = sends.empty() ? std::vector<proto::Frame>{} : frames(sends.front());
    EXPECT_FALSE(decoded.empty());
    if (decoded.empty()) return std::pair{proto::FrameType::kClose, std::string()};
    const proto::Frame& f = decoded.front();
    return std::pair{f.header.type,
                     std::string(reinterpret_cast<const char*>(f.payload.data()), f.payload.size())};
  };
  auto current = raw_wire(*a_.broker, via);
  ASSERT_TRUE(current);
  ASSERT_EQ(current->accept.version, proto::kProtocolVersion);
  auto [type, text] = first_frame(*current);
  ASSERT_EQ(type, proto::FrameType::kInfo);
  auto info = proto::decode_info(text);
  ASSERT_TRUE(info) << text;
  EXPECT_EQ(info->cluster, "test");
  EXPECT_EQ(info->self.urls, std::vector<std::string>{a_.client_url(via)});
  EXPECT_EQ(info->peers.size(), 2u) << text;
  auto older = raw_wire(*a_.broker, via, true, proto::ConnectRequest{16384, 16, 0, /*max_version=*/6});
  ASSERT_TRUE(older);
  ASSERT_EQ(older->accept.version, 6);
  EXPECT_EQ(first_frame(*older).first, proto::FrameType::kPong) << "version 6 knows no INFO";
}

TEST_P(Gossip, AReloadedAdvertiseReachesItsClientsAndThoseOfTheOtherBrokers) {
  const Via via = GetParam();
  auto of_a = client(a_);
  auto of_c = client(c_);
  ASSERT_TRUE(of_a && of_c);
  const std::string id_of_a = of_a->server_info().self.id;
  ASSERT_EQ(id_of_a.size(), 16u);
  // A as C's INFO names it (C has a route up to A).
  auto a_seen_by_c = [&] {
    for (const auto& p : of_c->server_info().peers)
      if (p.id == id_of_a) return p;
    return ServerInfo::Broker{};
  };
  ASSERT_TRUE(wait_until([&] { return a_seen_by_c().urls == std::vector{a_.client_url(via)}; }, 60s));
  // A reload (cluster.advertise and client_advertise are live) adds a URL
  // to both, and 24 more client URLs: INFO grows past what a send block
  // holds (SPEC.md §8), and goes whole to every client whose receive
  // buffers hold it.
  const std::string route_added = "tcp://a.example:7471";
  std::vector<std::string> added;
  for (int i = 0; i < 24; ++i) added.push_back("tcp://a-" + std::to_string(i) + ".example.internal:7471");
  a_.extra_advertise = {route_added};
  a_.extra_client_advertise = added;
  route(a_, {b_.client_url(via)});
  std::vector<std::string> now{a_.client_url(via), route_added};
  now.insert(now.end(), added.begin(), added.end());
  const std::vector<std::string> routes_now{a_.client_url(via), route_added};
  EXPECT_TRUE(wait_until([&] { return of_a->server_info().self.urls == now; }, 30s));
  EXPECT_EQ(of_a->server_info().self.routes, routes_now) << "cluster.advertise";
  EXPECT_TRUE(
      wait_until([&] { return a_seen_by_c().urls == now && a_seen_by_c().routes == routes_now; }, 30s))
      << "C's clients learn it from C, which learned it over its route from A";
  const auto urls = of_c->server_info().client_urls();
  EXPECT_NE(std::find(urls.begin(), urls.end(), added.back()), urls.end())
      << "a failover candidate for C's clients";
  // A client with 1 KiB receive buffers gets it cut to fit: A's id, its first URLs.
  auto small = raw_wire(*a_.broker, via, true, proto::ConnectRequest{1024, 16, 0});
  ASSERT_TRUE(small);
  const auto sends = small->receive(30s);
  ASSERT_FALSE(sends.empty());
  const auto decoded = frames(sends.front());
  ASSERT_FALSE(decoded.empty());
  ASSERT_EQ(decoded.front().header.type, proto::FrameType::kInfo);
  const std::string cut(reinterpret_cast<const char*>(decoded.front().payload.data()),
                        decoded.front().payload.size());
  EXPECT_LE(cut.size(), 960u);
  const auto cut_info = proto::decode_info(cut);
  ASSERT_TRUE(cut_info) << cut;
  EXPECT_EQ(cut_info->self.id, id_of_a);
  ASSERT_FALSE(cut_info->self.urls.empty());
  EXPECT_EQ(cut_info->self.urls.front(), a_.client_url(via));
  EXPECT_LT(cut_info->self.urls.size(), now.size());
  EXPECT_EQ(a_.stat("messages.pending_bytes"), 0) << "an INFO is no message in the queues' count";
  // Nothing else moved: the same broker, every route still up.
  EXPECT_EQ(of_a->server_info().self.id, id_of_a);
  for (Member* m : {&a_, &b_, &c_}) EXPECT_EQ(m->stat("cluster.routes_up"), 2);
}

INSTANTIATE_TEST_SUITE_P(Via, Gossip, ::testing::Values(Via::kRdma, Via::kTcp),
                         [](const auto& info) { return to_string(info.param); });

}  // namespace
}  // namespace rdmabroker::test
