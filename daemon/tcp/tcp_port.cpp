// SPDX-License-Identifier: Apache-2.0
// TcpPort: accepting, handshakes, TLS, buffer waiters (tcp_port.hpp).
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <spdlog/spdlog.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "frames/frame_handler.hpp"
#include "tcp/tcp_link.hpp"
#include "tcp/tcp_port.hpp"
#include "tcp/tcp_listener.hpp"
#include "tcp/tls_context.hpp"

namespace rdmabroker::daemon {

namespace {

constexpr auto kHandshakeTimeout = std::chrono::seconds(5);
/// The first byte of a TLS record carrying a handshake message (ClientHello).
constexpr std::byte kTlsHandshakeRecord{0x16};

bool write_all_now(int fd, std::span<const std::byte> bytes) {
  const ssize_t n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  return n == static_cast<ssize_t>(bytes.size());
}

/// The broker's answer on TCP is always 24 bytes: an Accept, or a Reject
/// padded with zeros (a client tells them apart by the reason field).
std::array<std::byte, proto::kConnectAcceptSize> reject_reply(proto::RejectReason reason,
                                                              std::uint32_t buffer_size) {
  std::array<std::byte, proto::kConnectAcceptSize> reply{};
  const auto reject = proto::encode(proto::ConnectReject{reason, buffer_size});
  std::memcpy(reply.data(), reject.data(), reject.size());
  return reply;
}

/// What OpenSSL said, put down to a counted reason.
TlsFailure tls_failure_kind(const std::string& why) {
  const auto has = [&](std::string_view s) { return why.find(s) != std::string::npos; };
  if (has("certificate required") || has("did not return a certificate")) return TlsFailure::kNoCertificate;
  if (has("certificate") || has("unknown ca") || has("unknown CA")) return TlsFailure::kCertificate;
  if (has("version") || has("protocol") || has("cipher") || has("http request") || has("record"))
    return TlsFailure::kProtocol;
  return TlsFailure::kOther;
}

}  // namespace

std::string_view to_string(TlsFailure f) {
  switch (f) {
    case TlsFailure::kNoCertificate:
      return "no_certificate";
    case TlsFailure::kCertificate:
      return "certificate";
    case TlsFailure::kProtocol:
      return "protocol";
    case TlsFailure::kClosed:
      return "closed";
    case TlsFailure::kTimeout:
      return "timeout";
    case TlsFailure::kOther:
      break;
  }
  return "other";
}

// ---------------------------------------------------------------- the port

Result<std::unique_ptr<TcpPort>> TcpPort::create(WorkerContext& ctx, Connections& connections,
                                                 FrameHandler& frames, int epoll_fd, EpollTags tags,
                                                 TcpListeners listeners) {
  std::unique_ptr<TcpPort> port(new TcpPort(ctx, connections, frames, epoll_fd, tags, listeners));
  for (const auto& [fd, kind] :
       {std::pair{listeners.clients, kListenClients}, {listeners.routes, kListenRoutes}}) {
    if (fd < 0) continue;
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLEXCLUSIVE;
    ev.data.u64 = tags.tag(kind);
    if (::epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &ev) != 0)
      return Error{ErrorKind::kResource, std::string("epoll_ctl: ") + std::strerror(errno)};
  }
  return port;
}

void TcpPort::on_event(std::uint64_t payload, std::uint32_t events, bool stopping) {
  switch (payload & kKindMask) {
    case kListenClients:
    case kListenRoutes:
      accept((payload & kKindMask) == kListenRoutes, stopping);
      return;
    case kHandshake:
      on_handshake_readable(static_cast<int>(payload & ~kKindMask), stopping);
      return;
    case kDial:
      on_dial_event(static_cast<int>(payload & ~kKindMask), events);
      return;
    case kConnection:
      // Every connection whose socket carries this port's tag has a TcpLink.
      if (Connection* c = connections_.find(payload & ~kKindMask)) {
        static_cast<TcpLink&>(*c->link).on_event(*c, events);
      }
      return;
    default:
      return;
  }
}

void TcpPort::check_deadlines(bool stopping) {
  if (!handshakes_.empty()) check_handshake_deadlines(stopping);
  if (!dials_.empty()) check_dial_deadlines();
  check_partial_frames();
}

bool TcpPort::wants_events_every_turn() const {
  return ctx_.stats.tcp_connections.get() > 0 || !handshakes_.empty() || !dials_.empty();
}

