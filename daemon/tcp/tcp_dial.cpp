// SPDX-License-Identifier: Apache-2.0
// TcpPort: a route this broker dials over TCP (broker/route_events.hpp,
// SPEC.md §1.2, §8). A non-blocking connect on the worker's epoll; once the
// socket is writable, the 16-byte connect request; then the broker's 24
// bytes (32 for an accept of version 4 or later). An accept makes a
// Connection with a TcpLink, which logs in as a route; anything else, or no
// answer within kDialTimeout, ends the dial and tells the routes. A route
// never speaks TLS (SPEC.md §1.3: route listeners are plain TCP).
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <spdlog/spdlog.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include "frames/frame_handler.hpp"
#include "tcp/tcp_link.hpp"
#include "tcp/tcp_port.hpp"

namespace rdmabroker::daemon {

void TcpPort::dial(std::uint64_t id, std::uint32_t slot, const ParsedUrl& url, RouteDial dial) {
  const std::string peer = url.host + ":" + std::to_string(url.port);
  auto fail = [&](const std::string& why) { dial_failed(ctx_, slot, dial, "tcp: " + why); };
  // Resolved on the worker: a route is dialed rarely, and an address (what
  // cluster.routes usually holds) resolves without a lookup.
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(url.port);
  if (const int rc = getaddrinfo(url.host.c_str(), port.c_str(), &hints, &found); rc != 0)
    return fail("cannot resolve '" + url.host + "': " + gai_strerror(rc));
  UniqueFd fd(::socket(found->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  const int rc = fd ? ::connect(fd.get(), found->ai_addr, found->ai_addrlen) : -1;
  const int err = errno;
  freeaddrinfo(found);
  if (!fd || (rc != 0 && err != EINPROGRESS)) return fail(std::string("connect: ") + std::strerror(err));
  const int one = 1;
  ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);  // batching is ours, not Nagle's
  epoll_event ev{};
  ev.events = EPOLLOUT | EPOLLIN | EPOLLRDHUP;
  ev.data.u64 = tags_.tag(kDial | static_cast<std::uint32_t>(fd.get()));
  if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd.get(), &ev) != 0)
    return fail(std::string("epoll_ctl: ") + std::strerror(errno));
  const int raw = fd.get();
  Dialing& d = dials_[raw];
  d.id = id;
  d.slot = slot;
  d.peer = peer;
  d.dial = std::move(dial);
  d.fd = std::move(fd);
  d.deadline = ctx_.now + kDialTimeout;
}

void TcpPort::on_dial_event(int fd, std::uint32_t events) {
  auto it = dials_.find(fd);
  if (it == dials_.end()) return;
  Dialing& d = it->second;
  if (!d.sent) {
    if ((events & (EPOLLOUT | EPOLLERR | EPOLLHUP)) == 0) return;
    int err = 0;
    socklen_t len = sizeof err;
    ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) return drop_dial(it, std::string("connect: ") + std::strerror(err));
    // A route's receive buffers are the pool's; its credits are not used over TCP (SPEC.md §1.2).
    const auto request =
        proto::encode(proto::ConnectRequest{ctx_.options.buffer_size, 2, 0, proto::kProtocolVersion});
    if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL | MSG_DONTWAIT) !=
        static_cast<ssize_t>(request.size()))
      return drop_dial(it, std::string("sending the connect request: ") + std::strerror(errno));
    d.sent = true;
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.u64 = tags_.tag(kDial | static_cast<std::uint32_t>(fd));
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, fd, &ev);
    return;
  }
  // 24 bytes; an accept of version 4 or later has 8 more (SPEC.md §1.2).
  std::size_t need = proto::kConnectAcceptSize;
  if (d.got >= need && proto::load<std::uint16_t>(d.answer.data() + 6) == 0 &&
      std::to_integer<std::uint8_t>(d.answer[4]) >= proto::kFragmentsVersion)
    need = proto::kConnectAcceptSizeV4;
  const ssize_t n = ::read(fd, d.answer.data() + d.got, need - d.got);
  if (n == 0) return drop_dial(it, "closed by the broker before it answered");
  if (n < 0) {
    if (errno == EAGAIN || errno == EINTR) return;
    return drop_dial(it, std::string("read: ") + std::strerror(errno));
  }
  d.got += static_cast<std::uint32_t>(n);
  if (d.got < proto::kConnectAcceptSize) return;
  if (d.got == proto::kConnectAcceptSize && proto::load<std::uint16_t>(d.answer.data() + 6) == 0 &&
      std::to_integer<std::uint8_t>(d.answer[4]) >= proto::kFragmentsVersion)
    return on_dial_event(fd, events);  // the last 8 bytes of a longer accept
  if (auto st = finish_dial(d); !st) return drop_dial(it, st.error().message);
  dials_.erase(it);  // its socket moved to the connection's link
}

Status TcpPort::finish_dial(Dialing& d) {
  const std::span<const std::byte> answer(d.answer.data(), d.got);
  if (const auto reason = proto::load<std::uint16_t>(answer.data() + 6); reason != 0) {
    proto::ConnectReject reject;
    if (proto::decode(answer.first(proto::kConnectRejectSize), reject) != proto::HandshakeStatus::kOk)
      return Error{ErrorKind::kConnectFailed, "not an rdmabroker answer"};
    return Error{ErrorKind::kConnectFailed,
                 "refused the connection: " + std::string(proto::to_string(reject.reason))};
  }
  proto::ConnectAccept accept;
  if (const auto st = proto::decode(answer, accept); st != proto::HandshakeStatus::kOk)
    return Error{ErrorKind::kConnectFailed, "a bad accept: " + std::string(proto::to_string(st))};
  auto link = std::make_unique<TcpLink>(*this, std::move(d.fd));
  TcpLink& l = *link;
  // One send being written at a time: a window of 1.
  Connection& c = connections_.add(std::make_unique<Connection>(
      d.id, d.slot, d.peer, std::move(link), accept.max_frame_size, 1, ConnState::kAccepting));
  c.protocol_version = accept.version;
  c.dialed = std::make_unique<DialedRoute>(std::move(d.dial));
  ctx_.stats.tcp_connections.add(1);
  l.update_events(c);  // re-tags the socket with the connection id
  connections_.establish(c);
  frames_.dialed_up(c);
  return {};
}

void TcpPort::drop_dial(Dials::iterator it, const std::string& why) {
  const RouteDial dial = std::move(it->second.dial);
  const std::uint32_t slot = it->second.slot;
  dials_.erase(it);  // closes the socket, which leaves the epoll set
  dial_failed(ctx_, slot, dial, "tcp: " + why);
}

void TcpPort::check_dial_deadlines() {
  for (auto it = dials_.begin(); it != dials_.end();) {
    auto next = std::next(it);
    if (ctx_.now >= it->second.deadline)
      drop_dial(it, "no answer within " + std::to_string(kDialTimeout.count()) + " s");
    it = next;
  }
}

void TcpPort::cancel_dial(std::uint64_t route) {
  for (auto it = dials_.begin(); it != dials_.end(); ++it) {
    if (it->second.dial.route != route) continue;
    ctx_.core.admission->release(it->second.slot);
    dials_.erase(it);
    return;
  }
}

}  // namespace rdmabroker::daemon
