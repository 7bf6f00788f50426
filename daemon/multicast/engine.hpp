// SPDX-License-Identifier: Apache-2.0
// Hardware multicast fan-out (docs/multicast.md, SPEC.md §7).
//
// A subject that the config makes multicast-backed gets a *channel* once an
// exact (wildcard-free, non-queue-group) subscription names it: the channel
// stands in the subscription index for all of its subscribers, so a worker
// routes a publish to it once, and the engine's thread gives each message the
// channel's next sequence number, keeps it for repair, and delivers it:
//   - to the group, as UD datagrams (fragmented to the path MTU) on every
//     device with a member that joined, once the channel has `threshold`
//     members that can join (and until fewer than `leave_below` remain);
//   - over RC, through the member's worker, to every member that has not
//     joined (not yet, could not, or cannot: TCP and older clients).
// Sequence numbers make the two paths one stream for a client: it delivers
// each number once, in order, whichever path brought it, and asks for what
// is missing over RC (MCAST_REPAIR); what the window no longer holds is
// reported (MCAST_LOSS), never silently skipped.
//
// Threads: subscribe()/unsubscribe() run on workers and keep the index and
// the subject -> channel registry consistent under one mutex; everything else
// (channels, members, groups, the UD endpoints) belongs to the engine thread,
// which workers reach only through its command queue.
#pragma once

#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <variant>
#include <vector>

#include "broker/channels.hpp"
#include "broker/dispatch.hpp"
#include "broker/options.hpp"
#include "broker/outbound.hpp"
#include "broker/stats.hpp"
#include "broker/subscription_index.hpp"
#include "broker/buffer_pool.hpp"
#include "rdma/device.hpp"
#include "rdmabroker/common/fd.hpp"
#include "rdmabroker/common/ud_endpoint.hpp"
#include "rdmabroker/common/verbs.hpp"
#include "rdmabroker/result.hpp"
#include "worker/command_queue.hpp"

namespace rdmabroker::daemon {

struct BrokerCore;

/// Counters and gauges of the engine (its thread is the only writer).
struct MulticastStats {
  /// Declares every statistic below to `v` (multicast_stats.cpp).
  void visit(StatsVisitor& v) const;

  Gauge channels;                // subjects served by a channel
  Gauge groups;                  // channels sending to a multicast group
  Gauge members;                 // subscriptions served by channels
  Gauge members_joined;          // ... of which receive from the group
  Counter messages;              // channel messages sequenced
  Counter group_messages;        // ... sent to a group (once per device)
  Counter datagrams;             // UD datagrams sent (fragments and heartbeats)
  Counter unicast_copies;        // channel messages sent over RC to members that have not joined
  Counter repairs_requested;     // messages clients asked to have resent
  Counter repairs_served;        // ... resent over RC from the window
  Counter losses;                // ... no longer in the window: reported to the client as lost
  Counter joins;                 // groups joined by the broker (per device)
  Counter join_failures;         // broker joins that failed (the subject stays unicast)
  Counter client_join_failures;  // subscriptions whose client could not join (served by unicast)
  Counter send_errors;           // UD send completions with an error
  Counter no_channel;            // channel messages whose channel had just gone (subscribers closed)
};

class MulticastEngine final : public MulticastChannels {
 public:
  /// Needs the RDMA devices; starts nothing yet. What it sends over RC goes
  /// through `workers` (the members' workers).
  static Result<std::unique_ptr<MulticastEngine>> create(BrokerCore& core, const DeviceSet& devices,
                                                         WorkerDispatch& workers);
  ~MulticastEngine();
  MulticastEngine(const MulticastEngine&) = delete;
  MulticastEngine& operator=(const MulticastEngine&) = delete;

  void start();
  /// Leaves every group and joins the thread. Idempotent.
  void stop();

