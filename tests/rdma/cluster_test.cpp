// A cluster of three brokers in a full mesh of routes (docs/cluster.md,
// SPEC.md §8), run over each transport: "/rdma" in the Soft-RoCE guest (the
// routes and the clients over RDMA), "/tcp" on the host; Mixed: RDMA clients
// on brokers routed over TCP.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <mutex>
#include <thread>

#include "harness.hpp"
#include "rdmabroker/client.hpp"

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

/// A broker of cluster "test" with its config file (rewritten to add routes).
struct Member {
  explicit Member(const std::string& name, const std::string& cluster = "test")
      : file("/tmp/rdmabroker-cluster-" + std::to_string(getpid()) + "-" + name + ".yaml") {
    write(cluster, {});
    broker = std::make_unique<BrokerProcess>(next_port(), std::vector<std::string>{"--config", file});
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
        << "cluster:\n  name: " << cluster << "\n  user: route\n  password: s3cret-route\n  routes: [";
    for (std::size_t i = 0; i < routes.size(); ++i) out << (i ? ", " : "") << routes[i];
    out << "]\n";
  }
  std::int64_t stat(const std::string& key) const {
    auto s = broker->stats();
    auto it = s.find(key);
    return it == s.end() ? 0 : it->second;
  }
  std::string file;
  std::unique_ptr<BrokerProcess> broker;
};

class Cluster : public ::testing::TestWithParam<Via> {
 protected:
  void SetUp() override {
    if (GetParam() == Via::kRdma) require_rdma();
    mesh(GetParam());
  }
  /// Every broker routes to all three (itself included, as a StatefulSet's
  /// seed list would: a route to itself is recognised and not used), over `via`.
  void mesh(Via via) {
    std::vector<std::string> urls;
    for (auto* m : all()) urls.push_back(url_via(*m->broker, via));
    for (auto* m : all()) {
      m->write("test", urls);
      const std::string reply = m->broker->admin("reload");
      ASSERT_NE(reply.find("\"ok\":true"), std::string::npos) << reply;
    }
    for (auto* m : all()) {
      ASSERT_TRUE(wait_until([&] { return m->stat("cluster.routes_up") == 2; }, 60s))
          << "routes up: " << m->stat("cluster.routes_up") << " of " << m->stat("cluster.routes");
    }
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

TEST_P(Cluster, ARequestOnOneBrokerIsAnsweredOnAnother) {
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
  // The requester's inbox (made by its first request) is interest like any
  // other: it travels to C on A's route there, not with the request on C's
  // route here, so a reply can overtake it (docs/cluster.md). Once it is
  // there, requests are answered across the cluster.
  auto first = requester->request("svc.nobody", std::as_bytes(std::span("?", 1)), 30s);
  ASSERT_FALSE(first.ok());
  EXPECT_EQ(first.error().kind, ErrorKind::kNoResponders) << first.error().message;
  await_subscriptions(c_, 2);
  auto reply = requester->request("svc.time", std::as_bytes(std::span("now?", 4)), 30s);
  ASSERT_TRUE(reply.ok()) << reply.error().message;
  EXPECT_EQ(reply.value().data(), "noon");
}

INSTANTIATE_TEST_SUITE_P(Via, Cluster, ::testing::Values(Via::kRdma, Via::kTcp),
                         [](const auto& info) { return to_string(info.param); });

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
  // A route only subscribes: a PUBLISH on it closes it (PROTOCOL_VIOLATION).
  (void)right.value()->publish("x", std::as_bytes(std::span("1", 1)));
  EXPECT_FALSE(right.value()->flush(10s).ok());
  EXPECT_EQ(a.stat("auth.failed"), 2);
}

}  // namespace
}  // namespace rdmabroker::test
