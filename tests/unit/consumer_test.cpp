// SPDX-License-Identifier: Apache-2.0
// A stream consumer's bookkeeping (daemon/stream/consumer.hpp) over a real
// store in a temporary directory: which message goes next and to whom,
// redelivery after a deadline, a NAK or a member's end, max_deliver,
// cumulative acknowledgements, flow control; its saved state; and the
// CONSUME settings on the wire (proto/consumer.hpp).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "rdmabroker/proto/consumer.hpp"
#include "store/file_store.hpp"
#include "stream/consumer.hpp"
#include "stream/consumer_state.hpp"

namespace rdmabroker::daemon {
namespace {

constexpr std::int64_t kMs = 1'000'000;

class ConsumerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = store::FileStore::open({dir_, 1 << 20, {}}, 1);
    ASSERT_TRUE(s.ok());
    store_ = std::move(s.value());
    for (int i = 1; i <= 10; ++i) {
      const std::string subject = i % 2 ? "odd" : "even";
      ASSERT_TRUE(store_->append({subject, {}, std::as_bytes(std::span("x", 1))}, i * kMs).ok());
    }
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  /// Picks and records deliveries until none is allowed; their sequences.
  std::vector<std::uint64_t> drain(Consumer& k, std::int64_t now, std::size_t* member = nullptr) {
    std::vector<std::uint64_t> out;
    std::int64_t wait = 0;
    while (auto p = k.pick(*store_, now, 1 << 20, &wait)) {
      if (member != nullptr) *member = p->member;
      k.delivered(*p, 40, now);
      out.push_back(p->sequence);
    }
    return out;
  }
  static ConsumerMember member(std::uint64_t connection) { return {connection, 0, 0, 1, 16384}; }

