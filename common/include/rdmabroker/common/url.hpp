// SPDX-License-Identifier: Apache-2.0
// Broker URLs ("scheme://[user:password@|token@]host[:port]"), parsed one
// way for the client library (Client::connect) and the broker's
// configuration (cluster.routes). Header-only.
#pragma once

#include <charconv>
#include <cstdint>
#include <string>
#include <string_view>

#include "rdmabroker/result.hpp"

namespace rdmabroker {

inline constexpr std::uint16_t kDefaultPort = 7470;     // rdma://
inline constexpr std::uint16_t kDefaultTcpPort = 7471;  // tcp://

struct ParsedUrl {
  std::string scheme;  // "rdma", "tcp" or "tls" (TCP with TLS)
  std::string host;
  std::uint16_t port = kDefaultPort;  // the scheme's default when the URL has none
  std::string user;                   // from "user:password@" ...
  std::string password;
  std::string token;  // ... or "token@"
};

/// Parses a broker URL; the error says what is wrong.
inline Result<ParsedUrl> parse_url(std::string_view url) {
  const auto bad = [&](const std::string& why) {
    return Error{ErrorKind::kInvalidArgument,
                 "bad broker URL '" + std::string(url) + "': " + why +
                     " (expected rdma://host[:port], tcp://host[:port] or tls://host[:port])"};
  };
  ParsedUrl out;
  const auto sep = url.find("://");
  if (sep == std::string_view::npos) return bad("no scheme");
  out.scheme = std::string(url.substr(0, sep));
  if (out.scheme == "tcp" || out.scheme == "tls") out.port = kDefaultTcpPort;
  std::string_view rest = url.substr(sep + 3);
  if (!rest.empty() && rest.back() == '/') rest.remove_suffix(1);
  if (const auto at = rest.rfind('@'); at != std::string_view::npos) {
    const std::string_view userinfo = rest.substr(0, at);
    rest.remove_prefix(at + 1);
    if (userinfo.empty()) return bad("empty credentials before '@'");
    if (const auto colon = userinfo.find(':'); colon != std::string_view::npos) {
      out.user = std::string(userinfo.substr(0, colon));
      out.password = std::string(userinfo.substr(colon + 1));
      if (out.user.empty()) return bad("no user name before ':'");
    } else {
      out.token = std::string(userinfo);
    }
  }
  if (rest.empty()) return bad("no host");
  std::string_view host = rest;
  if (rest.front() == '[') {  // [v6]:port
    const auto close = rest.find(']');
    if (close == std::string_view::npos) return bad("unterminated [");
    host = rest.substr(1, close - 1);
    rest = rest.substr(close + 1);
    if (!rest.empty() && rest.front() != ':') return bad("junk after ]");
    if (!rest.empty())
      rest.remove_prefix(1);
    else
      rest = {};
  } else if (const auto colon = rest.rfind(':'); colon != std::string_view::npos) {
    host = rest.substr(0, colon);
    rest = rest.substr(colon + 1);
  } else {
    rest = {};
  }
  if (host.empty()) return bad("no host");
  out.host = std::string(host);
  if (!rest.empty()) {
    unsigned port = 0;
    auto [p, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), port);
    if (ec != std::errc{} || p != rest.data() + rest.size() || port == 0 || port > 65535)
      return bad("bad port");
    out.port = static_cast<std::uint16_t>(port);
  }
  return out;
}

}  // namespace rdmabroker
