// SPDX-License-Identifier: Apache-2.0
// Messages delivered in place (Client::subscribe_view, MessageView), over
// RDMA (in the guest, label rdma) and TCP (on the host, label tcp): the
// handler reads subject, reply, header fields and payload in the library's
// receive buffer, which stays the handler's until it returns.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "harness.hpp"
#include "rdmabroker/client.hpp"

namespace rdmabroker::test {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

class InPlace : public ::testing::TestWithParam<Via> {
 protected:
  void SetUp() override {
    if (GetParam() == Via::kRdma) require_rdma();
  }
};

/// Payload `i` of `size` bytes: the number, then a byte pattern derived from it.
std::string patterned(std::uint64_t i, std::size_t size) {
  std::string p = std::to_string(i) + ":";
  while (p.size() < size) p.push_back(static_cast<char>('a' + (i + p.size()) % 26));
  p.resize(size);
  return p;
}

TEST_P(InPlace, AViewHandlerSeesEveryPartOfTheMessageAndItsBufferStaysPutUntilItReturns) {
  BrokerProcess broker(next_port());
  ASSERT_TRUE(broker.running());
  // Few receive buffers (RDMA): while a handler dawdles, the broker fills
  // every other one, and its next SEND would land in the handler's buffer if
  // that were posted again (the handler publishes, so that any credit owed
  // for it would go back to the broker).
  ClientOptions few;
  few.recv_credits = 4;
  auto sub = connect_via(broker, GetParam(), few);
  auto pub = connect_via(broker, GetParam());
  ASSERT_TRUE(sub && pub);

  std::mutex mu;
  std::vector<Message> seen;  // copies made from the views
  std::atomic<int> changed_under_handler{0};
  std::atomic<std::uint64_t> calls{0};
  Client* subscriber = sub.get();
  auto handler = [&](const MessageView& v) {
    Message m = v.to_message();
    // Every 50th call the handler publishes and dawdles while the broker
    // goes on sending: the bytes it is looking at must not change.
    if (calls.fetch_add(1) % 50 == 0) {
      EXPECT_TRUE(subscriber->publish("elsewhere", "x").ok());
      std::this_thread::sleep_for(5ms);
      if (v.data() != m.data() || v.subject != m.subject) changed_under_handler.fetch_add(1);
    }
    EXPECT_EQ(v.header("trace-id"), m.headers.get("Trace-Id"));
    EXPECT_EQ(v.has_headers(), !m.headers.empty());
    std::lock_guard lock(mu);
    seen.push_back(std::move(m));
  };
  ASSERT_TRUE(sub->subscribe_view("views.>", handler).ok());
  ASSERT_TRUE(sub->flush(10s).ok());

  // Many small messages (several to a DELIVER, several DELIVERs to a
  // receive), every third with headers, every fifth with a reply subject;
  // then one message larger than a frame (fragments, seen whole).
  constexpr std::uint64_t kSmall = volume(2000);
  for (std::uint64_t i = 0; i < kSmall; ++i) {
    const std::string payload = patterned(i, 200 + i % 300);
    const std::string reply = i % 5 == 0 ? "answers." + std::to_string(i) : "";
    Status st = i % 3 == 0 ? pub->publish("views.small", Headers{{"Trace-Id", std::to_string(i)}, {"k", "v"}},
                                          payload, reply)
                           : pub->publish_request("views.small", reply, as_payload(payload));
    ASSERT_TRUE(st.ok()) << "publish " << i << ": " << st.error().message;
  }
  const std::string large = patterned(kSmall, 150'000);
  ASSERT_TRUE(pub->publish("views.large", Headers{{"Trace-Id", "large"}}, large).ok());
  ASSERT_TRUE(pub->flush(60s).ok());
  ASSERT_TRUE(wait_until(
      [&] {
        std::lock_guard lock(mu);
        return seen.size() >= kSmall + 1;
      },
      60s));

  std::lock_guard lock(mu);
  ASSERT_EQ(seen.size(), kSmall + 1);
  for (std::uint64_t i = 0; i < kSmall; ++i) {
    const Message& m = seen[i];
    ASSERT_EQ(m.subject, "views.small") << i;
    ASSERT_EQ(m.data(), patterned(i, 200 + i % 300)) << i;
    ASSERT_EQ(m.reply, i % 5 == 0 ? "answers." + std::to_string(i) : "") << i;
    if (i % 3 == 0) {
      ASSERT_EQ(m.headers, (Headers{{"Trace-Id", std::to_string(i)}, {"k", "v"}})) << i;
    } else {
      ASSERT_TRUE(m.headers.empty()) << i;
    }
  }
  EXPECT_EQ(seen.back().subject, "views.large");
  EXPECT_TRUE(seen.back().data() == large)
      << "the large message arrived with " << seen.back().payload.size() << " bytes";
  EXPECT_EQ(seen.back().headers.get("trace-id"), "large");
  EXPECT_EQ(changed_under_handler.load(), 0) << "a receive buffer was reused while its handler ran";
}

TEST_P(InPlace, QueueGroupsAndRequestsWorkWithViewHandlers) {
  BrokerProcess broker(next_port());
  ASSERT_TRUE(broker.running());
  // One member is a reconnecting client: its view subscriptions are kept
  // and restored like any other.
  ConnectionEvents events;
  auto member_a = connect_via(broker, GetParam());
  auto member_b = connect_via(broker, GetParam(), events.options());
  auto responder = connect_via(broker, GetParam());
  auto client = connect_via(broker, GetParam());
  ASSERT_TRUE(member_a && member_b && responder && client);

  std::mutex mu;
  std::vector<std::uint64_t> got;
  std::atomic<int> a_count{0}, b_count{0};
  auto member = [&](std::atomic<int>& count) {
    return [&](const MessageView& v) {
      count.fetch_add(1);
      std::lock_guard lock(mu);
      got.push_back(std::stoull(std::string(v.data())));
    };
  };
  ASSERT_TRUE(member_a->queue_subscribe_view("work", "workers", member(a_count)).ok());
  ASSERT_TRUE(member_b->queue_subscribe_view("work", "workers", member(b_count)).ok());
  // A responder answers in its handler, from the views: the reply subject
  // and payload are read in place and published before the handler returns.
  Client* r = responder.get();
  ASSERT_TRUE(responder
                  ->subscribe_view("echo",
                                   [r](const MessageView& v) {
                                     std::string answer = "echo:";
                                     answer.append(v.data());
                                     EXPECT_TRUE(r->publish(v.reply, answer).ok());
                                   })
                  .ok());
  for (auto* c : {member_a.get(), member_b.get(), responder.get()}) ASSERT_TRUE(c->flush(10s).ok());

  constexpr std::uint64_t kWork = volume(400);
  for (std::uint64_t i = 0; i < kWork; ++i) ASSERT_TRUE(client->publish("work", std::to_string(i)).ok());
  for (int i = 0; i < 5; ++i) {
    auto answer = client->request("echo", "ping " + std::to_string(i), 10s);
    ASSERT_TRUE(answer.ok()) << answer.error().message;
    EXPECT_EQ(answer.value().data(), "echo:ping " + std::to_string(i));
  }
  ASSERT_TRUE(client->flush(30s).ok());
  ASSERT_TRUE(wait_until(
      [&] {
        std::lock_guard lock(mu);
        return got.size() >= kWork;
      },
      30s));
  std::lock_guard lock(mu);
  std::sort(got.begin(), got.end());
  ASSERT_EQ(got.size(), kWork) << "each message goes to exactly one member";
  for (std::uint64_t i = 0; i < kWork; ++i) ASSERT_EQ(got[i], i);
  EXPECT_GT(a_count.load(), 0);
  EXPECT_GT(b_count.load(), 0);
}

// SPEC.md §3.4, relay time (version 5): each view says when the library
// took it and how long the broker held it, which fits inside what the
// publisher and the subscriber saw; a client of version 4 is sent the word 0.
TEST_P(InPlace, EachViewSaysWhenItCameAndHowLongTheBrokerHeldIt) {
  // A worker that spins (200 ms after its last work) between messages 20 ms
  // apart: a message found by a spin counts from the poll that found it,
  // not from when the spin began (CliBench covers a worker that sleeps).
  BrokerProcess broker(next_port(), {"--workers", "1", "--busy-poll-us", "200000"});
  ASSERT_TRUE(broker.running());
  auto sub = connect_via(broker, GetParam());
  auto pub = connect_via(broker, GetParam());
  auto v4 = raw_wire(broker, GetParam(), true, proto::ConnectRequest{16384, 16, 0, /*max_version=*/4});
  ASSERT_TRUE(sub && pub && v4);
  EXPECT_EQ(v4->accept.version, 4);
  struct Seen {
    Clock::time_point handler, received_at;
    std::chrono::nanoseconds relay;
    std::size_t size;
  };
  std::mutex mu;
  std::vector<Seen> seen;
  ASSERT_TRUE(sub->subscribe_view("relay.>",
                                  [&](const MessageView& v) {
                                    const auto now = Clock::now();
                                    std::lock_guard lock(mu);
                                    seen.push_back({now, v.received_at, v.relay_time, v.payload.size()});
                                  })
                  .ok());
  // The raw client returns no credits: it takes the small messages only.
  ASSERT_TRUE(v4->send(frame(proto::FrameType::kSubscribe, 1, "relay.small")));
  ASSERT_TRUE(sub->flush(10s).ok());
  ASSERT_EQ(broker.wait_stats([](auto& s) { return s["subscriptions"] == 2; }, 30s)["subscriptions"], 2);

  // One at a time, each waited for; the last larger than a frame (its view
  // is of the reassembled message, its relay time its last fragment's).
  constexpr std::size_t kMessages = 12;
  std::vector<Clock::time_point> published;
  for (std::size_t i = 0; i < kMessages; ++i) {
    const bool large = i + 1 == kMessages;
    const std::string payload(large ? 100'000 : 64 + i, 'r');
    std::this_thread::sleep_for(20ms);
    published.push_back(Clock::now());
    ASSERT_TRUE(pub->publish(large ? "relay.large" : "relay.small", payload).ok());
    ASSERT_TRUE(wait_until(
        [&] {
          std::lock_guard lock(mu);
          return seen.size() == i + 1;
        },
        30s));
  }
  std::lock_guard lock(mu);
  for (std::size_t i = 0; i < kMessages; ++i) {
    const Seen& s = seen[i];
    EXPECT_EQ(s.size, i + 1 == kMessages ? 100'000u : 64 + i);
    EXPECT_GE(s.received_at, published[i]) << i;
    EXPECT_LE(s.received_at, s.handler) << i;
    EXPECT_GT(s.relay.count(), 0) << i << ": a broker of version 5 measures every DELIVER";
    EXPECT_LE(s.relay, s.received_at - published[i]) << i << ": the broker held it longer than it travelled";
  }
  // The version-4 client got the same messages with the word reserved, 0.
  std::vector<std::uint32_t> words;
  EXPECT_EQ(read_delivered(
                *v4, kMessages - 1, 30s, [](const proto::Frame&) {},
                [&](const proto::Frame& f) {
                  if (f.header.type == proto::FrameType::kDeliver) words.push_back(f.header.relay_ns());
                }),
            kMessages - 1);
  ASSERT_FALSE(words.empty());
  EXPECT_EQ(std::count(words.begin(), words.end(), 0u), static_cast<std::ptrdiff_t>(words.size()));
}

INSTANTIATE_TEST_SUITE_P(Via, InPlace, ::testing::Values(Via::kRdma, Via::kTcp),
                         [](const auto& info) { return to_string(info.param); });

}  // namespace
}  // namespace rdmabroker::test
