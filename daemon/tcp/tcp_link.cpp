// The TCP transport of a worker (SPEC.md §1.2): accept and handshake, read
// into pool buffers, write packed sends. Everything above the byte stream
// (frames, routing, queues and their bounds, the close state machine) is the
// code RDMA connections use.
//
// Reading: a connection reads into a pool buffer and routes each whole frame
// in place, so a TCP publisher's messages fan out zero-copy like an RDMA
// receive. An incomplete last frame stays where it is and the next read
// appends to it; only when the buffer is full is that tail copied to a fresh
// buffer (the old one lives on while deliveries reference it).
//
// Flow control: TCP's own window. A publisher the broker must slow down
// (a backlogged subscriber) is simply not read; one whose subscriber queues
// overflow is cut off like an RDMA one.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <spdlog/spdlog.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "broker/handshake.hpp"
#include "tcp/tcp_listener.hpp"
#include "worker/worker.hpp"

namespace rdmabroker::daemon {

namespace {

constexpr auto kHandshakeTimeout = std::chrono::seconds(5);
/// Reads per readiness event: one busy socket must not starve the rest.
constexpr int kReadsPerEvent = 4;

/// The broker's answer on TCP is always 24 bytes: an Accept, or a Reject
/// padded with zeros (a client tells them apart by the reason field).
bool write_all_now(int fd, std::span<const std::byte> bytes) {
  const ssize_t n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  return n == static_cast<ssize_t>(bytes.size());
}

void send_reject(int fd, proto::RejectReason reason, std::uint32_t buffer_size) {
  std::array<std::byte, proto::kConnectAcceptSize> reply{};
  const auto reject = proto::encode(proto::ConnectReject{reason, buffer_size});
  std::memcpy(reply.data(), reject.data(), reject.size());
  write_all_now(fd, reply);
}

}  // namespace

// ---------------------------------------------------------------- accept

void Worker::accept_tcp() {
  // Bounded per wake-up; the listening socket stays readable for the rest.
  for (int i = 0; i < 64; ++i) {
    UniqueFd fd(::accept4(tcp_listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!fd) {
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED) {
        spdlog::warn("worker {}: accept: {}", index_, std::strerror(errno));
      }
      return;
    }
    const std::string peer = tcp_peer_address(fd.get());
    const int one = 1;
    ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);  // batching is ours, not Nagle's
    auto refuse = [&](proto::RejectReason reason) {
      spdlog::warn("tcp connection from {} rejected: {}", peer, proto::to_string(reason));
      stats_.tcp_rejected.add();
      send_reject(fd.get(), reason, opt_.buffer_size);
    };
    if (stopping_) {
      refuse(proto::RejectReason::kShuttingDown);
      continue;
    }
    const auto slot = core_.slots->acquire();
    if (!slot) {
      stats_.limit_connections.add();
      refuse(proto::RejectReason::kTooManyConnections);
      continue;
    }
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.u64 = kTagHandshake | static_cast<std::uint32_t>(fd.get());
    if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd.get(), &ev) != 0) {
      core_.slots->release(*slot);
      refuse(proto::RejectReason::kNoResources);
      continue;
    }
    const int raw = fd.get();
    Handshake& h = handshakes_[raw];
    h.fd = std::move(fd);
    h.slot = *slot;
    h.peer = peer;
    h.deadline = now_ + kHandshakeTimeout;
  }
}

