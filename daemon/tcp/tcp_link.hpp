// SPDX-License-Identifier: Apache-2.0
// The TCP transport of a worker (SPEC.md §1.2): TcpPort (tcp_port.hpp)
// accepts from the broker's listening socket and runs the 16-byte
// handshake; each connection's TcpLink reads into pool buffers and writes
// packed sends. Everything above
// the byte stream (frames, routing, queues and their bounds, the close state
// machine) is the code RDMA connections use.
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
//
// TLS (SPEC.md §1.3, tls.mode): on a TLS listener the handshake's first byte
// tells a TLS ClientHello (0x16) from a plain connect request ('R'); a TLS
// connection runs OpenSSL's handshake, then the same 16-byte handshake and
// frames inside TLS. The link then reads through SSL_read (decrypting into
// the pool buffer, so routing stays zero-copy after decryption) and writes
// through a staging buffer: SSL_write takes one contiguous piece, and must
// be called again with the same bytes after WANT_WRITE. Bytes handed to TLS
// are committed like bytes handed to the kernel (cut_short keeps their
// frames). Decrypted bytes OpenSSL holds raise no epoll event: the port
// keeps such links on a list the worker reads each turn.
#pragma once

#include <sys/uio.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "connection/connection.hpp"
#include "connection/connections.hpp"
#include "rdmabroker/common/fd.hpp"
#include "rdmabroker/common/tls.hpp"
#include "rdmabroker/proto/handshake.hpp"

namespace rdmabroker::daemon {

class TcpPort;

class TcpLink final : public Link {
 public:
  TcpLink(TcpPort& transport, UniqueFd fd, tls::UniqueSsl ssl = {})
      : transport_(transport), fd_(std::move(fd)), ssl_(std::move(ssl)) {}

  Transport transport() const override { return Transport::kTcp; }
  std::string_view protocol() const override { return ssl_ ? "tls" : "tcp"; }
  void flush() override;
  /// A stalled publisher (or one short of pool buffers) is not read.
  void pause() override;
  void resume() override;
  void add_send_credits(std::uint32_t) override {}  // the socket's window is the flow control
  /// Ends the send in progress after the frame being written: the frames
  /// not begun are dropped, so that CLOSE follows within one frame.
  void cut_short() override;
  /// FIN after what was written; the socket is read (and discarded) until
  /// the peer's FIN, the TCP twin of waiting for DISCONNECTED.
  void disconnect() override;
  void release() override;
  std::string where() const override { return ssl_ ? "over tls" : "over tcp"; }
  bool is_tls() const { return ssl_ != nullptr; }

  /// The socket is readable or writable (epoll).
  void on_event(Connection& c, std::uint32_t events);
  /// Re-registers the socket's epoll interest (reading, writing) under c's id.
  void update_events(const Connection& c);
  /// A frame begun and not finished: since when (zero: none), and how far.
  std::chrono::steady_clock::time_point partial_since() const { return partial_since_; }
  std::uint32_t partial_bytes() const { return rlen_ - rstart_; }
  /// Not read now (a stalled publisher, or no pool buffer): its frame cannot progress.
  bool input_paused() const override { return !reading_; }
  void restart_partial_clock(std::chrono::steady_clock::time_point now) { partial_since_ = now; }
  /// TLS: decrypted bytes wait in OpenSSL, which epoll cannot see; reads them.
  void read_buffered(Connection& c);

 private:
  void read(Connection& c);
  void read_rounds(Connection& c);
  /// rbuf_ is full with an incomplete frame at its end: moves that frame to a
  /// fresh buffer; false (the link paused) when there is none.
  bool move_partial_frame(Connection& c);
  /// read(2), or SSL_read on a TLS link: > 0 bytes, 0 at the peer's end,
  /// < 0 with errno (EAGAIN: wait; EPROTO: a TLS error, logged here).
  ssize_t receive(Connection& c, std::byte* to, std::size_t n);
  /// sendmsg(2) of the in-flight iovecs, or SSL_write of them through the
  /// staging buffer: bytes taken, or < 0 with errno.
  ssize_t transmit(Connection& c);
  /// Writes what remains of the in-flight send; false if it must wait (EPOLLOUT) or failed.
  bool write(Connection& c);
  void lost(Connection& c, const char* what, int err);
  /// Frames of the in-flight send that the socket took whole.
  std::uint32_t frames_written_whole() const;
  /// The deliveries (messages, payload) in frames [from, to) of the in-flight send.
  PackedFrame tally(std::uint32_t from, std::uint32_t to) const;

  TcpPort& transport_;
  UniqueFd fd_;
  tls::UniqueSsl ssl_;  // after fd_: freed first (it never closes the socket)
  /// TLS: bytes of the in-flight send copied for SSL_write and not yet taken.
  std::vector<std::byte> stage_;
  std::uint32_t staged_ = 0;
  bool read_wants_write_ = false;  // TLS: SSL_read needs the socket writable
  BufferRef rbuf_;                 // frames [rstart_, rlen_) not yet processed
  std::uint32_t rstart_ = 0;
  std::uint32_t rlen_ = 0;
  /// When the incomplete frame at the end of the buffer was begun (zero: none).
  std::chrono::steady_clock::time_point partial_since_{};
  bool reading_ = true;                   // EPOLLIN wanted (false while stalled or short of buffers)
  bool writing_ = false;                  // EPOLLOUT wanted (a write hit EAGAIN)
  std::array<iovec, kMaxSendSge> iov_{};  // the in-flight send's remaining pieces
  std::uint32_t iov_next_ = 0;
  std::uint32_t iov_count_ = 0;
  // The in-flight send's frames and how much of it the socket took: a send
  // cut short counts as delivered exactly the frames written whole.
  std::array<PackedFrame, kMaxFramesPerSend> frames_{};
  std::uint32_t frame_count_ = 0;
  std::uint32_t written_ = 0;
};

}  // namespace rdmabroker::daemon
