// SPDX-License-Identifier: Apache-2.0
// The part of a Connection that only a route this broker dialed has
// (broker/route_events.hpp): its login, its subscriptions at the other
// broker (one per interest entry), the PINGs that confirm them, and the
// messages in fragments it is forwarding. Owned by its Connection, touched
// only on its worker's thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "broker/cluster_interest.hpp"
#include "broker/route_events.hpp"
#include "broker/subscription_index.hpp"

namespace rdmabroker::daemon {

struct DialedRoute {
  explicit DialedRoute(RouteDial d) : dial(std::move(d)) {}

  RouteDial dial;
  /// Logged in: its broker answered the PING sent after CONNECT.
  bool logged_in = false;
  /// Its broker's id, once its INFO said (`rdmabroker stat`).
  std::string broker;
  /// Its broker refused the login; the reason (ERROR's text) for the log.
  std::string refusal;
  /// Set once its end was reported (RouteEvents::route_down): once only.
  bool reported_down = false;
  /// Ended by this broker (a reload removed it, or it shuts down).
  bool removed = false;

  // ---- subscriptions there: one per interest entry
  struct Entry {
    std::uint32_t id = 0;  // the entry's id (ClusterInterest)
    std::string group;     // its queue group (empty: none)
  };
  std::unordered_map<std::uint32_t, Entry> by_sid;          // sid there -> entry
  std::unordered_map<std::uint32_t, std::uint32_t> sid_of;  // entry id -> sid there
  std::uint32_t next_sid = 1;
  /// Per entry of a queue group: the round robin over its local members.
  std::unordered_map<std::uint32_t, std::uint32_t> next_member;
  /// New interest held back by a fault (route-stall) until `held_until`.
  bool held = false;
  std::chrono::steady_clock::time_point held_until{};

  // ---- PINGs after SUBSCRIBEs (SPEC.md §8, "Interest in effect")
  struct Ping {
    std::uint32_t through = 0;  // the interest it confirms
    std::chrono::steady_clock::time_point sent{};
    bool reported = false;  // reported synced at its deadline, unanswered
  };
  std::deque<Ping> pings;    // in order: PONGs answer them in order (the first: the login's)
  std::uint32_t pinged = 0;  // the highest interest a PING was sent for
  std::uint32_t synced = 0;  // ... and answered

  // ---- messages in fragments it is forwarding (SPEC.md §3.7)
  /// By (sid there, publisher id there): the id its fragments carry here
  /// (drawn like a connection's, so no two senders share one) and the
  /// local subscriptions it goes to, fixed at its first fragment.
  struct OpenMessage {
    std::uint64_t publisher = 0;
    std::vector<Subscriber> recipients;
  };
  std::map<std::pair<std::uint32_t, std::uint64_t>, OpenMessage> open;
};

struct WorkerContext;

/// A dial of `dial` that never made a connection: its connection slot goes
/// back and the routes hear why (`why`, as the log says it).
void dial_failed(WorkerContext& ctx, std::uint32_t slot, const RouteDial& dial, const std::string& why);

}  // namespace rdmabroker::daemon