void TcpPort::stop_accepting() {
  for (const int fd : {listeners_.clients, listeners_.routes})
    if (fd >= 0) ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
  check_handshake_deadlines(true);  // refuses those still in their handshake
  while (!dials_.empty()) drop_dial(dials_.begin(), "shutting down");
}

// ---------------------------------------------------------------- accept

void TcpPort::accept(bool routes, bool stopping) {
  const int listen_fd = routes ? listeners_.routes : listeners_.clients;
  // Bounded per wake-up; the listening socket stays readable for the rest.
  for (int i = 0; i < 64; ++i) {
    UniqueFd fd(::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!fd) {
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED) {
        spdlog::warn("worker {}: accept: {}", ctx_.index, std::strerror(errno));
      }
      return;
    }
    const std::string peer = tcp_peer_address(fd.get());
    const int one = 1;
    ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);  // batching is ours, not Nagle's
    Admission& admission = *ctx_.core.admission;
    // On a TLS listener nothing is sent before the first byte shows whether
    // the client speaks TLS: a plain reject would be garbage to a TLS client.
    const bool tls_listener = tls_for(routes) != nullptr;
    auto refuse = [&](proto::RejectReason reason) {
      admission.refuse(Admission::Via::kTcp, peer, proto::to_string(reason),
                       tls_listener ? std::nullopt : std::optional(reason));
      if (!tls_listener) write_all_now(fd.get(), reject_reply(reason, ctx_.options.buffer_size));
    };
    proto::RejectReason why{};
    std::optional<Admission::Eviction> evict;
    const std::uint64_t id = ctx_.core.next_connection_id.fetch_add(1);
    const auto slot = admission.reserve(stopping, {id, ctx_.index, peer}, why, evict);
    if (evict) ctx_.core.workers->evict(*evict);
    if (!slot) {
      refuse(why);
      continue;
    }
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.u64 = tags_.tag(kHandshake | static_cast<std::uint32_t>(fd.get()));
    if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd.get(), &ev) != 0) {
      admission.release(*slot);
      refuse(proto::RejectReason::kNoResources);
      continue;
    }
    const int raw = fd.get();
    Handshake& h = handshakes_[raw];
    h.id = id;
    h.fd = std::move(fd);
    h.slot = *slot;
    h.peer = peer;
    h.route_listener = routes;
    h.deadline = ctx_.now + kHandshakeTimeout;
  }
}

void TcpPort::watch_handshake(Handshake& h, bool write) {
  if (h.wants_write == write) return;
  h.wants_write = write;
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP | (write ? EPOLLOUT : 0u);
  ev.data.u64 = tags_.tag(kHandshake | static_cast<std::uint32_t>(h.fd.get()));
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, h.fd.get(), &ev);
}

bool TcpPort::handshake_write(Handshake& h, std::span<const std::byte> bytes) {
  if (!h.ssl) return write_all_now(h.fd.get(), bytes);
  if (!h.tls_done) return false;  // a TLS client could not read it
  ERR_clear_error();
  // Small, and the socket's buffer is empty this early: it is written whole or not at all.
  return SSL_write(h.ssl.get(), bytes.data(), static_cast<int>(bytes.size())) ==
         static_cast<int>(bytes.size());
}

void TcpPort::tls_failed(Handshakes::iterator it, TlsFailure kind, const std::string& why) {
  ctx_.stats.tls_failures[static_cast<std::size_t>(kind)].add();
  drop_handshake(it, "TLS handshake failed: " + why, std::nullopt);
}

std::shared_ptr<const TlsContext> TcpPort::tls_for(bool route_listener) const {
  // The route listener is plain TCP (routes run inside the cluster's network).
  return route_listener || listeners_.tls == nullptr ? nullptr : listeners_.tls->get();
}

