// SPDX-License-Identifier: Apache-2.0
// The polled client (ClientOptions::polled, Client::poll): no I/O thread,
// the application's thread makes the progress; over RDMA (in the guest,
// label rdma) and TCP (on the host, label tcp).
#include <gtest/gtest.h>

#include <csignal>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "harness.hpp"
#include "rdmabroker/client.hpp"

namespace rdmabroker::test {
namespace {

using namespace std::chrono_literals;

class Polled : public ::testing::TestWithParam<Via> {
 protected:
  void SetUp() override {
    if (GetParam() == Via::kRdma) require_rdma();
  }
  static ClientOptions polled() {
    ClientOptions o;
    o.polled = true;
    return o;
  }
};

/// The threads of this process (/proc/self/status).
int threads_now() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
  }
  return -1;
}

/// How long `f` took.
template <typename F>
std::chrono::milliseconds took(F&& f) {
  const auto start = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
}

/// A poll() that waits this long only returns early because of wake() or a
/// wait of another thread: the tests bound what a wake-up takes well below it.
constexpr auto kLongPoll = 60s;
constexpr auto kWokenWithin = 10s;

/// Wakes `c` and joins `poller`, a thread in c.poll(kLongPoll): true if that
/// took less than kWokenWithin (its poll() could otherwise sleep a minute).
bool woken_and_joined(Client& c, std::thread& poller) {
  return took([&] {
           EXPECT_TRUE(c.wake().ok());
           poller.join();
         }) < kWokenWithin;
}

/// Polls `c` (spinning, poll(0)) until `done()` or the timeout; false on timeout.
bool poll_until(Client& c, const std::function<bool()>& done, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    auto n = c.poll();
    if (!n) return false;
  }
  return true;
}

