// SPDX-License-Identifier: Apache-2.0
#include "cluster/routes.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>

#include "rdmabroker/proto/wire.hpp"

namespace rdmabroker::daemon {

namespace {
/// A route that failed is dialed again after this, doubling up to kLongestRetry.
constexpr std::chrono::milliseconds kFirstRetry{100};
constexpr std::chrono::milliseconds kLongestRetry{5000};
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
  interest_.on_change([this] { interest_changed(); });
  std::lock_guard lock(mu_);
  announce_locked();  // before the first client logs in
}

Routes::~Routes() {
  // Workers are joined by now; connections they destroyed released their
  // interest, which must no longer call here.
  interest_.on_change({});
}

void Routes::start(const std::vector<std::string>& urls) {
  std::lock_guard lock(mu_);
  started_ = true;
  urls_ = urls;
  for (const auto& url : urls_) add_locked(url, {});
}

void Routes::stop() {
  std::lock_guard lock(mu_);
  stopped_ = true;
}

void Routes::set_urls(const std::vector<std::string>& urls) {
  std::lock_guard lock(mu_);
  urls_ = urls;
  if (!started_ || stopped_) return;
  std::vector<std::uint64_t> gone;
  for (auto& r : routes_) {
    const bool listed = std::find(urls_.begin(), urls_.end(), r->url) != urls_.end();
    if (listed) {
      r->announced_id.clear();  // listed now: configured (redialed for good), whatever announced it
    } else if (r->announced_id.empty()) {
      spdlog::info("route {}: removed by a reload", r->url);
      gone.push_back(r->id);
    }
  }
  for (const std::uint64_t id : gone) remove_locked(id);
  for (const auto& url : urls_) {
    if (std::none_of(routes_.begin(), routes_.end(), [&](const auto& r) { return r->url == url; }))
      add_locked(url, {});
  }
  announce_locked();
  sync_locked();
}

bool Routes::set_self(proto::BrokerInfo self) {
  std::lock_guard lock(mu_);
  self.id = self_.id;
  if (self.urls == self_.urls && self.routes == self_.routes) return false;
  self_ = std::move(self);
  announce_locked();
  return true;
}

std::vector<RouteStatus> Routes::status() const {
  std::lock_guard lock(mu_);
  std::vector<RouteStatus> out;
  for (const auto& r : routes_) {
    const RouteCounters& c = *r->counters;
    out.push_back({r->url, r->state, r->peer.id, !r->announced_id.empty(), c.messages_in.load(),
                   c.bytes_in.load(), c.dropped.load(), c.interest.load(), r->reconnects});
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

Routes::Route* Routes::find_locked(std::uint64_t id) {
  for (auto& r : routes_)
    if (r->id == id) return r.get();
  return nullptr;
}

void Routes::add_locked(const std::string& url, std::string announced_id) {
  auto r = std::make_unique<Route>();
  r->id = next_id_++;
  r->url = url;
  r->announced_id = std::move(announced_id);
  routes_.push_back(std::move(r));
  dial_locked(*routes_.back(), std::chrono::milliseconds(0));
}

void Routes::dial_locked(Route& r, std::chrono::milliseconds delay) {
  RouteDial d;
  d.route = r.id;
  d.url = r.url;
  d.cluster = core_.options.cluster.name;
  d.server = self_.id;
  d.announce = self_.routes;
  d.user = core_.options.cluster.user;
  d.password = core_.options.cluster.password;
  d.counters = r.counters;
  d.not_before = std::chrono::steady_clock::now() + delay;
  r.state = r.state == RouteState::kUp ? RouteState::kDown : r.state;
  worker_of(r.id).post(DialRouteCommand{std::move(d)});
}

void Routes::remove_locked(std::uint64_t id) {
  worker_of(id).post(EndRouteCommand{id});
  std::erase_if(routes_, [&](const auto& r) { return r->id == id; });
}

void Routes::announced(const proto::BrokerInfo& b) {
  std::lock_guard lock(mu_);
  if (b.id == self_.id || b.routes.empty()) return;
  announced_[b.id] = b.routes;
  add_discovered_locked();
}

void Routes::route_up(std::uint64_t route, const std::string& description) {
  std::lock_guard lock(mu_);
  Route* r = find_locked(route);
  if (r == nullptr || stopped_) return;
  r->state = RouteState::kUp;
  r->last_error.clear();
  r->retry = std::chrono::milliseconds(0);
  if (std::exchange(r->was_up, true)) {
    ++r->reconnects;
    spdlog::info("route {}: up again ({})", r->url, description);
  } else {
    spdlog::info("route {}{}: up ({})", r->url, r->announced_id.empty() ? "" : " (discovered)", description);
  }
  announce_locked();
}

void Routes::route_down(std::uint64_t route, RouteEnd end, const std::string& why) {
  std::lock_guard lock(mu_);
  Route* r = find_locked(route);
  if (r == nullptr || stopped_ || end == RouteEnd::kRemoved) return;  // ended here: nothing to redial
  const bool was_up = r->state == RouteState::kUp;
  r->synced = 0;
  if (end == RouteEnd::kItself) {
    r->state = RouteState::kItself;
    spdlog::info("route {}: leads to this broker; not used", r->url);
  } else if (!r->announced_id.empty()) {
    // Its broker announces itself again when it is back (it dials its routes).
    spdlog::info("route {} (discovered, broker {}): {} ({}); forgotten until announced again", r->url,
                 r->announced_id, was_up ? "down" : "cannot connect", why);
    announced_.erase(r->announced_id);
    remove_locked(route);
  } else {
    if (was_up) {
      spdlog::warn("route {}: down ({}); reconnecting", r->url, why);
    } else if (why != r->last_error) {
      spdlog::warn("route {}: cannot connect: {}", r->url, why);
    }
    r->last_error = why;
    r->state = RouteState::kDown;
    // At once after an outage (its broker may simply have restarted), then
    // doubling while it stays away.
    r->retry = was_up ? std::chrono::milliseconds(0) : std::clamp(r->retry * 2, kFirstRetry, kLongestRetry);
    dial_locked(*r, r->retry);
  }
  announce_locked();
  sync_locked();  // a route that is down is not waited for
}

void Routes::route_info(std::uint64_t route, const proto::Info& info) {
  std::lock_guard lock(mu_);
  Route* r = find_locked(route);
  if (r == nullptr || stopped_) return;
  r->peer = info.self;
  for (const auto& p : info.peers) {
    // The brokers it has routes up to: one this broker has no route to is dialed.
    if (p.id != self_.id && !p.routes.empty()) announced_.try_emplace(p.id, p.routes);
  }
  add_discovered_locked();
  announce_locked();
}

void Routes::route_synced(std::uint64_t route, std::uint32_t through) {
  std::lock_guard lock(mu_);
  Route* r = find_locked(route);
  if (r == nullptr) return;
  r->synced = std::max(r->synced, through);
  sync_locked();
}

void Routes::interest_changed() {
  std::lock_guard lock(mu_);
  if (!started_ || stopped_) return;
  // The workers that carry routes subscribe to it there; then the interest
  // is in effect once each route's broker answered (route_synced).
  std::vector<std::uint32_t> told;
  for (const auto& r : routes_) {
    const auto w = static_cast<std::uint32_t>(r->id % workers_.size());
    if (std::find(told.begin(), told.end(), w) != told.end()) continue;
    told.push_back(w);
    workers_[w].post(InterestChangedCommand{});
  }
  sync_locked();
}

void Routes::sync_locked() {
  if (stopped_) return;
  std::uint32_t through = interest_.through();
  for (const auto& r : routes_)
    if (r->state == RouteState::kUp) through = std::min(through, r->synced);
  if (through > interest_.synced()) {
    interest_.set_synced(through);
    workers_.post_all(InterestSyncedCommand{through});
  }
}

void Routes::add_discovered_locked() {
  if (!started_ || stopped_) return;
  for (const auto& [id, urls] : announced_) {
    const bool covered = std::any_of(routes_.begin(), routes_.end(), [&](const auto& r) {
      return r->peer.id == id || r->announced_id == id ||
             std::find(urls.begin(), urls.end(), r->url) != urls.end();
    });
    if (covered) continue;
    // The first URL: the broker lists the one it prefers first (cluster.advertise).
    spdlog::info("route {}: discovered (broker {} was announced); dialing it", urls.front(), id);
    add_locked(urls.front(), id);
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

}  // namespace rdmabroker::daemon
