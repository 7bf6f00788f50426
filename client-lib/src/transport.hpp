// SPDX-License-Identifier: Apache-2.0
// Internal to librdmabroker: what moves a Session's frames. A Session owns
// one Transport (RdmaTransport, TcpTransport): the connection to the broker
// and the I/O thread that feeds what arrives to the session and puts the
// session's filled send buffers on the wire. Everything above the bytes
// (subscriptions, requests, multicast sequencing, flow of send buffers) is
// the Session's, written once for both.
//
// A transport sees its session only through SessionSide: the session's
// options, a scoped hold of its lock, its send buffers, and where what
// arrives goes. Nothing else of the session is reachable from a transport.
#pragma once

#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "deliveries.hpp"
#include "rdmabroker/client.hpp"
#include "rdmabroker/common/fd.hpp"
#include "rdmabroker/common/url.hpp"
#include "rdmabroker/proto/handshake.hpp"
#include "rdmabroker/proto/multicast.hpp"
#include "rdmabroker/result.hpp"

namespace rdmabroker {

/// The session above a transport, as the transport sees it. Calls named
/// *_locked need the hold that lock() returns; the others take it themselves
/// where they need it.
class SessionSide {
 public:
  /// No send buffer (take_ready_locked found none; a pure credit update).
  static constexpr std::uint32_t kNoBuffer = ~0u;

  virtual const ClientOptions& options() const = 0;
  /// Holds the session's lock for the scope of the returned guard.
  [[nodiscard]] virtual std::unique_lock<std::mutex> lock() = 0;

  // ---- connecting
  /// Runs `attempt` with our receive buffer size and, if the broker refuses
  /// that as too small, once more with the size it names; `reset` undoes a
  /// failed attempt.
  virtual Status connect_with_retry(
      const std::function<Status(std::uint32_t recv_buffer_size, proto::ConnectReject*)>& attempt,
      const std::function<void()>& reset) = 0;
  /// Sets up the send buffers once the broker's answer is known.
  virtual void init_send_buffers(const proto::ConnectAccept& accept, std::uint32_t count) = 0;
  /// All send buffers, back to back (RDMA registers them once).
  virtual std::span<std::byte> send_memory() = 0;
  /// The connection is up; `description` is what transport_description() says.
  virtual void established(std::string description) = 0;
  /// Sends CONNECT with the options' credentials and waits for the broker's
  /// verdict (SPEC.md §2.4); the I/O loop must be running.
  virtual Status authenticate() = 0;

  // ---- closing
  /// Sends CLOSE, waits (bounded) for it to leave, marks the session closed.
  /// Returns false if the session was never established (nothing to close).
  virtual bool begin_close() = 0;
  /// The transport is gone (after begin_close()).
  virtual void ended() = 0;
  /// True once close() asked the I/O loop to end.
  virtual bool stop_requested() const = 0;
  virtual bool closed_locked() const = 0;
  /// close() has begun: a disconnect now is ours, not an error to report.
  virtual bool closing_locked() const = 0;
  /// The connection failed for `why`: every waiter wakes and learns it.
  virtual void fail_locked(Error why) = 0;

  // ---- sending
  /// The next buffer to put on the wire: a filled one, else the one being
  /// filled (idle: no batching delay); kNoBuffer if there is none.
  virtual std::pair<std::uint32_t, std::uint32_t> take_ready_locked() = 0;
  virtual bool has_ready_locked() const = 0;
  /// No send buffer is free: a publisher waits for one.
  virtual bool out_of_buffers_locked() const = 0;
  /// A buffer the transport is done with (sent, or failed).
  virtual void release_send_buffer_locked(std::uint32_t buffer) = 0;
  virtual std::byte* send_buffer(std::uint32_t buffer) = 0;
  /// Sends completed: whoever waits on them (close(), a flush) looks again.
  virtual void sends_completed_locked() = 0;

  // ---- receiving (the I/O loop's turn)
  /// Decodes what the broker sent (whole frames) into deliveries and errors.
  virtual void on_frames(std::span<const std::byte> data, Deliveries& deliveries,
                         std::vector<Error>& errors) = 0;
  /// Runs callbacks and fills queues, reports errors, then counts the PONGs
  /// that came after them (without the lock). Returns the messages handed over.
  virtual std::size_t dispatch(Deliveries& deliveries, std::vector<Error>& errors) = 0;
  /// A datagram from a multicast group, without the GRH.
  virtual void on_datagram(std::span<const std::byte> datagram, Deliveries& deliveries) = 0;
  /// The answer to the broker's MCAST_JOIN for `sid`; `error` empty: joined.
  virtual void join_done(std::uint32_t sid, std::uint64_t epoch, const std::string& error) = 0;
  /// Asks for multicast gaps that lasted long enough; ms until it should
  /// run again (-1: nothing pending).
  virtual int check_gaps() = 0;