TEST_P(Polled, APolledClientPublishesSubscribesAndRequestsWithNoThreadOfItsOwn) {
  BrokerProcess broker(next_port());
  ASSERT_TRUE(broker.running());
  auto other = connect_via(broker, GetParam());
  ASSERT_TRUE(other);
  const int threads_before = threads_now();
  auto p = connect_via(broker, GetParam(), polled());
  ASSERT_TRUE(p);
  EXPECT_EQ(threads_now(), threads_before) << "a polled client started a thread";

  // Subscribe (in place) and receive by spinning on poll(0): no wake-up at all.
  std::vector<std::uint64_t> got;  // the polling thread's only
  ASSERT_TRUE(p->subscribe_view("p.in", [&](const MessageView& v) {
                 got.push_back(std::stoull(std::string(v.data())));
               }).ok());
  ASSERT_TRUE(p->flush(10s).ok());  // drives the client itself while it waits
  const auto before = p->stats();
  constexpr std::uint64_t kIn = volume(1000);
  for (std::uint64_t i = 0; i < kIn; ++i) ASSERT_TRUE(other->publish("p.in", std::to_string(i)).ok());
  ASSERT_TRUE(poll_until(
      *p, [&] { return got.size() >= kIn; }, 60s))
      << got.size() << " of " << kIn;
  ASSERT_EQ(got.size(), kIn);
  for (std::uint64_t i = 0; i < kIn; ++i) ASSERT_EQ(got[i], i);
  const auto after = p->stats();
  EXPECT_EQ(after.io_wakeups - before.io_wakeups, 0u) << "poll(0) never sleeps";
  EXPECT_EQ(after.app_wakeups - before.app_wakeups, 0u);
  EXPECT_EQ(after.messages_received - before.messages_received, kIn);

  // Publish: flat out, more than its send buffers hold (a publish with none
  // free makes the progress that frees one).
  SeqSink out;
  ASSERT_TRUE(other->subscribe("p.out", out.handler()).ok());
  ASSERT_TRUE(other->flush(10s).ok());
  constexpr std::uint64_t kOut = volume(3000);
  const std::string pad(2000, ' ');
  for (std::uint64_t i = 0; i < kOut; ++i)
    ASSERT_TRUE(p->publish("p.out", std::to_string(i) + pad).ok()) << i;
  ASSERT_TRUE(p->flush(30s).ok());
  ASSERT_TRUE(wait_until([&] { return out.size() >= kOut; }, 30s)) << out.describe();
  EXPECT_TRUE(out.exactly(0, kOut)) << out.describe();

  // A blocking subscription: next() drives the client while it waits.
  auto queue = p->subscribe("p.queue");
  ASSERT_TRUE(queue.ok());
  ASSERT_TRUE(p->flush(10s).ok());
  ASSERT_TRUE(other->publish("p.queue", "queued").ok());
  auto m = queue.value()->next(10s);
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_EQ(m.value().data(), "queued");

  // Requests both ways: the polled client asks (request() drives it) ...
  ASSERT_TRUE(other
                  ->subscribe("svc.other",
                              [&](const Message& q) {
                                EXPECT_TRUE(other->publish(q.reply, "re:" + std::string(q.data())).ok());
                              })
                  .ok());
  ASSERT_TRUE(other->flush(10s).ok());
  auto answer = p->request("svc.other", "a", 10s);
  ASSERT_TRUE(answer.ok()) << answer.error().message;
  EXPECT_EQ(answer.value().data(), "re:a");
  // ... and answers from its callback, run by a thread of the application's
  // that polls with a long timeout (sleeping when idle: requests wake it,
  // and so do this thread's flush() and wake()).
  Client* responder = p.get();
  ASSERT_TRUE(p->subscribe_view("svc.polled", [&](const MessageView& q) {
                 EXPECT_TRUE(responder->publish(q.reply, "from polled").ok());
                 EXPECT_FALSE(responder->poll().ok()) << "poll() from its own callback";
               }).ok());
  ASSERT_TRUE(p->flush(10s).ok());
  std::atomic<bool> stop{false};
  std::thread poller([&] {
    while (!stop) EXPECT_TRUE(p->poll(kLongPoll).ok());
  });
  for (int i = 0; i < 5; ++i) {
    auto r = other->request("svc.polled", "q", 10s);
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r.value().data(), "from polled");
  }

  // A queue group with a polled member and a threaded one: each message once.
  std::atomic<int> polled_share{0};
  std::mutex mu;
  std::vector<std::uint64_t> members;
  auto member = [&](bool is_polled) {
    return [&, is_polled](const MessageView& v) {
      if (is_polled) polled_share.fetch_add(1);
      std::lock_guard lock(mu);
      members.push_back(std::stoull(std::string(v.data())));
    };
  };
  ASSERT_TRUE(p->queue_subscribe_view("work", "g", member(true)).ok());
  ASSERT_TRUE(other->queue_subscribe_view("work", "g", member(false)).ok());
  // From this thread while the poller sleeps in its poll(): the flush ends
  // that sleep and takes the next turn (else it would wait out the minute).
  ASSERT_TRUE(p->flush(10s).ok());
  ASSERT_TRUE(other->flush(10s).ok());
  auto publisher = connect_via(broker, GetParam());
  ASSERT_TRUE(publisher);
  constexpr std::uint64_t kWork = volume(400);
  for (std::uint64_t i = 0; i < kWork; ++i) ASSERT_TRUE(publisher->publish("work", std::to_string(i)).ok());
  ASSERT_TRUE(publisher->flush(30s).ok());
  ASSERT_TRUE(wait_until(
      [&] {
        std::lock_guard lock(mu);
        return members.size() >= kWork;
      },
      30s));
  stop = true;
  EXPECT_TRUE(woken_and_joined(*p, poller)) << "wake() did not end the poller's poll()";
  // A wake-up with no poll() waiting is kept for the next one.
  ASSERT_TRUE(p->wake().ok());
  Result<std::size_t> woken = std::size_t{1};
  EXPECT_LT(took([&] { woken = p->poll(kLongPoll); }), kWokenWithin);
  ASSERT_TRUE(woken.ok());
  EXPECT_EQ(woken.value(), 0u);
  {
    // Not held across the close() below: the callbacks that take it run
    // inside the client's turn, which close() takes too (lock order).
    std::lock_guard lock(mu);
    std::sort(members.begin(), members.end());
    ASSERT_EQ(members.size(), kWork);
    for (std::uint64_t i = 0; i < kWork; ++i) ASSERT_EQ(members[i], i);
  }
  EXPECT_GT(polled_share.load(), 0);
  // close() from this thread while another sleeps in poll(): the close ends
  // that sleep and takes the turn (nothing arrives to end it otherwise: the
  // CLOSE frame waits for the turn), and the poller then hears kClosed.
  Result<std::size_t> last_poll = std::size_t{0};
  std::thread sleeper([&] {
    while (last_poll.ok()) last_poll = p->poll(kLongPoll);
  });
  std::this_thread::sleep_for(300ms);  // into its poll()
  EXPECT_LT(took([&] { p->close(); }), kWokenWithin) << "close() waited out the poller's poll()";
  sleeper.join();
  ASSERT_FALSE(last_poll.ok());
  EXPECT_EQ(last_poll.error().kind, ErrorKind::kClosed);
  EXPECT_EQ(p->close_reason().message, "client closed the connection");
  auto after_close = p->poll();
  ASSERT_FALSE(after_close.ok());
  EXPECT_EQ(after_close.error().kind, ErrorKind::kClosed);
  auto wake_closed = p->wake();
  ASSERT_FALSE(wake_closed.ok());
  EXPECT_EQ(wake_closed.error().kind, ErrorKind::kClosed);
}

