// SPDX-License-Identifier: Apache-2.0
// When the broker gives freed heap back to the system (ops/memory_trim.hpp):
// after a burst of connections leaves, after a steady churn (at most every
// third call), after queued bytes drain; never while nothing changes.
#include "ops/memory_trim.hpp"

#include <gtest/gtest.h>

namespace rdmabroker::daemon {
namespace {

TEST(MemoryTrimmer, ABurstThatLeavesIsTrimmedOnceAndNothingElseIs) {
  MemoryTrimmer t;
  EXPECT_FALSE(t.observe(0, 0, 0));
  EXPECT_FALSE(t.observe(100, 0, 0));
  EXPECT_FALSE(t.observe(50, 50, 0)) << "50 of a peak of 100 left: not yet worth one";
  EXPECT_TRUE(t.observe(10, 90, 0)) << "90 of a peak of 100 left";
  for (int i = 0; i < 10; ++i) EXPECT_FALSE(t.observe(10, 90, 0)) << "nothing changed since";
  EXPECT_EQ(t.trims(), 1u);
}

TEST(MemoryTrimmer, ChurnTrimsAtMostEveryThirdCallAndADrainedQueueAtOnce) {
  MemoryTrimmer t;
  // One connection at a time: 64 closed, but only from the third call.
  EXPECT_FALSE(t.observe(1, 64, 0));
  EXPECT_FALSE(t.observe(1, 64, 0));
  EXPECT_TRUE(t.observe(1, 64, 0));
  EXPECT_FALSE(t.observe(1, 100, 0)) << "36 more closed: not worth one";
  EXPECT_FALSE(t.observe(1, 127, 0));
  EXPECT_TRUE(t.observe(1, 128, 0)) << "64 more closed";
  // 16 MiB of queued messages dropped: at once.
  EXPECT_FALSE(t.observe(1, 128, std::int64_t{20} << 20));
  EXPECT_TRUE(t.observe(1, 128, std::int64_t{4} << 20));
  EXPECT_EQ(t.trims(), 3u);
}

}  // namespace
}  // namespace rdmabroker::daemon
