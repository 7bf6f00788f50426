// SPDX-License-Identifier: Apache-2.0
// A port: what a worker's loop drives to move its connections' bytes. An
// RDMA device's completion queues and SRQ (rdma/RdmaPort), the TCP sockets
// (tcp/TcpPort), or a test's fake: the loop (worker/worker.cpp) knows them
// only through this interface and calls each the same way every turn. A
// port hands what arrives to the frame handler it was made with and sends
// through its connections' links.
//
// Epoll: a port registers its descriptors in the worker's epoll set with
// tags from its EpollTags (its index in the tag's top byte, the port's own
// payload below); the loop hands each event back to that port.
#pragma once

#include <cstdint>

namespace rdmabroker::daemon {

/// What a port puts in epoll_event::data.u64 and gets back in on_event().
struct EpollTags {
  static constexpr int kPortShift = 56;
  static constexpr std::uint64_t kPayloadMask = (std::uint64_t{1} << kPortShift) - 1;
  std::uint64_t port_bits = 0;  // (index + 1) << kPortShift

  explicit EpollTags(std::uint32_t port_index = 0)
      : port_bits(static_cast<std::uint64_t>(port_index + 1) << kPortShift) {}
  std::uint64_t tag(std::uint64_t payload) const { return port_bits | (payload & kPayloadMask); }
  /// The port index of a tag, or -1 for one of the worker's own (top byte 0).
  static int port_of(std::uint64_t tag) { return static_cast<int>(tag >> kPortShift) - 1; }
  static std::uint64_t payload_of(std::uint64_t tag) { return tag & kPayloadMask; }
};

/// Why the loop woke, as wake-up counters tell it (docs/benchmarks.md, "Wake-ups").
enum class PortEvent : std::uint8_t {
  kCompletion,  // the data path: a completion arrived
  kSocket,      // a socket or listening socket is ready
};

class Port {
 public:
  virtual ~Port() = default;

  /// Takes what has arrived without waiting (completions; bytes TLS holds
  /// decrypted, which epoll cannot see). True if it found any: the loop
  /// does not sleep then. Called every turn and while the loop spins.
  virtual bool poll() = 0;
  /// After the loop flushed its connections: the port's periodic work
  /// (credit rebalancing, receive refills, resuming readers that waited for
  /// buffers).
  virtual void after_flush() = 0;
  /// After the connections' deadlines: the port's own (handshakes, frames begun and not finished).
  virtual void check_deadlines(bool stopping) = 0;
  /// Before the loop sleeps: asks to be woken by what arrives next, and by
  /// send completions if `sends_awaited`.
  virtual void arm(bool sends_awaited) = 0;
  /// An epoll event with one of this port's tags (its payload).
  virtual void on_event(std::uint64_t payload, std::uint32_t events, bool stopping) = 0;
  /// What an event with `payload` means for the wake-up counters.
  virtual PortEvent kind_of(std::uint64_t payload) const = 0;
  /// While the loop spins, an event of this port was found: true if it is
  /// work for the loop (a socket); false if the port took it (a completion
  /// channel's event, whose completions the spin polls anyway).
  virtual bool ready_in_spin(std::uint64_t payload) = 0;
  /// Send completions only, for a worker lending its turn to another
  /// thread's deliveries (Worker::deliver_if_asleep). True if any.
  virtual bool reap_sends() = 0;
  /// While busy, the loop still looks at this port's events every turn (a
  /// socket has no completion queue to poll); else every millisecond.
  virtual bool wants_events_every_turn() const = 0;
  /// What arrives here is seen only through epoll (no queue to poll): a
  /// spinning loop looks at epoll every 64 turns.
  virtual bool seen_only_by_epoll() const = 0;
  /// Connections still being accepted, which the worker must not stop before.
  virtual bool accepting() const = 0;
  /// Drops connection `id` if it is still being accepted here (an eviction:
  /// Admission); false if it is not here.
  virtual bool evict_accepting(std::uint64_t id) = 0;
  /// Shutdown: takes no new connections, refuses those being accepted.
  virtual void stop_accepting() = 0;
};

}  // namespace rdmabroker::daemon
