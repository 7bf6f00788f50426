#include "cluster/routes.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>

#include "multicast/engine.hpp"
#include "rdmabroker/proto/headers.hpp"
#include "rdmabroker/proto/wire.hpp"

namespace rdmabroker::daemon {

namespace {
constexpr auto kFirstRetry = std::chrono::milliseconds(100);
constexpr auto kLongestRetry = std::chrono::seconds(5);
constexpr auto kConnectTimeout = std::chrono::seconds(10);
/// How long a route's I/O thread waits for a pool buffer before it counts
/// the message as dropped: waiting holds the route (its broker stops sending
/// once the credits run out), which is the back-pressure we want.
constexpr int kPoolWaitMs = 1000;
}  // namespace

struct Routes::Route {
  explicit Route(std::string u) : url(std::move(u)) {}
  const std::string url;
  std::unique_ptr<Client> client;                               // null until the first login succeeded
  std::unordered_map<std::uint32_t, std::uint32_t> subscribed;  // interest entry id -> sid there
  std::string state = "connecting";                             // guarded by Routes::mu_
  bool itself = false;  // the URL leads back to this broker: never used
  std::chrono::steady_clock::time_point next_attempt{};
  std::chrono::milliseconds retry = kFirstRetry;
  std::string last_error;  // logged when it changes, not on every attempt
  std::atomic<std::uint64_t> messages_in{0};
  std::atomic<std::uint64_t> bytes_in{0};
  std::atomic<std::uint64_t> dropped{0};
  std::atomic<std::uint64_t> reconnects{0};
};

Routes::Routes(BrokerCore& core, ClusterInterest& interest, std::string server_id)
    : core_(core), interest_(interest), server_id_(std::move(server_id)) {
  interest_.on_change([this] { wake(); });
}

Routes::~Routes() {
  stop();
  // Workers are joined by now; connections they destroy later still release
  // their interest, which must no longer call here.
  interest_.on_change({});
}

void Routes::start(const std::vector<std::string>& urls) {
  batches_.resize(core_.workers.size());
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
    out.push_back({r->url, r->state, r->messages_in.load(), r->bytes_in.load(), r->dropped.load(),
                   r->subscribed.size(), r->reconnects.load()});
  }
  return out;
}

