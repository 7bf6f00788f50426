// SPDX-License-Identifier: Apache-2.0
// A worker's TCP port (SPEC.md §1.2, §1.3): its share of the broker's
// listening sockets, the 16-byte handshake of each accepted socket (inside
// TLS on a TLS listener: the first byte tells a ClientHello from a plain
// connect request), the connections waiting for pool buffers, and the
// deadlines of handshakes and of frames begun and not finished. A
// connection that completes its handshake gets a TcpLink (tcp_link.hpp).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "broker/route_events.hpp"
#include "connection/connections.hpp"
#include "connection/port.hpp"
#include "connection/worker_context.hpp"
#include "rdmabroker/common/fd.hpp"
#include "rdmabroker/common/tls.hpp"
#include "rdmabroker/common/url.hpp"
#include "rdmabroker/proto/handshake.hpp"
#include "rdmabroker/result.hpp"
#include "tcp/tcp_listener.hpp"
#include "tcp/tls_context.hpp"

namespace rdmabroker::daemon {

class FrameHandler;

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

/// A worker's TCP side: its share of the listening socket, the handshakes in
/// progress, and the connections waiting for pool buffers.
class TcpPort final : public Port {
 public:
  /// What an epoll tag's payload names (Port's EpollTags): a kind, and a
  /// socket's fd or a connection's id (below 2^52) beside it.
  static constexpr std::uint64_t kListenClients = 1ull << 55;
  static constexpr std::uint64_t kListenRoutes = 1ull << 54;
  static constexpr std::uint64_t kHandshake = 1ull << 53;           // | fd
  static constexpr std::uint64_t kConnection = 1ull << 52;          // | connection id
  static constexpr std::uint64_t kDial = kHandshake | kConnection;  // | fd: a route dialed (tcp_dial.cpp)
  static constexpr std::uint64_t kKindMask = 0xfull << 52;
  /// How long a route's dial may take, connect to the broker's answer.
  static constexpr std::chrono::seconds kDialTimeout{5};

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

  // tcp/tcp_dial.cpp: routes this broker dials (broker/route_events.hpp)
  /// Dials `url` as connection `id` (its slot taken) for `dial`: a
  /// non-blocking connect, the 16-byte connect request, the broker's answer;
  /// then a Connection with a TcpLink logs in.
  void dial(std::uint64_t id, std::uint32_t slot, const ParsedUrl& url, RouteDial dial);
  /// The dial of route `route` in progress, if any, ends (the route was removed).
  void cancel_dial(std::uint64_t route);

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

  /// A route being dialed: connecting, then waiting for the broker's answer.
  struct Dialing {
    std::uint64_t id = 0;
    std::uint32_t slot = 0;
    std::string peer;
    RouteDial dial;
    UniqueFd fd;
    bool sent = false;  // the connect request went out
    std::array<std::byte, proto::kConnectAcceptSizeV4> answer{};
    std::uint32_t got = 0;
    std::chrono::steady_clock::time_point deadline{};
  };
  using Dials = std::unordered_map<int, Dialing>;  // by fd
  void on_dial_event(int fd, std::uint32_t events);
  /// The answer is whole: a Connection, or why not.
  Status finish_dial(Dialing& d);
  void drop_dial(Dials::iterator it, const std::string& why);
  void check_dial_deadlines();
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
  Dials dials_;
  std::vector<std::uint64_t> buffer_waiters_;  // connections that found the pool empty
  std::vector<std::uint64_t> partial_frames_;  // connections with a frame begun and not finished
  std::vector<std::uint64_t> tls_buffered_;    // TLS connections with decrypted bytes not read
};

}  // namespace rdmabroker::daemon
