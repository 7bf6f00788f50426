// SPDX-License-Identifier: Apache-2.0
// Log lines a client can cause at will are throttled per kind, and the next
// line says how many were left out (broker/log_throttle.hpp).
#include "broker/log_throttle.hpp"

#include <gtest/gtest.h>

#include <thread>

namespace rdmabroker::daemon {
namespace {

using namespace std::chrono_literals;

TEST(LogThrottle, AllowsABurstPerPeriodThenSaysHowManyItLeftOut) {
  LogThrottle throttle(3, std::chrono::seconds(1));
  std::uint64_t suppressed = 99;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(throttle.allow(suppressed));
    EXPECT_EQ(suppressed, 0u);
  }
  for (int i = 0; i < 7; ++i) EXPECT_FALSE(throttle.allow(suppressed));
  std::this_thread::sleep_for(1100ms);  // the next period
  ASSERT_TRUE(throttle.allow(suppressed));
  EXPECT_EQ(suppressed, 7u);  // the line that is logged names the seven left out
  ASSERT_TRUE(throttle.allow(suppressed));
  EXPECT_EQ(suppressed, 0u);
}

}  // namespace
}  // namespace rdmabroker::daemon