bool TcpPort::advance_tls(Handshakes::iterator it) {
  Handshake& h = it->second;
  const int fd = h.fd.get();
  if (!h.sniffed) {
    const auto tls = tls_for(h.route_listener);
    if (!tls) {
      h.sniffed = true;  // a plain listener
      return true;
    }
    std::byte first{};
    const ssize_t n = ::recv(fd, &first, 1, MSG_PEEK);
    if (n == 0) {
      drop_handshake(it, "closed during the handshake", std::nullopt);
      return false;
    }
    if (n < 0) {
      if (errno != EAGAIN && errno != EINTR)
        drop_handshake(it, std::string("read: ") + std::strerror(errno), std::nullopt);
      return false;
    }
    h.sniffed = true;
    if (first != kTlsHandshakeRecord) {
      if (tls->mode() != config::TlsMode::kRequired) return true;  // plain, where that is allowed
      ctx_.stats.tls_plain_refused.add();
      drop_handshake(it, "plain TCP where TLS is required (tls.mode: required)",
                     proto::RejectReason::kTlsRequired);
      return false;
    }
    h.ssl = tls->session(fd);
    if (!h.ssl) {
      tls_failed(it, TlsFailure::kOther, tls::take_errors());
      return false;
    }
  }
  ERR_clear_error();
  const int r = SSL_do_handshake(h.ssl.get());
  if (r == 1) {
    h.tls_done = true;
    watch_handshake(h, false);
    ctx_.stats.tls_handshakes.add();
    h.certificate_name = tls::peer_common_name(h.ssl.get());
    return true;
  }
  std::string err;
  switch (tls::classify(h.ssl.get(), r, err)) {
    case tls::Io::kWantRead:
      watch_handshake(h, false);
      return false;
    case tls::Io::kWantWrite:
      watch_handshake(h, true);
      return false;
    case tls::Io::kClosed:
      tls_failed(it, TlsFailure::kClosed, "the client closed the connection");
      return false;
    case tls::Io::kFailed:
      tls_failed(it, tls_failure_kind(err), err);
      return false;
  }
  return false;
}

void TcpPort::on_handshake_readable(int fd, bool stopping) {
  auto it = handshakes_.find(fd);
  if (it == handshakes_.end()) return;
  Handshake& h = it->second;
  Admission& admission = *ctx_.core.admission;
  auto drop = [&](const std::string& why, std::optional<proto::RejectReason> reason) {
    drop_handshake(it, why, reason);
  };
  if ((!h.sniffed || (h.ssl && !h.tls_done)) && !advance_tls(it)) return;
  std::string tls_error;
  bool wants_write = false;
  std::byte* to = h.bytes.data() + h.got;
  const std::size_t room = h.bytes.size() - h.got;
  const ssize_t n = h.ssl ? tls::read(h.ssl.get(), to, room, tls_error, &wants_write) : ::read(fd, to, room);
  if (n == 0) return drop("closed during the handshake", std::nullopt);
  if (n < 0) {
    if (errno == EAGAIN || errno == EINTR) {
      if (h.ssl) watch_handshake(h, wants_write);
      return;
    }
    if (errno == EPROTO) return tls_failed(it, tls_failure_kind(tls_error), tls_error);
    return drop(std::string("read: ") + std::strerror(errno), std::nullopt);
  }
  h.got += static_cast<std::uint32_t>(n);
  if (h.got < h.bytes.size()) return;

  proto::ConnectRequest req;
  if (auto refuse = admission.check(Admission::Via::kTcp, h.bytes, req)) {
    return drop(std::string(proto::to_string(*refuse)), *refuse);
  }
  if (stopping) return drop("shutting down", proto::RejectReason::kShuttingDown);
  const std::uint64_t id = h.id;
  const std::uint8_t version = Admission::version_for(Admission::Via::kTcp, req);
  const auto accept =
      proto::encode(proto::ConnectAccept{ctx_.options.buffer_size, 0, id, version, ctx_.options.max_payload});
  if (!handshake_write(h, std::span(accept).first(proto::accept_size(version))))
    return drop(std::string("sending the accept: ") + (h.ssl ? tls::take_errors() : std::strerror(errno)),
                std::nullopt);
  // One send being written at a time: a window of 1.
  const bool tls = h.ssl != nullptr;
  auto link = std::make_unique<TcpLink>(*this, std::move(h.fd), std::move(h.ssl));
  TcpLink& l = *link;
  Connection& c = connections_.add(std::make_unique<Connection>(
      id, h.slot, h.peer, std::move(link), req.recv_buffer_size, 1, ConnState::kAccepting));
  c.certificate_name = std::move(h.certificate_name);
  c.route_listener = h.route_listener;
  c.protocol_version = version;
  handshakes_.erase(it);
  ctx_.stats.tcp_connections.add(1);
  if (tls) ctx_.stats.tls_connections.add(1);
  l.update_events(c);  // re-tags the socket with the connection id
  connections_.establish(c);
}

