// SPDX-License-Identifier: Apache-2.0
// The TCP transport of a worker (SPEC.md §1.2): TcpPort accepts from the
// broker's listening socket and runs the 16-byte handshake; each connection's
// TcpLink reads into pool buffers and writes packed sends. Everything above
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
#include "connection/port.hpp"
#include "rdmabroker/common/fd.hpp"
#include "rdmabroker/common/tls.hpp"
#include "rdmabroker/proto/handshake.hpp"
#include "tcp/tcp_listener.hpp"

namespace rdmabroker::daemon {

class FrameHandler;
class TcpPort;
class TlsContext;

/// Why a TLS handshake failed, as counted (tls.handshake_failures.*).
enum class TlsFailure : std::uint8_t {
  kNoCertificate,  // a client certificate was required and none came
  kCertificate,    // a certificate did not verify (either side's: unknown CA, expired, bad)
  kProtocol,       // no common version or cipher, or not TLS at all
  kClosed,         // the peer closed in the middle of it
  kTimeout,        // not done within the handshake deadline
  kOther,
};
inline constexpr std::size_t kTlsFailureCount = 6;
std::string_view to_string(TlsFailure f);

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

/// A worker's TCP side: its share of the listening socket, the handshakes in
/// progress, and the connections waiting for pool buffers.
class TcpPort final : public Port {
 public:
  /// What an epoll tag's payload names (Port's EpollTags): a kind, and a
  /// socket's fd or a connection's id (below 2^52) beside it.
  static constexpr std::uint64_t kListenClients = 1ull << 55;
  static constexpr std::uint64_t kListenRoutes = 1ull << 54;
  static constexpr std::uint64_t kHandshake = 1ull << 53;   // | fd
  static constexpr std::uint64_t kConnection = 1ull << 52;  // | connection id
  static constexpr std::uint64_t kKindMask = 0xfull << 52;

  /// Watches the listening sockets in `epoll_fd` (EPOLLEXCLUSIVE: one worker
  /// is woken per incoming connection).
  static Result<std::unique_ptr<TcpPort>> create(WorkerContext& ctx, Connections& connections,
                                                 FrameHandler& frames, int epoll_fd, EpollTags tags,
                                                 TcpListeners listeners);

  // ---- Port
  /// Reads what TLS links hold decrypted (epoll cannot see it).
  bool poll() override { return read_buffered(); }
  /// Resumes reading on connections that waited for pool buffers.
  void after_flush() override { retry_buffer_waiters(); }
  /// Refuses handshakes past their deadline (all of them when stopping);
  /// closes connections whose begun frame is overdue.
  void check_deadlines(bool stopping) override;
  void arm(bool) override {}
  /// Accepts, advances a handshake, or reads and writes a connection's socket.
  void on_event(std::uint64_t payload, std::uint32_t events, bool stopping) override;
  PortEvent kind_of(std::uint64_t) const override { return PortEvent::kSocket; }
  bool ready_in_spin(std::uint64_t) override { return true; }
  bool reap_sends() override { return false; }  // a write completes as it is made
  bool wants_events_every_turn() const override;
  bool seen_only_by_epoll() const override { return true; }
  bool accepting() const override { return !handshakes_.empty(); }
  bool evict_accepting(std::uint64_t id) override;
  void stop_accepting() override;

  /// c's link began a frame it has not finished: from now on its deadline
  /// (limits.frame_timeout_ms) is checked.
  void watch_partial_frame(const Connection& c) { partial_frames_.push_back(c.id); }
  /// TLS link c holds decrypted bytes it has not read: read_buffered() reads them.
  void note_buffered(const Connection& c) { tls_buffered_.push_back(c.id); }
  /// The epoll tag of connection `id`'s socket.
  std::uint64_t connection_tag(std::uint64_t id) const { return tags_.tag(kConnection | id); }

  WorkerContext& ctx() { return ctx_; }
  Connections& connections() { return connections_; }
  FrameHandler& frames() { return frames_; }
  int epoll_fd() const { return epoll_fd_; }
  /// A pool buffer for c's reads, or none (then c waits, not reading, for buffers to come back).
  BufferRef read_buffer(Connection& c);

 private:
  TcpPort(WorkerContext& ctx, Connections& connections, FrameHandler& frames, int epoll_fd, EpollTags tags,
          TcpListeners listeners)
      : ctx_(ctx),
        connections_(connections),
        frames_(frames),
        epoll_fd_(epoll_fd),
        tags_(tags),
        listeners_(listeners) {}
  /// Accepts what a listening socket has (bounded per wake-up): the client
  /// listener's, or with `routes` the route listener's (cluster.listen_tcp).
  void accept(bool routes, bool stopping);
  /// A socket in its handshake is readable (or, in a TLS handshake, writable).
  void on_handshake_readable(int fd, bool stopping);
  void check_handshake_deadlines(bool stopping);
  void retry_buffer_waiters();
  void check_partial_frames();
  bool read_buffered();

  /// TCP sockets accepted and waiting for their 16-byte connect request.
  struct Handshake {
    std::uint64_t id = 0;  // the connection it becomes (drawn at accept: Admission knows it by this)
    UniqueFd fd;
    tls::UniqueSsl ssl;            // a TLS connection (after fd: freed first)
    bool sniffed = false;          // TLS or plain is decided (the first byte was seen)
    bool tls_done = false;         // its TLS handshake completed
    bool wants_write = false;      // its TLS handshake waits for the socket to be writable
    std::string certificate_name;  // the verified client certificate's CN (mutual TLS)
    bool route_listener = false;   // accepted on cluster.listen_tcp: plain TCP, routes only
    std::uint32_t slot = 0;
    std::string peer;
    std::array<std::byte, proto::kConnectRequestSize> bytes{};
    std::uint32_t got = 0;
    std::chrono::steady_clock::time_point deadline{};
  };

  using Handshakes = std::unordered_map<int, Handshake>;  // by fd
  /// Refuses a connection in its handshake (logged, counted; told `reason`
  /// if given), gives its slot back and closes it; returns the next entry.
  Handshakes::iterator drop_handshake(Handshakes::iterator it, std::string_view why,
                                      std::optional<proto::RejectReason> reason);
  /// What a connection accepted on the route listener (or a client listener)
  /// speaks TLS with: null, plain TCP.
  std::shared_ptr<const TlsContext> tls_for(bool route_listener) const;
  /// On a TLS listener: decides TLS or plain, runs the TLS handshake. False
  /// while it must wait for the socket, or when it dropped the handshake.
  bool advance_tls(Handshakes::iterator it);
  /// A TLS handshake that failed: counted by reason, logged (throttled), dropped.
  void tls_failed(Handshakes::iterator it, TlsFailure kind, const std::string& why);
  /// Watches h's socket for reading, or for writing too (a TLS handshake's flight).
  void watch_handshake(Handshake& h, bool write);
  /// Writes `bytes` at once to a socket in its handshake (through TLS on a TLS one).
  static bool handshake_write(Handshake& h, std::span<const std::byte> bytes);

  WorkerContext& ctx_;
  Connections& connections_;
  FrameHandler& frames_;
  int epoll_fd_;
  EpollTags tags_;
  TcpListeners listeners_;  // the broker's; never closed here
  Handshakes handshakes_;
  std::vector<std::uint64_t> buffer_waiters_;  // connections that found the pool empty
  std::vector<std::uint64_t> partial_frames_;  // connections with a frame begun and not finished
  std::vector<std::uint64_t> tls_buffered_;    // TLS connections with decrypted bytes not read
};

}  // namespace rdmabroker::daemon
