// SPDX-License-Identifier: Apache-2.0
#include "ops/polled_server.hpp"

#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>

namespace rdmabroker::daemon {

void PolledServer::add_poll_fds(std::vector<pollfd>& fds) const {
  fds.push_back({listen_.get(), POLLIN, 0});
  for (const auto& c : clients_)
    fds.push_back({c.fd.get(), static_cast<short>(c.out.empty() ? POLLIN : POLLOUT), 0});
}

int PolledServer::timeout_ms(int idle) const {
  if (clients_.empty()) return idle;
  auto next = clients_.front().deadline;
  for (const auto& c : clients_) next = std::min(next, c.deadline);
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(next - std::chrono::steady_clock::now());
  return static_cast<int>(std::clamp<std::int64_t>(left.count() + 1, 0, idle));
}

void PolledServer::on_poll(const pollfd* ready, std::size_t count) {
  // ready[1..] are the clients as add_poll_fds() listed them: serve those
  // first, before accepting changes the list.
  const auto now = std::chrono::steady_clock::now();
  std::vector<bool> done(clients_.size(), false);
  for (std::size_t i = 0; i < clients_.size() && i + 1 < count; ++i) {
    if (ready[i + 1].revents != 0) done[i] = !serve(clients_[i], ready[i + 1].revents);
    if (!done[i] && now >= clients_[i].deadline) {
      spdlog::debug("{}: a client gave up or stalled ({} bytes of request read); dropped", protocol_.name,
                    clients_[i].in.size());
      done[i] = true;
    }
  }
  std::size_t k = 0;
  std::erase_if(clients_, [&](const Client&) { return done[k++]; });
  if (count > 0 && ready[0].revents != 0) accept_clients();
}

void PolledServer::accept_clients() {
  while (true) {
    UniqueFd fd(::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (!fd) return;  // EAGAIN: nobody else waiting
    Client c{std::move(fd), {}, {}, 0, std::chrono::steady_clock::now() + protocol_.deadline};
    if (clients_.size() >= protocol_.max_clients && protocol_.evict_idle_when_full) {
      // The oldest client still without a whole request makes room: an idle
      // socket is the cheapest thing to give up, and a real request arrives
      // right after its connect.
      auto idle =
          std::find_if(clients_.begin(), clients_.end(), [](const Client& x) { return x.out.empty(); });
      if (idle != clients_.end()) {
        spdlog::debug("{}: {} clients connected; the oldest idle one dropped for a newcomer", protocol_.name,
                      clients_.size());
        clients_.erase(idle);
      }
    }
    if (clients_.size() >= protocol_.max_clients) {
      // Told why, best effort, and not kept.
      spdlog::warn("{}: {} clients already connected; one more refused", protocol_.name, clients_.size());
      const std::string reply = protocol_.busy();
      [[maybe_unused]] auto n = ::send(c.fd.get(), reply.data(), reply.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      continue;
    }
    clients_.push_back(std::move(c));
  }
}

bool PolledServer::serve(Client& c, short revents) {
  if (c.out.empty()) {
    char buf[1024];
    const ssize_t n = ::recv(c.fd.get(), buf, sizeof buf, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return false;  // gone before a whole request
    if (n > 0) c.in.append(buf, static_cast<std::size_t>(n));
    if (auto reply = protocol_.answer(c.in)) {
      c.out = std::move(*reply);
    } else if (c.in.size() > protocol_.max_request) {
      c.out = protocol_.too_long();
    } else {
      return true;  // more to come
    }
  } else if ((revents & (POLLERR | POLLHUP)) != 0) {
    return false;
  }
  while (c.written < c.out.size()) {
    const ssize_t n =
        ::send(c.fd.get(), c.out.data() + c.written, c.out.size() - c.written, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return true;  // POLLOUT next
    if (n <= 0) return false;                                       // the client left without its reply
    c.written += static_cast<std::size_t>(n);
  }
  return false;  // answered: close
}

}  // namespace rdmabroker::daemon