  // ---- any thread (workers, the main thread): MulticastChannels
  std::uint32_t subscribe(std::string_view subject, const ChannelMember& member,
                          std::uint32_t interest) override;
  void unsubscribe(std::uint32_t channel, std::uint64_t connection, std::uint32_t sid) override;
  void publish(std::vector<ChannelPublish>&& batch) override;
  void joined(std::uint64_t connection, std::uint32_t sid, std::uint64_t epoch, std::string error) override;
  void repair(std::uint64_t connection, std::uint32_t sid, std::uint64_t first, std::uint64_t count) override;
  /// A reload's multicast settings (only the live ones can differ).
  void reload(const config::MulticastSettings& settings);

  const MulticastStats& stats() const { return stats_; }

 private:
  struct AddMember {
    std::uint32_t channel = 0;
    std::string subject;
    ChannelMember member;
  };
  struct RemoveMember {
    std::uint32_t channel = 0;
    std::uint64_t connection = 0;
    std::uint32_t sid = 0;
  };
  struct PublishBatch {
    std::vector<ChannelPublish> items;
  };
  struct Joined {
    std::uint64_t connection = 0;
    std::uint32_t sid = 0;
    std::uint64_t epoch = 0;
    std::string error;
  };
  struct Repair {
    std::uint64_t connection = 0;
    std::uint32_t sid = 0;
    std::uint64_t first = 0;
    std::uint64_t count = 0;
  };
  struct Reload {
    config::MulticastSettings settings;
  };
  struct Stop {};
  /// Everything but the messages: cheap, and handled ahead of queued
  /// messages, so that a repair request is answered before the window moves
  /// past the gap it asks for (and a new member is in before its messages).
  using Command = std::variant<AddMember, RemoveMember, Joined, Repair, Reload, Stop>;

  /// One device's UD endpoint: an rdma_cm id bound to the broker's address on
  /// that device (groups are joined on it), a UD QP and its CQ, and staging
  /// slots (registered) that datagrams are written into. Members in creation
  /// order; destruction in reverse is a valid teardown (QP, MR, CQ, id).
  /// A device's UD endpoint (id, CQ, staging slots, QP) and its send state.
  struct Endpoint : verbs::UdEndpoint {
    std::uint32_t device = 0;
    std::uint32_t mtu = 0;  // path MTU: the largest datagram
    std::uint32_t slot_count = 0;
    std::uint32_t next_slot = 0;
    std::uint32_t in_flight = 0;  // sends posted, not completed (all signaled, FIFO)
    bool broken = false;          // a send failed: no more groups on this device
  };
  enum class MemberMode : std::uint8_t {
    kUnicast,   // gets every message over RC
    kJoining,   // told to join (MCAST_JOIN); still over RC until it answers
    kJoined,    // receives from the group; over RC only repairs
    kFallback,  // its join failed: over RC for good
  };
  struct Member {
    ChannelMember info;
    MemberMode mode = MemberMode::kUnicast;
    std::uint64_t join_epoch = 0;  // the MCAST_JOIN's sequence: matches its MCAST_JOINED
    std::uint64_t lost_until = 0;  // reported lost below this: a repeated request is not counted twice
  };
  /// The group on one device.
  struct DeviceGroup {
    bool joining = false;
    bool joined = false;
    verbs::AhPtr ah;
    std::uint32_t remote_qpn = 0;
    std::uint32_t remote_qkey = 0;
    std::uint64_t token = 0;  // the join's context (CM events name it)
  };
  struct WindowEntry {
    std::uint64_t sequence = 0;
    BufferRef buf;
    RoutedFrame frame;
    std::int64_t received_at = 0;  // when its worker took it from the publisher (steady ns)
  };
  struct Channel {
    std::uint32_t id = 0;
    std::string subject;
    std::uint64_t next_sequence = 1;
    std::vector<Member> members;
    std::deque<WindowEntry> window;  // consecutive sequence numbers, oldest first
    bool grouped = false;            // has a group address and joins (or joined) it
    bool join_failed = false;        // the broker could not join: unicast for good
    std::uint32_t group_index = 0;   // offset in multicast.groups
    sockaddr_in group{};
    std::map<std::uint32_t, DeviceGroup> devices;  // by device index
    std::vector<WindowEntry> packed;               // consecutive messages for the next datagram
    std::uint32_t packed_bytes = 0;
  };

