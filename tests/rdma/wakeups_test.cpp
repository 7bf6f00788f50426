// Wake-ups at light load (issue 16: a wake-up is the unit cost of latency),
// over RDMA (in the guest, label rdma) and TCP (on the host, label tcp).
// tests/bench/wakeups.sh measures them per delivered message end to end.
#include <gtest/gtest.h>

#include <string>
#include <thread>

#include "harness.hpp"
#include "rdmabroker/client.hpp"

namespace rdmabroker::test {
namespace {

using namespace std::chrono_literals;

// A publish at light load is sent from the publisher's thread and wakes
// nobody (issue 16: a wake-up is the unit cost of latency). RDMA: its SEND
// completes into a send CQ that is armed only while a thread waits on it;
// TCP: an idle socket is written by the publishing thread. The publisher's
// I/O thread then wakes only for what the broker sends it (credits). And a
// publisher whose few send buffers are all taken still gets them back
// (RDMA: waiting arms the send CQ).
class LightLoad : public ::testing::TestWithParam<Via> {
 protected:
  void SetUp() override {
    if (GetParam() == Via::kRdma) require_rdma();
  }
};

TEST_P(LightLoad, APublishWakesNothingAndTheSendBuffersStillComeBack) {
  BrokerProcess broker(next_port(), {"--workers", "1"});
  ASSERT_TRUE(broker.running());
  auto sub = connect_via(broker, GetParam());
  auto pub = connect_via(broker, GetParam());
  ASSERT_TRUE(sub && pub);
  SeqSink got;
  ASSERT_TRUE(sub->subscribe("light", got.handler()).ok());
  ASSERT_TRUE(sub->flush(10s).ok());
  ASSERT_TRUE(pub->flush(10s).ok());

  constexpr int kLight = 100;
  const auto before = pub->stats().io_wakeups;
  for (int i = 0; i < kLight; ++i) {
    ASSERT_TRUE(pub->publish("light", std::to_string(i)).ok());
    std::this_thread::sleep_for(3ms);  // the SEND is long complete before the next
  }
  ASSERT_TRUE(wait_until([&] { return got.size() >= kLight; }, 30s)) << got.describe();
  const auto woke = pub->stats().io_wakeups - before;
  // A hand-off to the I/O thread, or a completion waking it, was one per publish.
  EXPECT_LT(woke, kLight / 5u) << "the publisher's I/O thread woke " << woke << " times for " << kLight
                               << " publishes";

  // Larger than a SEND carries inline, and 3 send buffers in all: every
  // publish after the third waits for a buffer that only a completion frees.
  ClientOptions few;
  few.max_inflight_sends = 2;
  few.send_queue_buffers = 1;
  few.publish_timeout = 30s;
  auto tight = connect_via(broker, GetParam(), few);
  ASSERT_TRUE(tight);
  constexpr int kTight = volume(2000);
  const std::string pad(4000, ' ');
  for (int i = kLight; i < kLight + kTight; ++i) {
    ASSERT_TRUE(tight->publish("light", std::to_string(i) + pad).ok()) << "publish " << i;
  }
  ASSERT_TRUE(tight->flush(60s).ok());
  EXPECT_TRUE(wait_until([&] { return got.size() >= kLight + kTight; }, 60s)) << got.describe();
  EXPECT_TRUE(got.exactly(0, kLight + kTight)) << got.describe();
  tight->close();
  EXPECT_EQ(tight->close_reason().message, "client closed the connection");
}

INSTANTIATE_TEST_SUITE_P(Via, LightLoad, ::testing::Values(Via::kRdma, Via::kTcp),
                         [](const auto& info) { return to_string(info.param); });

}  // namespace
}  // namespace rdmabroker::test