TEST_P(Polled, ItSaysWhenItEndsAndRefusesWhatItCannotDo) {
  BrokerProcess broker(next_port());
  ASSERT_TRUE(broker.running());
  auto threaded = connect_via(broker, GetParam());
  ASSERT_TRUE(threaded);
  auto not_polled = threaded->poll();
  ASSERT_FALSE(not_polled.ok());
  EXPECT_EQ(not_polled.error().kind, ErrorKind::kInvalidArgument);
  auto not_woken = threaded->wake();
  ASSERT_FALSE(not_woken.ok());
  EXPECT_EQ(not_woken.error().kind, ErrorKind::kInvalidArgument);

  // The broker goes away: poll() reports it (and on_error got it first).
  std::mutex mu;
  std::vector<Error> errors;
  ClientOptions o = polled();
  o.on_error = [&](const Error& e) {
    std::lock_guard lock(mu);
    errors.push_back(e);
  };
  auto p = connect_via(broker, GetParam(), o);
  ASSERT_TRUE(p);
  // And one that reconnects: with its broker gone, its poll() waits for the
  // next connection, and wake() ends that wait too.
  ConnectionEvents events;
  ClientOptions ro = events.options();
  ro.polled = true;
  auto rp = connect_via(broker, GetParam(), ro);
  ASSERT_TRUE(rp);
  broker.stop(SIGTERM, 10s);
  Result<std::size_t> last = std::size_t{0};
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (last.ok() && std::chrono::steady_clock::now() < deadline) last = p->poll(50ms);
  ASSERT_FALSE(last.ok()) << "poll() never reported the end";
  EXPECT_EQ(last.error().kind, ErrorKind::kClosed);
  {
    std::lock_guard lock(mu);
    EXPECT_FALSE(errors.empty());
  }

  ASSERT_TRUE(poll_until(
      *rp, [&] { return events.saw(ConnectionEvent::Kind::kDisconnected); }, 30s));
  std::atomic<bool> stop{false};
  std::atomic<int> polls{0};
  std::thread poller([&] {
    while (!stop) {
      EXPECT_TRUE(rp->poll(kLongPoll).ok()) << "an outage is no error of poll()";
      ++polls;
    }
  });
  std::this_thread::sleep_for(300ms);  // into its wait for a connection
  stop = true;
  EXPECT_TRUE(woken_and_joined(*rp, poller)) << "wake() did not end a reconnecting client's wait";
  EXPECT_GE(polls.load(), 1);
  rp->close();
}

