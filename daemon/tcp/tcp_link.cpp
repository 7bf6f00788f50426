// SPDX-License-Identifier: Apache-2.0
// TcpLink: a TCP connection's reads and writes (tcp_link.hpp).
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

/// Reads per readiness event: one busy socket must not starve the rest.
constexpr int kReadsPerEvent = 4;
/// What one SSL_write takes at most: one TLS record's worth.
constexpr std::size_t kTlsStage = 16384;

}  // namespace

// ---------------------------------------------------------------- events

void TcpLink::update_events(const Connection& c) {
  epoll_event ev{};
  ev.events = (reading_ ? EPOLLIN | EPOLLRDHUP : 0u) | (writing_ || read_wants_write_ ? EPOLLOUT : 0u);
  ev.data.u64 = transport_.connection_tag(c.id);
  if (::epoll_ctl(transport_.epoll_fd(), EPOLL_CTL_MOD, fd_.get(), &ev) != 0) {
    spdlog::error("connection {}: epoll_ctl: {}", c.id, std::strerror(errno));
  }
}

void TcpLink::pause() {
  Connection& c = connection();
  if (!reading_) return;
  reading_ = false;
  update_events(c);
}

void TcpLink::resume() {
  Connection& c = connection();
  if (reading_) return;
  reading_ = true;
  update_events(c);  // level-triggered: data already waiting is reported again
  // ... but not what TLS decrypted and holds.
  if (ssl_ && SSL_has_pending(ssl_.get()) == 1) transport_.note_buffered(c);
}

void TcpLink::on_event(Connection& c, std::uint32_t events) {
  if ((events & EPOLLOUT) != 0) transport_.connections().touch(c);  // the flush writes
  if ((events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) != 0 ||
      ((events & EPOLLOUT) != 0 && read_wants_write_))
    read(c);
}

void TcpLink::read_buffered(Connection& c) {
  if (reading_ && !c.input_held()) read(c);
}

void TcpLink::lost(Connection& c, const char* what, int err) {
  if (err != 0 && err != ECONNRESET && err != EPIPE && err != EPROTO) {  // EPROTO: TLS, logged by receive()
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

void TcpLink::cut_short() {
  Connection& c = connection();
  if (c.inflight_count == 0) return;
  // Frames written whole stay; so does the one being written (the peer could
  // not tell its end from the next frame otherwise); the rest is dropped.
  std::uint32_t keep = frames_written_whole();
  if (keep < frame_count_ && written_ > (keep == 0 ? 0 : frames_[keep - 1].end)) ++keep;
  // TLS: bytes staged for SSL_write's retry are committed like bytes the
  // kernel took (the retry must present them again): their frames stay too.
  while (keep < frame_count_ && (keep == 0 ? 0 : frames_[keep - 1].end) < written_ + staged_) ++keep;
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

void TcpLink::disconnect() {
  Connection& c = connection();
  // A send cut at the deadline never completes: the frames the socket took
  // whole reached the peer (or sit in its kernel), the rest did not.
  if (c.inflight_count > 0) {
    const PackedFrame reached = tally(0, frames_written_whole());
    transport_.connections().retire_send_in_part(c, reached.messages, reached.payload);
  }
  writing_ = false;
  if (!c.peer_disconnected) {
    if (ssl_) {
      ERR_clear_error();
      SSL_shutdown(ssl_.get());  // close_notify, best effort: the CLOSE frame is the orderly close
      ERR_clear_error();
    }
    ::shutdown(fd_.get(), SHUT_WR);
  }
  rbuf_.reset();
  reading_ = true;
  update_events(c);
}

void TcpLink::release() {
  transport_.ctx().stats.tcp_connections.add(-1);
  if (ssl_) transport_.ctx().stats.tls_connections.add(-1);
}

// ---------------------------------------------------------------- read

ssize_t TcpLink::receive(Connection& c, std::byte* to, std::size_t n) {
  if (!ssl_) return ::read(fd_.get(), to, n);
  std::string err;
  bool wants_write = false;
  const ssize_t r = tls::read(ssl_.get(), to, n, err, &wants_write);
  const int saved = errno;                 // for the caller, past what is logged and registered here
  if (wants_write != read_wants_write_) {  // TLS may need to write before it can read on
    read_wants_write_ = wants_write;
    update_events(c);
  }
  if (r < 0 && saved == EPROTO) spdlog::warn("connection {} ({}): TLS: {}", c.id, c.peer, err);
  errno = saved;
  return r;
}

void TcpLink::read(Connection& c) {
  read_rounds(c);
  // Decrypted bytes left in OpenSSL raise no epoll event: read them next turn.
  if (ssl_ && reading_ && SSL_has_pending(ssl_.get()) == 1) transport_.note_buffered(c);
}

void TcpLink::read_rounds(Connection& c) {
  auto& ctx = transport_.ctx();
  const std::uint32_t buffer_size = ctx.options.buffer_size;
  for (int round = 0; round < kReadsPerEvent; ++round) {
    if (!c.is_up()) {
      // Closing: what the peer still sends is discarded until its FIN.
      std::byte scratch[4096];
      const ssize_t n = receive(c, scratch, sizeof scratch);
      if (n > 0) continue;
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
      return lost(c, "read", n < 0 ? errno : 0);
    }
    if (!rbuf_) {
      rbuf_ = transport_.read_buffer(c);
      if (!rbuf_) return;
      rstart_ = rlen_ = 0;
    } else if (rlen_ == buffer_size && !move_partial_frame(c)) {
      return;  // full, and no buffer to move its incomplete frame to: paused until one comes back
    }
    // Never 0: a read of 0 bytes returns 0, which is the peer's end of stream.
    const std::uint32_t room = buffer_size - rlen_;
    const ssize_t n = receive(c, rbuf_.data() + rlen_, room);
    if (n == 0) return lost(c, "read", 0);
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) return;
      return lost(c, "read", errno);
    }
    ctx.stats.tcp_reads.add();
    ctx.now =
        std::chrono::steady_clock::now();  // these bytes arrived by now: their relay time counts from here
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
    } else if (rlen_ == buffer_size && !move_partial_frame(c)) {
      return;
    }
    if (c.input_held()) return;  // the router paused us, or the login is being checked
    if (static_cast<std::uint32_t>(n) < room && !(ssl_ && SSL_has_pending(ssl_.get()) == 1))
      return;  // drained the socket
  }
}

