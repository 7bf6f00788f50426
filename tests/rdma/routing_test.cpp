// SPDX-License-Identifier: Apache-2.0
// Routing as users see it (wildcards, queue groups, request/reply), run over
// each transport: "/rdma" instances in the Soft-RoCE guest (label rdma),
// "/tcp" instances on the host (label tcp). Plus RDMA and TCP clients mixed on
// one broker, and what a misbehaving TCP peer gets.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "harness.hpp"
#include "rdmabroker/client.hpp"

namespace rdmabroker::test {
namespace {

using namespace std::chrono_literals;

/// Everything one subscription received, safe to read from the test thread.
/// Declare it before the clients that feed it: they must be closed (their
/// I/O threads joined) before it is destroyed.
class Inbox {
 public:
  MessageHandler handler() {
    return [this](const Message& m) {
      std::lock_guard l(mu_);
      messages_.push_back(m);
      count_.fetch_add(1);
    };
  }
  std::size_t count() const { return count_.load(); }
  std::vector<Message> messages() const {
    std::lock_guard l(mu_);
    return messages_;
  }
  std::multiset<std::string> subjects() const {
    std::multiset<std::string> s;
    for (const auto& m : messages()) s.insert(m.subject);
    return s;
  }

 private:
  mutable std::mutex mu_;
  std::vector<Message> messages_;
  std::atomic<std::size_t> count_{0};
};

/// Polls `pred` until it holds or `timeout` passes.
template <typename Pred>
bool eventually(Pred pred, std::chrono::milliseconds timeout = 30s) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!pred()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

std::uint64_t seq_of(const Message& m) {
  std::uint64_t seq = 0;
  if (m.payload.size() >= 8) std::memcpy(&seq, m.payload.data(), 8);
  return seq;
}

std::span<const std::byte> seq_bytes(const std::uint64_t& seq) { return std::as_bytes(std::span(&seq, 1)); }

class Routing : public ::testing::TestWithParam<Via> {
 protected:
  void SetUp() override {
    if (GetParam() == Via::kRdma) require_rdma();
  }
  std::unique_ptr<Client> client() { return connect_via(broker_, GetParam()); }

