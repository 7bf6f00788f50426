// TcpPort (accept, handshake) and TcpLink (read, write): tcp_link.hpp.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <spdlog/spdlog.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "tcp/tcp_listener.hpp"
#include "frames/frame_handler.hpp"
#include "tcp/tcp_link.hpp"

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

void TcpPort::accept(bool stopping) {
  // Bounded per wake-up; the listening socket stays readable for the rest.
  for (int i = 0; i < 64; ++i) {
    UniqueFd fd(::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
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
    auto refuse = [&](proto::RejectReason reason) {
      admission.refuse(Admission::Via::kTcp, peer, proto::to_string(reason), reason);
      send_reject(fd.get(), reason, ctx_.options.buffer_size);
    };
    proto::RejectReason why{};
    std::optional<Admission::Eviction> evict;
    const std::uint64_t id = ctx_.core.next_connection_id.fetch_add(1);
    const auto slot = admission.reserve(stopping, {id, ctx_.index, peer}, why, evict);
    if (evict) ctx_.core.evict(*evict);
    if (!slot) {
      refuse(why);
      continue;
    }
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.u64 = kTagHandshake | static_cast<std::uint32_t>(fd.get());
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
    h.deadline = ctx_.now + kHandshakeTimeout;
  }
}

void TcpPort::stop_listening() { ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, listen_fd_, nullptr); }

