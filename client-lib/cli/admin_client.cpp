// SPDX-License-Identifier: Apache-2.0
#include "admin_client.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "rdmabroker/common/fd.hpp"

namespace rdmabroker::cli {

Result<std::string> admin_request(const std::string& socket_path, const std::string& command) {
  sockaddr_un addr{};
  if (socket_path.size() >= sizeof addr.sun_path)
    return Error{ErrorKind::kInvalidArgument, "socket path too long"};
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) return Error{ErrorKind::kResource, std::string("socket: ") + std::strerror(errno)};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, socket_path.c_str(), socket_path.size() + 1);
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    return Error{ErrorKind::kConnectFailed, "cannot reach the broker's admin socket " + socket_path + ": " +
                                                std::strerror(errno) +
                                                " (is rdmabrokerd running with --admin-socket?)"};
  }
  const std::string line = command + "\n";
  if (::send(fd.get(), line.data(), line.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(line.size())) {
    return Error{ErrorKind::kClosed, std::string("admin socket write: ") + std::strerror(errno)};
  }
  std::string reply;
  char buf[4096];
  while (true) {
    pollfd p{fd.get(), POLLIN, 0};
    if (::poll(&p, 1, 5000) <= 0) return Error{ErrorKind::kTimeout, "the broker did not answer within 5 s"};
    const ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0) return Error{ErrorKind::kClosed, std::string("admin socket read: ") + std::strerror(errno)};
    if (n == 0) break;
    reply.append(buf, static_cast<std::size_t>(n));
  }
  while (!reply.empty() && reply.back() == '\n') reply.pop_back();
  return reply;
}

Result<nlohmann::json> admin_command(const std::string& socket_path, const std::string& command) {
  auto reply = admin_request(socket_path, command);
  if (!reply) return reply.error();
  auto doc = nlohmann::json::parse(reply.value(), nullptr, false);
  if (doc.is_discarded() || !doc.is_object())
    return Error{ErrorKind::kBrokerError, "bad reply from the broker: " + reply.value()};
  return doc;
}

Result<std::string> request_reload(const std::string& socket_path) {
  auto r = admin_command(socket_path, "reload");
  if (!r) return r.error();
  if (!r.value().value("ok", false))
    return Error{ErrorKind::kBrokerError, r.value().value("error", "reload failed")};
  return r.value().value("message", "reloaded");
}

}  // namespace rdmabroker::cli
