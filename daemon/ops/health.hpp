// SPDX-License-Identifier: Apache-2.0
// The health endpoints' bodies, served on the metrics listener: GET /healthz
// (live: restart me if not) and GET /readyz (ready: send me clients), in
// the style of Kubernetes' own /readyz?verbose ("[+]name ok", "[-]name
// failed: why"). What is checked: broker/health.hpp.
#pragma once

#include <string>
#include <string_view>

#include "broker/health.hpp"

namespace rdmabroker::daemon {

/// The endpoint's body: a line per check, then "ok" or "<endpoint> check
/// failed" (`endpoint` is "healthz" or "readyz").
std::string render(const HealthReport& report, std::string_view endpoint);

}  // namespace rdmabroker::daemon
