// SPDX-License-Identifier: Apache-2.0
// Broker URLs ("scheme://[user:password@|token@]host[:port]"), parsed one
// way for the client library (Client::connect) and the broker's
// configuration (cluster.routes). common/src/url.cpp parses them.
#pragma once

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

/// Parses a broker URL (RFC 3986, with liburiparser): user, password and
/// token are percent-decoded ("p%3Ass" is "p:ss"); an '@' left raw in a
/// password is taken as the password's, the last '@' ending the credentials.
/// The error says what is wrong.
Result<ParsedUrl> parse_url(std::string_view url);

}  // namespace rdmabroker
