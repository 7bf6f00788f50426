// SPDX-License-Identifier: Apache-2.0
// This broker's routes to the other brokers of its cluster (docs/cluster.md,
// SPEC.md §8). A route is pulled: this broker logs in to each broker of
// cluster.routes as a route (librdmabroker, over RDMA or TCP, reconnecting
// with back-off) and subscribes there once per entry of its ClusterInterest,
// so the other broker sends it exactly what its own clients want, and only
// messages that broker's clients published (one hop: no loop can form). The
// other brokers do the same here; they arrive as connections whose
// subscriptions are marked `route` in the index.
//
// A message that comes back over a route was published on that broker. It
// is copied into a pool buffer as a PUBLISH frame and handed, like the
// multicast engine hands its copies, to the workers of the local
// subscriptions its entry stands for: the plain ones of that pattern, or one
// member of that queue group (the other broker chose this one for the group
// because it had no member of its own). Never to a route: one hop.
//
// Gossip (protocol version 7, SPEC.md §8): a route's login announces this
// broker's route URLs (cluster.advertise), and the broker it dials sends INFO
// with its own and those of the brokers it has routes up to. A broker that
// learns of one it has no route to dials it ("discovered"), so a full mesh
// forms from partial lists. A discovered route that fails is forgotten until
// it is announced again. What this broker announces (its INFO) is rebuilt
// when its routes change and sent to every client of version 7.
//
// One thread (the route thread) connects, subscribes and unsubscribes; each
// route has a poller thread that polls its client (a polled client: the
// callbacks run there) and hands what arrived to the workers in one batch
// per worker after each poll, packed back to back in pool buffers.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "broker/core.hpp"
#include "broker/stats.hpp"
#include "broker/cluster_interest.hpp"
#include "worker/worker_set.hpp"
#include "rdmabroker/client.hpp"
#include "rdmabroker/proto/info.hpp"

namespace rdmabroker::daemon {

/// Where a route stands.
enum class RouteState {
  kConnecting,  // not logged in yet
  kUp,
  kDown,    // lost or refused: reconnecting with back-off
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

class Routes final : public RouteGossip {
 public:
  /// `self`: this broker's id (sent in every route login, so that a route to
  /// itself is recognised and refused), the client and route URLs it announces.
  Routes(BrokerCore& core, WorkerSet& workers, ClusterInterest& interest, proto::BrokerInfo self);
  ~Routes();
  Routes(const Routes&) = delete;
  Routes& operator=(const Routes&) = delete;

  void start(const std::vector<std::string>& urls);
  /// Closes every route and joins the thread (before the workers stop).
  void stop();
  /// cluster.routes reloaded: routes no longer listed close, new ones open.
  void set_urls(const std::vector<std::string>& urls);
  /// cluster.advertise or client_advertise reloaded: what this broker
  /// announces from its next INFO on, and in its routes' next logins (the
  /// id stays). False if nothing changed.
  bool set_self(proto::BrokerInfo self);
  std::vector<RouteStatus> status() const;
  /// A route login announced the route URLs of broker `b` (any thread): a
  /// broker with no route to it dials it.
  void announced(const proto::BrokerInfo& b) override;
  /// Declares the routes' statistics (docs/cluster.md, "Metrics"): per route,
  /// labelled by its URL (bounded: the configured list), summed in the snapshot.
  void visit(StatsVisitor& v) const;
  /// A broker not in a cluster: the broker-wide series, at 0.
  static void visit_no_cluster(StatsVisitor& v);
  static void visit_broker_wide(StatsVisitor& v, std::int64_t configured, std::int64_t interest);

 private:
  struct Route;
  void run();
  /// Under mu_ (released while a removed route ends): routes no longer
  /// listed or forgotten go, newly listed and discovered ones come.
  void update_list(std::unique_lock<std::mutex>& lock);
  /// Under mu_: takes each finished connect attempt and starts those due.
  /// When the loop should look again at the latest.
  std::chrono::steady_clock::time_point connect_due(std::unique_lock<std::mutex>& lock,
                                                    const std::vector<ClusterInterest::Entry>& interest);
  /// Makes `r`'s subscriptions there the entries of the interest now; true
  /// if it subscribed to any.
  bool reconcile(Route& r, const std::vector<ClusterInterest::Entry>& entries);
  /// Waits (a bounded time) until r's broker has processed what was sent on
  /// it so far: a PING and its PONG.
  void confirm(Route& r);
  /// Fault injection: the route-stall the admin armed, taken before the pass
  /// subscribes to new interest (lock released meanwhile).
  void stall_if_armed(std::unique_lock<std::mutex>& lock);
  /// A route's poller thread: polls its client, hands over after each poll.
  void poll(Route& r);
  /// The options of r's client (its callbacks report to this object).
  ClientOptions options_for(Route& r);
  /// A connect of r ended with `outcome`: r is up (true), or it is down until
  /// its next attempt, leads to this broker, or is forgotten; under mu_.
  bool connected(Route& r, Result<std::unique_ptr<Client>> outcome);
  /// Stops a route's poller and closes its client.
  void end(Route& r);
  /// Posts what `r` routed since the last hand-over to the workers (r.io_mu
  /// held); hand_over_taken takes r.io_mu. Whichever thread ran a turn of
  /// r's client hands over what it took in: the poller after each poll(),
  /// the route thread after it waited on the client (confirm, reconcile),
  /// since the poller may sleep in its poll() meanwhile.
  void hand_over(Route& r);
  void hand_over_taken(Route& r);
  /// A message from route `r` for interest entry `entry` (group `group`);
  /// on r's poller thread, or the route thread while it waits on the client.
  void on_message(Route& r, std::uint32_t entry, const std::string& group, const MessageView& m);
  /// One PUBLISH frame of a message from route r, at `frame_at` of its
  /// buffer, into the batches of its recipients' workers (or channels).
  void deliver_frame(Route& r, const std::vector<Subscriber>& to, std::uint32_t frame_at, std::uint32_t len,
                     std::uint32_t payload_len);
  /// The local subscriptions entry `entry` stands for that match `subject`:
  /// all of them, or one member of `group`.
  std::vector<Subscriber> recipients(Route& r, std::uint32_t entry, const std::string& group,
                                     std::string_view subject);
  /// Where the next `len` bytes go in r's pool buffer (a fresh one when it is
  /// full), waiting up to a second for one (the route waits meanwhile: its
  /// broker stops at the credits); null after that (a counted drop).
  std::byte* room(Route& r, std::uint32_t len, std::string_view subject);
  void wake();
  /// Route `r` brought its broker's INFO.
  void on_info(Route& r, const ServerInfo& info);
  /// Adds routes to the announced brokers that no route leads to; under mu_.
  void add_discovered_locked();
  /// Rebuilds this broker's INFO and, when it changed, sends it to every
  /// client (through the workers); under mu_.
  void announce_locked();

  BrokerCore& core_;
  WorkerSet& workers_;
  ClusterInterest& interest_;
  mutable std::mutex mu_;  // guards self_, routes_ (the list), urls_, stop_, dirty_
  proto::BrokerInfo self_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<Route>> routes_;
  std::vector<std::string> urls_;
  bool stop_ = false;
  bool dirty_ = true;  // the interest or the list changed since the last pass
  /// Route URLs of brokers announced to this one, by broker id (guarded by mu_).
  std::unordered_map<std::string, std::vector<std::string>> announced_;
  std::shared_ptr<const Announcement> info_;  // what this broker announces now (guarded by mu_)
  std::thread thread_;
};

}  // namespace rdmabroker::daemon
