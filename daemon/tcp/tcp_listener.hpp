// SPDX-License-Identifier: Apache-2.0
// The TCP listening socket (SPEC.md §1.2). One socket for the broker, watched
// by every worker's epoll with EPOLLEXCLUSIVE: the kernel wakes one worker per
// incoming connection, which accepts it and owns it from then on.
#pragma once

#include <cstdint>
#include <string>

#include "rdmabroker/common/fd.hpp"
#include "tcp/tls_context.hpp"
#include "rdmabroker/result.hpp"

namespace rdmabroker::daemon {

/// The broker's listening sockets a worker watches (-1: none): the clients'
/// (listen.tcp) and the routes' (cluster.listen_tcp).
struct TcpListeners {
  int clients = -1;
  int routes = -1;
  const TlsHolder* tls = nullptr;  // the clients' listener's TLS (null: none); routes are plain TCP
  bool any() const { return clients >= 0 || routes >= 0; }
};

/// Binds and listens on address:port (non-blocking, SO_REUSEADDR); the error
/// names the address.
Result<UniqueFd> listen_tcp(const std::string& address, std::uint16_t port);

/// "a.b.c.d:port" of a connected socket's peer.
std::string tcp_peer_address(int fd);

}  // namespace rdmabroker::daemon
