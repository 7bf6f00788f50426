// SPDX-License-Identifier: Apache-2.0
// `rdmabroker stat`'s rates: the change of the counters over the sampled window.
#include <gtest/gtest.h>

#include "ops/rate_meter.hpp"

namespace rdmabroker::daemon {
namespace {

TEST(RateMeter, RatesAreTheChangeOverTheWindow) {
  RateMeter m;
  const auto t0 = RateMeter::Clock::time_point{} + std::chrono::hours(1);
  StatsSnapshot s{{"messages.in", 0}, {"messages.delivered", 0}, {"bytes.in", 0}, {"bytes.out", 0}};
  StatsSnapshot out;
  m.sample(s, t0);
  m.add_rates(out);
  EXPECT_EQ(out["rates.messages_in_per_s"], 0);  // one sample: no rate yet
  for (int i = 1; i <= 10; ++i) {
    s["messages.in"] = 1000 * i;
    s["messages.delivered"] = 3000 * i;  // fan-out of 3
    s["bytes.in"] = 64000 * i;
    s["bytes.out"] = 192000 * i;
    m.sample(s, t0 + std::chrono::seconds(i));
    m.sample(s, t0 + std::chrono::seconds(i) + std::chrono::milliseconds(100));  // too soon: ignored
  }
  m.add_rates(out);
  EXPECT_EQ(out["rates.messages_in_per_s"], 1000);
  EXPECT_EQ(out["rates.messages_out_per_s"], 3000);
  EXPECT_EQ(out["rates.bytes_in_per_s"], 64000);
  EXPECT_EQ(out["rates.bytes_out_per_s"], 192000);
  // Traffic stops: the rate falls to zero once the window holds only idle samples.
  for (int i = 11; i <= 17; ++i) m.sample(s, t0 + std::chrono::seconds(i));
  m.add_rates(out);
  EXPECT_EQ(out["rates.messages_in_per_s"], 0);
}

}  // namespace
}  // namespace rdmabroker::daemon