void Worker::on_handshake_readable(int fd) {
  auto it = handshakes_.find(fd);
  if (it == handshakes_.end()) return;
  Handshake& h = it->second;
  auto drop = [&](const std::string& why, std::optional<proto::RejectReason> reason) {
    spdlog::log(refusal_log_level(reason), "tcp connection from {} refused: {}", h.peer, why);
    stats_.tcp_rejected.add();
    if (reason) send_reject(fd, *reason, opt_.buffer_size);
    core_.slots->release(h.slot);
    handshakes_.erase(it);  // closes the socket, which leaves the epoll set
  };
  const ssize_t n = ::read(fd, h.bytes.data() + h.got, h.bytes.size() - h.got);
  if (n == 0) return drop("closed during the handshake", std::nullopt);
  if (n < 0) {
    if (errno == EAGAIN || errno == EINTR) return;
    return drop(std::string("read: ") + std::strerror(errno), std::nullopt);
  }
  h.got += static_cast<std::uint32_t>(n);
  if (h.got < h.bytes.size()) return;

  proto::ConnectRequest req;
  if (auto refuse = check_connect_request(h.bytes, opt_.buffer_size, req)) {
    return drop(std::string(proto::to_string(*refuse)), *refuse);
  }
  if (stopping_) return drop("shutting down", proto::RejectReason::kShuttingDown);
  auto conn = std::make_unique<Connection>();
  conn->id = core_.next_connection_id.fetch_add(1);
  conn->slot = h.slot;
  conn->transport = Transport::kTcp;
  conn->peer = h.peer;
  conn->peer_buffer_size = req.recv_buffer_size;
  conn->inflight.resize(2);  // one send being written (+1 keeps the ring's full/empty test simple)
  const auto accept = proto::encode(proto::ConnectAccept{opt_.buffer_size, 0, conn->id});
  if (!write_all_now(fd, accept))
    return drop(std::string("sending the accept: ") + std::strerror(errno), std::nullopt);
  conn->tcp.fd = std::move(h.fd);
  handshakes_.erase(it);
  Connection& c = *conn;
  connections_.emplace(c.id, std::move(conn));
  stats_.connections_current.add(1);
  stats_.tcp_connections.add(1);
  update_tcp_events(c);  // re-tags the socket with the connection id
  establish(c);
}

void Worker::check_handshake_deadlines() {
  for (auto it = handshakes_.begin(); it != handshakes_.end();) {
    if (now_ < it->second.deadline && !stopping_) {
      ++it;
      continue;
    }
    const auto why = stopping_ ? "shutting down" : "no connect request within 5 s";
    spdlog::warn("tcp connection from {} refused: {}", it->second.peer, why);
    stats_.tcp_rejected.add();
    if (stopping_) send_reject(it->first, proto::RejectReason::kShuttingDown, opt_.buffer_size);
    core_.slots->release(it->second.slot);
    it = handshakes_.erase(it);
  }
}

// ---------------------------------------------------------------- events

void Worker::update_tcp_events(Connection& c) {
  epoll_event ev{};
  ev.events = (c.tcp.reading ? EPOLLIN | EPOLLRDHUP : 0u) | (c.tcp.writing ? EPOLLOUT : 0u);
  ev.data.u64 = kTagTcpConnection | c.id;
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, c.tcp.fd.get(), &ev) != 0) {
    spdlog::error("connection {}: epoll_ctl: {}", c.id, std::strerror(errno));
  }
}

void Worker::pause_reading(Connection& c) {
  // RDMA publishers are slowed by withholding credits (take_credits_to_return).
  if (c.transport != Transport::kTcp || !c.tcp.reading) return;
  c.tcp.reading = false;
  update_tcp_events(c);
}

void Worker::resume_reading(Connection& c) {
  if (c.transport != Transport::kTcp || c.tcp.reading) return;
  c.tcp.reading = true;
  update_tcp_events(c);  // level-triggered: data already waiting is reported again
}

void Worker::retry_buffer_waiters() {
  if (buffer_waiters_.empty() || core_.pool->exhausted()) return;
  std::vector<std::uint64_t> ids;
  ids.swap(buffer_waiters_);
  for (std::uint64_t id : ids) {
    if (Connection* c = find(id); c != nullptr && !c->stalled) resume_reading(*c);
  }
}

void Worker::on_tcp_event(Connection& c, std::uint32_t events) {
  if ((events & EPOLLOUT) != 0) touch(c);  // flush_touched() writes
  if ((events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) != 0) read_tcp(c);
}

void Worker::tcp_lost(Connection& c, const char* what, int err) {
  if (err != 0 && err != ECONNRESET && err != EPIPE) {
    spdlog::warn("connection {} ({}): {}: {}", c.id, c.peer, what, std::strerror(err));
  }
  c.peer_disconnected = true;
  close(c, c.close_received ? CloseReason::kClientClose : CloseReason::kPeerDisconnected);
  try_finish(c);
}

// ---------------------------------------------------------------- read

BufferRef Worker::read_buffer(Connection& c) {
  std::uint32_t index = 0;
  const bool empty = core_.pool->acquire(&index, 1) == 0;
  note_pool_starved(empty);
  if (empty) {
    // Pool exhausted: stop reading until buffers come back (TCP's window
    // then holds the publisher, as withheld credits hold an RDMA one).
    buffer_waiters_.push_back(c.id);
    pause_reading(c);
    return {};
  }
  return BufferRef(core_.pool, index);
}

