#include <gtest/gtest.h>

#include "broker/subscription_index.hpp"

namespace rdmabroker::daemon {
namespace {

TEST(SubscriptionIndex, ExactSubjectRouting) {
  SubscriptionIndex idx;
  idx.add("a.b", {0, 1, 10});
  idx.add("a.b", {1, 2, 20});
  idx.add("a.c", {0, 1, 11});
  std::vector<Subscriber> out;
  idx.match("a.b", out);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0], (Subscriber{0, 1, 10}));
  EXPECT_EQ(out[1], (Subscriber{1, 2, 20}));
  idx.match("a", out);
  EXPECT_TRUE(out.empty());
  idx.match("a.b.c", out);
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(idx.size(), 3u);
}

TEST(SubscriptionIndex, RemoveIsExactAndCleansUp) {
  SubscriptionIndex idx;
  idx.add("x", {0, 1, 1});
  EXPECT_FALSE(idx.remove("x", {0, 1, 2}));
  EXPECT_FALSE(idx.remove("y", {0, 1, 1}));
  EXPECT_TRUE(idx.remove("x", {0, 1, 1}));
  EXPECT_FALSE(idx.remove("x", {0, 1, 1}));
  std::vector<Subscriber> out{{9, 9, 9}};
  idx.match("x", out);
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(idx.size(), 0u);
}

}  // namespace
}  // namespace rdmabroker::daemon