bool TcpLink::move_partial_frame(Connection& c) {
  // Full, with an incomplete frame at the end (a whole frame fits a buffer,
  // so it does not start at 0): move it to a fresh buffer. With none free,
  // read_buffer() pauses the link until buffers come back, and this buffer
  // stays as it is: the publisher is held back, never taken for gone.
  BufferRef fresh = transport_.read_buffer(c);
  if (!fresh) return false;
  std::memcpy(fresh.data(), rbuf_.data() + rstart_, rlen_ - rstart_);
  rlen_ -= rstart_;
  rstart_ = 0;
  rbuf_ = std::move(fresh);
  return true;
}

// ---------------------------------------------------------------- write

void TcpLink::flush() {
  Connection& c = connection();
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

ssize_t TcpLink::transmit(Connection& c) {
  if (!ssl_) {
    msghdr msg{};
    msg.msg_iov = iov_.data() + iov_next_;
    msg.msg_iovlen = iov_count_ - iov_next_;
    return ::sendmsg(fd_.get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
  }
  if (staged_ == 0) {
    // The next record's worth of the send, in one piece. What SSL_write has
    // not taken stays staged, unchanged, for its retry.
    if (stage_.empty()) stage_.resize(kTlsStage);
    for (std::uint32_t i = iov_next_; i < iov_count_ && staged_ < stage_.size(); ++i) {
      const std::size_t take = std::min<std::size_t>(iov_[i].iov_len, stage_.size() - staged_);
      std::memcpy(stage_.data() + staged_, iov_[i].iov_base, take);
      staged_ += static_cast<std::uint32_t>(take);
    }
  }
  std::string err;
  const ssize_t r = tls::write(ssl_.get(), stage_.data(), staged_, err);
  if (r > 0) {
    std::memmove(stage_.data(), stage_.data() + r, staged_ - static_cast<std::uint32_t>(r));
    staged_ -= static_cast<std::uint32_t>(r);
  } else if (errno == EPROTO) {
    spdlog::warn("connection {} ({}): TLS: {}", c.id, c.peer, err);
    errno = EPROTO;  // for the caller, past the log
  }
  return r;
}

bool TcpLink::write(Connection& c) {
  auto& ctx = transport_.ctx();
  ssize_t n = transmit(c);
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