  const std::string dir_ = "/tmp/rdmabroker-consumer-" + std::to_string(getpid());
  std::unique_ptr<store::MessageStore> store_;
};

TEST_F(ConsumerTest, FlowControlRedeliveryAndMaxDeliver) {
  proto::ConsumerConfig c;
  c.max_ack_pending = 4;
  c.ack_wait_ms = 100;
  c.max_deliver = 2;
  Consumer k("k", true, c, *store_);
  EXPECT_TRUE(drain(k, 0).empty()) << "no member, nothing delivered";
  k.add_member(member(1));
  EXPECT_EQ(drain(k, 0), (std::vector<std::uint64_t>{1, 2, 3, 4})) << "max_ack_pending";
  k.ack(0, 2);
  EXPECT_EQ(drain(k, 0), (std::vector<std::uint64_t>{5}));
  std::int64_t next = 0;
  EXPECT_TRUE(k.expire(50 * kMs, &next).empty());
  EXPECT_EQ(next, 100 * kMs);
  EXPECT_TRUE(k.expire(100 * kMs, &next).empty()) << "first deadline: delivered again, not given up";
  EXPECT_EQ(drain(k, 100 * kMs), (std::vector<std::uint64_t>{1, 3, 4, 5}));
  const auto given_up = k.expire(200 * kMs, &next);
  ASSERT_EQ(given_up.size(), 4u);
  EXPECT_EQ(given_up[0].sequence, 1u);
  EXPECT_EQ(given_up[0].deliveries, 2u);
  const ConsumerCounts counts = k.take_counts();
  EXPECT_EQ(counts.redelivered, 4u);
  EXPECT_EQ(counts.max_deliveries, 4u);
  EXPECT_EQ(drain(k, 200 * kMs), (std::vector<std::uint64_t>{6, 7, 8, 9}));
}

TEST_F(ConsumerTest, AMembersMessagesGoToAnotherWhenItEndsAndCumulativeAcksTakeAllBefore) {
  proto::ConsumerConfig c;
  c.ack = proto::ConsumerAck::kCumulative;
  c.max_ack_pending = 6;
  Consumer k("k", true, c, *store_);
  k.add_member(member(1));
  k.add_member(member(2));
  EXPECT_EQ(drain(k, 0).size(), 6u);
  ASSERT_TRUE(k.remove_member(1, 1));
  EXPECT_FALSE(k.remove_member(1, 1));
  EXPECT_EQ(drain(k, 0), (std::vector<std::uint64_t>{1, 3, 5})) << "member 1's, round robin had them";
  k.ack(0, 5);
  EXPECT_EQ(k.outstanding(), 1u) << "6 only";
  // Saved and loaded: the unacknowledged one is due again, the position kept.
  ASSERT_TRUE(save_consumer(dir_, "k", k.state(), false));
  std::vector<std::string> problems;
  auto loaded = load_consumers(dir_, problems);
  ASSERT_EQ(loaded.size(), 1u);
  EXPECT_TRUE(problems.empty());
  Consumer back(loaded[0].first, loaded[0].second);
  back.add_member(member(3));
  EXPECT_EQ(drain(back, 0), (std::vector<std::uint64_t>{6, 7, 8, 9, 10}));
}

TEST_F(ConsumerTest, StartPoliciesAndANak) {
  proto::ConsumerConfig c;
  c.start = proto::ConsumerStart::kLastPerSubject;
  Consumer last("l", false, c, *store_);
  last.add_member(member(1));
  EXPECT_EQ(drain(last, 0), (std::vector<std::uint64_t>{9, 10}));
  last.nak(0, 9);
  EXPECT_EQ(drain(last, 0), (std::vector<std::uint64_t>{9}));
  c.start = proto::ConsumerStart::kTime;
  c.start_at = 8 * kMs;
  Consumer since("t", false, c, *store_);
  since.add_member(member(1));
  EXPECT_EQ(drain(since, 0), (std::vector<std::uint64_t>{8, 9, 10}));
}

/// A user that may subscribe to `allow` less `deny` (docs/security.md).
std::shared_ptr<const Identity> reader(std::vector<std::string> allow, std::vector<std::string> deny = {}) {
  auto id = std::make_shared<Identity>();
  id->name = "reader";
  id->permissions.subscribe.allow = std::move(allow);
  id->permissions.subscribe.deny = std::move(deny);
  return id;
}

TEST_F(ConsumerTest, EveryDeliveryPassesTheReadersPermissionsAndWhatNoMemberMayReadIsPassedOver) {
  proto::ConsumerConfig c;
  c.ack = proto::ConsumerAck::kExplicit;
  Consumer k("k", false, c, *store_);
  ConsumerMember evens = member(1);
  evens.reader = reader({">"}, {"odd"});
  k.add_member(evens);
  EXPECT_EQ(drain(k, 0), (std::vector<std::uint64_t>{2, 4, 6, 8, 10}))
      << "the odd subject is denied: never delivered, from the stream or as a redelivery";
  EXPECT_EQ(k.take_counts().denied, 5u);
  EXPECT_EQ(k.unprocessed(*store_), 0u) << "passed over for good, not waiting";

  // Two members of one durable consumer under different users: each message
  // goes to one that may read it, the round robin among those.
  Consumer shared("s", true, c, *store_);
  ConsumerMember odds = member(2);
  odds.reader = reader({"odd"});
  shared.add_member(evens);
  shared.add_member(odds);
  std::vector<std::uint64_t> to_evens, to_odds;
  std::int64_t wait = 0;
  while (auto p = shared.pick(*store_, 0, 1 << 20, &wait)) {
    (p->member == 0 ? to_evens : to_odds).push_back(p->sequence);
    shared.delivered(*p, 40, 0);
  }
  EXPECT_EQ(to_evens, (std::vector<std::uint64_t>{2, 4, 6, 8, 10}));
  EXPECT_EQ(to_odds, (std::vector<std::uint64_t>{1, 3, 5, 7, 9}));
  EXPECT_EQ(shared.take_counts().denied, 0u);

  // New permissions (a reload) apply to what is delivered again: a message
  // the member may no longer read is not redelivered to it.
  shared.member(1).renew(reader({"nothing"}));
  ASSERT_TRUE(shared.remove_member(1, 1));  // the evens' messages are due again
  EXPECT_TRUE(drain(shared, 0).empty()) << "the one member left may read none of them";
  EXPECT_EQ(shared.take_counts().denied, 5u);
}

TEST_F(ConsumerTest, ADurableConsumersOwnerIsSavedWithItsState) {
  proto::ConsumerConfig c;
  Consumer k("k", true, c, *store_, "alice");
  ASSERT_TRUE(save_consumer(dir_, "k", k.state(), false));
  Consumer anonymous("a", true, c, *store_, "");
  ASSERT_TRUE(save_consumer(dir_, "a", anonymous.state(), false));
  std::vector<std::string> problems;
  auto loaded = load_consumers(dir_, problems);
  ASSERT_EQ(loaded.size(), 2u);
  for (auto& [name, state] : loaded) {
    ASSERT_TRUE(state.owner) << name;
    EXPECT_EQ(*state.owner, name == "k" ? "alice" : "") << name;
  }
}

TEST(ConsumerConfig, SettingsTravelWholeAndOutOfRangeOnesAreRefused) {
  proto::ConsumerConfig c;
  c.start = proto::ConsumerStart::kSequence;
  c.start_at = 42;
  c.ack = proto::ConsumerAck::kCumulative;
  c.pull = true;
  c.max_deliver = 3;
  std::array<std::byte, proto::kConsumeConfigLen> bytes{};
  proto::encode_consumer_config(c, bytes);
  EXPECT_EQ(proto::decode_consumer_config(bytes), c);
  auto bad = bytes;
  bad[0] = std::byte{6};  // no such start
  EXPECT_FALSE(proto::decode_consumer_config(bad));
  bad = bytes;
  bad[2] = std::byte{4};  // an undefined flag
  EXPECT_FALSE(proto::decode_consumer_config(bad));
  bad = bytes;
  bad[4] = bad[5] = bad[6] = bad[7] = std::byte{0};  // max_ack_pending 0
  EXPECT_FALSE(proto::decode_consumer_config(bad));
  bad = bytes;
  bad[8] = bad[9] = std::byte{0};  // start_at 0 with start by sequence
  EXPECT_FALSE(proto::decode_consumer_config(bad));
  bad = bytes;
  bad[31] = std::byte{1};  // reserved
  EXPECT_FALSE(proto::decode_consumer_config(bad));
}

}  // namespace
}  // namespace rdmabroker::daemon
