// SPDX-License-Identifier: Apache-2.0
// The interest the routes carry to the other brokers (broker/cluster_interest.hpp):
// an entry is announced only once a subscription of it is in the index
// (activate()), so a message another broker sends for it finds it; and
// "in effect up to N" never covers an entry the routes have not seen.
#include <gtest/gtest.h>

#include <algorithm>

#include "broker/cluster_interest.hpp"

namespace rdmabroker::daemon {
namespace {

bool has(const ClusterInterest::Snapshot& s, std::uint32_t id) {
  return std::any_of(s.entries.begin(), s.entries.end(), [&](const auto& e) { return e.id == id; });
}

TEST(ClusterInterest, AnEntryIsAnnouncedOnlyOnceItsSubscriptionIsInPlace) {
  ClusterInterest interest;
  int notified = 0;
  interest.on_change([&] { ++notified; });
  const std::uint32_t orders = interest.acquire("orders.>", "");
  EXPECT_EQ(notified, 0) << "announced before the subscription is in the index";
  auto before = interest.snapshot();
  EXPECT_FALSE(has(before, orders));
  EXPECT_LT(before.through, orders) << "'in effect' would cover an entry no route has seen";

  interest.activate(orders);
  EXPECT_EQ(notified, 1);
  auto after = interest.snapshot();
  EXPECT_TRUE(has(after, orders));
  EXPECT_GE(after.through, orders);

  // A second subscription of the same entry, and activating it again, change nothing.
  EXPECT_EQ(interest.acquire("orders.>", ""), orders);
  interest.activate(orders);
  EXPECT_EQ(notified, 1);

  // A pending entry holds `through` below it while later ones are active.
  const std::uint32_t pending = interest.acquire("ticks.>", "");
  const std::uint32_t later = interest.acquire("jobs", "workers");
  interest.activate(later);
  auto mixed = interest.snapshot();
  EXPECT_TRUE(has(mixed, later));
  EXPECT_FALSE(has(mixed, pending));
  EXPECT_EQ(mixed.through, pending - 1);

  // Released before it was active: gone without a word to the routes.
  const int before_release = notified;
  interest.release(pending);
  EXPECT_EQ(interest.snapshot().through, later);
  EXPECT_EQ(notified, before_release);
  interest.release(later);
  EXPECT_EQ(notified, before_release + 1) << "an announced entry's end is news to the routes";
}

}  // namespace
}  // namespace rdmabroker::daemon
