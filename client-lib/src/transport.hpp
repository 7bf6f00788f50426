// SPDX-License-Identifier: Apache-2.0
// Internal to librdmabroker: what moves a Session's frames. A Session owns
// one Transport (RdmaTransport, TcpTransport): the connection to the broker
// and the I/O thread that feeds what arrives to Session::on_frames() and puts
// the session's filled send buffers on the wire. Everything above the bytes
// (subscriptions, requests, multicast sequencing, flow of send buffers) is
// the Session's, written once for both.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstddef>

#include "rdmabroker/common/fd.hpp"
#include "rdmabroker/proto/multicast.hpp"
#include "rdmabroker/result.hpp"

namespace rdmabroker {

class Session;

class Transport {
 public:
  explicit Transport(Session& session) : session_(session) {}
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
  /// I/O thread: joins the group of `j` for subscription `sid` and answers
  /// with Session::join_done (now, or when the join completes). A transport
  /// without multicast refuses.
  virtual void join_group(std::uint32_t sid, const proto::McastJoin& j, std::uint64_t epoch);
  /// I/O thread: subscription `sid` no longer takes its messages from a group.
  virtual void leave_group(std::uint32_t /*sid*/) {}

 protected:
  /// The loop's turn takes the wake-ups (wake_fd_ was readable).
  void take_wakeups() {
    std::uint64_t count;
    [[maybe_unused]] auto n = ::read(wake_fd_.get(), &count, sizeof count);
  }

  Session& session_;
  /// Made by connect() and watched by the loop's epoll. It lives as long as
  /// the transport (past close()), so a wake() racing a close() writes to
  /// an fd that is still ours.
  UniqueFd wake_fd_;
};

}  // namespace rdmabroker