void TcpPort::check_handshake_deadlines(bool stopping) {
  for (auto it = handshakes_.begin(); it != handshakes_.end();) {
    if (ctx_.now < it->second.deadline && !stopping) {
      ++it;
      continue;
    }
    const Handshake& h = it->second;
    if (!stopping && h.ssl && !h.tls_done) {
      // A client that stopped in the middle of its TLS handshake.
      ctx_.stats.tls_failures[static_cast<std::size_t>(TlsFailure::kTimeout)].add();
      it = drop_handshake(it, "TLS handshake not finished within 5 s", std::nullopt);
      continue;
    }
    const auto why = stopping ? "shutting down" : "no connect request within 5 s";
    const auto reason = stopping ? std::optional(proto::RejectReason::kShuttingDown) : std::nullopt;
    it = drop_handshake(it, why, reason);
  }
}

bool TcpPort::evict_accepting(std::uint64_t id) {
  for (auto it = handshakes_.begin(); it != handshakes_.end(); ++it) {
    if (it->second.id != id) continue;
    drop_handshake(it, "closed in its handshake: the unauthenticated connections are at their limit",
                   std::nullopt);
    return true;
  }
  return false;
}

TcpPort::Handshakes::iterator TcpPort::drop_handshake(Handshakes::iterator it, std::string_view why,
                                                      std::optional<proto::RejectReason> reason) {
  Handshake& h = it->second;
  // A client in the middle of its TLS handshake cannot read a reject: it is closed without one.
  if (reason && h.ssl && !h.tls_done) reason.reset();
  ctx_.core.admission->refuse(Admission::Via::kTcp, h.peer, why, reason);
  if (reason) {
    handshake_write(h, reject_reply(*reason, ctx_.options.buffer_size));
    // Closing a socket with unread input sends a reset, which can overtake
    // the reject on the wire and destroy it in the client's buffer (a plain
    // client on a TLS-only port: its request was only peeked). What has
    // arrived is read and dropped, and the write side closed first: a FIN.
    std::byte unread[512];
    for (int i = 0; i < 16 && ::recv(h.fd.get(), unread, sizeof unread, MSG_DONTWAIT) > 0; ++i) {
    }
    ::shutdown(h.fd.get(), SHUT_WR);
  }
  ctx_.core.admission->release(it->second.slot);
  return handshakes_.erase(it);  // closes the socket, which leaves the epoll set
}

void TcpPort::check_partial_frames() {
  if (partial_frames_.empty()) return;
  const auto timeout = std::chrono::milliseconds(ctx_.options.frame_timeout_ms);
  std::erase_if(partial_frames_, [&](std::uint64_t id) {
    Connection* c = connections_.find_up(id);
    if (c == nullptr) return true;
    auto& link = static_cast<TcpLink&>(*c->link);
    if (link.partial_since() == std::chrono::steady_clock::time_point{}) return true;  // finished
    if (link.input_paused()) {
      link.restart_partial_clock(ctx_.now);  // we are not reading it: not the client's delay
      return false;
    }
    if (ctx_.now - link.partial_since() < timeout) return false;
    connections_.close(*c, CloseReason::kFrameTimeout, proto::ErrorCode::kMalformedFrame,
                       "a frame was begun and not finished within " +
                           std::to_string(ctx_.options.frame_timeout_ms) + " ms (limits.frame_timeout_ms): " +
                           std::to_string(link.partial_bytes()) + " bytes of it arrived");
    return true;
  });
}

bool TcpPort::read_buffered() {
  if (tls_buffered_.empty()) return false;
  std::vector<std::uint64_t> ids;
  ids.swap(tls_buffered_);
  for (std::uint64_t id : ids) {
    if (Connection* c = connections_.find(id)) static_cast<TcpLink&>(*c->link).read_buffered(*c);
  }
  return true;
}

void TcpPort::retry_buffer_waiters() {
  if (buffer_waiters_.empty() || !ctx_.core.pool->has_free_above(ctx_.core.pool_shares.reserve())) return;
  std::vector<std::uint64_t> ids;
  ids.swap(buffer_waiters_);
  for (std::uint64_t id : ids) {
    Connection* c = connections_.find(id);
    if (c != nullptr && !c->input_held()) c->link->resume();
  }
}

BufferRef TcpPort::read_buffer(Connection& c) {
  std::uint32_t index = 0;
  // The reserve is left to the receive queues (broker/pool_shares.hpp).
  const bool empty = ctx_.core.pool->acquire(&index, 1, ctx_.core.pool_shares.reserve()) == 0;
  ctx_.note_pool_starved(empty);
  if (empty) {
    // Pool exhausted: stop reading until buffers come back (TCP's window
    // then holds the publisher, as withheld credits hold an RDMA one).
    buffer_waiters_.push_back(c.id);
    c.link->pause();
    return {};
  }
  return BufferRef(ctx_.core.pool, index);
}

}  // namespace rdmabroker::daemon