void Routes::visit(StatsVisitor& v) const {
  const auto routes = status();
  std::int64_t configured = 0;
  std::int64_t up = 0;
  for (const auto& r : routes) {
    if (r.state == "itself") continue;
    ++configured;
    up += r.state == "up" ? 1 : 0;
    v.gauge({"cluster.routes_up", "rdmabroker_route_up", "1 while the route to that broker is up.", "route",
             r.url},
            r.state == "up" ? 1 : 0);
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
  v.level("cluster.routes", configured, "rdmabroker_routes",
          "Routes configured (cluster.routes, itself excluded).");
  v.level("cluster.interest", static_cast<std::int64_t>(interest_.size()), "rdmabroker_cluster_interest",
          "Distinct patterns and queue groups this broker's clients subscribe to: what its routes carry.");
}

void Routes::run() {
  std::unique_lock lock(mu_);
  while (!stop_) {
    dirty_ = false;
    // The list: routes no longer configured close (their I/O threads are
    // joined, so no message of theirs is being routed), new ones are added.
    for (auto it = routes_.begin(); it != routes_.end();) {
      if (std::find(urls_.begin(), urls_.end(), (*it)->url) != urls_.end()) {
        ++it;
        continue;
      }
      spdlog::info("route {}: removed by a reload", (*it)->url);
      auto gone = std::move(*it);
      it = routes_.erase(it);
      lock.unlock();
      if (gone->client) gone->client->close();
      gone.reset();
      lock.lock();
    }
    for (const auto& url : urls_) {
      if (std::none_of(routes_.begin(), routes_.end(), [&](const auto& r) { return r->url == url; }))
        routes_.push_back(std::make_unique<Route>(url));
    }
    const auto entries = interest_.snapshot();
    auto wake_at = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    for (auto& r : routes_) {
      if (stop_) break;
      if (r->itself) continue;
      if (!r->client) {
        if (std::chrono::steady_clock::now() < r->next_attempt) {
          wake_at = std::min(wake_at, r->next_attempt);
          continue;
        }
        ClientOptions opt;
        opt.user = core_.options.cluster.user;
        opt.password = core_.options.cluster.password;
        opt.route_cluster = core_.options.cluster.name;
        opt.route_server = server_id_;
        opt.multicast = false;  // a route takes its messages over its connection
        opt.connect_timeout = kConnectTimeout;
        opt.reconnect = true;  // once up, the library keeps it up and restores its subscriptions
        opt.reconnect_delay = kFirstRetry;
        opt.reconnect_max_delay = kLongestRetry;
        Route* route = r.get();
        opt.on_connection_event = [this, route](const ConnectionEvent& e) {
          std::lock_guard guard(mu_);
          if (e.kind == ConnectionEvent::Kind::kDisconnected) {
            route->state = "down";
            spdlog::warn("route {}: down ({}); reconnecting", route->url, e.reason.message);
          } else if (e.kind == ConnectionEvent::Kind::kReconnected) {
            route->state = "up";
            route->reconnects.fetch_add(1);
            spdlog::info("route {}: up again after {} ms, {} subscriptions restored", route->url,
                         e.downtime.count(), e.subscriptions_restored);
          }
        };
        opt.on_error = [route](const Error& e) { spdlog::warn("route {}: {}", route->url, e.message); };
        const std::string url = r->url;
        lock.unlock();
        auto connected = Client::connect(url, std::move(opt));
        lock.lock();
        if (!connected) {
          const auto& why = connected.error().message;
          if (connected.error().kind == ErrorKind::kAuthenticationFailed &&
              why.find("itself") != std::string::npos) {
            r->itself = true;
            r->state = "itself";
            spdlog::info("route {}: leads to this broker; not used", url);
            continue;
          }
          if (why != r->last_error) spdlog::warn("route {}: cannot connect: {}", url, why);
          r->last_error = why;
          r->state = "down";
          r->next_attempt = std::chrono::steady_clock::now() + r->retry;
          r->retry = std::min<std::chrono::milliseconds>(r->retry * 2, kLongestRetry);
          wake_at = std::min(wake_at, r->next_attempt);
          continue;
        }
        r->client = std::move(connected).value();
        r->state = "up";
        r->last_error.clear();
        r->retry = kFirstRetry;
        spdlog::info("route {}: up ({})", url, r->client->transport_description());
      }
      lock.unlock();
      reconcile(*r, entries);
      lock.lock();
    }
    cv_.wait_until(lock, wake_at, [&] { return stop_ || dirty_; });
  }
  auto routes = std::move(routes_);
  routes_.clear();
  lock.unlock();
  for (auto& r : routes) {
    if (r->client) r->client->close();
  }
}

void Routes::reconcile(Route& r, const std::vector<ClusterInterest::Entry>& entries) {
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
}

void Routes::on_message(Route& r, std::uint32_t entry, const std::string& group, const MessageView& m) {
  std::span<const std::byte> block = m.header_block();
  std::vector<std::byte> encoded;  // the block of a view of an owning Message, made again
  if (block.empty() && m.has_headers()) {
    const Headers headers = m.headers();
    std::vector<proto::HeaderField> fields;
    for (const auto& [name, value] : headers) fields.push_back({name, value});
    encoded.resize(proto::header_block_len(fields));
    proto::encode_header_block(encoded.data(), fields);
    block = encoded;
  }
  const std::size_t body = m.subject.size() + m.reply.size() + block.size() + m.payload.size();
  const std::size_t len = proto::align_up(proto::kHeaderSize + body);
  const std::uint32_t buffer_size = core_.options.buffer_size;
  if (len > proto::max_publish_frame(buffer_size)) {
    // Messages larger than one frame do not cross routes yet (docs/cluster.md).
    if (r.dropped.fetch_add(1) == 0)
      spdlog::warn(
          "route {}: a message of {} bytes to '{}' is larger than a frame and was dropped; "
          "routes carry messages of one frame (counted in the route's dropped messages)",
          r.url, m.payload.size(), m.subject);
    return;
  }
  std::uint32_t index = 0;
  for (int waited = 0; core_.pool->acquire(&index, 1) == 0; ++waited) {
    if (waited == kPoolWaitMs) {
      if (r.dropped.fetch_add(1) == 0)
        spdlog::warn("route {}: no pool buffer for {} ms; a message to '{}' was dropped", r.url, kPoolWaitMs,
                     m.subject);
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  BufferRef buf(core_.pool, index);
  proto::FrameHeader h;
  h.type = proto::FrameType::kPublish;
  h.subject_len = static_cast<std::uint16_t>(m.subject.size());
  h.reply_len = static_cast<std::uint16_t>(m.reply.size());
  h.header_len = static_cast<std::uint16_t>(block.size());
  h.payload_len = static_cast<std::uint32_t>(block.size() + m.payload.size());
  std::byte* p = buf.data();
  proto::encode_header(p, h);
  std::size_t off = proto::kHeaderSize;
  auto put = [&](const void* from, std::size_t n) {
    if (n != 0) std::memcpy(p + off, from, n);
    off += n;
  };
  put(m.subject.data(), m.subject.size());
  put(m.reply.data(), m.reply.size());
  put(block.data(), block.size());
  put(m.payload.data(), m.payload.size());
  std::memset(p + off, 0, len - off);
  r.messages_in.fetch_add(1, std::memory_order_relaxed);
  r.bytes_in.fetch_add(m.payload.size(), std::memory_order_relaxed);

  const auto frame_len = static_cast<std::uint32_t>(len);
  const std::int64_t now = std::chrono::steady_clock::now().time_since_epoch().count();
  std::lock_guard lock(routing_mu_);
  Match& match = match_cache_.match(core_.index, m.subject);
  auto deliver = [&](const Subscriber& s) {
    core_.slots->add_queued(s.slot, frame_len);
    batches_[s.worker].push_back(
        {s.connection, s.slot, make_delivery(buf.clone(), s.sid, 0, frame_len, h.payload_len, now)});
  };
  // Only the local subscriptions this entry stands for (one hop: never a
  // route's, and never one another entry brings its own copy to).
  auto ours = [&](const Subscriber& s) {
    return !s.route && s.interest == entry && s.worker != kChannelWorker;
  };
  if (group.empty()) {
    for (const Subscriber& s : match.plain)
      if (ours(s)) deliver(s);
  } else {
    // The other broker chose this one for the group: one member of it here.
    std::vector<const Subscriber*> members;
    for (const auto& g : match.groups)
      for (const Subscriber& s : g)
        if (ours(s)) members.push_back(&s);
    if (!members.empty()) deliver(*members[next_member_[entry]++ % members.size()]);
  }
  core_.post_deliveries(batches_);
}

}  // namespace rdmabroker::daemon