  BrokerProcess broker_{next_port()};
};

TEST_P(Routing, WildcardsDeliverExactlyTheMatchingSubjects) {
  Inbox star, tail, first, exact;
  auto sub = client();
  auto pub = client();
  ASSERT_TRUE(sub && pub);
  ASSERT_TRUE(sub->subscribe("orders.*", star.handler()));
  ASSERT_TRUE(sub->subscribe("orders.>", tail.handler()));
  ASSERT_TRUE(sub->subscribe("*.eu", first.handler()));
  ASSERT_TRUE(sub->subscribe("orders.eu", exact.handler()));
  ASSERT_TRUE(sub->flush(10s));
  for (const char* s : {"orders.eu", "orders.us", "orders.eu.paris", "billing.eu", "orders", "billing.us"}) {
    ASSERT_TRUE(pub->publish(s, std::string_view("x")));
  }
  ASSERT_TRUE(pub->flush(10s));
  ASSERT_TRUE(eventually([&] {
    return star.count() == 2 && tail.count() == 3 && first.count() == 2 && exact.count() == 1;
  })) << star.count()
      << " " << tail.count() << " " << first.count() << " " << exact.count();
  EXPECT_EQ(star.subjects(), (std::multiset<std::string>{"orders.eu", "orders.us"}));
  EXPECT_EQ(tail.subjects(), (std::multiset<std::string>{"orders.eu", "orders.us", "orders.eu.paris"}));
  EXPECT_EQ(first.subjects(), (std::multiset<std::string>{"orders.eu", "billing.eu"}));
  EXPECT_EQ(exact.subjects(), (std::multiset<std::string>{"orders.eu"}));
  // A wildcard is refused in a publish, before it reaches the broker.
  auto st = pub->publish("orders.*", std::string_view("x"));
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().kind, ErrorKind::kInvalidArgument);
  // Nothing more arrives (the flush proves the broker has routed all of it).
  ASSERT_TRUE(pub->flush(10s));
  ASSERT_TRUE(sub->flush(10s));
  EXPECT_EQ(star.count() + tail.count() + first.count() + exact.count(), 8u);
}

// Four members of one queue group share 4,000 messages: each message to
// exactly one member, each member within 10% of an even share; a plain
// subscriber still gets all of them. A member that leaves gets nothing new.
TEST_P(Routing, QueueGroupSharesMessagesEvenlyAndExactlyOnce) {
  constexpr std::uint64_t kMessages = volume(4'000);
  // Declared before the clients: destroyed after them (callbacks use them).
  std::vector<std::unique_ptr<Inbox>> inboxes;
  Inbox all;
  std::vector<std::unique_ptr<Client>> members;
  std::vector<std::uint32_t> sids;
  for (int i = 0; i < 4; ++i) {
    members.push_back(client());
    ASSERT_TRUE(members.back());
    inboxes.push_back(std::make_unique<Inbox>());
    auto sid = members.back()->queue_subscribe("jobs.>", "workers", inboxes.back()->handler());
    ASSERT_TRUE(sid) << sid.error().message;
    sids.push_back(sid.value());
    ASSERT_TRUE(members.back()->flush(10s));
  }
  auto watcher = client();
  auto pub = client();
  ASSERT_TRUE(watcher && pub);
  ASSERT_TRUE(watcher->subscribe("jobs.>", all.handler()));
  ASSERT_TRUE(watcher->flush(10s));

  for (std::uint64_t seq = 0; seq < kMessages; ++seq) ASSERT_TRUE(pub->publish("jobs.build", seq_bytes(seq)));
  ASSERT_TRUE(pub->flush(30s));
  auto members_total = [&] {
    std::size_t n = 0;
    for (auto& in : inboxes) n += in->count();
    return n;
  };
  ASSERT_TRUE(eventually([&] { return members_total() >= kMessages && all.count() >= kMessages; }, 60s))
      << members_total() << " to members, " << all.count() << " to the plain subscriber";
  std::set<std::uint64_t> seen;
  for (std::size_t i = 0; i < inboxes.size(); ++i) {
    const std::size_t n = inboxes[i]->count();
    EXPECT_GE(n, kMessages / 4 * 9 / 10) << "member " << i;
    EXPECT_LE(n, kMessages / 4 * 11 / 10) << "member " << i;
    for (const auto& m : inboxes[i]->messages())
      EXPECT_TRUE(seen.insert(seq_of(m)).second) << "duplicate " << seq_of(m);
  }
  EXPECT_EQ(seen.size(), kMessages);
  EXPECT_EQ(all.count(), kMessages);

  // Member 0 leaves: the other three share what follows, it gets nothing.
  ASSERT_TRUE(members[0]->unsubscribe(sids[0]));
  ASSERT_TRUE(members[0]->flush(10s));
  const std::size_t before = inboxes[0]->count();
  for (std::uint64_t seq = kMessages; seq < kMessages + 300; ++seq)
    ASSERT_TRUE(pub->publish("jobs.build", seq_bytes(seq)));
  ASSERT_TRUE(pub->flush(30s));
  ASSERT_TRUE(eventually(
      [&] { return members_total() >= kMessages + 300 - 0 && all.count() >= kMessages + 300; }, 30s))
      << members_total();
  EXPECT_EQ(inboxes[0]->count(), before);
  for (int i = 1; i < 4; ++i) EXPECT_GT(inboxes[i]->count(), 0u);
  ASSERT_TRUE(pub->flush(10s));
  EXPECT_EQ(members_total(), kMessages + 300);
  const auto s = broker_.stats();
  EXPECT_EQ(s.at("messages.dropped.subscriber_closed"), 0);
}

// A queue-group member killed mid-stream: whatever was queued or in flight to
// it is counted as dropped, never silently lost: the other members' messages
// plus the drops account for every message published.
TEST_P(Routing, QueueGroupMemberKilledMidStreamLosesNothingSilently) {
  constexpr std::uint64_t kMessages = volume(20'000);
  Inbox survivor;
  auto member = client();
  auto pub = client();
  ASSERT_TRUE(member && pub);
  ASSERT_TRUE(member->queue_subscribe("work", "w", survivor.handler()));
  ASSERT_TRUE(member->flush(10s));
  std::vector<std::string> victim_args = {cli_path(), "sub", "work", "--queue", "w", "--raw"};
  for (auto& a : cli_where(broker_, GetParam())) victim_args.push_back(a);
  const int devnull = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
  const pid_t victim = spawn(victim_args, -1, devnull);
  ::close(devnull);
  ASSERT_EQ(broker_.wait_stats([](auto& s) { return s["subscriptions"] == 2; }, 30s)["subscriptions"], 2);
  for (std::uint64_t seq = 0; seq < kMessages; ++seq) {
    ASSERT_TRUE(pub->publish("work", seq_bytes(seq)));
    if (seq == kMessages / 4) {
      ASSERT_TRUE(pub->flush(30s));
      ::kill(victim, SIGKILL);
    }
  }
  ASSERT_TRUE(pub->flush(30s));
  ::waitpid(victim, nullptr, 0);
  auto gone = broker_.wait_stats([](auto& s) { return s["connections.current"] == 2; }, 30s);
  ASSERT_EQ(gone["connections.current"], 2);
  // What follows goes to the survivor alone, all of it.
  constexpr std::uint64_t kAfter = 1000;
  for (std::uint64_t seq = kMessages; seq < kMessages + kAfter; ++seq)
    ASSERT_TRUE(pub->publish("work", seq_bytes(seq)));
  ASSERT_TRUE(pub->flush(30s));
  std::set<std::uint64_t> got;
  ASSERT_TRUE(eventually([&] {
    got.clear();
    for (const auto& m : survivor.messages()) got.insert(seq_of(m));
    return got.size() == survivor.count() && got.lower_bound(kMessages) != got.end() &&
           std::distance(got.lower_bound(kMessages), got.end()) == static_cast<long>(kAfter);
  })) << survivor.count()
      << " received, " << got.size() << " distinct";
  // Each message was routed to exactly one member, and each routed copy was
  // delivered or dropped by a stated (counted) reason.
  // Deliveries are counted when their sends complete (after they left the
  // queue): wait for the sends in flight too, not only the queues.
  auto settled = [](auto& s) {
    const std::int64_t dropped = dropped_total(s);
    return s["messages.pending"] == 0 && s["messages.delivered"] + dropped == s["messages.routed"];
  };
  auto s = broker_.wait_stats(settled, 30s);
  const std::int64_t dropped = dropped_total(s);
  EXPECT_EQ(s["messages.routed"], static_cast<std::int64_t>(kMessages + kAfter));
  EXPECT_EQ(s["messages.delivered"] + dropped, s["messages.routed"]);
  EXPECT_GE(static_cast<std::int64_t>(survivor.count()), s["messages.routed"] / 2);
}

TEST_P(Routing, RequestGetsTheResponderReply) {
  std::atomic<int> answered{0};
  auto responder = client();
  auto requester = client();
  ASSERT_TRUE(responder && requester);
  Client* r = responder.get();
  ASSERT_TRUE(responder->queue_subscribe("svc.echo", "echoers", [r, &answered](const Message& m) {
    ASSERT_FALSE(m.reply.empty());
    // Counted before the reply goes: the requester may have the last reply,
    // and the test its count, before this thread goes on after publish().
    answered.fetch_add(1);
    ASSERT_TRUE(r->publish(m.reply, "echo: " + std::string(m.data())));
  }));
  ASSERT_TRUE(responder->flush(10s));
  for (int i = 0; i < 20; ++i) {
    auto reply = requester->request("svc.echo", "hello " + std::to_string(i), 10s);
    ASSERT_TRUE(reply) << reply.error().message;
    EXPECT_EQ(reply->data(), "echo: hello " + std::to_string(i));
  }
  EXPECT_EQ(answered.load(), 20);
}

TEST_P(Routing, RequestWithoutRespondersFailsAtOnce) {
  auto requester = client();
  ASSERT_TRUE(requester);
  const auto t0 = std::chrono::steady_clock::now();
  auto reply = requester->request("svc.nobody", "anyone?", 30s);
  ASSERT_FALSE(reply);
  EXPECT_EQ(reply.error().kind, ErrorKind::kNoResponders) << reply.error().message;
  // Told by the broker, not by the 30 s timeout.
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
  EXPECT_EQ(broker_.stats().at("messages.no_responders"), 1);
  // The connection is fine afterwards.
  EXPECT_TRUE(requester->flush(10s));
}

TEST_P(Routing, RequestTimesOutWhenNobodyAnswers) {
  Inbox heard;
  auto silent = client();
  auto requester = client();
  ASSERT_TRUE(silent && requester);
  ASSERT_TRUE(silent->subscribe("svc.slow", heard.handler()));
  ASSERT_TRUE(silent->flush(10s));
  auto reply = requester->request("svc.slow", "hurry", 300ms);
  ASSERT_FALSE(reply);
  EXPECT_EQ(reply.error().kind, ErrorKind::kTimeout) << reply.error().message;
  ASSERT_TRUE(eventually([&] { return heard.count() == 1; }));
  // The request carried its reply subject on the requester's inbox.
  EXPECT_EQ(heard.messages()[0].reply.rfind("_INBOX.", 0), 0u);
  // A late answer is ignored, and the next request still works.
  ASSERT_TRUE(silent->publish(heard.messages()[0].reply, "too late"));
  ASSERT_TRUE(silent->flush(10s));
  Client* s = silent.get();
  ASSERT_TRUE(
      silent->subscribe("svc.fast", [s](const Message& m) { ASSERT_TRUE(s->publish(m.reply, "quick")); }));
  ASSERT_TRUE(silent->flush(10s));
  auto ok = requester->request("svc.fast", "now", 10s);
  ASSERT_TRUE(ok) << ok.error().message;
  EXPECT_EQ(ok->data(), "quick");
}

// The CLI as a user runs it: a responder, requests (answered, no responders),
// and queue-group subscribers that split a stream.
TEST_P(Routing, CliRequestReplyAndQueueGroups) {
  const std::vector<std::string> where = cli_where(broker_, GetParam());
  auto cli = [&](std::vector<std::string> args) {
    args.insert(args.begin(), cli_path());
    args.insert(args.end(), where.begin(), where.end());
    return args;
  };
  std::pair<int, std::string> responder;
  std::jthread r([&] { responder = run(cli({"reply", "svc.time", "noon", "-n", "2"})); });
  ASSERT_EQ(broker_.wait_stats([](auto& s) { return s["subscriptions"] == 1; }, 30s)["subscriptions"], 1);
  EXPECT_EQ(run(cli({"request", "svc.time", "time?"})), (std::pair<int, std::string>{0, "noon\n"}));
  EXPECT_EQ(run(cli({"request", "svc.nobody", "x"})).first, 4);
  EXPECT_EQ(run(cli({"request", "svc.time", "again?"})), (std::pair<int, std::string>{0, "noon\n"}));
  r.join();
  EXPECT_EQ(responder.first, 0);

  std::pair<int, std::string> a, b;
  std::jthread ta([&] {
    a = run(cli({"sub", "jobs.*", "--queue", "w", "--count", "2", "--raw", "--timeout", "60"}));
  });
  std::jthread tb([&] {
    b = run(cli({"sub", "jobs.*", "--queue", "w", "--count", "2", "--raw", "--timeout", "60"}));
  });
  ASSERT_EQ(broker_.wait_stats([](auto& s) { return s["subscriptions"] == 2; }, 30s)["subscriptions"], 2);
  EXPECT_EQ(run(cli({"pub", "jobs.build", "-"}), "1\n2\n3\n4\n").first, 0);
  ta.join();
  tb.join();
  EXPECT_EQ(a.first, 0);
  EXPECT_EQ(b.first, 0);
  // Round robin from one publisher: two each, together all four, none twice.
  std::multiset<std::string> lines;
  for (const auto* out : {&a.second, &b.second}) {
    std::istringstream in(*out);
    for (std::string l; std::getline(in, l);) lines.insert(l);
  }
  EXPECT_EQ(lines, (std::multiset<std::string>{"1", "2", "3", "4"}));
}

// `rdmabroker bench` as a user runs it: every message is counted, none lost
// or reordered, latency measured; with a queue group each message counts once.
TEST_P(Routing, CliBenchCountsEveryMessage) {
  const std::vector<std::string> where = cli_where(broker_, GetParam());
  auto bench = [&](std::vector<std::string> args) {
    args.insert(args.begin(), {cli_path(), "bench"});
    args.insert(args.end(), {"--json", "--quiet"});
    args.insert(args.end(), where.begin(), where.end());
    auto [rc, out] = run(args);
    EXPECT_EQ(rc, 0) << out;
    return nlohmann::json::parse(out, nullptr, false);
  };
  auto fan = bench({"b.fan", "-p", "2", "-m", "2", "-n", "2000", "--size", "100", "--admin-socket",
                    broker_.admin_socket()});
  ASSERT_FALSE(fan.is_discarded());
  // Wake-ups are counted on both sides: a subscriber's I/O thread and the
  // broker's workers wake to move messages (none of them spins here).
  const auto& wakeups = fan["aggregate"]["wakeups_per_message"];
  ASSERT_TRUE(wakeups["clients"].is_number() && wakeups["broker"].is_number()) << wakeups.dump();
  EXPECT_GT(wakeups["clients"].get<double>(), 0);
  EXPECT_GT(wakeups["broker"].get<double>(), 0);
  EXPECT_NEAR(wakeups["total"].get<double>(),
              wakeups["clients"].get<double>() + wakeups["broker"].get<double>(), 1e-9);
  EXPECT_EQ(fan["aggregate"]["published"], 4000);
  EXPECT_EQ(fan["aggregate"]["received"], 8000);
  EXPECT_EQ(fan["aggregate"]["lost"], 0);
  EXPECT_EQ(fan["aggregate"]["reordered"], 0);
  EXPECT_GT(fan["aggregate"]["latency"]["p50_us"].get<double>(), 0);
  EXPECT_GE(fan["aggregate"]["latency"]["max_us"].get<double>(),
            fan["aggregate"]["latency"]["p99_us"].get<double>());
  auto queue = bench({"b.queue", "-p", "1", "-m", "3", "-q", "workers", "-n", "3000", "--rate", "3000"});
  ASSERT_FALSE(queue.is_discarded());
  EXPECT_EQ(queue["aggregate"]["expected"], 3000);
  EXPECT_EQ(queue["aggregate"]["received"], 3000);
  for (const auto& s : queue["subscribers"])
    EXPECT_EQ(s["received"], 1000);  // round robin from one publisher
  // The header a person reads: the duration as written ("0.5 s", not "0.500000 s").
  std::string human = cli_path() + " bench b.human -d 0.5 -r 200";
  for (const auto& w : where) human += " " + w;
  const auto [human_rc, human_out] = run({"/bin/sh", "-c", human + " 2>&1"});
  EXPECT_EQ(human_rc, 0) << human_out;
  EXPECT_NE(human_out.find(", 0.5 s each, 200 msg/s each,"), std::string::npos) << human_out;
  // --trace: the latency budget, every message joined to its publish call.
  // Per message, the broker's relay time (SPEC.md §3.4) and the library's
  // hand-over lie inside the total, so each of their percentiles does too.
  auto traced = bench({"b.trace", "-n", "200", "--rate", "1000", "--trace"});
  ASSERT_FALSE(traced.is_discarded());
  const auto& budget = traced["aggregate"]["latency_budget"];
  EXPECT_EQ(budget["messages"], 200);
  EXPECT_EQ(budget["without_relay_time"], 0) << "a broker of version 5 measures every DELIVER";
  std::map<std::string, nlohmann::json> stage;
  for (const auto& s : budget["stages"]) stage[s["key"].get<std::string>()] = s["latency"];
  for (const char* key : {"schedule_to_call", "publish_call", "return_to_client", "broker", "hops",
                          "client_to_handler", "total"}) {
    ASSERT_TRUE(stage[key].is_object()) << key << " not measured: " << budget.dump();
  }
  EXPECT_GT(stage["broker"]["p50_us"].get<double>(), 0);
  for (const char* q : {"p50_us", "p99_us"}) {
    EXPECT_LE(stage["broker"][q].get<double>(), stage["total"][q].get<double>()) << q;
    EXPECT_LE(stage["client_to_handler"][q].get<double>(), stage["total"][q].get<double>()) << q;
  }
}

INSTANTIATE_TEST_SUITE_P(Via, Routing, ::testing::Values(Via::kRdma, Via::kTcp),
                         [](const auto& info) { return to_string(info.param); });

// RDMA and TCP publishers and subscribers on one broker see each other's
// messages: every subscriber gets every message of both publishers, in each
// publisher's order.
TEST(Mixed, RdmaAndTcpClientsSeeEachOthersMessages) {
  require_rdma();
  BrokerProcess broker(next_port());
  constexpr std::uint64_t kEach = 2000;
  Inbox at_rdma, at_tcp;  // before the clients: their callbacks use these
  auto rdma_sub = connect_via(broker, Via::kRdma);
  auto tcp_sub = connect_via(broker, Via::kTcp);
  auto rdma_pub = connect_via(broker, Via::kRdma);
  auto tcp_pub = connect_via(broker, Via::kTcp);
  ASSERT_TRUE(rdma_sub && tcp_sub && rdma_pub && tcp_pub);
  EXPECT_EQ(rdma_sub->transport_description().rfind("rdma", 0), 0u);
  EXPECT_EQ(tcp_sub->transport_description().rfind("tcp", 0), 0u);
  ASSERT_TRUE(rdma_sub->subscribe("mix.>", at_rdma.handler()));
  ASSERT_TRUE(tcp_sub->subscribe("mix.>", at_tcp.handler()));
  ASSERT_TRUE(rdma_sub->flush(10s));
  ASSERT_TRUE(tcp_sub->flush(10s));
  std::jthread a([&] {
    for (std::uint64_t seq = 0; seq < kEach; ++seq)
      ASSERT_TRUE(rdma_pub->publish("mix.rdma", seq_bytes(seq)));
    ASSERT_TRUE(rdma_pub->flush(30s));
  });
  std::jthread b([&] {
    for (std::uint64_t seq = 0; seq < kEach; ++seq) ASSERT_TRUE(tcp_pub->publish("mix.tcp", seq_bytes(seq)));
    ASSERT_TRUE(tcp_pub->flush(30s));
  });
  a.join();
  b.join();
  ASSERT_TRUE(eventually([&] { return at_rdma.count() >= 2 * kEach && at_tcp.count() >= 2 * kEach; }, 60s))
      << at_rdma.count() << " at the RDMA subscriber, " << at_tcp.count() << " at the TCP one";
  for (const Inbox* in : {&at_rdma, &at_tcp}) {
    std::map<std::string, std::uint64_t> next;
    for (const auto& m : in->messages()) EXPECT_EQ(seq_of(m), next[m.subject]++) << m.subject;
    EXPECT_EQ(next["mix.rdma"], kEach);
    EXPECT_EQ(next["mix.tcp"], kEach);
  }
  ASSERT_TRUE(rdma_sub->flush(10s));
  ASSERT_TRUE(tcp_sub->flush(10s));
  EXPECT_EQ(at_rdma.count(), 2 * kEach);
  EXPECT_EQ(at_tcp.count(), 2 * kEach);
  const auto s = broker.stats();
  EXPECT_EQ(s.at("messages.in"), static_cast<std::int64_t>(2 * kEach));
  EXPECT_EQ(s.at("tcp.connections"), 2);
}

}  // namespace
}  // namespace rdmabroker::test
