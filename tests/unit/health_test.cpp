// SPDX-License-Identifier: Apache-2.0
// The body of GET /healthz and GET /readyz (daemon/ops/health.hpp): an
// operator reading a failed probe's output learns which check failed and why.
#include <gtest/gtest.h>

#include "ops/health.hpp"

namespace rdmabroker::daemon {
namespace {

TEST(HealthReport, EveryCheckPassingIsOk) {
  HealthReport r{{{"workers", true, "2 worker loops went round within 2 s"}, {"listeners", true, ""}}};
  EXPECT_TRUE(r.ok());
  EXPECT_EQ(render(r, "readyz"),
            "[+]workers ok: 2 worker loops went round within 2 s\n[+]listeners ok\nok\n");
}

TEST(HealthReport, OneFailedCheckFailsTheReportAndSaysWhy) {
  HealthReport r{
      {{"workers", true, "1 worker loop went round within 2 s"}, {"devices", false, "rxe0: port 1 down"}}};
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(render(r, "readyz"),
            "[+]workers ok: 1 worker loop went round within 2 s\n"
            "[-]devices failed: rxe0: port 1 down\n"
            "readyz check failed\n");
}

}  // namespace
}  // namespace rdmabroker::daemon
