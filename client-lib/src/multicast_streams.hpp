// SPDX-License-Identifier: Apache-2.0
// Internal to librdmabroker: the sequenced streams of subscriptions the
// broker serves by multicast (SPEC.md §7). Each such subscription's messages
// carry its channel's sequence numbers and come by two paths, the group's
// datagrams and the connection (repairs, messages sent before the join);
// each is delivered once, in order, whichever path brought it first. A gap
// that lasts is asked for (MCAST_REPAIR); one beyond the broker's window is
// reported lost. The I/O loop's own: no lock.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <span>
#include <unordered_map>
#include <vector>

#include "deliveries.hpp"

namespace rdmabroker {

class SequencedStreams {
 public:
  bool empty() const { return streams_.empty(); }
  /// MCAST_JOIN for `sid`: its messages come on `channel`, those before
  /// `sequence` came over the connection already.
  void joined(std::uint32_t sid, std::uint32_t channel, std::uint64_t sequence);
  /// MCAST_LEAVE: the rest comes over the connection; what the group did not
  /// bring before `sequence` is a gap like any other.
  void left(std::uint32_t sid, std::uint64_t sequence);
  /// Message `seq` of `sid` (a sequenced DELIVER's, or a datagram's).
  void add(std::uint32_t sid, std::uint64_t seq, Message&& m, Deliveries& deliveries, bool from_group);
  /// MCAST_LOSS: moves past `count` messages from `first`, reports it in `errors`.
  void lost(std::uint32_t sid, std::uint64_t first, std::uint64_t count, Deliveries& deliveries,
            std::vector<Error>& errors);
  /// A datagram from a group, without the GRH; `max_frame`: our receive buffer size.
  void on_datagram(std::span<const std::byte> datagram, std::uint32_t max_frame, Deliveries& deliveries);
  /// Forgets the streams of subscriptions that ended; returns their ids.
  std::vector<std::uint32_t> forget_ended(const std::function<bool(std::uint32_t sid)>& subscribed);

  struct Repair {
    std::uint32_t sid;
    std::uint64_t first;
    std::uint64_t count;
  };
  /// The gaps due to be asked for now (into `out`); ms until the next one
  /// is due (-1: no gap).
  int due_repairs(Clock::time_point now, std::vector<Repair>& out);

  // ClientStats, any thread.
  std::atomic<std::uint64_t> multicast_messages{0};
  std::atomic<std::uint64_t> repairs_requested{0};
  std::atomic<std::uint64_t> duplicates{0};
  std::atomic<std::uint64_t> messages_lost{0};

 private:
  struct Stream {
    std::uint32_t channel = 0;  // from MCAST_JOIN (0: not told yet)
    bool started = false;
    std::uint64_t next = 0;                  // the next sequence number to deliver
    std::uint64_t tail = 0;                  // the highest known to exist (a heartbeat or a later message)
    std::map<std::uint64_t, Message> early;  // arrived ahead of `next`
    Clock::time_point gap_since{};           // when the current gap was first seen
    Clock::time_point asked_at{};            // when it was last asked for
    bool asked = false;
  };
  /// A multicast message being reassembled from its datagrams.
  struct Partial {
    std::vector<std::byte> bytes;
    std::set<std::uint32_t> offsets;  // fragments received (duplicates are ignored)
    std::uint32_t received = 0;
  };
  void deliver_in_order(std::uint32_t sid, Stream& s, Deliveries& deliveries);

  std::unordered_map<std::uint32_t, Stream> streams_;                    // by sid
  std::map<std::pair<std::uint32_t, std::uint64_t>, Partial> partials_;  // (channel, seq)
};

}  // namespace rdmabroker
