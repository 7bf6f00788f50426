// SPDX-License-Identifier: Apache-2.0
// Client resilience (ClientOptions::reconnect), over RDMA in the guest and
// TCP on the host: a broker restarted under load, clients that reconnect
// with backoff, restore their subscriptions and report the outage; publishing
// while disconnected waits for the connection or fails clearly.
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <thread>

#include "harness.hpp"
#include "rdmabroker/client.hpp"

namespace rdmabroker::test {
namespace {

using namespace std::chrono_literals;
using Kind = ConnectionEvent::Kind;

using Events = ConnectionEvents;

class Resilience : public ::testing::TestWithParam<Via> {
 protected:
  void SetUp() override {
    if (GetParam() == Via::kRdma) require_rdma();
  }
};

TEST_P(Resilience, ClientsReconnectAfterABrokerRestartUnderLoad) {
  BrokerProcess broker(next_port());
  ASSERT_TRUE(broker.running());
  Events sub_events, pub_events;
  ClientOptions sub_opt = sub_events.options();
  auto sub = connect_via(broker, GetParam(), sub_opt);
  ClientOptions pub_opt = pub_events.options();
  pub_opt.publish_timeout = 60s;  // publishes wait through the outage
  auto pub = connect_via(broker, GetParam(), pub_opt);
  ASSERT_TRUE(sub && pub);

  std::mutex mu;
  std::vector<std::uint64_t> got;
  auto sid = sub->subscribe("load.seq", [&](const Message& m) {
    std::lock_guard l(mu);
    got.push_back(std::stoull(std::string(m.data())));
  });
  ASSERT_TRUE(sid);
  auto queue = sub->subscribe(std::string_view("load.tail"));  // a next() reader across the restart
  ASSERT_TRUE(queue);
  ASSERT_TRUE(sub->flush(10s));
  auto received = [&] {
    std::lock_guard l(mu);
    return got.size();
  };

  // Flat-out publishing from another thread, through the restart.
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> published{0};
  std::atomic<std::uint64_t> first_after_recovery{0};  // first seq published once both clients were back
  std::vector<Error> failures;  // written by the publisher thread, read once it is joined
  std::thread publisher([&] {
    for (std::uint64_t seq = 0; !stop; ++seq) {
      if (first_after_recovery == 0 && sub_events.reconnected > 0 && pub_events.reconnected > 0) {
        first_after_recovery = seq;
      }
      auto st = pub->publish("load.seq", std::to_string(seq));
      if (!st) {
        failures.push_back(st.error());
        break;
      }
      published = seq + 1;
      if (seq % 64 == 0) std::this_thread::sleep_for(1ms);  // a steady load, not a flood
    }
  });
  // However this test ends, the publisher thread is stopped and joined first.
  auto stop_publisher = [&] {
    stop = true;
    if (publisher.joinable()) publisher.join();
  };
  struct Joiner {
    std::function<void()> f;
    ~Joiner() { f(); }
  } joiner{stop_publisher};
  auto failure_text = [&] {
    stop_publisher();
    return failures.empty() ? std::string("no publish failed")
                            : "a publish failed: " + failures.front().message;
  };
  ASSERT_TRUE(wait_until([&] { return received() >= 2000; }, 60s)) << received() << "; " << failure_text();

  EXPECT_EQ(broker.restart(SIGTERM), 0);
  ASSERT_TRUE(broker.running());
  ASSERT_TRUE(wait_until([&] { return sub_events.reconnected > 0 && pub_events.reconnected > 0; }, 60s))
      << failure_text();
  ASSERT_TRUE(
      wait_until([&] { return first_after_recovery > 0 && published > first_after_recovery + 2000; }, 60s))
      << "published " << published << ", first after recovery " << first_after_recovery << "; "
      << failure_text();
  stop_publisher();
  EXPECT_TRUE(failures.empty()) << failures.front().message;
  ASSERT_TRUE(pub->flush(30s));
  const std::uint64_t last = published - 1;
  ASSERT_TRUE(wait_until(
      [&] {
        std::lock_guard l(mu);
        return !got.empty() && got.back() == last;
      },
      30s));

  // In order, no duplicates; the only gap is around the restart; every
  // message published after both clients were back arrived.
  std::lock_guard l(mu);
  for (std::size_t i = 1; i < got.size(); ++i) ASSERT_LT(got[i - 1], got[i]) << "at " << i;
  std::size_t gaps = 0;
  for (std::size_t i = 1; i < got.size(); ++i) gaps += got[i] != got[i - 1] + 1;
  EXPECT_LE(gaps, 1u);
  const auto tail_start = std::lower_bound(got.begin(), got.end(), first_after_recovery.load());
  EXPECT_EQ(static_cast<std::uint64_t>(got.end() - tail_start), last - first_after_recovery + 1);

  // Each client saw one outage: disconnected, then reconnected with its subscriptions.
  for (auto* events : {&sub_events, &pub_events}) {
    const auto e = events->get();
    ASSERT_EQ(e.size(), 2u);
    EXPECT_EQ(e[0].kind, Kind::kDisconnected);
    EXPECT_FALSE(e[0].reason.message.empty());
    EXPECT_EQ(e[1].kind, Kind::kReconnected);
    EXPECT_GE(e[1].attempts, 1u);
  }
  EXPECT_EQ(sub_events.get()[1].subscriptions_restored, 2u);
  EXPECT_EQ(pub_events.get()[1].subscriptions_restored, 0u);
  // The same subscription id and the same next() queue keep working.
  ASSERT_TRUE(pub->publish("load.tail", std::string_view("after the restart")));
  auto m = queue.value()->next(10s);
  ASSERT_TRUE(m) << m.error().message;
  EXPECT_EQ(m->data(), "after the restart");
  EXPECT_EQ(m->sid, queue.value()->sid());
  EXPECT_EQ(broker.stats()["subscriptions"], 2);
}

TEST_P(Resilience, PublishingWhileDisconnectedFailsClearlyAfterTheTimeout) {
  BrokerProcess broker(next_port());
  ASSERT_TRUE(broker.running());
  Events events;
  ClientOptions opt = events.options();
  opt.publish_timeout = 500ms;
  opt.max_reconnect_attempts = 0;
  auto c = connect_via(broker, GetParam(), opt);
  ASSERT_TRUE(c);
  ASSERT_EQ(broker.stop(SIGTERM, 30s), 0);
  ASSERT_TRUE(wait_until([&] { return !events.get().empty(); }, 10s));
  const auto t0 = std::chrono::steady_clock::now();
  auto st = c->publish("x.y", std::string_view("while down"));
  const auto waited = std::chrono::steady_clock::now() - t0;
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().kind, ErrorKind::kTimeout);
  EXPECT_NE(st.error().message.find("not connected to the broker"), std::string::npos) << st.error().message;
  EXPECT_GE(waited, 400ms);
  // Subscribing while down is remembered and made once the broker is back.
  auto sub = c->subscribe(std::string_view("x.y"));
  ASSERT_TRUE(sub);
  EXPECT_EQ(broker.restart(SIGTERM), -1);  // nothing to stop: it starts it again
  ASSERT_TRUE(wait_until([&] { return events.reconnected > 0; }, 60s));
  ASSERT_TRUE(c->publish("x.y", std::string_view("back")));
  auto m = sub.value()->next(10s);
  ASSERT_TRUE(m) << m.error().message;
  EXPECT_EQ(m->data(), "back");
}

TEST_P(Resilience, GivingUpClosesTheClientAndSaysWhy) {
  auto broker = std::make_unique<BrokerProcess>(next_port());
  ASSERT_TRUE(broker->running());
  Events events;
  ClientOptions opt = events.options();
  opt.max_reconnect_attempts = 3;
  auto c = connect_via(*broker, GetParam(), opt);
  ASSERT_TRUE(c);
  auto sub = c->subscribe(std::string_view("a.b"));
  ASSERT_TRUE(sub);
  broker.reset();  // stopped for good
  ASSERT_TRUE(wait_until([&] { return events.get().size() >= 2; }, 60s));
  const auto e = events.get();
  EXPECT_EQ(e[1].kind, Kind::kGaveUp);
  EXPECT_EQ(e[1].attempts, 3u);
  EXPECT_NE(c->close_reason().message.find("gave up reconnecting after 3 attempts"), std::string::npos)
      << c->close_reason().message;
  auto m = sub.value()->next(1s);
  ASSERT_FALSE(m);
  EXPECT_EQ(m.error().kind, ErrorKind::kClosed);
  EXPECT_FALSE(c->publish("a.b", std::string_view("x")));
}

TEST_P(Resilience, ASubscriptionTheBrokerRefusedStaysEndedAcrossReconnects) {
  // Anonymous clients may not subscribe to secret.>: the refusal (ERROR
  // PERMISSION_DENIED naming the subscription) ends it in the library, and a
  // reconnect must not ask for it again.
  const std::string path = "/tmp/rdmabroker-resilience-" + std::to_string(getpid()) + ".yaml";
  {
    std::ofstream out(path, std::ios::trunc);
    out << "auth:\n  anonymous: true\n  anonymous_permissions:\n    subscribe: {allow: [\">\"], deny: "
           "[\"secret.>\"]}\n";
  }
  BrokerProcess broker(next_port(), {"--config", path});
  ASSERT_TRUE(broker.running());
  Events events;
  std::atomic<int> denied{0};
  ClientOptions opt = events.options();
  opt.on_error = [&](const Error& e) {
    if (e.kind == ErrorKind::kPermissionDenied) denied.fetch_add(1);
  };
  auto c = connect_via(broker, GetParam(), opt);
  ASSERT_TRUE(c);
  ASSERT_TRUE(c->subscribe("secret.plans", [](const Message&) {}));
  auto open_queue = c->subscribe(std::string_view("open.news"));
  ASSERT_TRUE(open_queue);
  ASSERT_TRUE(c->flush(10s));
  EXPECT_EQ(denied.load(), 1);

  EXPECT_EQ(broker.restart(SIGTERM), 0);
  ASSERT_TRUE(wait_until([&] { return events.reconnected > 0; }, 60s));
  ASSERT_TRUE(c->flush(10s));
  const auto e = events.get();
  ASSERT_EQ(e.back().kind, Kind::kReconnected);
  EXPECT_EQ(e.back().subscriptions_restored, 1u) << "only open.news comes back";
  EXPECT_EQ(denied.load(), 1) << "the refused subscription was asked for again";
  EXPECT_EQ(broker.stats()["permissions.denied.subscribe"], 0);
  EXPECT_EQ(broker.stats()["subscriptions"], 1);
  ASSERT_TRUE(c->publish("open.news", std::string_view("still here")));
  auto m = open_queue.value()->next(10s);
  ASSERT_TRUE(m) << m.error().message;
  EXPECT_EQ(m->data(), "still here");
  std::remove(path.c_str());
}

INSTANTIATE_TEST_SUITE_P(Via, Resilience, ::testing::Values(Via::kRdma, Via::kTcp),
                         [](const auto& info) { return to_string(info.param); });

}  // namespace
}  // namespace rdmabroker::test
