// SPDX-License-Identifier: Apache-2.0
// The admin command `fault`'s arguments (daemon/fault/fault.hpp): what a test
// may arm, and the clear refusal of anything else. Parsing is built in every
// tree; arming needs a fault-injection build.
#include <gtest/gtest.h>

#include "fault/fault.hpp"

namespace rdmabroker::daemon::fault {
namespace {

TEST(FaultSpec, ParsesEveryFault) {
  auto wc = parse("wc-error 42");
  ASSERT_TRUE(wc);
  EXPECT_EQ(wc.value().kind, Kind::kWcError);
  EXPECT_EQ(wc.value().connection, 42u);
  auto qp = parse(" qp-error  7 ");
  ASSERT_TRUE(qp);
  EXPECT_EQ(qp.value().kind, Kind::kQpError);
  EXPECT_EQ(qp.value().connection, 7u);
  auto dup = parse("cm-duplicate 3");
  ASSERT_TRUE(dup);
  EXPECT_EQ(dup.value().kind, Kind::kCmDuplicate);
  EXPECT_EQ(dup.value().count, 3u);
  auto late = parse("cm-delay 250 2");
  ASSERT_TRUE(late);
  EXPECT_EQ(late.value().kind, Kind::kCmDelay);
  EXPECT_EQ(late.value().delay_ms, 250u);
  EXPECT_EQ(late.value().count, 2u);
  EXPECT_EQ(parse("pool-exhaust").value().kind, Kind::kPoolExhaust);
  EXPECT_EQ(parse("pool-release").value().kind, Kind::kPoolRelease);
  auto stall = parse("worker-stall 3000");
  ASSERT_TRUE(stall);
  EXPECT_EQ(stall.value().kind, Kind::kWorkerStall);
  EXPECT_EQ(stall.value().delay_ms, 3000u);
  auto route = parse("route-stall 500");
  ASSERT_TRUE(route);
  EXPECT_EQ(route.value().kind, Kind::kRouteStall);
  EXPECT_EQ(route.value().delay_ms, 500u);
  auto sync = parse("sync-fail 3");
  ASSERT_TRUE(sync);
  EXPECT_EQ(sync.value().kind, Kind::kSyncFail);
  EXPECT_EQ(sync.value().count, 3u);
}

TEST(FaultSpec, RefusesAnythingElseSayingWhy) {
  for (const char* bad :
       {"", "bogus", "wc-error", "wc-error x", "wc-error 1 2", "qp-error -1", "cm-duplicate 0", "cm-delay 10",
        "cm-delay ten 1", "pool-exhaust now", "pool-release 1", "worker-stall", "worker-stall 0",
        "worker-stall 1 2", "route-stall", "route-stall 0", "sync-fail", "sync-fail 0", "sync-fail x"}) {
    auto r = parse(bad);
    ASSERT_FALSE(r) << "'" << bad << "' was accepted";
    EXPECT_EQ(r.error().kind, ErrorKind::kInvalidArgument);
    EXPECT_NE(r.error().message.find("usage: fault"), std::string::npos) << r.error().message;
  }
  EXPECT_NE(parse("bogus").error().message.find("unknown fault 'bogus'"), std::string::npos);
}

TEST(FaultSpec, TakeCountsDown) {
  Shared s;
  s.cm_duplicates = 2;
  EXPECT_TRUE(Shared::take(s.cm_duplicates));
  EXPECT_TRUE(Shared::take(s.cm_duplicates));
  EXPECT_FALSE(Shared::take(s.cm_duplicates));
  EXPECT_EQ(s.cm_duplicates.load(), 0u);
}

}  // namespace
}  // namespace rdmabroker::daemon::fault
