// SPDX-License-Identifier: Apache-2.0
// What every worker shares, owned by the Server and outliving all workers:
// the options as started, the pool, the subscription index, the connection
// slots and the broker-wide budgets. It knows nothing of the layers above
// it: workers, the multicast engine and the routes are reached through the
// interfaces they implement (broker/dispatch.hpp, broker/channels.hpp,
// broker/route_events.hpp, broker/streams.hpp), set by the Server.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "broker/admission.hpp"
#include "broker/auth.hpp"
#include "broker/authenticator.hpp"
#include "broker/close_reason.hpp"
#include "broker/buffer_pool.hpp"
#include "broker/channels.hpp"
#include "broker/cluster_interest.hpp"
#include "broker/connection_slots.hpp"
#include "broker/dispatch.hpp"
#include "broker/log_throttle.hpp"
#include "broker/options.hpp"
#include "broker/outbound.hpp"
#include "broker/pool_shares.hpp"
#include "broker/route_events.hpp"
#include "broker/streams.hpp"
#include "broker/subscription_budget.hpp"
#include "broker/subscription_index.hpp"
#include "fault/fault.hpp"
#include "rdmabroker/common/adaptive_spin.hpp"
#include "rdmabroker/proto/info.hpp"

namespace rdmabroker::daemon {

/// Heap a queued delivery may cost besides its frame bytes (its OutItem and
/// queue slot; the payload itself sits in the registered pool): charged per
/// message against limits.max_pending_bytes_total, so that the bound holds
/// for heap too whatever the message size.
inline constexpr std::int64_t kQueuedMessageCharge = 128;
static_assert(sizeof(OutItem) + 16 <= kQueuedMessageCharge, "a queued message costs more than it is charged");
/// What `messages` queued deliveries of `bytes` frame bytes are charged.
constexpr std::int64_t queued_charge(std::int64_t bytes, std::int64_t messages) {
  return bytes + kQueuedMessageCharge * messages;
}

/// The brokers that have a route open to this one, by their id (SPEC.md §8):
/// a second route from the same broker (one broker listed twice under two
/// names) would bring its subscribers every message twice, so it is refused.
class RoutePeers {
 public:
  /// False if `server` already has a route open (another connection).
  bool claim(const std::string& server, std::uint64_t connection) {
    std::lock_guard lock(mu_);
    return open_.try_emplace(server, connection).first->second == connection;
  }
  /// Connection `connection`, a route of `server`, is closing.
  void release(const std::string& server, std::uint64_t connection) {
    std::lock_guard lock(mu_);
    if (auto it = open_.find(server); it != open_.end() && it->second == connection) open_.erase(it);
  }

 private:
  std::mutex mu_;
  std::unordered_map<std::string, std::uint64_t> open_;  // guarded by mu_
};

/// The INFO this broker sends now (SPEC.md §8, "Gossip"): Routes sets it
/// when what it says changes, workers read it for each login. It holds a
/// pool buffer: the Server clears it before the pool goes.
class AnnouncedInfo {
 public:
  std::shared_ptr<const Announcement> get() const {
    std::lock_guard lock(mu_);
    return info_;
  }
  void set(std::shared_ptr<const Announcement> info) {
    std::lock_guard lock(mu_);
    info_ = std::move(info);
  }

 private:
  mutable std::mutex mu_;
  std::shared_ptr<const Announcement> info_;  // guarded by mu_; null: nothing to announce (not in a cluster)
};

struct BrokerCore {
  BrokerOptions options;
  BufferPool* pool = nullptr;
  std::uint32_t rdma_devices = 0;  // RDMA devices served (0: TCP only)
  SubscriptionIndex index;
  WorkerDispatch* workers = nullptr;       // every worker, for what is routed to another's connection
  std::unique_ptr<ConnectionSlots> slots;  // one per open connection, all workers
  std::unique_ptr<Admission> admission;    // connect requests and slots, both transports
  SubscriptionBudget subscription_budget;  // limits.max_subscriptions_total / max_subscription_memory
  PoolShares pool_shares;                  // each client's share of the pool, the reserve, the queue budget
  std::atomic<std::uint64_t> next_connection_id{1};  // broker-wide, both transports
  SpinSlots spin_slots;  // flow.adaptive_poll: workers spinning at once, at most the cores but one
  std::shared_ptr<const AuthTable> auth;   // as started; reloads hand workers their successors
  Authenticator* authenticator = nullptr;  // checks passwords and tokens off the workers
  fault::Shared faults;                    // test builds: faults any worker may pick up
  /// Close lines per reason, broker-wide (a flood of failed logins must not flood the journal).
  std::array<LogThrottle, kCloseReasonCount> close_log_throttles;
  LogThrottle auth_failure_log;  // "authentication failed" lines, broker-wide
  // What an RDMA peer can make the workers log at will (a connect abandoned
  // right after rdma_connect): an accept that failed, a CM error event.
  LogThrottle rdma_accept_log;
  LogThrottle cm_error_log;
  MulticastChannels* multicast = nullptr;  // null: multicast off (or no RDMA device)
  ClusterInterest* interest = nullptr;     // null: not in a cluster (cluster.name empty)
  RoutePeers route_peers;                  // the brokers with a route open here: one each
  RouteEvents* routes = nullptr;           // null: not in a cluster; what the routes' connections report
  AnnouncedInfo announced;                 // the INFO a client of version 7 gets
  /// This broker's id in its cluster: random at each start, 16 hex digits. A
  /// route login that names it comes from this broker itself (SPEC.md §8).
  std::string server_id;
  /// The slot whose count is the multicast engine's backlog: messages
  /// workers routed to channels that the engine has not handled yet
  /// (messages, not bytes: each costs the engine at least one datagram).
  std::uint32_t multicast_slot = 0;
  /// The backlog's bound: publishers feeding channels are slowed above three
  /// quarters of it, as for a backlogged subscriber. A quarter of the
  /// retransmit window: a gap's repair request waits behind the backlog, and
  /// must be answered before the window has moved past the gap.
  std::uint64_t multicast_backlog = 1024;

  StreamCapture* streams = nullptr;  // the stream engine (null only in tests without one)
  /// The slot whose count is the stream engine's backlog: the receive
  /// buffers that messages routed to streams and not stored yet pin (each
  /// once per worker batch, StreamPublish::backlog_charge). Publishers to
  /// streams are slowed above three quarters of stream_backlog (a sixteenth
  /// of the pool: Server::create), as for a backlogged subscriber.
  std::uint32_t stream_slot = 0;
  std::uint64_t stream_backlog = 512;

  /// Whether `slot` counts an engine's backlog (in messages or buffers, not
  /// a connection's queued bytes: the broker-wide byte bound is not its).
  bool is_engine_slot(std::uint32_t slot) const {
    return (multicast != nullptr && slot == multicast_slot) || (streams != nullptr && slot == stream_slot);
  }
  /// The queue bound that slows publishers for `slot` (a connection's, or an engine's).
  std::uint64_t backlog_bound(std::uint32_t slot, std::uint64_t max_pending_bytes) const {
    if (multicast != nullptr && slot == multicast_slot) return multicast_backlog;
    if (streams != nullptr && slot == stream_slot) return stream_backlog;
    return max_pending_bytes;
  }
};

}  // namespace rdmabroker::daemon
