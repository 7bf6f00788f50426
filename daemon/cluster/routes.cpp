// SPDX-License-Identifier: Apache-2.0
#include "cluster/routes.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <optional>

#include "cluster/route.hpp"
#include "fault/fault.hpp"
#include "rdmabroker/proto/headers.hpp"
#include "rdmabroker/proto/wire.hpp"

namespace rdmabroker::daemon {

namespace {
constexpr auto kLongestRetry = std::chrono::seconds(5);
constexpr auto kConnectTimeout = std::chrono::seconds(10);
/// How long a route's broker may take to answer the PING that confirms new
/// subscriptions there: clients' PONGs wait for it (SPEC.md §8, "Interest
/// in effect"), so a route that does not answer must not hold them longer.
constexpr auto kSyncTimeout = std::chrono::seconds(2);
}  // namespace

std::string_view to_string(RouteState s) {
  switch (s) {
    case RouteState::kConnecting:
      return "connecting";
    case RouteState::kUp:
      return "up";
    case RouteState::kDown:
      return "down";
    case RouteState::kItself:
      return "itself";
  }
  return "?";
}

Routes::Routes(BrokerCore& core, WorkerSet& workers, ClusterInterest& interest, proto::BrokerInfo self)
    : core_(core), workers_(workers), interest_(interest), self_(std::move(self)) {
  interest_.on_change([this] { wake(); });
  std::lock_guard lock(mu_);
  announce_locked();  // before the first client logs in
}

Routes::~Routes() {
  stop();
  // Workers are joined by now; connections they destroy later still release
  // their interest, which must no longer call here.
  interest_.on_change({});
}

void Routes::start(const std::vector<std::string>& urls) {
  urls_ = urls;
  thread_ = std::thread([this] { run(); });
}

void Routes::stop() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Routes::set_urls(const std::vector<std::string>& urls) {
  {
    std::lock_guard lock(mu_);
    urls_ = urls;
    dirty_ = true;
  }
  cv_.notify_all();
}

bool Routes::set_self(proto::BrokerInfo self) {
  {
    std::lock_guard lock(mu_);
    self.id = self_.id;
    if (self.urls == self_.urls && self.routes == self_.routes) return false;
    self_ = std::move(self);
    dirty_ = true;  // the pass announces it
  }
  cv_.notify_all();
  return true;
}

void Routes::wake() {
  {
    std::lock_guard lock(mu_);
    dirty_ = true;
  }
  cv_.notify_all();
}

std::vector<RouteStatus> Routes::status() const {
  std::lock_guard lock(mu_);
  std::vector<RouteStatus> out;
  for (const auto& r : routes_) {
    out.push_back({r->url, r->state, r->peer.id, !r->announced_id.empty(), r->messages_in.load(),
                   r->bytes_in.load(), r->dropped.load(), r->interest.load(), r->reconnects.load()});
  }
  return out;
}

void Routes::visit(StatsVisitor& v) const {
  const auto routes = status();
  std::int64_t configured = 0;
  std::int64_t up = 0;
  for (const auto& r : routes) {
    if (r.state == RouteState::kItself) continue;
    ++configured;
    up += r.state == RouteState::kUp ? 1 : 0;
    v.gauge({"cluster.routes_up", "rdmabroker_route_up", "1 while the route to that broker is up.", "route",
             r.url},
            r.state == RouteState::kUp ? 1 : 0);
    v.counter({"cluster.route_messages_in", "rdmabroker_route_messages_received_total",
               "Messages a route brought from its broker (published there, wanted here).", "route", r.url},
              r.messages_in);
    v.counter({"cluster.route_bytes_in", "rdmabroker_route_received_bytes_total",
               "Payload bytes of the messages a route brought.", "route", r.url},
              r.bytes_in);
    v.counter({"cluster.route_dropped", "rdmabroker_route_messages_dropped_total",
               "Messages a route brought that could not be passed on (larger than a frame, no pool buffer).",
               "route", r.url},
              r.dropped);
    v.counter({"cluster.route_reconnects", "rdmabroker_route_reconnects_total",
               "Times a route came up again after it went down.", "route", r.url},
              r.reconnects);
    v.gauge({"cluster.route_interest", "rdmabroker_route_interest",
             "Subscriptions this broker holds at that broker (one per local pattern and queue group).",
             "route", r.url},
            static_cast<std::int64_t>(r.interest));
  }
  visit_broker_wide(v, configured, static_cast<std::int64_t>(interest_.size()));
}

void Routes::visit_no_cluster(StatsVisitor& v) { visit_broker_wide(v, 0, 0); }

void Routes::visit_broker_wide(StatsVisitor& v, std::int64_t configured, std::int64_t interest) {
  v.level("cluster.routes", configured, "rdmabroker_routes",
          "Routes to other brokers: configured (cluster.routes, itself excluded) and discovered.");
  v.level("cluster.interest", interest, "rdmabroker_cluster_interest",
          "Distinct patterns and queue groups this broker's clients subscribe to: what its routes carry.");
}

void Routes::run() {
  std::unique_lock lock(mu_);
  while (!stop_) {
    dirty_ = false;
    update_list(lock);
    const auto interest = interest_.snapshot();
    if (interest.through > interest_.synced()) stall_if_armed(lock);
    // The routes that are connected first: their subscriptions, and on those
    // that are up a PING answered there, before a connect can make anyone wait.
    std::vector<std::pair<Route*, bool>> open_routes;  // route, up
    for (auto& r : routes_) {
      if (r->client && r->state != RouteState::kItself && !r->forget)
        open_routes.emplace_back(r.get(), r->state == RouteState::kUp);
    }
    lock.unlock();
    for (auto [r, up] : open_routes) {
      if (reconcile(*r, interest.entries) && up) confirm(*r);
    }
    lock.lock();
    if (interest.through > interest_.synced()) {
      interest_.set_synced(interest.through);
      workers_.post_all(InterestSyncedCommand{interest.through});
    }
    const auto wake_at = connect_due(lock, interest.entries);
    announce_locked();
    cv_.wait_until(lock, wake_at, [&] { return stop_ || dirty_; });
  }
  auto routes = std::move(routes_);
  routes_.clear();
  lock.unlock();
  for (auto& r : routes) end(*r);
}

void Routes::update_list(std::unique_lock<std::mutex>& lock) {
  // Routes no longer configured close (their I/O threads are joined, so no
  // message of theirs is being routed), and discovered ones that failed;
  // new ones are added.
  for (auto it = routes_.begin(); it != routes_.end();) {
    Route& r = **it;
    const bool listed = std::find(urls_.begin(), urls_.end(), r.url) != urls_.end();
    if (listed) {  // listed now: configured (reconnecting for good), whatever announced it
      r.announced_id.clear();
      r.forget = false;
    }
    if (r.announced_id.empty() ? listed : !r.forget) {
      ++it;
      continue;
    }
    if (r.announced_id.empty())
      spdlog::info("route {}: removed by a reload", r.url);
    else
      spdlog::info("route {} (discovered, broker {}): forgotten until announced again", r.url,
                   r.announced_id);
    auto gone = std::move(*it);
    it = routes_.erase(it);
    lock.unlock();
    end(*gone);
    gone.reset();
    lock.lock();
  }
  for (const auto& url : urls_) {
    if (std::none_of(routes_.begin(), routes_.end(), [&](const auto& r) { return r->url == url; }))
      routes_.push_back(std::make_unique<Route>(url, core_.next_connection_id.fetch_add(1)));
  }
  add_discovered_locked();
}

std::chrono::steady_clock::time_point Routes::connect_due(
    std::unique_lock<std::mutex>& lock, const std::vector<ClusterInterest::Entry>& interest) {
  // Connecting happens on a thread per attempt (a broker that does not
  // answer takes kConnectTimeout): this thread stays free to carry new
  // interest to the routes that are up, and clients' PONGs wait for that.
  auto wake_at = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  for (auto& r : routes_) {
    if (stop_) break;
    if (r->state == RouteState::kItself || r->forget || r->client || r->connecting) continue;
    if (r->attempt) {
      if (r->connector.joinable()) r->connector.join();
      auto outcome = std::move(*r->attempt);
      r->attempt.reset();
      if (!connected(*r, std::move(outcome))) {
        if (r->state == RouteState::kDown) wake_at = std::min(wake_at, r->next_attempt);
        continue;
      }
      lock.unlock();
      reconcile(*r, interest);
      lock.lock();
      continue;
    }
    if (std::chrono::steady_clock::now() < r->next_attempt) {
      wake_at = std::min(wake_at, r->next_attempt);
      continue;
    }
    r->connecting = true;
    r->connector = std::thread([this, route = r.get(), opt = options_for(*r)]() mutable {
      auto outcome = Client::connect(route->url, std::move(opt));
      {
        std::lock_guard guard(mu_);
        route->attempt = std::move(outcome);
        route->connecting = false;
        dirty_ = true;
      }
      cv_.notify_all();
    });
  }
  return wake_at;
}

ClientOptions Routes::options_for(Route& r) {
  ClientOptions opt;
  opt.user = core_.options.cluster.user;
  opt.password = core_.options.cluster.password;
  opt.route_cluster = core_.options.cluster.name;
  opt.route_server = self_.id;
  opt.route_announce = self_.routes;
  opt.multicast = false;  // a route takes its messages over its connection
  opt.connect_timeout = kConnectTimeout;
  opt.reconnect = true;  // once up, the library keeps it up and restores its subscriptions
  // Polled: its own thread takes in what arrived and hands it over in
  // one batch per worker after each poll (not one wake-up per message).
  opt.polled = true;
  opt.reconnect_delay = kRouteFirstRetry;
  opt.reconnect_max_delay = kLongestRetry;
  Route* route = &r;
  opt.on_connection_event = [this, route](const ConnectionEvent& e) {
    {
      std::lock_guard guard(mu_);
      if (e.kind == ConnectionEvent::Kind::kDisconnected) {
        route->state = RouteState::kDown;
        if (!route->announced_id.empty()) {
          // Its broker announces itself again when it is back (it dials its routes).
          spdlog::warn("route {} (discovered): down ({})", route->url, e.reason.message);
          route->forget = true;
          announced_.erase(route->announced_id);
        } else {
          spdlog::warn("route {}: down ({}); reconnecting", route->url, e.reason.message);
        }
      } else if (e.kind == ConnectionEvent::Kind::kReconnected) {
        route->state = RouteState::kUp;
        route->reconnects.fetch_add(1);
        spdlog::info("route {}: up again after {} ms, {} subscriptions restored", route->url,
                     e.downtime.count(), e.subscriptions_restored);
      }
      dirty_ = true;  // what this broker announces changes with it
    }
    cv_.notify_all();
  };
  opt.on_server_info = [this, route](const ServerInfo& info) { on_info(*route, info); };
  opt.on_error = [this, route](const Error& e) {
    // A refused login is reported by the connect that made it.
    std::lock_guard guard(mu_);
    if (route->state == RouteState::kUp) spdlog::warn("route {}: {}", route->url, e.message);
  };
  return opt;
}

bool Routes::connected(Route& r, Result<std::unique_ptr<Client>> outcome) {
  if (!outcome) {
    const auto& why = outcome.error().message;
    if (outcome.error().kind == ErrorKind::kAuthenticationFailed && why.find("itself") != std::string::npos) {
      r.state = RouteState::kItself;
      spdlog::info("route {}: leads to this broker; not used", r.url);
      return false;
    }
    if (!r.announced_id.empty()) {
      spdlog::info("route {} (discovered, broker {}): cannot connect: {}", r.url, r.announced_id, why);
      r.forget = true;
      announced_.erase(r.announced_id);
      dirty_ = true;
      return false;
    }
    if (why != r.last_error) spdlog::warn("route {}: cannot connect: {}", r.url, why);
    r.last_error = why;
    r.state = RouteState::kDown;
    r.next_attempt = std::chrono::steady_clock::now() + r.retry;
    r.retry = std::min<std::chrono::milliseconds>(r.retry * 2, kLongestRetry);
    return false;
  }
  r.client = std::move(outcome).value();
  r.state = RouteState::kUp;
  r.last_error.clear();
  r.retry = kRouteFirstRetry;
  r.batches.resize(core_.options.workers);
  r.poller = std::thread([this, route = &r] { poll(*route); });
  spdlog::info("route {}{}: up ({}), broker {}", r.url, r.announced_id.empty() ? "" : " (discovered)",
               r.client->transport_description(), r.peer.id.empty() ? "?" : r.peer.id);
  return true;
}

void Routes::announced(const proto::BrokerInfo& b) {
  {
    std::lock_guard lock(mu_);
    if (b.id == self_.id || b.routes.empty()) return;
    announced_[b.id] = b.routes;
    dirty_ = true;
  }
  cv_.notify_all();
}

void Routes::on_info(Route& r, const ServerInfo& info) {
  {
    std::lock_guard lock(mu_);
    r.peer = {info.self.id, info.self.urls, info.self.routes};
    for (const auto& p : info.peers) {
      // The brokers it has routes up to: one this broker has no route to is dialed.
      if (p.id != self_.id && !p.routes.empty()) announced_.try_emplace(p.id, p.routes);
    }
    dirty_ = true;
  }
  cv_.notify_all();
}

void Routes::add_discovered_locked() {
  for (const auto& [id, urls] : announced_) {
    const bool covered = std::any_of(routes_.begin(), routes_.end(), [&](const auto& r) {
      return r->peer.id == id || r->announced_id == id ||
             std::find(urls.begin(), urls.end(), r->url) != urls.end();
    });
    if (covered) continue;
    // The first URL: the broker lists the one it prefers first (cluster.advertise).
    spdlog::info("route {}: discovered (broker {} was announced); dialing it", urls.front(), id);
    routes_.push_back(std::make_unique<Route>(urls.front(), core_.next_connection_id.fetch_add(1), id));
  }
}

void Routes::announce_locked() {
  proto::Info info;
  info.self = self_;
  info.cluster = core_.options.cluster.name;
  for (const auto& r : routes_) {
    if (r->state != RouteState::kUp || r->peer.id.empty()) continue;
    if (std::none_of(info.peers.begin(), info.peers.end(), [&](const auto& p) { return p.id == r->peer.id; }))
      info.peers.push_back(r->peer);
  }
  auto next = std::make_shared<Announcement>();
  next->text = proto::encode_info(info, core_.pool->buffer_size() - proto::kHeaderSize);
  // Unchanged, and whole (a pool buffer was free last time, or none was needed).
  if (info_ && info_->text == next->text && (info_->body || info_->text == info_->short_text)) return;
  next->short_text = proto::encode_info(info, kMaxInfoText);
  if (next->short_text != next->text) {
    std::uint32_t index = 0;
    if (core_.pool->acquire(&index, 1) == 1) {
      next->body = BufferRef(core_.pool, index);
      const std::size_t n = next->text.size();
      std::memcpy(next->body.data(), next->text.data(), n);
      std::memset(next->body.data() + n, 0, proto::align_up(n) - n);
    } else {
      spdlog::warn(
          "cluster: the buffer pool is empty; INFO goes out cut to {} of its {} bytes until it changes",
          next->short_text.size(), next->text.size());
    }
  }
  info_ = std::move(next);
  core_.announced.set(info_);
  workers_.post_all(InfoCommand{info_});
}

void Routes::end(Route& r) {
  if (r.connector.joinable()) r.connector.join();  // an attempt under way: its outcome is discarded
  r.attempt.reset();
  r.stopping = true;
  if (r.client) (void)r.client->wake();
  if (r.poller.joinable()) r.poller.join();
  if (r.client) r.client->close();
}

void Routes::stall_if_armed(std::unique_lock<std::mutex>& lock) {
  if constexpr (fault::kEnabled) {
    if (const auto ms = core_.faults.route_stall_ms.exchange(0); ms > 0) {
      lock.unlock();
      spdlog::warn("fault: the route thread waits {} ms before it subscribes to new interest", ms);
      std::this_thread::sleep_for(std::chrono::milliseconds(ms));
      lock.lock();
    }
  }
}

void Routes::confirm(Route& r) {
  // The broker answers in order: its PONG means the SUBSCRIBEs before it
  // are in its index. Whatever arrives meanwhile runs on_message here.
  if (auto st = r.client->flush(kSyncTimeout); !st)
    spdlog::debug("route {}: new subscriptions not confirmed: {}", r.url, st.error().message);
  hand_over_taken(r);
}

bool Routes::reconcile(Route& r, const std::vector<ClusterInterest::Entry>& entries) {
  bool subscribed = false;
  for (const auto& e : entries) {
    if (r.subscribed.contains(e.id)) continue;
    auto handler = [this, route = &r, id = e.id, group = e.group](const MessageView& m) {
      on_message(*route, id, group, m);
    };
    auto sid = e.group.empty() ? r.client->subscribe_view(e.pattern, handler)
                               : r.client->queue_subscribe_view(e.pattern, e.group, handler);
    if (!sid) {
      // Retried on the next pass (a route that is reconnecting refuses it now).
      spdlog::debug("route {}: subscribing to '{}' failed: {}", r.url, e.pattern, sid.error().message);
      continue;
    }
    r.subscribed.emplace(e.id, sid.value());
    subscribed = true;
  }
  for (auto it = r.subscribed.begin(); it != r.subscribed.end();) {
    const bool wanted =
        std::any_of(entries.begin(), entries.end(), [&](const auto& e) { return e.id == it->first; });
    if (wanted) {
      ++it;
      continue;
    }
    (void)r.client->unsubscribe(it->second);  // a route that is down drops it when it reconnects
    it = r.subscribed.erase(it);
  }
  r.interest.store(r.subscribed.size());
  // A subscribe that waited for a send buffer ran turns of the client here.
  hand_over_taken(r);
  return subscribed;
}

}  // namespace rdmabroker::daemon
