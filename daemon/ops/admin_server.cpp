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
      ::chmod(path_.c_str(), 0660) != 0 || ::listen(listen_.get(), 64) != 0) {
    const int err = errno;
    listen_.reset();
    return Error{ErrorKind::kResource, "admin socket " + path_ + ": " + std::strerror(err)};
  }
  return {};
}

void AdminServer::add_poll_fds(std::vector<pollfd>& fds) const {
  fds.push_back({listen_.get(), POLLIN, 0});
  for (const auto& c : clients_) fds.push_back({c.fd.get(), static_cast<short>(c.out.empty() ? POLLIN : POLLOUT), 0});
}

int AdminServer::timeout_ms(int idle) const {
  if (clients_.empty()) return idle;
  auto next = clients_.front().deadline;
  for (const auto& c : clients_) next = std::min(next, c.deadline);
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(next - std::chrono::steady_clock::now());
  return static_cast<int>(std::clamp<std::int64_t>(left.count() + 1, 0, idle));
}

void AdminServer::on_poll(const pollfd* ready, std::size_t count) {
  // ready[1..] are the clients as add_poll_fds() listed them: serve those
  // first, before accepting changes the list.
  const auto now = std::chrono::steady_clock::now();
  std::vector<bool> done(clients_.size(), false);
  for (std::size_t i = 0; i < clients_.size() && i + 1 < count; ++i) {
    if (ready[i + 1].revents != 0) done[i] = !serve(clients_[i], ready[i + 1].revents);
    if (!done[i] && now >= clients_[i].deadline) {
      spdlog::debug("admin: a client gave up or stalled ({} bytes of command read); dropped", clients_[i].in.size());
      done[i] = true;
    }
  }
  std::size_t k = 0;
  std::erase_if(clients_, [&](const Client&) { return done[k++]; });
  if (count > 0 && ready[0].revents != 0) accept_clients();
}

void AdminServer::accept_clients() {
  while (true) {
    UniqueFd fd(::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (!fd) return;  // EAGAIN: nobody else waiting
    Client c{std::move(fd), {}, {}, 0, std::chrono::steady_clock::now() + kClientDeadline};
    if (clients_.size() >= kMaxClients) {
      // Told why, best effort, and not kept.
      spdlog::warn("admin: {} clients already connected; one more refused", clients_.size());
      const std::string reply = error_reply("too many admin clients at once; try again");
      [[maybe_unused]] auto n = ::send(c.fd.get(), reply.data(), reply.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      continue;
    }
    clients_.push_back(std::move(c));
  }
}

bool AdminServer::serve(Client& c, short revents) {
  if (c.out.empty()) {
    char buf[512];
    const ssize_t n = ::recv(c.fd.get(), buf, sizeof buf, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return false;  // gone before a full line
    if (n > 0) c.in.append(buf, static_cast<std::size_t>(n));
    if (auto nl = c.in.find('\n'); nl != std::string::npos && nl <= kMaxLine) {
      answer(c, c.in.substr(0, nl));
    } else if (c.in.size() > kMaxLine) {
      c.out = error_reply("command longer than " + std::to_string(kMaxLine) + " bytes");
    } else {
      return true;  // more to come
    }
  } else if ((revents & (POLLERR | POLLHUP)) != 0) {
    return false;
  }
  while (c.written < c.out.size()) {
    const ssize_t n = ::send(c.fd.get(), c.out.data() + c.written, c.out.size() - c.written, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return true;  // POLLOUT next
    if (n <= 0) return false;  // the client left without its reply
    c.written += static_cast<std::size_t>(n);
  }
  return false;  // answered: close
}

void AdminServer::answer(Client& c, const std::string& command) {
  // A command is text: anything else is refused before the handler sees it.
  const bool printable = std::all_of(command.begin(), command.end(), [](char ch) {
    return static_cast<unsigned char>(ch) >= 0x20 && static_cast<unsigned char>(ch) < 0x7f;
  });
  c.out = printable ? handler_(command) + "\n" : error_reply("a command is one line of printable ASCII");
}

std::string AdminServer::error_reply(const std::string& message) {
  return nlohmann::json{{"ok", false}, {"error", message}}.dump() + "\n";
}

}  // namespace rdmabroker::daemon
