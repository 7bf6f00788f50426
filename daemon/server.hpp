// SPDX-License-Identifier: Apache-2.0
// The composition root: one broker instance, its buffer pool, devices, workers,
// multicast engine and listeners, created in that order and torn down in reverse.
#pragma once

#include <chrono>
#include <future>
#include <memory>
#include <utility>
#include <vector>

#include "broker/health.hpp"
#include "broker/options.hpp"
#include "broker/stats.hpp"
#include "fault/fault.hpp"
#include "broker/buffer_pool.hpp"
#include "rdma/device.hpp"
#include "multicast/engine.hpp"
#include "stream/engine.hpp"
#include "accept/listener.hpp"
#include "broker/cluster_interest.hpp"
#include "cluster/routes.hpp"
#include "worker/worker.hpp"
#include "worker/worker_set.hpp"
#include "rdmabroker/result.hpp"

namespace rdmabroker::daemon {

/// What the broker logs at start and reload, and --check-config prints, for
/// a configuration that admits no client.
inline constexpr const char* kNobodyCanConnect =
    "auth: no users and anonymous access off: every client will be refused "
    "(set auth.anonymous: true, or add auth.users; docs/security.md)";

class Server {
 public:
  /// Opens devices, registers memory, creates workers and the listening id.
  static Result<std::unique_ptr<Server>> create(const BrokerOptions& options);
  ~Server();

  void start();
  /// Stops accepting, closes every client (they receive CLOSE), waits for
  /// the workers to drain, joins all threads. Idempotent.
  void stop();

  /// Declares every statistic of the broker to `v`: each worker's, the
  /// listener's, the multicast engine's and the broker-wide gauges.
  void visit_stats(StatsVisitor& v) const;
  /// The sum of them by key.
  StatsSnapshot stats() const;
  /// Every open connection, asked of each worker (waits up to 2 s for them).
  std::vector<ConnectionInfo> connections() const;
  /// The stream engine, for `rdmabroker stream` (main thread).
  StreamEngine* streams() const { return streams_.get(); }
  /// The routes this broker pulls from, and their state (empty: not in a cluster).
  std::vector<RouteStatus> routes() const { return routes_ ? routes_->status() : std::vector<RouteStatus>{}; }
  /// Hands the live settings of a reload to every worker (config::diff says
  /// which settings are live; the caller has refused any other change).
  void apply_live(const BrokerOptions& next);
  /// Loads the TLS files again (a renewed certificate at the same path is
  /// picked up) and gives new TLS connections the result; connected ones
  /// keep theirs. What it loaded ("" while tls.mode is off), or why not:
  /// then nothing changed.
  Result<std::string> load_tls(const config::TlsSettings& settings);
  /// True while every worker's loop went round within kLivenessLimit (the
  /// systemd watchdog is fed only then).
  bool workers_healthy() const { return stuck_workers().empty(); }
  /// GET /healthz: every worker's loop went round within kLivenessLimit.
  HealthReport liveness() const;
  /// GET /readyz: live, listening, and every RDMA device has an active port.
  /// Main thread (it queries the ports).
  HealthReport readiness() const;
  /// A worker loop that has not gone round for this long is stuck: the
  /// watchdog stops being fed and /healthz fails (each loop wakes at least
  /// every 200 ms).
  static constexpr std::chrono::seconds kLivenessLimit{2};
  const BrokerOptions& options() const { return core_.options; }
  /// "rdma://0.0.0.0:7470 (rxe0, rxe1), tcp://0.0.0.0:7471": what it listens on.
  std::string listeners() const;
  /// The URLs of its listeners: the clients' and the routes' own (cluster.listen_*).
  struct ListenerUrls {
    std::vector<std::string> clients;
    std::vector<std::string> routes;
  };
  ListenerUrls listener_urls() const;
  /// What this broker announces (SPEC.md §8, "Gossip") with settings `opt`:
  /// cluster.advertise and cluster.client_advertise, or its listeners that
  /// name a host.
  proto::BrokerInfo announcement(const BrokerOptions& opt) const;
  /// Logs what `self` announces (at start, and after a reload changed it).
  void log_announcement(const proto::BrokerInfo& self) const;
  bool rdma_enabled() const { return devices_ != nullptr; }
  /// Test builds (fault/fault.hpp): arms one fault; the admin command `fault`.
  /// Main thread only.
  Status inject(const fault::Spec& spec);

 private:
  /// Each worker whose loop has not gone round within kLivenessLimit, and
  /// for how long: what the watchdog and /healthz both judge by.
  std::vector<std::pair<std::uint32_t, std::chrono::milliseconds>> stuck_workers() const;
  static void warn_if_nobody_can_connect(const AuthTable& table);
  /// Readiness in a cluster: at least one route up (or none to other brokers).
  HealthCheck routes_check() const;
  /// Opens the RDMA devices (as rdma: auto/on/off and what is present say)
  /// and the TCP listening socket; true when RDMA is served.
  Result<bool> open_transports();
  /// The multicast engine (multicast.enabled, with RDMA) and the stream engine.
  Status create_engines(bool use_rdma);
  Server() = default;
  /// Posts make(promise) to every worker; each answers through its promise.
  template <typename T, typename MakeCommand>
  std::vector<std::future<T>> ask_workers(MakeCommand make) const;
  /// How long the main thread waits for the workers' answers (a stuck worker
  /// is the watchdog's business, not a reason to hang `stat` or a reload).
  static constexpr std::chrono::seconds kWorkerAnswerTimeout{2};

  BrokerCore core_;
  std::unique_ptr<BufferPool> pool_;           // declaration order = creation order
  std::unique_ptr<DeviceSet> devices_;         // null: TCP only
  UniqueFd tcp_listen_;                        // -1: no TCP; outlives the workers that watch it
  UniqueFd route_tcp_listen_;                  // cluster.listen_tcp; -1: none
  TlsHolder tls_;                              // TLS on the TCP listener (null: tls.mode off)
  std::unique_ptr<ClusterInterest> interest_;  // null: not in a cluster; outlives the workers' subscriptions
  std::vector<std::unique_ptr<Worker>> workers_;
  WorkerSet worker_set_;  // the same workers, as the core and the layers above see them
  std::unique_ptr<MulticastEngine>
      multicast_;  // null: multicast off; stopped after the workers, before them destroyed
  // Stopped after the workers (nothing routes to it then), destroyed before the pool.
  std::unique_ptr<StreamEngine> streams_;
  std::unique_ptr<Listener> listener_;            // the RDMA CM listener; null: TCP only
  std::unique_ptr<Authenticator> authenticator_;  // after workers_: destroyed (joined) before them
  std::unique_ptr<Routes> routes_;                // after workers_: stopped and destroyed before them
  bool stopped_ = false;
};

}  // namespace rdmabroker::daemon
