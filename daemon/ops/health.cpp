// SPDX-License-Identifier: Apache-2.0
#include "ops/health.hpp"

namespace rdmabroker::daemon {

std::string render(const HealthReport& report, std::string_view endpoint) {
  std::string body;
  for (const auto& c : report.checks) {
    body += (c.ok ? "[+]" : "[-]") + c.name + (c.ok ? " ok" : " failed");
    if (!c.detail.empty()) body += ": " + c.detail;
    body += '\n';
  }
  body += report.ok() ? std::string("ok\n") : std::string(endpoint) + " check failed\n";
  return body;
}

}  // namespace rdmabroker::daemon
