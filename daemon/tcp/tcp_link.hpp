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
#include "rdmabroker/proto/handshake.hpp"

namespace rdmabroker::daemon {

class FrameHandler;
class TcpPort;

class TcpLink final : public Link {
 public:
  TcpLink(TcpPort& transport, UniqueFd fd) : transport_(transport), fd_(std::move(fd)) {}

  Transport transport() const override { return Transport::kTcp; }
  void flush(Connection& c) override;
  /// A stalled publisher (or one short of pool buffers) is not read.
  void pause(Connection& c) override;
  void resume(Connection& c) override;
  void add_send_credits(std::uint32_t) override {}  // the socket's window is the flow control
  /// Ends the send in progress after the frame being written: the frames
  /// not begun are dropped, so that CLOSE follows within one frame.
  void cut_short(Connection& c) override;
  /// FIN after what was written; the socket is read (and discarded) until
  /// the peer's FIN, the TCP twin of waiting for DISCONNECTED.
  void disconnect(Connection& c) override;
  void release(Connection& c) override;
  std::string where() const override { return "over tcp"; }

  /// The socket is readable or writable (epoll).
  void on_event(Connection& c, std::uint32_t events);
  /// Re-registers the socket's epoll interest (reading, writing) under c's id.
  void update_events(const Connection& c);
  /// A frame begun and not finished: since when (zero: none), and how far.
  std::chrono::steady_clock::time_point partial_since() const { return partial_since_; }
  std::uint32_t partial_bytes() const { return rlen_ - rstart_; }
  /// Not read now (a stalled publisher, or no pool buffer): its frame cannot progress.
  bool paused() const { return !reading_; }
  void restart_partial_clock(std::chrono::steady_clock::time_point now) { partial_since_ = now; }

 private:
  void read(Connection& c);
  /// Writes what remains of the in-flight send; false if it must wait (EPOLLOUT) or failed.
  bool write(Connection& c);
  void lost(Connection& c, const char* what, int err);
  /// Frames of the in-flight send that the socket took whole.
  std::uint32_t frames_written_whole() const;
  /// The deliveries (messages, payload) in frames [from, to) of the in-flight send.
  PackedFrame tally(std::uint32_t from, std::uint32_t to) const;

  TcpPort& transport_;
  UniqueFd fd_;
  BufferRef rbuf_;  // frames [rstart_, rlen_) not yet processed
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
class TcpPort {
 public:
  static constexpr std::uint64_t kTagHandshake = 1ull << 59;      // epoll data: | fd
  static constexpr std::uint64_t kTagTcpConnection = 1ull << 58;  // epoll data: | connection id (< 2^58)

  TcpPort(WorkerContext& ctx, Connections& connections, FrameHandler& frames, int epoll_fd, int listen_fd)
      : ctx_(ctx), connections_(connections), frames_(frames), epoll_fd_(epoll_fd), listen_fd_(listen_fd) {}

  /// Shutdown: this worker no longer takes connections from the listening socket.
  void stop_listening();
  /// Accepts what the listening socket has (bounded per wake-up).
  void accept(bool stopping);
  /// A socket in its handshake is readable.
  void on_handshake_readable(int fd, bool stopping);
  /// Refuses handshakes past their deadline (all of them when stopping).
  void check_handshake_deadlines(bool stopping);
  /// Resumes reading on connections that waited for pool buffers.
  void retry_buffer_waiters();
  bool has_handshakes() const { return !handshakes_.empty(); }
  /// Drops connection `id` if it is still in its handshake (an eviction,
  /// Admission); false if no handshake here has that id.
  bool evict_handshake(std::uint64_t id);
  /// c's link began a frame it has not finished: from now on its deadline
  /// (limits.frame_timeout_ms) is checked.
  void watch_partial_frame(const Connection& c) { partial_frames_.push_back(c.id); }
  /// Closes connections whose begun frame is overdue (frame_timeout).
  void check_partial_frames();

  WorkerContext& ctx() { return ctx_; }
  Connections& connections() { return connections_; }
  FrameHandler& frames() { return frames_; }
  int epoll_fd() const { return epoll_fd_; }
  /// A pool buffer for c's reads, or none (then c waits, not reading, for buffers to come back).
  BufferRef read_buffer(Connection& c);

 private:
  /// TCP sockets accepted and waiting for their 16-byte connect request.
  struct Handshake {
    std::uint64_t id = 0;  // the connection it becomes (drawn at accept: Admission knows it by this)
    UniqueFd fd;
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

  WorkerContext& ctx_;
  Connections& connections_;
  FrameHandler& frames_;
  int epoll_fd_;
  int listen_fd_;  // the broker's; never closed here (-1: no TCP)
  Handshakes handshakes_;
  std::vector<std::uint64_t> buffer_waiters_;  // connections that found the pool empty
  std::vector<std::uint64_t> partial_frames_;  // connections with a frame begun and not finished
};

}  // namespace rdmabroker::daemon
