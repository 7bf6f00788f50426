// SPDX-License-Identifier: Apache-2.0
// Health for orchestrators and load balancers, as the server judges it:
// liveness is only what a restart can fix (every worker loop went round
// lately, the same test as the systemd watchdog's); readiness adds what a
// restart cannot fix but clients should avoid (the listeners are open and
// every RDMA device the broker serves has an active port). ops/health.hpp
// renders it for GET /healthz and GET /readyz.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

namespace rdmabroker::daemon {

struct HealthCheck {
  std::string name;  // "workers", "listeners", "devices"
  bool ok = false;
  std::string detail;  // what was seen, for an operator reading the probe's output
};

struct HealthReport {
  std::vector<HealthCheck> checks;
  bool ok() const {
    return std::all_of(checks.begin(), checks.end(), [](const HealthCheck& c) { return c.ok; });
  }
};

}  // namespace rdmabroker::daemon