// A polled client that reconnects (ClientOptions::polled + reconnect): the
// broker restarts under it while an application thread polls; the client
// connects again on its own, restores its subscriptions (a handler and a
// queue), and what is published afterwards reaches both, the handler always
// inside poll() on the polling thread, never on the library's reconnecting
// thread. (The restart runs on the test's main thread: a broker dies with
// the thread that started it, PR_SET_PDEATHSIG.)
TEST_P(Polled, APolledClientReconnectsAndRestoresItsSubscriptions) {
  BrokerProcess broker(next_port());
  ASSERT_TRUE(broker.running());
  ConnectionEvents events;
  ClientOptions o = events.options();
  o.polled = true;
  auto p = connect_via(broker, GetParam(), o);
  ASSERT_TRUE(p);
  std::atomic<std::thread::id> polling{std::this_thread::get_id()};
  std::atomic<int> handled{0};
  std::atomic<bool> off_thread{false};
  ASSERT_TRUE(p->subscribe("re.h", [&](const Message&) {
                 if (std::this_thread::get_id() != polling.load()) off_thread = true;
                 ++handled;
               }).ok());
  auto queue = p->subscribe("re.q");
  ASSERT_TRUE(queue.ok());
  auto flushed = p->flush(10s);
  ASSERT_TRUE(flushed.ok()) << flushed.error().message;
  auto pub = connect_via(broker, GetParam(), events.options());
  ASSERT_TRUE(pub);
  ASSERT_TRUE(pub->publish("re.h", "before").ok());
  ASSERT_TRUE(poll_until(
      *p, [&] { return handled == 1; }, 20s));

  // The restart, while a thread polls on (poll() never fails meanwhile: the
  // outage is the library's to mend). It polls with a long timeout: the
  // reconnection and wake() end its waits.
  std::atomic<bool> stop{false};
  std::string poll_error;
  std::thread poller([&] {
    polling = std::this_thread::get_id();
    while (!stop) {
      auto n = p->poll(kLongPoll);
      if (!n) {
        poll_error = n.error().message;
        break;
      }
    }
  });
  broker.restart(SIGTERM);
  const bool back = wait_until([&] { return events.reconnected >= 2; }, 60s);  // the publisher and ours
  stop = true;
  EXPECT_TRUE(woken_and_joined(*p, poller));
  polling = std::this_thread::get_id();
  EXPECT_EQ(poll_error, "");
  ASSERT_TRUE(back) << "reconnected " << events.reconnected;
  EXPECT_TRUE(events.saw(ConnectionEvent::Kind::kDisconnected));

  // What was restored without a flush on the library's thread is confirmed
  // by this flush; then both subscriptions get what is published.
  flushed = p->flush(10s);
  ASSERT_TRUE(flushed.ok()) << flushed.error().message;
  for (int i = 0; i < 10; ++i) {
    ASSERT_TRUE(pub->publish("re.h", "after").ok());
    ASSERT_TRUE(pub->publish("re.q", std::to_string(i)).ok());
  }
  ASSERT_TRUE(pub->flush(10s).ok());
  EXPECT_TRUE(poll_until(
      *p, [&] { return handled == 11; }, 20s))
      << handled;
  EXPECT_FALSE(off_thread) << "a handler ran outside the application's poll()";
  for (int i = 0; i < 10; ++i) {
    auto m = queue.value()->next(10s);  // polls the client while it waits
    ASSERT_TRUE(m.ok()) << m.error().message;
    EXPECT_EQ(std::string(m.value().data()), std::to_string(i));
  }
  p->close();
  pub->close();
}

INSTANTIATE_TEST_SUITE_P(Via, Polled, ::testing::Values(Via::kRdma, Via::kTcp),
                         [](const auto& info) { return to_string(info.param); });

}  // namespace
}  // namespace rdmabroker::test
