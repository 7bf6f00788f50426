// SPDX-License-Identifier: Apache-2.0
#include "server.hpp"

#include "rdmabroker/common/url.hpp"
#include "rdmabroker/config/config.hpp"
#include "tcp/tcp_listener.hpp"

#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <ctime>
#include <random>
#include <thread>

namespace rdmabroker::daemon {

Result<std::unique_ptr<Server>> Server::create(const BrokerOptions& options) {
  std::unique_ptr<Server> b(new Server());
  b->core_.options = options;
  auto& opt = b->core_.options;
  // The options were validated by the config library (config::parse, and
  // config::validate once the flags were applied): ranges and the rules
  // that tie settings together are checked there, once.
  if (opt.workers == 0) opt.workers = std::clamp(std::thread::hardware_concurrency(), 1u, 8u);
  // Two reserved slots: the multicast and stream engines' backlogs
  // (BrokerCore::multicast_slot, stream_slot).
  b->core_.slots = std::make_unique<ConnectionSlots>(opt.max_connections, 2);
  b->core_.admission = std::make_unique<Admission>(*b->core_.slots, opt.max_connections, opt.buffer_size);
  b->core_.admission->set_unauthenticated_limits(opt.unauthenticated_limit(),
                                                 opt.unauthenticated_per_address_limit());
  b->core_.multicast_slot = opt.max_connections;
  b->core_.stream_slot = opt.max_connections + 1;
  // Messages queued for the stream engine pin their receive buffers: the
  // backlog (counted in buffers) that slows publishers to streams is a
  // sixteenth of the pool, so a slow disk never takes the pool from
  // everyone else (issue 48's rule for a slow subscriber).
  b->core_.stream_backlog = std::max<std::uint64_t>(64, opt.pool_buffers / 16);
  b->core_.auth = AuthTable::build(opt.auth);
  warn_if_nobody_can_connect(*b->core_.auth);
  Server* self = b.get();
  b->authenticator_ = std::make_unique<Authenticator>(
      b->core_.auth, Authenticator::Policy::from(opt.auth),
      [self](const Authenticator::Request& r, Result<std::shared_ptr<const Identity>> verdict) {
        AuthResultCommand cmd{r.connection, nullptr, ""};
        if (verdict) {
          cmd.identity = std::move(verdict.value());
        } else {
          cmd.error = verdict.error().message;
        }
        self->worker_set_[r.worker].post(std::move(cmd));
      });
  b->core_.authenticator = b->authenticator_.get();
  auto pool = BufferPool::create(opt.pool_buffers, opt.buffer_size);
  if (!pool) return pool.error();
  b->pool_ = std::move(pool.value());
  b->core_.pool = b->pool_.get();
  b->core_.pool_shares.configure(opt.pool_buffers);
  if (opt.tcp_listen_address.empty()) opt.tcp_listen_address = opt.listen_address;

  if (auto tls = b->load_tls(opt.tls); !tls) {
    return tls.error();
  } else if (!tls->empty()) {
    spdlog::info("tls ({} on tcp://{}:{}): {}", config::to_string(opt.tls.mode), opt.tcp_listen_address,
                 opt.tcp_port, *tls);
  }
  auto use_rdma = b->open_transports();
  if (!use_rdma) return use_rdma.error();

  for (std::uint32_t i = 0; i < opt.workers; ++i) {
    b->workers_.push_back(std::make_unique<Worker>(i, b->core_));
    b->worker_set_.add(*b->workers_.back());
  }
  b->core_.workers = &b->worker_set_;
  for (auto& w : b->workers_) {
    if (auto st = w->init(b->devices_.get(), {b->tcp_listen_.get(), b->route_tcp_listen_.get(), &b->tls_});
        !st)
      return st.error();
  }
  if (auto st = b->create_engines(*use_rdma); !st) return st.error();
  {
    std::random_device random;
    b->core_.server_id = fmt::format("{:08x}{:08x}", random(), random());
  }
  if (!opt.cluster.name.empty()) {
    b->routes_ =
        std::make_unique<Routes>(b->core_, b->worker_set_, *b->interest_, b->announcement(b->core_.options));
    b->core_.routes = b->routes_.get();
  }
  if (*use_rdma) {
    b->listener_ = std::make_unique<Listener>(b->core_, *b->devices_, b->worker_set_);
    if (auto st = b->listener_->listen(); !st) return st.error();
  }
  return b;
}

Status Server::create_engines(bool use_rdma) {
  const auto& opt = core_.options;
  if (!opt.cluster.name.empty()) {
    // Before the engines: a stream's subjects are interest on the routes.
    interest_ = std::make_unique<ClusterInterest>();
    core_.interest = interest_.get();
  }
  if (opt.multicast.enabled && !use_rdma) {
    spdlog::warn("multicast.enabled: no RDMA device, so no multicast: every subject is served by unicast");
  } else if (opt.multicast.enabled) {
    auto engine = MulticastEngine::create(core_, *devices_, worker_set_);
    if (!engine) return engine.error();
    multicast_ = std::move(engine.value());
    core_.multicast = multicast_.get();
  }
  auto streams = StreamEngine::create(core_, opt.storage, opt.streams);
  if (!streams) return streams.error();
  streams_ = std::move(streams.value());
  core_.streams = streams_.get();
  return {};
}

Result<bool> Server::open_transports() {
  const auto& opt = core_.options;
  bool use_rdma = opt.rdma != RdmaMode::kOff;
  if (use_rdma && DeviceSet::count() == 0) {
    if (opt.rdma == RdmaMode::kOn) {
      return Error{
          ErrorKind::kResource,
          "no RDMA device found and RDMA is required (--rdma on): load a driver (e.g. rdma_rxe) and check "
          "`rdma link`, or use --rdma auto to serve TCP only"};
    }
    use_rdma = false;
    spdlog::warn("no RDMA device found: serving TCP only");
  }
  if (opt.cluster.listen_rdma_port != 0 && !use_rdma) {
    spdlog::warn(
        "cluster.listen_rdma: no RDMA here, so no RDMA route listener; routes log in on "
        "cluster.listen_tcp{}",
        opt.cluster.listen_tcp_port != 0 ? "" : " (not set either: this broker takes no routes)");
  }
  if (!use_rdma && opt.tcp_port == 0) {
    return Error{ErrorKind::kInvalidArgument,
                 "nothing to listen on: RDMA is off (or has no device) and TCP is disabled (--tcp-port 0)"};
  }
  if (use_rdma) {
    auto devices = DeviceSet::open(*pool_, opt.devices);
    if (!devices) return devices.error();
    devices_ = std::move(devices.value());
    core_.rdma_devices = static_cast<std::uint32_t>(devices_->devices().size());
  }
  if (opt.tcp_port != 0) {
    auto fd = listen_tcp(opt.tcp_listen_address, opt.tcp_port);
    if (!fd) return fd.error();
    tcp_listen_ = std::move(fd.value());
  }
  if (opt.cluster.listen_tcp_port != 0) {
    auto fd = listen_tcp(opt.cluster.listen_tcp_address, opt.cluster.listen_tcp_port);
    if (!fd) return fd.error();
    route_tcp_listen_ = std::move(fd.value());
  }

  return use_rdma;
}

Server::~Server() { stop(); }

Status Server::inject(const fault::Spec& spec) {
  if constexpr (!fault::kEnabled) {
    return Error{ErrorKind::kInvalidArgument,
                 "fault injection is not built in (a test build has it: "
                 "-DRDMABROKER_FAULT_INJECTION=ON)"};
  }
  switch (spec.kind) {
    case fault::Kind::kWcError:
    case fault::Kind::kQpError: {
      auto reply = std::make_shared<std::promise<Status>>();
      auto answer = reply->get_future();
      worker_set_.rdma_owner(spec.connection).post(FaultCommand{spec, std::move(reply)});
      if (answer.wait_for(kWorkerAnswerTimeout) != std::future_status::ready) {
        return Error{ErrorKind::kTimeout, "the worker did not answer"};
      }
      return answer.get();
    }
    case fault::Kind::kCmDuplicate:
      core_.faults.cm_duplicates.store(spec.count);
      break;
    case fault::Kind::kCmDelay:
      core_.faults.cm_delay_ms.store(spec.delay_ms);
      core_.faults.cm_delays.store(spec.count);
      break;
    case fault::Kind::kPoolExhaust:
      spdlog::warn("fault: the buffer pool hands out nothing until `fault pool-release`");
      pool_->set_exhausted(true);
      break;
    case fault::Kind::kPoolRelease:
      spdlog::warn("fault: the buffer pool hands out buffers again");
      pool_->set_exhausted(false);
      break;
    case fault::Kind::kMcastDrop:
      spdlog::warn("fault: the next {} multicast channel messages are not sent to their groups", spec.count);
      core_.faults.mcast_drops.store(spec.count);
      break;
    case fault::Kind::kSyncFail:
      spdlog::warn("fault: the next {} stream syncs fail", spec.count);
      core_.faults.sync_fails.store(spec.count);
      break;
    case fault::Kind::kMcastJoinFail:
      spdlog::warn("fault: the next {} multicast group joins fail", spec.count);
      core_.faults.mcast_join_fails.store(spec.count);
      break;
    case fault::Kind::kWorkerStall:
      spdlog::warn("fault: a worker loop stops for {} ms", spec.delay_ms);
      core_.faults.worker_stall_ms.store(spec.delay_ms);
      break;
    case fault::Kind::kRouteStall:
      if (routes_ == nullptr)
        return Error{ErrorKind::kInvalidArgument, "route-stall: this broker is in no cluster"};
      spdlog::warn("fault: the routes' next new interest waits {} ms", spec.delay_ms);
      core_.faults.route_stall_ms.store(spec.delay_ms);
      break;
  }
  return {};
}

void Server::warn_if_nobody_can_connect(const AuthTable& table) {
  if (table.nobody_can_connect()) {
    spdlog::warn("{}", kNobodyCanConnect);
  }
}

Server::ListenerUrls Server::listener_urls() const {
  const auto& opt = core_.options;
  const auto& cl = opt.cluster;
  const auto url = [](std::string_view scheme, const std::string& host, std::uint16_t port) {
    const bool v6 = host.find(':') != std::string::npos;
    return std::string(scheme) + "://" + (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
  };
  ListenerUrls out;
  if (devices_) out.clients.push_back(url("rdma", opt.listen_address, opt.port));
  if (tcp_listen_) out.clients.push_back(url("tcp", opt.tcp_listen_address, opt.tcp_port));
  if (devices_ && cl.listen_rdma_port != 0)
    out.routes.push_back(url("rdma", cl.listen_rdma_address, cl.listen_rdma_port));
  if (route_tcp_listen_) out.routes.push_back(url("tcp", cl.listen_tcp_address, cl.listen_tcp_port));
  return out;
}

std::string Server::listeners() const {
  const ListenerUrls urls = listener_urls();
  std::string out;
  for (const auto& u : urls.clients) {
    out += (out.empty() ? "" : ", ") + u;
    if (u.starts_with("rdma://")) out += " (" + devices_->names() + ")";
  }
  if (!urls.routes.empty()) out += fmt::format("; routes: {}", fmt::join(urls.routes, ", "));
  return out;
}

proto::BrokerInfo Server::announcement(const BrokerOptions& opt) const {
  const auto& cl = opt.cluster;
  const ListenerUrls listening = listener_urls();
  // A listener on a wildcard address says nothing about where it is reached.
  const auto named = [](std::vector<std::string> urls) {
    std::erase_if(urls, [](const std::string& u) {
      auto parsed = parse_url(u);
      return !parsed || parsed->host == "0.0.0.0" || parsed->host == "::" || parsed->host.empty();
    });
    return urls;
  };
  std::vector<std::string> clients = listening.clients;
  if (opt.tls.mode == config::TlsMode::kRequired) {
    for (auto& u : clients)
      if (u.starts_with("tcp://")) u.replace(0, 3, "tls");
  }
  return proto::BrokerInfo{
      core_.server_id, cl.client_advertise.empty() ? named(clients) : cl.client_advertise,
      cl.advertise.empty() ? named(cl.has_route_listener() ? listening.routes : listening.clients)
                           : cl.advertise};
}

void Server::start() {
  authenticator_->start();
  if (multicast_) multicast_->start();
  if (streams_) streams_->start();
  for (auto& w : workers_) w->start();
  if (routes_) {
    spdlog::info("cluster '{}': this broker is {}; routes to {}", core_.options.cluster.name, core_.server_id,
                 core_.options.cluster.routes.empty()
                     ? std::string("none (others route here)")
                     : fmt::format("{}", fmt::join(core_.options.cluster.routes, ", ")));
    log_announcement(announcement(core_.options));
    routes_->start(core_.options.cluster.routes);
  }
  if (listener_) listener_->start();
}

void Server::log_announcement(const proto::BrokerInfo& self) const {
  if (self.routes.empty()) {
    spdlog::info(
        "cluster '{}': this broker announces no route URL (its listeners are on wildcard addresses; set "
        "cluster.advertise): brokers that do not list it route here, but it is not dialed back",
        core_.options.cluster.name);
  } else {
    spdlog::info("cluster '{}': announces routes at {} and clients at {}", core_.options.cluster.name,
                 fmt::join(self.routes, ", "),
                 self.urls.empty() ? "(none)" : fmt::format("{}", fmt::join(self.urls, ", ")));
  }
}

void Server::stop() {
  if (stopped_) return;
  stopped_ = true;
  if (listener_) listener_->stop();
  // The routes hand messages to the workers: they end first.
  if (routes_) routes_->stop();
  if (authenticator_) authenticator_->stop();  // a verdict still queued is moot: every connection is closing
  for (auto& w : workers_) w->post(ShutdownCommand{});
  for (auto& w : workers_) w->join();
  // Closing connections removed their channel members; now the groups go.
  if (multicast_) multicast_->stop();
  // Nothing routes to streams any more: what is queued is stored and synced.
  if (streams_) streams_->stop();
  core_.announced.set(nullptr);  // its INFO's pool buffer goes back before the pool does
  // Connections still in the backlog are reset rather than left waiting for
  // a handshake reply that will never come.
  tcp_listen_.reset();
  route_tcp_listen_.reset();
}

template <typename T, typename MakeCommand>
std::vector<std::future<T>> Server::ask_workers(MakeCommand make) const {
  std::vector<std::future<T>> answers;
  for (const auto& w : workers_) {
    auto promise = std::make_shared<std::promise<T>>();
    answers.push_back(promise->get_future());
    w->post(make(std::move(promise)));
  }
  return answers;
}

std::vector<ConnectionInfo> Server::connections() const {
  auto replies = ask_workers<std::vector<ConnectionInfo>>(
      [](auto reply) { return ListConnectionsCommand{std::move(reply)}; });
  std::vector<ConnectionInfo> all;
  const auto deadline = std::chrono::steady_clock::now() + kWorkerAnswerTimeout;
  for (auto& r : replies) {
    if (r.wait_until(deadline) != std::future_status::ready)
      continue;  // a stuck worker: the watchdog's business
    auto part = r.get();
    all.insert(all.end(), std::make_move_iterator(part.begin()), std::make_move_iterator(part.end()));
  }
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
  return all;
}

Result<std::string> Server::load_tls(const config::TlsSettings& settings) {
  if (settings.mode == config::TlsMode::kOff) {
    tls_.set(nullptr);
    return std::string();
  }
  auto next = TlsContext::build(settings);
  if (!next) return next.error();
  std::string loaded = next.value()->description();
  const auto left = next.value()->not_after() - static_cast<std::int64_t>(std::time(nullptr));
  if (left < 30 * 86400) {
    spdlog::warn("tls.certificate {} {}: renew it and reload", settings.certificate,
                 left <= 0 ? std::string("has expired") : fmt::format("expires in {} days", left / 86400));
  }
  tls_.set(std::move(next.value()));
  return loaded;
}

void Server::apply_live(const BrokerOptions& next) {
  // Wait (bounded) until every worker uses them: a reload that returned has
  // taken effect for every frame that arrives afterwards.
  auto auth = AuthTable::build(next.auth);
  warn_if_nobody_can_connect(*auth);
  authenticator_->update(auth, Authenticator::Policy::from(next.auth));
  core_.admission->set_unauthenticated_limits(next.unauthenticated_limit(),
                                              next.unauthenticated_per_address_limit());
  auto applied = ask_workers<void>([&](auto done) { return ReloadCommand{next, auth, std::move(done)}; });
  const auto deadline = std::chrono::steady_clock::now() + kWorkerAnswerTimeout;
  for (auto& a : applied) a.wait_until(deadline);
  if (multicast_) multicast_->reload(next.multicast);
  if (streams_) streams_->reload(next.storage, next.streams);
  if (routes_) {
    routes_->set_urls(next.cluster.routes);
    // cluster.advertise and client_advertise: the next INFO says them, to
    // clients and, over the routes, to the other brokers, which pass them on.
    if (auto self = announcement(next); routes_->set_self(self)) log_announcement(self);
  }
}

std::vector<std::pair<std::uint32_t, std::chrono::milliseconds>> Server::stuck_workers() const {
  const auto now = std::chrono::steady_clock::now().time_since_epoch().count();
  std::vector<std::pair<std::uint32_t, std::chrono::milliseconds>> stuck;
  for (const auto& w : workers_) {
    const std::chrono::steady_clock::duration age(now - w->heartbeat());
    if (age > kLivenessLimit)
      stuck.emplace_back(w->index(), std::chrono::duration_cast<std::chrono::milliseconds>(age));
  }
  return stuck;
}

HealthReport Server::liveness() const {
  HealthCheck workers{"workers", true, ""};
  for (const auto& [index, age] : stuck_workers()) {
    if (!workers.ok) workers.detail += "; ";
    workers.ok = false;
    const auto ms = age.count();
    workers.detail +=
        fmt::format("worker {} has not gone round for {}.{} s", index, ms / 1000, ms % 1000 / 100);
  }
  if (workers.ok) {
    workers.detail = fmt::format("{} worker loop{} went round within {} s", workers_.size(),
                                 workers_.size() == 1 ? "" : "s", kLivenessLimit.count());
  }
  return {{std::move(workers)}};
}

HealthCheck Server::routes_check() const {
  // Ready once this broker has joined the mesh: at least one of its routes is
  // up (or it has none to other brokers). Not "all of them": a peer that is
  // gone for good must not make the brokers that survive it unready too; the
  // routes that are down are named, and rdmabroker_route_up says which.
  std::size_t configured = 0;
  std::size_t up = 0;
  std::string down;
  for (const auto& r : routes_->status()) {
    if (r.state == RouteState::kItself) continue;
    ++configured;
    if (r.state == RouteState::kUp) {
      ++up;
    } else {
      down += fmt::format("{}{} {}", down.empty() ? "" : ", ", r.url, to_string(r.state));
    }
  }
  std::string detail = fmt::format("{} of {} routes up", up, configured);
  if (!down.empty()) detail += " (" + down + ")";
  return {"routes", configured == 0 || up > 0, std::move(detail)};
}

HealthReport Server::readiness() const {
  HealthReport report = liveness();
  const std::string where = listeners();
  report.checks.push_back(stopped_ || where.empty() ? HealthCheck{"listeners", false, "not listening"}
                                                    : HealthCheck{"listeners", true, where});
  if (routes_) report.checks.push_back(routes_check());
  if (!devices_) {
    report.checks.push_back({"devices", true, "no RDMA device served (TCP only)"});
    return report;
  }
  // Ready when every device has a port that can carry traffic: a device whose
  // link is down (cable, switch, the netdev under RoCE) strands the clients
  // that reach the broker through it.
  HealthCheck devices{"devices", true, ""};
  for (const auto& dev : devices_->devices()) {
    bool active = false;
    std::string ports;
    for (std::uint8_t port = 1; port <= dev->attr.phys_port_cnt; ++port) {
      ibv_port_attr pa{};
      const char* state = ibv_query_port(dev->context, port, &pa) == 0 ? ibv_port_state_str(pa.state)
                                                                       : "unknown (ibv_query_port failed)";
      active = active || pa.state == IBV_PORT_ACTIVE;
      ports += fmt::format("{}port {} {}", ports.empty() ? "" : ", ", port, state);
    }
    devices.ok = devices.ok && active;
    devices.detail += fmt::format("{}{}: {}", devices.detail.empty() ? "" : "; ", dev->name, ports);
  }
  report.checks.push_back(std::move(devices));
  return report;
}

void Server::visit_stats(StatsVisitor& v) const {
  for (const auto& w : workers_) w->stats().visit(v);
  core_.admission->visit(v);
  authenticator_->visit(v);
  static const MulticastStats kOff;  // multicast off: every series is there, at 0
  const MulticastStats& m = multicast_ ? multicast_->stats() : kOff;
  m.visit(v);
  if (streams_) streams_->visit(v);
  if (routes_) {
    routes_->visit(v);
  } else {
    Routes::visit_no_cluster(v);
  }
  // A channel is one entry in the index for all of its members; a stream
  // holds one per subject pattern, which is no client's subscription.
  v.gauge({"subscriptions", "rdmabroker_subscriptions", "Active subscriptions."},
          static_cast<std::int64_t>(core_.index.size()) - m.channels.get() + m.members.get() -
              (streams_ ? streams_->index_entries() : 0));
  v.gauge({"subscriptions.memory_bytes", "rdmabroker_subscription_memory_bytes",
           "Estimated heap held by subscriptions (limits.max_subscription_memory bounds it)."},
          static_cast<std::int64_t>(core_.subscription_budget.bytes()));
  v.gauge({"pool.buffers", "rdmabroker_pool_buffers", "Buffers in the registered pool."}, pool_->count());
  v.gauge({"pool.reserve", "rdmabroker_pool_reserve_buffers",
           "Pool buffers only receive-queue refills may take (TCP reads, compaction and routes leave them)."},
          core_.pool_shares.reserve());
  v.gauge(
      {"pool.out_queue_budget", "rdmabroker_pool_out_queue_budget_buffers",
       "Pool buffers subscribers' out-queues share while the pool runs short: each backlogged one may hold "
       "an equal part."},
      core_.pool_shares.queue_budget());
  v.gauge({"pool.in_use", "rdmabroker_pool_buffers_in_use", "Pool buffers posted, queued or being sent."},
          pool_->in_use());
  v.gauge({"workers", "rdmabroker_workers", "Worker threads."}, static_cast<std::int64_t>(workers_.size()));
  const auto tls = tls_.get();
  v.gauge({"tls.certificate_expiry", "rdmabroker_tls_certificate_expiry_timestamp_seconds",
           "When the broker's TLS certificate expires (Unix time; 0: TLS off)."},
          tls ? tls->not_after() : 0);
}

StatsSnapshot Server::stats() const {
  StatsSnapshotter s;
  visit_stats(s);
  return std::move(s.snapshot);
}

}  // namespace rdmabroker::daemon
