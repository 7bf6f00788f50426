// SPDX-License-Identifier: Apache-2.0
// The routes this broker dials to the other brokers of its cluster
// (docs/cluster.md, SPEC.md §8), as the layers below the cluster see them.
// A route is a connection of a worker like any other, made by dialing
// instead of accepting: the worker that owns it logs it in, subscribes there
// once per entry of this broker's ClusterInterest, and routes what comes
// back to the local subscriptions each entry stands for. What it learns on
// the way (up, down, the other broker's INFO, interest in effect) goes to
// RouteEvents, which cluster/routes.hpp implements: the list of routes,
// their back-off, gossip and the broker-wide interest sync. Any thread may
// call RouteEvents; workers call it from their loops.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "rdmabroker/proto/info.hpp"

namespace rdmabroker::daemon {

/// One route's traffic, shared by the worker that carries it (writes) and
/// the routes' status (reads).
struct RouteCounters {
  std::atomic<std::uint64_t> messages_in{0};  // messages it brought
  std::atomic<std::uint64_t> bytes_in{0};     // their payload bytes
  std::atomic<std::uint64_t> dropped{0};      // ... that could not be passed on (counted, logged)
  std::atomic<std::size_t> interest{0};       // entries subscribed there
};

/// What a worker needs to dial a route and log it in (SPEC.md §8).
struct RouteDial {
  std::uint64_t route = 0;            // the route's id in RouteEvents (stable across its connections)
  std::string url;                    // rdma://host[:port] or tcp://host[:port]
  std::string cluster;                // cluster.name: the login's subject
  std::string server;                 // this broker's id
  std::vector<std::string> announce;  // this broker's route URLs (version 7 logins carry them)
  std::string user;                   // cluster.user / cluster.password
  std::string password;
  std::shared_ptr<RouteCounters> counters;
  /// Not before then (a back-off after the last attempt failed).
  std::chrono::steady_clock::time_point not_before{};
};

/// How a route's connection ended, for the back-off and the log.
enum class RouteEnd : std::uint8_t {
  kLost,     // it failed to connect, was refused a login, or went down
  kItself,   // the broker at the URL is this one (a route login to itself is refused)
  kRemoved,  // this broker ended it (reload, shutdown)
};

class RouteEvents {
 public:
  virtual ~RouteEvents() = default;
  /// A route login here announced the route URLs of broker `b` (SPEC.md §8,
  /// "Gossip"): a broker with no route to it dials it.
  virtual void announced(const proto::BrokerInfo& b) = 0;
  /// Route `route` is logged in at its broker; `description`: how ("rdma ... -> ...").
  virtual void route_up(std::uint64_t route, const std::string& description) = 0;
  /// Its connection ended (or never came up): why, as the log says it.
  virtual void route_down(std::uint64_t route, RouteEnd end, const std::string& why) = 0;
  /// Its broker's INFO.
  virtual void route_info(std::uint64_t route, const proto::Info& info) = 0;
  /// Its broker has every interest entry up to `through` in its index (a
  /// PONG after the SUBSCRIBEs), or took longer than the interest's bound
  /// to say so (then it is not waited for).
  virtual void route_synced(std::uint64_t route, std::uint32_t through) = 0;
};

}  // namespace rdmabroker::daemon
