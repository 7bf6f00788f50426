#include "ops/admin_server.hpp"

#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include <cerrno>
#include <cstring>

namespace rdmabroker::daemon {

AdminServer::~AdminServer() {
  if (listen_) ::unlink(path_.c_str());
}

Status AdminServer::open() {
  sockaddr_un addr{};
  if (path_.size() >= sizeof addr.sun_path) {
    return Error{ErrorKind::kInvalidArgument, "admin socket path too long: " + path_};
  }
  listen_.reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!listen_) return Error{ErrorKind::kResource, std::string("admin socket: ") + std::strerror(errno)};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path_.c_str(), path_.size() + 1);
  ::unlink(path_.c_str());  // a stale socket from a previous run
  if (::bind(listen_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::chmod(path_.c_str(), 0660) != 0 || ::listen(listen_.get(), 16) != 0) {
    const int err = errno;
    listen_.reset();
    return Error{ErrorKind::kResource, "admin socket " + path_ + ": " + std::strerror(err)};
  }
  return {};
}

void AdminServer::serve_one() {
  UniqueFd client(::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC));
  if (!client) return;
  // A local client gets one second to send its line: a stuck one cannot hold
  // the main thread (signals) for long.
  std::string line;
  char buf[256];
  while (line.find('\n') == std::string::npos && line.size() < 4096) {
    pollfd p{client.get(), POLLIN, 0};
    if (::poll(&p, 1, 1000) <= 0) break;
    const ssize_t n = ::read(client.get(), buf, sizeof buf);
    if (n <= 0) break;
    line.append(buf, static_cast<std::size_t>(n));
  }
  if (auto nl = line.find('\n'); nl != std::string::npos) line.resize(nl);
  std::string reply = handler_(line) + "\n";
  std::size_t off = 0;
  while (off < reply.size()) {
    const ssize_t n = ::send(client.get(), reply.data() + off, reply.size() - off, MSG_NOSIGNAL);
    if (n <= 0) break;
    off += static_cast<std::size_t>(n);
  }
}

}  // namespace rdmabroker::daemon
