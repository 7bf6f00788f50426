// Internal to librdmabroker: URL parsing and the transport constructors.
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>
#include <string_view>

#include "rdmabroker/client.hpp"

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

/// An error of `kind` for a failed system call, with errno's text.
inline Error sys_error(ErrorKind kind, const std::string& what) {
  return Error{kind, what + ": " + std::strerror(errno)};
}

/// Parses "scheme://[user:password@|token@]host[:port]"; the error says what is wrong.
Result<ParsedUrl> parse_url(std::string_view url);
/// A server list ("rdma://a:7470,rdma://b:7470"): its URLs in order; one URL alone is a list of one.
std::vector<std::string> split_urls(std::string_view urls);

Result<std::unique_ptr<Client>> connect_rdma(const ParsedUrl& url, ClientOptions options);
Result<std::unique_ptr<Client>> connect_tcp(const ParsedUrl& url, ClientOptions options);
/// ClientOptions::reconnect: a client that reconnects (reconnecting_client.cpp).
Result<std::unique_ptr<Client>> connect_reconnecting(std::string_view url, ClientOptions options);

}  // namespace rdmabroker
