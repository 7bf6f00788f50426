// SPDX-License-Identifier: Apache-2.0
// Addresses in settings (config.hpp): host:port pairs and the URLs a
// cluster dials or announces.
#include <charconv>
#include <string>

#include "rdmabroker/common/url.hpp"
#include "rdmabroker/config/config.hpp"

namespace rdmabroker::config {

// Routes get no TLS: they run inside the cluster's network (docs/cluster.md).
std::optional<std::string> check_cluster_url(const std::string& url, bool for_routes) {
  const auto sep = url.find("://");
  const std::string scheme = sep == std::string::npos ? std::string() : url.substr(0, sep);
  if (scheme != "rdma" && scheme != "tcp" && (for_routes || scheme != "tls")) {
    return for_routes ? "expected rdma://host[:port] or tcp://host[:port], got '" + url + "'"
                      : "expected rdma://, tcp:// or tls://host[:port], got '" + url + "'";
  }
  auto parsed = parse_url(url);
  if (!parsed) return parsed.error().message;
  if (!parsed->user.empty() || !parsed->token.empty()) {
    return "'" + url + "': no credentials in " +
           (for_routes ? "a route URL (cluster.user and cluster.password are used)" : "an announced URL");
  }
  return std::nullopt;
}

Result<HostPort> parse_host_port(std::string_view text, std::string_view what) {
  auto bad = [&](const std::string& why) {
    return Error{ErrorKind::kInvalidArgument, std::string(what) + " '" + std::string(text) + "': " + why +
                                                  " (expected host:port, e.g. 0.0.0.0:7470 or [::]:7470)"};
  };
  const auto colon = text.rfind(':');
  if (colon == std::string_view::npos || colon == 0) return bad("no port");
  std::string_view host = text.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  const std::string_view port = text.substr(colon + 1);
  unsigned v = 0;
  auto [p, ec] = std::from_chars(port.data(), port.data() + port.size(), v);
  if (ec != std::errc{} || p != port.data() + port.size() || v == 0 || v > 65535) return bad("bad port");
  return HostPort{std::string(host), static_cast<std::uint16_t>(v)};
}

}  // namespace rdmabroker::config
