// SPDX-License-Identifier: Apache-2.0
#include "ops/admin_server.hpp"

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace rdmabroker::daemon {

AdminServer::~AdminServer() {
  if (server_) ::unlink(path_.c_str());
}

Status AdminServer::open() {
  sockaddr_un addr{};
  if (path_.size() >= sizeof addr.sun_path) {
    return Error{ErrorKind::kInvalidArgument, "admin socket path too long: " + path_};
  }
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd) return Error{ErrorKind::kResource, std::string("admin socket: ") + std::strerror(errno)};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path_.c_str(), path_.size() + 1);
  ::unlink(path_.c_str());  // a stale socket from a previous run
  if (auto st = check_directory(); !st) return st;
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::chmod(path_.c_str(), 0660) != 0 || ::listen(fd.get(), 64) != 0) {
    return Error{ErrorKind::kResource, "admin socket " + path_ + ": " + std::strerror(errno)};
  }
  // Whoever may connect may reload the broker and manage its streams: the
  // owner and its group only, checked, not assumed (docs/security.md).
  struct stat sock {};
  if (::stat(path_.c_str(), &sock) != 0 || (sock.st_mode & 0007) != 0) {
    return Error{ErrorKind::kResource,
                 "admin socket " + path_ + " is open to other users; refusing to serve it"};
  }
  PolledServer::Protocol p;
  p.name = "admin";
  p.max_request = kMaxLine;
  p.max_clients = kMaxClients;
  p.deadline = kClientDeadline;
  p.answer = [this](const std::string& in) { return answer(in); };
  p.too_long = [] { return too_long_reply(); };
  p.busy = [] { return error_reply("too many admin clients at once; try again"); };
  server_ = std::make_unique<PolledServer>(std::move(fd), std::move(p));
  return {};
}

Status AdminServer::check_directory() const {
  // In a directory every user may write to, another user could put their own
  // socket in its place: only one whose entries are its owner's (or sticky).
  const auto slash = path_.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path_.substr(0, slash);
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    return Error{ErrorKind::kResource, "admin socket directory " + dir + ": " + std::strerror(errno)};
  }
  if ((st.st_mode & S_IWOTH) != 0 && (st.st_mode & S_ISVTX) == 0) {
    return Error{ErrorKind::kResource, "admin socket directory " + dir +
                                           " is writable by every user (and not sticky): refusing to serve "
                                           "the admin socket there"};
  }
  return {};
}

std::optional<std::string> AdminServer::answer(const std::string& in) const {
  const auto nl = in.find('\n');
  if (nl == std::string::npos) return std::nullopt;
  if (nl > kMaxLine) return too_long_reply();
  const std::string command = in.substr(0, nl);
  // A command is text: anything else is refused before the handler sees it.
  const bool printable = std::all_of(command.begin(), command.end(), [](char ch) {
    return static_cast<unsigned char>(ch) >= 0x20 && static_cast<unsigned char>(ch) < 0x7f;
  });
  return printable ? handler_(command) + "\n" : error_reply("a command is one line of printable ASCII");
}

std::string AdminServer::too_long_reply() {
  return error_reply("command longer than " + std::to_string(kMaxLine) + " bytes");
}

std::string AdminServer::error_reply(const std::string& message) {
  return nlohmann::json{{"ok", false}, {"error", message}}.dump() + "\n";
}

}  // namespace rdmabroker::daemon