  MulticastEngine(BrokerCore& core, const DeviceSet& devices, WorkerDispatch& workers);
  void run();
  void handle_commands();
  void handle(AddMember& c);
  void handle(RemoveMember& c);
  void handle(PublishBatch& c);
  void handle(Joined& c);
  void handle(Repair& c);
  void handle(Reload& c);
  void handle(Stop&) { stopping_ = true; }
  void handle_cm_events();

  /// Joins or leaves the group as the membership and the settings say, and
  /// tells members on joined devices to join.
  void update(Channel& ch);
  void leave_group(Channel& ch);
  Endpoint* endpoint_for(const ChannelMember& m, std::string& why);
  /// Writes and posts datagrams: none = a heartbeat; one message longer than
  /// a datagram = its fragments; otherwise the messages packed into one.
  void send_datagrams(Channel& ch, std::span<const WindowEntry> entries);
  /// Adds a message to the channel's datagram being packed (sent when the
  /// next does not fit, does not follow, or the batch ends).
  void pack(Channel& ch, const WindowEntry& e);
  void flush_packed(Channel& ch);
  /// The message bytes one datagram carries on every device of the channel's group.
  std::uint32_t datagram_room(const Channel& ch) const;
  void poll_sends(Endpoint& ep);
  void remember(Channel& ch, WindowEntry entry);
  void heartbeats();

  /// Queues an item for a member over RC (through its worker).
  void to_member(const Member& m, OutItem item);
  void unicast(const Member& m, const WindowEntry& e, bool repair);
  void post_to_workers();
  Channel* find_channel(std::uint32_t id);
  Member* find_member(std::uint64_t connection, std::uint32_t sid, Channel** channel);

  BrokerCore& core_;
  const DeviceSet& devices_;
  WorkerDispatch& workers_;
  MulticastStats stats_;

  // ---- registry: workers, under registry_mutex_
  struct Registered {
    std::uint32_t id = 0;
    std::size_t members = 0;
    Subscriber entry;  // the channel's entry in the subscription index
  };
  std::mutex registry_mutex_;
  std::unordered_map<std::string, Registered> by_subject_;
  std::unordered_map<std::uint32_t, std::string> subject_of_;
  /// The last channel id given. Ids start at a random number (never 0), as
  /// does next_group_: brokers on one fabric with the same multicast.groups
  /// send to the same groups, where each client's UD QP also receives the
  /// other brokers' datagrams; it keeps only its channels' (SPEC.md §7.3).
  std::uint32_t last_channel_ = 0;

  // ---- engine thread
  config::MulticastSettings settings_;
  std::uint32_t group_base_ = 0;   // host order
  std::uint32_t group_count_ = 0;  // addresses in the range
  std::uint32_t next_group_ = 0;
  std::set<std::uint32_t> groups_in_use_;
  verbs::EventChannelPtr cm_channel_;
  std::map<std::uint32_t, std::unique_ptr<Endpoint>>
      endpoints_;                                        // by device; before channels_: destroyed after
  std::unordered_map<std::uint32_t, Channel> channels_;  // AHs go before the endpoints' QPs
  std::unordered_map<std::uint64_t, std::pair<std::uint32_t, std::uint32_t>>
      joins_;  // token -> (channel, device)
  std::uint64_t next_token_ = 1;
  std::size_t window_entries_ = 0;  // across channels: bounded so that windows cannot drain the pool
  std::size_t window_limit_ = 0;
  std::vector<std::vector<RemoteDelivery>> remote_;  // per worker, posted at the end of each command batch
  CommandQueue<Command> commands_;
  CommandQueue<PublishBatch> publishes_;  // the workers' routed messages, in their order
  UniqueFd epoll_;
  std::vector<Command> scratch_;
  std::vector<PublishBatch> batches_;
  bool stopping_ = false;
  std::atomic<bool> started_{false};
  std::thread thread_;
};

}  // namespace rdmabroker::daemon
