// SPDX-License-Identifier: Apache-2.0
#include "tcp/tcp_listener.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <memory>

namespace rdmabroker::daemon {

Result<UniqueFd> listen_tcp(const std::string& address, std::uint16_t port) {
  const std::string where = "tcp://" + address + ":" + std::to_string(port);
  addrinfo hints{};
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (int rc = getaddrinfo(address.c_str(), std::to_string(port).c_str(), &hints, &res); rc != 0) {
    return Error{ErrorKind::kInvalidArgument, "listen address " + where + ": " + gai_strerror(rc)};
  }
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> owner(res, freeaddrinfo);
  auto fail = [&](const char* what) {
    return Error{ErrorKind::kResource, std::string(what) + " for " + where + ": " + std::strerror(errno)};
  };
  UniqueFd fd(::socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) return fail("socket");
  const int one = 1;
  if (::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0) return fail("SO_REUSEADDR");
  if (::bind(fd.get(), res->ai_addr, res->ai_addrlen) != 0) return fail("bind");
  if (::listen(fd.get(), 1024) != 0) return fail("listen");
  return fd;
}

std::string tcp_peer_address(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "?";
  char host[INET6_ADDRSTRLEN] = "?";
  std::uint16_t port = 0;
  if (ss.ss_family == AF_INET) {
    const auto* sa = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &sa->sin_addr, host, sizeof host);
    port = ntohs(sa->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    const auto* sa = reinterpret_cast<const sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &sa->sin6_addr, host, sizeof host);
    port = ntohs(sa->sin6_port);
  }
  return std::string(host) + ":" + std::to_string(port);
}

}  // namespace rdmabroker::daemon