void Worker::read_tcp(Connection& c) {
  TcpState& t = c.tcp;
  for (int round = 0; round < kReadsPerEvent; ++round) {
    if (c.state != ConnState::kEstablished) {
      // Closing: what the peer still sends is discarded until its FIN.
      std::byte scratch[4096];
      const ssize_t n = ::read(t.fd.get(), scratch, sizeof scratch);
      if (n > 0) continue;
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
      return tcp_lost(c, "read", n < 0 ? errno : 0);
    }
    if (!t.rbuf) {
      t.rbuf = read_buffer(c);
      if (!t.rbuf) return;
      t.rstart = t.rlen = 0;
    }
    const std::uint32_t room = opt_.buffer_size - t.rlen;
    const ssize_t n = ::read(t.fd.get(), t.rbuf.data() + t.rlen, room);
    if (n == 0) return tcp_lost(c, "read", 0);
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) return;
      return tcp_lost(c, "read", errno);
    }
    stats_.tcp_reads.add();
    t.rlen += static_cast<std::uint32_t>(n);

    // Route every whole frame; an invalid one is handed over too, so that
    // process_frames() answers it with its ERROR.
    const std::uint32_t whole =
        t.rstart + static_cast<std::uint32_t>(
                       proto::whole_frames({t.rbuf.data() + t.rstart, t.rlen - t.rstart}, opt_.buffer_size));
    if (whole > t.rstart) {
      process_frames(c, t.rbuf, t.rstart, whole);
      t.rstart = whole;
      touch(c);
    }
    if (c.state != ConnState::kEstablished) return;
    if (t.rstart == t.rlen) {
      t.rbuf.reset();  // idle connections hold no buffer
    } else if (t.rlen == opt_.buffer_size) {
      // Full, with an incomplete frame at the end: move it to a fresh buffer.
      BufferRef fresh = read_buffer(c);
      if (!fresh) return;
      std::memcpy(fresh.data(), t.rbuf.data() + t.rstart, t.rlen - t.rstart);
      t.rlen -= t.rstart;
      t.rstart = 0;
      t.rbuf = std::move(fresh);
    }
    if (c.stalled) return;                             // route_publish() paused us
    if (static_cast<std::uint32_t>(n) < room) return;  // drained the socket
  }
}

// ---------------------------------------------------------------- write

void Worker::flush_tcp(Connection& c) {
  while (true) {
    if (c.inflight_count > 0) {
      if (!write_tcp(c)) return;
      continue;
    }
    if (c.outq.empty()) return;
    ibv_sge sge[kMaxSendSge];
    std::array<BufferRef, kMaxFramesPerSend> refs;
    PackedSend packed;
    const std::uint32_t block = pack_next(c, kMaxSendSge, 0, 0, sge, refs, packed);
    if (block == kNoBlock) return;
    record_send(c, block, &refs, packed);
    ++c.inflight_count;
    TcpState& t = c.tcp;
    for (std::uint32_t i = 0; i < packed.num_sge; ++i) {
      t.iov[i] = iovec{reinterpret_cast<void*>(sge[i].addr), sge[i].length};
    }
    t.iov_next = 0;
    t.iov_count = packed.num_sge;
  }
}

bool Worker::write_tcp(Connection& c) {
  TcpState& t = c.tcp;
  msghdr msg{};
  msg.msg_iov = t.iov.data() + t.iov_next;
  msg.msg_iovlen = t.iov_count - t.iov_next;
  ssize_t n = ::sendmsg(t.fd.get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
  if (n < 0) {
    if (errno == EINTR) return true;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      // The client is not reading fast enough: wait for room. The write
      // deadline and the queue bound still apply (slow consumer).
      stats_.tcp_write_blocked.add();
      if (!t.writing) {
        t.writing = true;
        update_tcp_events(c);
      }
      return false;
    }
    tcp_lost(c, "write", errno);
    return false;
  }
  stats_.tcp_writes.add();
  c.last_progress = now_;
  while (n > 0) {
    iovec& v = t.iov[t.iov_next];
    if (static_cast<std::size_t>(n) >= v.iov_len) {
      n -= static_cast<ssize_t>(v.iov_len);
      ++t.iov_next;
    } else {
      v.iov_base = static_cast<std::byte*>(v.iov_base) + n;
      v.iov_len -= static_cast<std::size_t>(n);
      n = 0;
    }
  }
  if (t.iov_next < t.iov_count) return true;  // partial: try again (likely EAGAIN next)
  retire_send(c, true);
  if (t.writing) {
    t.writing = false;
    update_tcp_events(c);
  }
  wake_block_waiters();
  return true;
}

}  // namespace rdmabroker::daemon
