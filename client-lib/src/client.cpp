// SPDX-License-Identifier: Apache-2.0
#include <algorithm>
#include <charconv>

#include "client_internal.hpp"
#include "session.hpp"

namespace rdmabroker {

std::vector<std::string> split_urls(std::string_view urls) {
  std::vector<std::string> out;
  while (true) {
    const auto comma = urls.find(',');
    std::string_view one = urls.substr(0, comma);
    while (!one.empty() && one.front() == ' ') one.remove_prefix(1);
    while (!one.empty() && one.back() == ' ') one.remove_suffix(1);
    out.emplace_back(one);
    if (comma == std::string_view::npos) return out;
    urls.remove_prefix(comma + 1);
  }
}

std::vector<std::string> ServerInfo::client_urls() const {
  std::vector<std::string> out;
  auto add = [&](const std::vector<std::string>& urls) {
    for (const auto& u : urls)
      if (std::find(out.begin(), out.end(), u) == out.end()) out.push_back(u);
  };
  add(self.urls);
  for (const auto& p : peers) add(p.urls);
  return out;
}

Result<std::unique_ptr<Client>> Client::connect(std::string_view url, ClientOptions options) {
  if (url.find(',') != std::string_view::npos) {
    // A server list (brokers of one cluster, docs/cluster.md): every URL must
    // be valid; the first that connects serves, and a reconnecting client
    // moves to the next when its broker fails.
    const auto urls = split_urls(url);
    for (const auto& u : urls) {
      if (auto parsed = parse_url(u); !parsed) return parsed.error();
    }
    if (options.reconnect) return connect_reconnecting(url, std::move(options));
    Error last{ErrorKind::kConnectFailed, ""};
    for (const auto& u : urls) {
      auto c = connect(u, options);
      if (c) return c;
      last = c.error();
      if (last.kind == ErrorKind::kAuthenticationFailed || last.kind == ErrorKind::kInvalidArgument) break;
    }
    return Error{last.kind,
                 "no server of '" + std::string(url) + "' could be used; the last said: " + last.message};
  }
  auto parsed = parse_url(url);
  if (!parsed) return parsed.error();
  if (options.reconnect) return connect_reconnecting(url, std::move(options));
  // Credentials in the URL stand in for those of the options.
  if (!parsed->user.empty() || !parsed->token.empty()) {
    options.user = parsed->user;
    options.password = parsed->password;
    options.token = parsed->token;
  }
  if (parsed->scheme == "rdma" || parsed->scheme == "tcp" || parsed->scheme == "tls") {
    auto session = std::make_unique<Session>(std::move(options));
    if (auto st = session->connect(*parsed); !st) return st.error();
    return std::unique_ptr<Client>(std::move(session));
  }
  return Error{ErrorKind::kInvalidArgument, "unsupported scheme '" + parsed->scheme + "' in '" +
                                                std::string(url) + "' (rdma://, tcp:// or tls://)"};
}

}  // namespace rdmabroker