 protected:
  ~SessionSide() = default;
};

/// The error for a broker's reject (SPEC.md §2.3), naming `where` and the reason.
Error connect_rejected(const std::string& where, const proto::ConnectReject& reject);

class Transport {
 public:
  explicit Transport(SessionSide& session) : session_(session) {}
  virtual ~Transport() = default;
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  /// Connects: the handshake (retried once with the broker's buffer size),
  /// the I/O thread (none for a polled client), then CONNECT and the
  /// broker's verdict.
  virtual Status connect() = 0;
  /// One turn of the I/O loop: waits up to `timeout_ms` (-1: until something
  /// happens, 0: not at all) for completions, bytes or events, hands what
  /// arrived to the session (Session::on_frames, dispatch: the callbacks run
  /// here), and puts what is ready on the wire. Returns the messages
  /// delivered. Run by the I/O thread, or for a polled client by the
  /// application's threads, one at a time (Session::progress).
  virtual std::size_t progress(int timeout_ms) = 0;
  /// A polled client's callback waits for a send buffer (the thread is in
  /// progress() already): takes back what was sent and sends what is ready,
  /// receiving nothing.
  virtual void progress_sends() = 0;
  /// Sends CLOSE (bounded wait), ends the connection and joins the I/O
  /// thread. Idempotent.
  virtual void close() = 0;
  /// With the session's lock held: put the session's ready send buffers on
  /// the wire, as far as credits, the send window or the socket allow.
  virtual void transmit_locked() = 0;
  /// Whether every turn of the I/O thread ends by transmitting what is
  /// ready (RDMA with an I/O thread): a frame left ready goes with the next
  /// thing that wakes it. Over TCP the I/O thread writes only when asked.
  virtual bool transmits_every_turn() const { return false; }
  /// With the session's lock held, before a thread waits for a free send
  /// buffer: take back the buffers already sent, and make sure that the next
  /// one sent wakes the I/O thread (which then notifies the waiter).
  virtual void reclaim_locked() {}
  /// Any thread: the wait in progress() now, or the next one, returns at
  /// once (an eventfd: the wake-up is kept until a turn takes it).
  void wake() {
    const std::uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(wake_fd_.get(), &one, sizeof one);
  }
  /// With the session's lock held: nothing waits to be sent, nothing is in flight.
  virtual bool drained_locked() const = 0;
  /// With the session's lock held, version 8 over RDMA (SPEC.md §3.8):
  /// registers `data` (`length` bytes) for the broker to READ, kept until
  /// release_region(offer); where it is and its rkey. A transport without
  /// RDMA READ refuses.
  virtual Result<proto::RendezvousRegion> expose_for_read(std::uint64_t offer,
                                                          std::unique_ptr<std::byte[]> data,
                                                          std::size_t length) {
    (void)offer, (void)data, (void)length;
    return Error{ErrorKind::kInvalidArgument, "rendezvous needs RDMA"};
  }
  /// With the session's lock held: the broker is done with offer `offer`'s
  /// region (RDV_RELEASE): deregistered and freed.
  virtual void release_region(std::uint64_t offer) { (void)offer; }
  /// I/O thread, version 9 over RDMA (SPEC.md §3.9): registers `length`
  /// bytes at `data` for the broker to WRITE into, the landing area of
  /// (`sid`, `publisher`)'s message, kept until release_landing(); its rkey.
  /// A transport without RDMA WRITE has none.
  virtual std::optional<std::uint32_t> expose_for_write(std::uint32_t sid, std::uint64_t publisher,
                                                        std::byte* data, std::size_t length) {
    (void)sid, (void)publisher, (void)data, (void)length;
    return std::nullopt;
  }
  /// I/O thread: that landing area is deregistered (its message is whole or gone).
  virtual void release_landing(std::uint32_t sid, std::uint64_t publisher) { (void)sid, (void)publisher; }
  /// I/O thread: joins the group of `j` for subscription `sid` and answers
  /// with Session::join_done (now, or when the join completes). A transport
  /// without multicast refuses.
  virtual void join_group(std::uint32_t sid, const proto::McastJoin& j, std::uint64_t epoch);
  /// I/O thread: subscription `sid` no longer takes its messages from a group.
  virtual void leave_group(std::uint32_t /*sid*/) {}
  /// Groups joined now (ClientStats::multicast_groups).
  virtual std::uint64_t groups_joined() const { return 0; }
  /// Times the I/O loop slept and woke (ClientStats::io_wakeups).
  std::uint64_t io_wakeups() const { return io_wakeups_.load(std::memory_order_relaxed); }

 protected:
  /// The loop's turn takes the wake-ups (wake_fd_ was readable).
  void take_wakeups() {
    std::uint64_t count;
    [[maybe_unused]] auto n = ::read(wake_fd_.get(), &count, sizeof count);
  }

  /// A wait of the loop ended (its timeout was not 0).
  void count_wakeup() { io_wakeups_.fetch_add(1, std::memory_order_relaxed); }

  SessionSide& session_;
  std::atomic<std::uint64_t> io_wakeups_{0};
  /// Made by connect() and watched by the loop's epoll. It lives as long as
  /// the transport (past close()), so a wake() racing a close() writes to
  /// an fd that is still ours.
  UniqueFd wake_fd_;
};

/// The transports: unconnected, for a session to connect().
std::unique_ptr<Transport> make_rdma_transport(SessionSide& session, const ParsedUrl& url);
std::unique_ptr<Transport> make_tcp_transport(SessionSide& session, const ParsedUrl& url);

}  // namespace rdmabroker
