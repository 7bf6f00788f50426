// SPDX-License-Identifier: Apache-2.0
// Health for orchestrators and load balancers, served on the metrics
// listener: GET /healthz (live: restart me if not) and GET /readyz (ready:
// send me clients). Liveness is only what a restart can fix: every worker
// loop went round lately (the same test as the systemd watchdog's).
// Readiness adds what a restart cannot fix but clients should avoid:
// the listeners are open and every RDMA device the broker serves has an
// active port. The body says which check failed and why, in the style of
// Kubernetes' own /readyz?verbose ("[+]name ok", "[-]name failed: why").
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace rdmabroker::daemon {

struct HealthCheck {
  std::string name;  // "workers", "listeners", "devices"
  bool ok = false;
  std::string detail;  // what was seen, for an operator reading the probe's output
};

struct HealthReport {
  std::vector<HealthCheck> checks;
  bool ok() const;
};

/// The endpoint's body: a line per check, then "ok" or "<endpoint> check
/// failed" (`endpoint` is "healthz" or "readyz").
std::string render(const HealthReport& report, std::string_view endpoint);

}  // namespace rdmabroker::daemon