void TcpPort::on_handshake_readable(int fd, bool stopping) {
  auto it = handshakes_.find(fd);
  if (it == handshakes_.end()) return;
  Handshake& h = it->second;
  Admission& admission = *ctx_.core.admission;
  auto drop = [&](const std::string& why, std::optional<proto::RejectReason> reason) {
    drop_handshake(it, why, reason);
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
  if (auto refuse = admission.check(h.bytes, req)) {
    return drop(std::string(proto::to_string(*refuse)), *refuse);
  }
  if (stopping) return drop("shutting down", proto::RejectReason::kShuttingDown);
  const std::uint64_t id = h.id;
  const auto accept = proto::encode(proto::ConnectAccept{ctx_.options.buffer_size, 0, id});
  if (!write_all_now(fd, accept))
    return drop(std::string("sending the accept: ") + std::strerror(errno), std::nullopt);
  // One send being written at a time: a window of 1.
  auto link = std::make_unique<TcpLink>(*this, std::move(h.fd));
  TcpLink& l = *link;
  Connection& c = connections_.add(std::make_unique<Connection>(
      id, h.slot, h.peer, std::move(link), req.recv_buffer_size, 1, ConnState::kAccepting));
  handshakes_.erase(it);
  ctx_.stats.tcp_connections.add(1);
  l.update_events(c);  // re-tags the socket with the connection id
  connections_.establish(c);
}

void TcpPort::check_handshake_deadlines(bool stopping) {
  for (auto it = handshakes_.begin(); it != handshakes_.end();) {
    if (ctx_.now < it->second.deadline && !stopping) {
      ++it;
      continue;
    }
    const auto why = stopping ? "shutting down" : "no connect request within 5 s";
    const auto reason = stopping ? std::optional(proto::RejectReason::kShuttingDown) : std::nullopt;
    it = drop_handshake(it, why, reason);
  }
}

bool TcpPort::evict_handshake(std::uint64_t id) {
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
  ctx_.core.admission->refuse(Admission::Via::kTcp, it->second.peer, why, reason);
  if (reason) send_reject(it->first, *reason, ctx_.options.buffer_size);
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
    if (link.paused()) {
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

void TcpPort::retry_buffer_waiters() {
  if (buffer_waiters_.empty() || ctx_.core.pool->exhausted()) return;
  std::vector<std::uint64_t> ids;
  ids.swap(buffer_waiters_);
  for (std::uint64_t id : ids) {
    Connection* c = connections_.find(id);
    if (c != nullptr && !c->input_held()) c->link->resume(*c);
  }
}

BufferRef TcpPort::read_buffer(Connection& c) {
  std::uint32_t index = 0;
  const bool empty = ctx_.core.pool->acquire(&index, 1) == 0;
  ctx_.note_pool_starved(empty);
  if (empty) {
    // Pool exhausted: stop reading until buffers come back (TCP's window
    // then holds the publisher, as withheld credits hold an RDMA one).
    buffer_waiters_.push_back(c.id);
    c.link->pause(c);
    return {};
  }
  return BufferRef(ctx_.core.pool, index);
}

// ---------------------------------------------------------------- events

void TcpLink::update_events(const Connection& c) {
  epoll_event ev{};
  ev.events = (reading_ ? EPOLLIN | EPOLLRDHUP : 0u) | (writing_ ? EPOLLOUT : 0u);
  ev.data.u64 = TcpPort::kTagTcpConnection | c.id;
  if (::epoll_ctl(transport_.epoll_fd(), EPOLL_CTL_MOD, fd_.get(), &ev) != 0) {
    spdlog::error("connection {}: epoll_ctl: {}", c.id, std::strerror(errno));
  }
}

void TcpLink::pause(Connection& c) {
  if (!reading_) return;
  reading_ = false;
  update_events(c);
}

void TcpLink::resume(Connection& c) {
  if (reading_) return;
  reading_ = true;
  update_events(c);  // level-triggered: data already waiting is reported again
}

void TcpLink::on_event(Connection& c, std::uint32_t events) {
  if ((events & EPOLLOUT) != 0) transport_.connections().touch(c);  // the flush writes
  if ((events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) != 0) read(c);
}

void TcpLink::lost(Connection& c, const char* what, int err) {
  if (err != 0 && err != ECONNRESET && err != EPIPE) {
    spdlog::warn("connection {} ({}): {}: {}", c.id, c.peer, what, std::strerror(err));
  }
  transport_.connections().peer_gone(
      c, c.close_received ? CloseReason::kClientClose : CloseReason::kPeerDisconnected);
}

std::uint32_t TcpLink::frames_written_whole() const {
  std::uint32_t n = 0;
  while (n < frame_count_ && frames_[n].end <= written_) ++n;
  return n;
}

PackedFrame TcpLink::tally(std::uint32_t from, std::uint32_t to) const {
  PackedFrame sum;
  for (std::uint32_t i = from; i < to; ++i) {
    sum.messages += frames_[i].messages;
    sum.payload += frames_[i].payload;
  }
  return sum;
}

void TcpLink::cut_short(Connection& c) {
  if (c.inflight_count == 0) return;
  // Frames written whole stay; so does the one being written (the peer could
  // not tell its end from the next frame otherwise); the rest is dropped.
  std::uint32_t keep = frames_written_whole();
  if (keep < frame_count_ && written_ > (keep == 0 ? 0 : frames_[keep - 1].end)) ++keep;
  if (keep == frame_count_) return;
  const PackedFrame dropped = tally(keep, frame_count_);
  auto& connections = transport_.connections();
  connections.trim_send(c, keep, dropped.messages, dropped.payload);
  frame_count_ = keep;
  std::uint32_t left = (keep == 0 ? 0 : frames_[keep - 1].end) - written_;
  if (left == 0) {  // the socket took all that stays: the send is done
    iov_next_ = iov_count_ = 0;
    connections.retire_send(c, true);
    return;
  }
  std::uint32_t i = iov_next_;
  while (left > iov_[i].iov_len) left -= static_cast<std::uint32_t>(iov_[i++].iov_len);
  iov_[i].iov_len = left;
  iov_count_ = i + 1;
}

void TcpLink::disconnect(Connection& c) {
  // A send cut at the deadline never completes: the frames the socket took
  // whole reached the peer (or sit in its kernel), the rest did not.
  if (c.inflight_count > 0) {
    const PackedFrame reached = tally(0, frames_written_whole());
    transport_.connections().retire_send_in_part(c, reached.messages, reached.payload);
  }
  writing_ = false;
  if (!c.peer_disconnected) ::shutdown(fd_.get(), SHUT_WR);
  rbuf_.reset();
  reading_ = true;
  update_events(c);
}

void TcpLink::release(Connection&) { transport_.ctx().stats.tcp_connections.add(-1); }

// ---------------------------------------------------------------- read

void TcpLink::read(Connection& c) {
  auto& ctx = transport_.ctx();
  const std::uint32_t buffer_size = ctx.options.buffer_size;
  for (int round = 0; round < kReadsPerEvent; ++round) {
    if (!c.is_up()) {
      // Closing: what the peer still sends is discarded until its FIN.
      std::byte scratch[4096];
      const ssize_t n = ::read(fd_.get(), scratch, sizeof scratch);
      if (n > 0) continue;
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
      return lost(c, "read", n < 0 ? errno : 0);
    }
    if (!rbuf_) {
      rbuf_ = transport_.read_buffer(c);
      if (!rbuf_) return;
      rstart_ = rlen_ = 0;
    }
    const std::uint32_t room = buffer_size - rlen_;
    const ssize_t n = ::read(fd_.get(), rbuf_.data() + rlen_, room);
    if (n == 0) return lost(c, "read", 0);
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) return;
      return lost(c, "read", errno);
    }
    ctx.stats.tcp_reads.add();
    rlen_ += static_cast<std::uint32_t>(n);

    // Route every whole frame; an invalid one is handed over too, so that
    // the frame handler answers it with its ERROR.
    const std::uint32_t whole = rstart_ + static_cast<std::uint32_t>(proto::whole_frames(
                                              {rbuf_.data() + rstart_, rlen_ - rstart_}, buffer_size));
    const bool completed = whole > rstart_;
    if (completed) {
      transport_.frames().process(c, rbuf_, rstart_, whole);
      rstart_ = whole;
      transport_.connections().touch(c);
    }
    if (!c.is_up()) return;
    // The frame left incomplete at the end was begun by this read if a frame
    // before it completed (or none was pending): its clock starts now.
    if (rstart_ == rlen_) {
      partial_since_ = {};
    } else if (completed || partial_since_ == std::chrono::steady_clock::time_point{}) {
      if (partial_since_ == std::chrono::steady_clock::time_point{}) transport_.watch_partial_frame(c);
      partial_since_ = ctx.now;
    }
    if (rstart_ == rlen_) {
      rbuf_.reset();  // idle connections hold no buffer
    } else if (rlen_ == buffer_size) {
      // Full, with an incomplete frame at the end: move it to a fresh buffer.
      BufferRef fresh = transport_.read_buffer(c);
      if (!fresh) return;
      std::memcpy(fresh.data(), rbuf_.data() + rstart_, rlen_ - rstart_);
      rlen_ -= rstart_;
      rstart_ = 0;
      rbuf_ = std::move(fresh);
    }
    if (c.input_held()) return;                        // the router paused us, or the login is being checked
    if (static_cast<std::uint32_t>(n) < room) return;  // drained the socket
  }
}

// ---------------------------------------------------------------- write

void TcpLink::flush(Connection& c) {
  auto& connections = transport_.connections();
  while (true) {
    if (c.inflight_count > 0) {
      if (!write(c)) return;
      continue;
    }
    if (c.outq.empty()) return;
    Segment sge[kMaxSendSge];
    std::array<BufferRef, kMaxFramesPerSend> refs;
    PackedSend packed;
    const std::uint32_t block = connections.pack_next(c, kMaxSendSge, 0, 0, sge, refs, packed);
    if (block == SendBlocks::kNone) return;
    connections.record_send(c, block, &refs, packed);
    for (std::uint32_t i = 0; i < packed.num_sge; ++i) {
      iov_[i] = iovec{reinterpret_cast<void*>(sge[i].addr), sge[i].length};
    }
    iov_next_ = 0;
    iov_count_ = packed.num_sge;
    frames_ = packed.frame;
    frame_count_ = packed.frames;
    written_ = 0;
  }
}

bool TcpLink::write(Connection& c) {
  auto& ctx = transport_.ctx();
  msghdr msg{};
  msg.msg_iov = iov_.data() + iov_next_;
  msg.msg_iovlen = iov_count_ - iov_next_;
  ssize_t n = ::sendmsg(fd_.get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
  if (n < 0) {
    if (errno == EINTR) return true;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      // The client is not reading fast enough: wait for room. The write
      // deadline and the queue bound still apply (slow consumer).
      ctx.stats.tcp_write_blocked.add();
      if (!writing_) {
        writing_ = true;
        update_events(c);
      }
      return false;
    }
    lost(c, "write", errno);
    return false;
  }
  ctx.stats.tcp_writes.add();
  c.last_progress = ctx.now;
  written_ += static_cast<std::uint32_t>(n);
  while (n > 0) {
    iovec& v = iov_[iov_next_];
    if (static_cast<std::size_t>(n) >= v.iov_len) {
      n -= static_cast<ssize_t>(v.iov_len);
      ++iov_next_;
    } else {
      v.iov_base = static_cast<std::byte*>(v.iov_base) + n;
      v.iov_len -= static_cast<std::size_t>(n);
      n = 0;
    }
  }
  if (iov_next_ < iov_count_) return true;  // partial: try again (likely EAGAIN next)
  transport_.connections().retire_send(c, true);
  if (writing_) {
    writing_ = false;
    update_events(c);
  }
  return true;
}

}  // namespace rdmabroker::daemon
