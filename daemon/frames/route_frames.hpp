// SPDX-License-Identifier: Apache-2.0
// A route this broker dialed, on the worker that owns it: the client side
// of SPEC.md §8. Once its transport is up it logs in as a route (CONNECT
// with the ROUTE flag), subscribes at the other broker once per entry of
// this broker's ClusterInterest and PINGs; the PONG says the login took
// (RouteEvents::route_up), later PONGs that the interest is in effect there
// (route_synced). What the other broker sends is handled here: DELIVERs go
// to the router (router/route_inbound.cpp), INFO to the routes' gossip,
// ERROR and CLOSE end it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "broker/cluster_interest.hpp"
#include "connection/connections.hpp"
#include "connection/worker_context.hpp"
#include "rdmabroker/proto/wire.hpp"
#include "router/router.hpp"

namespace rdmabroker::daemon {

class RouteFrames {
 public:
  /// How long a route's broker may take to answer the PING that confirms
  /// new subscriptions there: clients' PONGs wait for it (SPEC.md §8,
  /// "Interest in effect"), so a route that does not answer must not hold
  /// them longer.
  static constexpr std::chrono::seconds kSyncTimeout{2};

  RouteFrames(WorkerContext& ctx, Connections& connections, Router& router)
      : ctx_(ctx), connections_(connections), router_(router) {}

  /// The frames its broker sent on dialed route `c`: whole ones in [begin, end) of `buf`.
  void process(Connection& c, const BufferRef& buf, std::uint32_t begin, std::uint32_t end);
  /// c's transport is up: CONNECT as a route, a SUBSCRIBE per interest entry, PING.
  void log_in(Connection& c);
  /// The cluster's interest changed: every logged-in route of this worker
  /// subscribes to the new entries, drops those gone, and PINGs.
  void interest_changed();
  /// Once per loop turn: PINGs unanswered past kSyncTimeout are not waited
  /// for, interest held back by a fault (route-stall) goes out when due.
  void check();
  /// Dialed route `c` joined this worker (to be looked after by check()).
  void watch(const Connection& c) { routes_.push_back(c.id); }

 private:
  /// Makes c's subscriptions there the entries of `interest` and PINGs;
  /// nothing if they are already (no PING either).
  void reconcile(Connection& c, const ClusterInterest::Snapshot& interest);
  void on_deliver(Connection& c, const proto::Frame& f, const BufferRef& buf);
  void on_pong(Connection& c);
  void on_info(Connection& c, const proto::Frame& f);
  void on_error(Connection& c, const proto::Frame& f);
  /// Queues a frame of ours on c (CONNECT's credentials in a pool buffer: a
  /// send block is too small for them).
  void send(Connection& c, proto::FrameHeader h, std::string_view subject, std::string_view reply,
            std::string_view payload);
  void ping(Connection& c, std::uint32_t through);

  WorkerContext& ctx_;
  Connections& connections_;
  Router& router_;
  std::vector<std::uint64_t> routes_;  // this worker's dialed routes (ids; gone ones dropped by check())
};

}  // namespace rdmabroker::daemon
