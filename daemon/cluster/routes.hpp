// SPDX-License-Identifier: Apache-2.0
// This broker's routes to the other brokers of its cluster (docs/cluster.md,
// SPEC.md §8). A route is pulled: this broker logs in to each broker of
// cluster.routes as a route and subscribes there once per entry of its
// ClusterInterest, so the other broker sends it exactly what its own clients
// want, and only messages that broker's clients published (one hop: no loop
// can form). The other brokers do the same here; they arrive as connections
// whose subscriptions are marked `route` in the index.
//
// Each route is a connection of one worker, dialed instead of accepted
// (broker/route_events.hpp): the worker logs it in, keeps its subscriptions
// in step with the interest, and routes what comes back to the local
// subscriptions each entry stands for, in place, as it routes a publish.
// This object has no thread: it keeps the list of routes (configured and
// discovered), tells workers to dial (after a back-off when one failed) and
// to end them, and hears from the workers how each fares (RouteEvents).
//
// Gossip (protocol version 7, SPEC.md §8): a route's login announces this
// broker's route URLs (cluster.advertise), and the broker it dials sends INFO
// with its own and those of the brokers it has routes up to. A broker that
// learns of one it has no route to dials it ("discovered"), so a full mesh
// forms from partial lists. A discovered route that fails is forgotten until
// it is announced again. What this broker announces (its INFO) is rebuilt
// when its routes change and sent to every client of version 7.
//
// Interest in effect (SPEC.md §8): clients' PONGs wait until every route
// that is up has confirmed the interest up to theirs (route_synced), or has
// not answered within the bound; this object raises ClusterInterest::synced()
// and tells the workers.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "broker/cluster_interest.hpp"
#include "broker/core.hpp"
#include "broker/route_events.hpp"
#include "broker/stats.hpp"
#include "worker/worker_set.hpp"

namespace rdmabroker::daemon {

/// Where a route stands.
enum class RouteState {
  kConnecting,  // not logged in yet
  kUp,
  kDown,    // lost or refused: dialed again after a back-off
  kItself,  // the URL leads to this broker: never used
};
std::string_view to_string(RouteState s);

/// What `rdmabroker stat` and the metrics say about one route.
struct RouteStatus {
  std::string url;
  RouteState state = RouteState::kConnecting;
  std::string broker;             // the id of the broker it leads to (its INFO); empty: not known yet
  bool discovered = false;        // not in cluster.routes: announced (gossip)
  std::uint64_t messages_in = 0;  // messages it brought
  std::uint64_t bytes_in = 0;     // their payload bytes
  std::uint64_t dropped = 0;      // ... that could not be passed on (counted, logged)
  std::size_t interest = 0;       // entries subscribed there
  std::uint64_t reconnects = 0;
};

class Routes final : public RouteEvents {
 public:
  /// `self`: this broker's id (sent in every route login, so that a route to
  /// itself is recognised and refused), the client and route URLs it announces.
  Routes(BrokerCore& core, WorkerSet& workers, ClusterInterest& interest, proto::BrokerInfo self);
  ~Routes() override;
  Routes(const Routes&) = delete;
  Routes& operator=(const Routes&) = delete;

  void start(const std::vector<std::string>& urls);
  /// Before the workers stop: no route is dialed again (their connections
  /// end with the workers' shutdown).
  void stop();
  /// cluster.routes reloaded: routes no longer listed close, new ones open.
  void set_urls(const std::vector<std::string>& urls);
  /// cluster.advertise or client_advertise reloaded: what this broker
  /// announces from its next INFO on, and in its routes' next logins (the
  /// id stays). False if nothing changed.
  bool set_self(proto::BrokerInfo self);
  std::vector<RouteStatus> status() const;
  /// Declares the routes' statistics (docs/cluster.md, "Metrics"): per route,
  /// labelled by its URL (bounded: the configured list), summed in the snapshot.
  void visit(StatsVisitor& v) const;
  /// A broker not in a cluster: the broker-wide series, at 0.
  static void visit_no_cluster(StatsVisitor& v);
  static void visit_broker_wide(StatsVisitor& v, std::int64_t configured, std::int64_t interest);

  // ---- RouteEvents (workers, and route logins here)
  void announced(const proto::BrokerInfo& b) override;
  void route_up(std::uint64_t route, const std::string& description) override;
  void route_down(std::uint64_t route, RouteEnd end, const std::string& why) override;
  void route_info(std::uint64_t route, const proto::Info& info) override;
  void route_synced(std::uint64_t route, std::uint32_t through) override;

 private:
  struct Route {
    std::uint64_t id = 0;
    std::string url;
    /// Not in cluster.routes: the id of the broker announced with this URL
    /// (gossip); empty for a configured route.
    std::string announced_id;
    RouteState state = RouteState::kConnecting;
    bool was_up = false;
    proto::BrokerInfo peer;  // its broker, as its INFO says; empty id: no INFO (yet)
    std::chrono::milliseconds retry{0};
    std::string last_error;  // logged when it changes, not on every attempt
    std::uint64_t reconnects = 0;
    std::uint32_t synced = 0;  // the interest its broker confirmed
    std::shared_ptr<RouteCounters> counters = std::make_shared<RouteCounters>();
  };
  /// Under mu_.
  Route* find_locked(std::uint64_t id);
  void add_locked(const std::string& url, std::string announced_id);
  /// Tells r's worker to dial it, after `delay`.
  void dial_locked(Route& r, std::chrono::milliseconds delay);
  /// Ends r (its worker closes its connection or dial) and forgets it.
  void remove_locked(std::uint64_t id);
  /// Adds routes to the announced brokers that no route leads to.
  void add_discovered_locked();
  /// Rebuilds this broker's INFO and, when it changed, sends it to every
  /// client (through the workers).
  void announce_locked();
  /// Raises ClusterInterest::synced() as far as every route that is up has
  /// confirmed, and tells the workers (their held PONGs go out).
  void sync_locked();
  /// The interest changed (a worker's subscription): every worker's routes follow.
  void interest_changed();
  Worker& worker_of(std::uint64_t route) const {
    return workers_[static_cast<std::uint32_t>(route % workers_.size())];
  }

  BrokerCore& core_;
  WorkerSet& workers_;
  ClusterInterest& interest_;
  mutable std::mutex mu_;  // guards everything below
  proto::BrokerInfo self_;
  std::vector<std::unique_ptr<Route>> routes_;
  std::vector<std::string> urls_;
  std::uint64_t next_id_ = 1;
  bool started_ = false;
  bool stopped_ = false;
  /// Route URLs of brokers announced to this one, by broker id.
  std::unordered_map<std::string, std::vector<std::string>> announced_;
  std::shared_ptr<const Announcement> info_;  // what this broker announces now
};

}  // namespace rdmabroker::daemon
