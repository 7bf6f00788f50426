// SPDX-License-Identifier: Apache-2.0
// The rules that tie settings together (rules.hpp): each names the key at
// fault and says what would make it right.
#include "rules.hpp"

#include <algorithm>
#include <cctype>
#include <string>

#include "rdmabroker/proto/info.hpp"
#include "rdmabroker/proto/wire.hpp"

namespace rdmabroker::config {

namespace {

bool valid_cluster_name(std::string_view name) {
  if (name.empty() || name.size() > 255) return false;
  return std::all_of(name.begin(), name.end(), [](char ch) {
    return std::isalnum(static_cast<unsigned char>(ch)) != 0 || ch == '-' || ch == '_' || ch == '.';
  });
}

/// cluster.*: a name, credentials and listeners of its own for routes, and
/// announced URLs that fit a route login.
void check_cluster_rules(const BrokerOptions& b, const RuleReport& report) {
  const auto& cl = b.cluster;
  if (!cl.name.empty() && !valid_cluster_name(cl.name)) {
    report("cluster.name",
           "'" + cl.name + "' is not a name: 1..255 of letters, digits, '-', '_' and '.', no spaces");
  }
  if (!cl.routes.empty() && cl.name.empty()) report("cluster.routes", "routes need cluster.name");
  if (!cl.advertise.empty() && cl.name.empty())
    report("cluster.advertise", "announcing routes needs cluster.name");
  if (!cl.client_advertise.empty() && cl.name.empty())
    report("cluster.client_advertise", "announcing to clients needs cluster.name");
  // They travel in the route login's second string (SPEC.md §8): the id,
  // then each after a comma, within the subject rules of §3.2.
  const std::string login = proto::route_login_name(std::string(16, '0'), cl.advertise);
  if (login.size() > proto::kMaxSubjectLen) {
    report("cluster.advertise", "the route URLs take " + std::to_string(login.size() - 16) +
                                    " bytes in a route login, which has room for " +
                                    std::to_string(proto::kMaxSubjectLen - 16) +
                                    " (with the commas): announce fewer");
  } else if (!proto::valid_subject(login)) {
    report("cluster.advertise",
           "a route login carries these URLs as a subject (SPEC.md §3.2): no empty token between dots, no "
           "'*' or '>'");
  }
  if (cl.has_route_listener() && cl.name.empty())
    report(cl.listen_rdma_port != 0 ? "cluster.listen_rdma" : "cluster.listen_tcp",
           "a route listener needs cluster.name");
  // One port cannot serve both: the client listener of the same transport.
  if (cl.listen_rdma_port != 0 && cl.listen_rdma_port == b.port)
    report("cluster.listen_rdma",
           "port " + std::to_string(b.port) + " is listen.rdma's: routes need a port of their own");
  if (cl.listen_tcp_port != 0 && cl.listen_tcp_port == b.tcp_port)
    report("cluster.listen_tcp",
           "port " + std::to_string(b.tcp_port) + " is listen.tcp's: routes need a port of their own");
  if (!cl.name.empty() && (cl.user.empty() || cl.password.empty())) {
    report(cl.user.empty() ? "cluster.user" : "cluster.password",
           "a cluster's routes are authenticated: set cluster.user and cluster.password");
  }
}

}  // namespace

void check_rules(const Config& c, const RuleReport& report) {
  const auto& b = c.broker;
  if (b.buffer_size % 64 != 0) report("buffers.size", "must be a multiple of 64");
  if (b.max_pending_bytes < 4ull * b.buffer_size) {
    report("limits.max_pending_bytes",
           "must be at least 4 buffers (" + std::to_string(4ull * b.buffer_size) + " bytes)");
  }
  if (b.rdma == RdmaMode::kOff && b.tcp_port == 0) {
    report("rdma", "RDMA is off and listen.tcp is empty: nothing to listen on");
  }
  if (b.max_unauthenticated > b.max_connections) {
    report("limits.max_unauthenticated",
           "must not exceed limits.max_connections (" + std::to_string(b.max_connections) + ")");
  }
  if (b.auth.failure_delay_max_ms < b.auth.failure_delay_ms) {
    report("auth.failure_delay_max_ms",
           "must be at least auth.failure_delay_ms (" + std::to_string(b.auth.failure_delay_ms) + ")");
  }
  if (b.multicast.leave_below > b.multicast.threshold) {
    report("multicast.leave_below", "must not exceed multicast.threshold (" +
                                        std::to_string(b.multicast.threshold) +
                                        "): a subject would leave its group as soon as it joined");
  }
  if (b.max_pending_bytes_total < b.max_pending_bytes) {
    report("limits.max_pending_bytes_total", "must be at least limits.max_pending_bytes (" +
                                                 std::to_string(b.max_pending_bytes) +
                                                 "): one subscriber may queue that much");
  }
  if (b.tls.mode != TlsMode::kOff) {
    if (b.tls.certificate.empty())
      report("tls.certificate",
             "tls.mode is " + std::string(to_string(b.tls.mode)) + ": a certificate is needed");
    if (b.tls.key.empty())
      report("tls.key", "tls.mode is " + std::string(to_string(b.tls.mode)) + ": a private key is needed");
    if (b.tcp_port == 0) report("tls.mode", "TLS is served on the TCP listener, and listen.tcp is empty");
  }
  for (const auto& u : b.auth.users) {
    if (u.certificate && b.tls.client_ca.empty()) {
      report("auth.users",
             "user '" + u.name +
                 "' logs in with a client certificate, which needs tls.client_ca (and tls.mode)");
      break;
    }
  }
  check_cluster_rules(b, report);
  if (!c.metrics_listen.empty()) {
    if (auto hp = parse_host_port(c.metrics_listen, "metrics.listen"); !hp) {
      report("metrics.listen", hp.error().message);
    }
  }
}

}  // namespace rdmabroker::config
