// SPDX-License-Identifier: Apache-2.0
// A Client that survives its connection (ClientOptions::reconnect): it holds
// one connected Session at a time and, when that fails, a supervisor thread
// connects a new one with backoff and restores every subscription under its
// old id, with its old handler or queue. Application calls go to the current
// Session; while there is none, publish() and request() wait for one (up to
// publish_timeout) and subscribe()/unsubscribe() change what will be
// restored.
//
// Polled (ClientOptions::polled): each session is polled; poll() polls the
// current one, and while there is none it waits (up to its timeout) for the
// supervisor, which still does the reconnecting (connect, restore) on its
// own thread: no message is taken in there, so every callback but the
// connection events still runs inside the application's poll().
#include <algorithm>
#include <random>
#include <thread>
#include <unordered_map>

#include "client_internal.hpp"
#include "reconnecting_consumer.hpp"
#include "session.hpp"
#include "rdmabroker/common/thread_name.hpp"

namespace rdmabroker {

namespace {

class ReconnectingClient final : public Client {
 public:
  ReconnectingClient(std::string url, ClientOptions options)
      : url_(std::move(url)),
        urls_(split_urls(url_)),
        opt_(with_url_credentials(std::move(options), urls_)) {}
  ~ReconnectingClient() override { close(); }

  Status start() {
    auto first = connect_once();
    if (!first) return first.error();
    current_ = std::move(first.value());
    board_->set(current_);
    supervisor_ = std::thread([this] {
      name_this_thread("rb-reconnect");
      supervise();
    });
    return {};
  }

  Status publish(std::string_view subject, ByteView payload) override {
    return with_session([&](Session& s) { return s.publish(subject, payload); });
  }
  Status publish_request(std::string_view subject, std::string_view reply, ByteView payload) override {
    return with_session([&](Session& s) { return s.publish_request(subject, reply, payload); });
  }
  Result<Message> request(std::string_view subject, ByteView payload,
                          std::chrono::milliseconds timeout) override {
    auto s = wait_for_session(opt_.publish_timeout);
    if (!s) return s.error();
    return s.value()->request(subject, payload, timeout);
  }
  Status publish(std::string_view subject, const Headers& headers, ByteView payload,
                 std::string_view reply) override {
    return with_session([&](Session& s) { return s.publish(subject, headers, payload, reply); });
  }
  Result<Message> request(std::string_view subject, const Headers& headers, ByteView payload,
                          std::chrono::milliseconds timeout) override {
    auto s = wait_for_session(opt_.publish_timeout);
    if (!s) return s.error();
    return s.value()->request(subject, headers, payload, timeout);
  }
  Result<PubAck> publish_acked(std::string_view subject, const Headers& headers, ByteView payload,
                               std::chrono::milliseconds timeout) override {
    auto s = wait_for_session(opt_.publish_timeout);
    if (!s) return s.error();
    return s.value()->publish_acked(subject, headers, payload, timeout);
  }
  Status publish_acked_async(std::string_view subject, const Headers& headers, ByteView payload,
                             PubAckHandler done) override {
    auto s = wait_for_session(opt_.publish_timeout);
    if (!s) return s.error();
    return s.value()->publish_acked_async(subject, headers, payload, std::move(done));
  }
  /// Opened on the connection of now, and again on the next one when
  /// that ends (reconnecting_consumer.hpp).
  Result<std::shared_ptr<Consumer>> consume(std::string_view stream, const ConsumerOptions& options,
                                            std::chrono::milliseconds timeout) override {
    auto s = wait_for_session(opt_.publish_timeout);
    if (!s) return s.error();
    auto k = s.value()->consume(stream, options, timeout);
    if (!k) return k.error();
    return make_reconnecting_consumer(board_, std::string(stream), options, s.value(), k.value());
  }
  using Client::publish;
  using Client::publish_acked;
  using Client::request;
  Result<std::uint32_t> subscribe(std::string_view subject, MessageHandler handler) override {
    return queue_subscribe(subject, {}, std::move(handler));
  }
  Result<std::shared_ptr<Subscription>> subscribe(std::string_view subject) override {
    return queue_subscribe(subject, {});
  }
  Result<std::uint32_t> queue_subscribe(std::string_view subject, std::string_view group,
                                        MessageHandler handler) override {
    if (!handler) return Error{ErrorKind::kInvalidArgument, "subscribe needs a handler"};
    return queue_subscribe_view(subject, group, owning_handler(std::move(handler)));
  }
  Result<std::uint32_t> subscribe_view(std::string_view subject, MessageViewHandler handler) override {
    return queue_subscribe_view(subject, {}, std::move(handler));
  }
  Result<std::uint32_t> queue_subscribe_view(std::string_view subject, std::string_view group,
                                             MessageViewHandler handler) override {
    if (!handler) return Error{ErrorKind::kInvalidArgument, "subscribe needs a handler"};
    auto added = add(subject, group, std::move(handler));
    if (!added) return added.error();
    return added->first;
  }
  Result<std::shared_ptr<Subscription>> queue_subscribe(std::string_view subject,
                                                        std::string_view group) override {
    auto added = add(subject, group, nullptr);
    if (!added) return added.error();
    return std::shared_ptr<Subscription>(added->second);
  }
  Status unsubscribe(std::uint32_t sid) override {
    std::shared_ptr<Session> s;
    {
      std::lock_guard lock(mu_);
      auto it = subs_.find(sid);
      if (it == subs_.end())
        return Error{ErrorKind::kInvalidArgument, "no subscription " + std::to_string(sid)};
      if (it->second.queue) it->second.queue->close("unsubscribed");
      subs_.erase(it);
      s = current_;
    }
    if (s && s->has_subscription(sid)) return s->unsubscribe(sid);
    return {};
  }
  Status flush(std::chrono::milliseconds timeout) override {
    auto s = wait_for_session(timeout);
    if (!s) return s.error();
    return s.value()->flush(timeout);
  }
  Result<std::size_t> poll(std::chrono::microseconds timeout) override {
    if (!opt_.polled) return not_polled("poll()");
    std::shared_ptr<Session> s;
    {
      std::unique_lock lock(mu_);
      // Reconnecting: nothing to take in until the supervisor has the next
      // connection, or wake() asks this poll() to return.
      const auto ready = [&] {
        return closed_ || wake_pending_ || (current_ && current_->close_reason().message.empty());
      };
      if (!ready()) cv_.wait_for(lock, timeout, ready);
      if (closed_) return close_error_;
      if (std::exchange(wake_pending_, false) || !ready()) return std::size_t{0};
      s = current_;
    }
    auto n = s->poll(timeout);
    if (n || n.error().kind == ErrorKind::kInvalidArgument) return n;
    // This connection just ended: the supervisor notices and reconnects; the
    // application polls on (on_connection_event says kDisconnected).
    std::lock_guard lock(mu_);
    if (closed_) return close_error_;
    return std::size_t{0};
  }
  Status wake() override {
    if (!opt_.polled) return not_polled("wake()");
    std::shared_ptr<Session> s;
    {
      std::lock_guard lock(mu_);
      if (closed_) return close_error_;
      // A connected session keeps the wake-up (its eventfd) for the poll()
      // in it or the next; without one, poll() waits on cv_ and takes it here.
      if (current_ && current_->close_reason().message.empty()) {
        s = current_;
      } else {
        wake_pending_ = true;
      }
    }
    if (!s) {
      cv_.notify_all();
      return {};
    }
    (void)s->wake();  // a session that ends meanwhile ends its poll() too
    return {};
  }
  void close() override {
    std::shared_ptr<Session> s;
    Error why{ErrorKind::kClosed, ""};
    {
      std::lock_guard lock(mu_);
      if (!closed_) {  // else the supervisor gave up: what is left is the joining
        closed_ = true;
        close_error_ = Error{ErrorKind::kClosed, "client closed the connection"};
        for (auto& [sid, sub] : subs_) {
          if (sub.queue) sub.queue->close(close_error_.message);
        }
      }
      s = std::move(current_);
      why = close_error_;
    }
    cv_.notify_all();
    board_->end(why);
    if (supervisor_.joinable()) supervisor_.join();
    if (s) s->close();
  }
  std::size_t max_payload(std::size_t subject_len) const override {
    std::lock_guard lock(mu_);
    return current_ ? current_->max_payload(subject_len)
                    : proto::max_payload(proto::max_publish_frame(last_max_frame_), subject_len);
  }
  std::string transport_description() const override {
    std::lock_guard lock(mu_);
    return current_ ? current_->transport_description() : "reconnecting to " + url_;
  }
  Error close_reason() const override {
    std::lock_guard lock(mu_);
    return closed_ ? close_error_ : Error{ErrorKind::kClosed, ""};
  }
  ServerInfo server_info() const override {
    std::lock_guard lock(mu_);
    return current_ ? current_->server_info() : last_info_;
  }
  ClientStats stats() const override {
    std::lock_guard lock(mu_);
    ClientStats s = past_;
    if (current_) add_stats(s, current_->stats());
    s.app_wakeups += app_wakeups_->load(std::memory_order_relaxed);          // its own queues' waits
    s.multicast_groups = current_ ? current_->stats().multicast_groups : 0;  // a gauge: now, not summed
    return s;
  }

 private:
  static void add_stats(ClientStats& to, const ClientStats& s) {
    to.messages_received += s.messages_received;
    to.multicast_messages += s.multicast_messages;
    to.join_failures += s.join_failures;
    to.repairs_requested += s.repairs_requested;
    to.duplicates += s.duplicates;
    to.messages_lost += s.messages_lost;
    to.io_wakeups += s.io_wakeups;
    to.app_wakeups += s.app_wakeups;
  }
  ClientStats past_;  // sessions that failed (guarded by mu_)
  /// Waits in the subscription queues this client makes (they outlive sessions).
  const WakeupCounter app_wakeups_ = std::make_shared<std::atomic<std::uint64_t>>(0);

  struct Entry {
    std::string subject;
    std::string group;
    MessageViewHandler handler;                // or
    std::shared_ptr<QueueSubscription> queue;  // one of the two
    /// Made on a connection at least once: if that connection no longer had
    /// it when it failed, the broker refused or revoked it, and it stays ended.
    bool placed = false;
  };

  /// Credentials in the first URL serve every server, the announced ones
  /// too (an announced URL carries none).
  static ClientOptions with_url_credentials(ClientOptions o, const std::vector<std::string>& urls) {
    if (!o.user.empty() || !o.token.empty() || urls.empty()) return o;
    if (auto parsed = parse_url(urls.front())) {
      o.user = parsed->user;
      o.password = parsed->password;
      o.token = parsed->token;
    }
    return o;
  }

  /// The servers to try: those given to connect(), then those the brokers
  /// announced (ServerInfo::client_urls(); ClientOptions::ignore_announced_servers).
  std::vector<std::string> servers() const {
    std::lock_guard lock(mu_);
    std::vector<std::string> out = urls_;
    if (opt_.ignore_announced_servers) return out;
    for (const auto& u : last_info_.client_urls()) {
      const bool given = std::any_of(urls_.begin(), urls_.end(), [&](const std::string& g) {
        auto parsed = parse_url(g);  // a given URL may carry credentials: compared without them
        return g == u ||
               (parsed && parsed->scheme + "://" + parsed->host + ":" + std::to_string(parsed->port) == u);
      });
      if (!given && std::find(out.begin(), out.end(), u) == out.end()) out.push_back(u);
    }
    return out;
  }

  /// What `s`'s broker announced last: the list for the next reconnect.
  void remember_announced(const Session& s) {
    ServerInfo info = s.server_info();
    if (info.self.id.empty()) return;  // no INFO: what was known stays
    std::lock_guard lock(mu_);
    last_info_ = std::move(info);
  }

  /// One attempt at each server of the list, from the preferred one on.
  Result<std::shared_ptr<Session>> connect_once() {
    ClientOptions o = opt_;
    o.reconnect = false;
    Result<std::unique_ptr<Client>> c = Error{ErrorKind::kConnectFailed, ""};
    const std::vector<std::string> list = servers();
    for (std::size_t i = 0; i < list.size(); ++i) {
      const std::size_t at = (preferred_ + i) % list.size();
      c = Client::connect(list[at], o);
      if (c) {
        preferred_ = at;
        break;
      }
    }
    if (!c) return c.error();
    std::shared_ptr<Session> s(static_cast<Session*>(c.value().release()));
    remember_announced(*s);
    std::lock_guard lock(mu_);
    last_max_frame_ = s->max_frame();
    return s;
  }

  /// Registers a subscription (a queue when `handler` is empty) for every
  /// connection from now on, and subscribes on the current one. Registered
  /// first: a reconnect that happens meanwhile restores it too (a second
  /// SUBSCRIBE of the same id on the same session is refused locally).
  Result<std::pair<std::uint32_t, std::shared_ptr<QueueSubscription>>> add(std::string_view subject,
                                                                           std::string_view group,
                                                                           MessageViewHandler handler) {
    if (!proto::valid_pattern(subject)) {
      return Error{ErrorKind::kInvalidArgument,
                   "invalid subject '" + std::string(subject) + "' (see docs/subjects.md)"};
    }
    if (!group.empty() && !proto::valid_subject(group)) {
      return Error{ErrorKind::kInvalidArgument, "invalid queue group name '" + std::string(group) + "'"};
    }
    std::shared_ptr<Session> s;
    std::uint32_t sid;
    std::shared_ptr<QueueSubscription> queue;
    {
      std::lock_guard lock(mu_);
      if (closed_) return close_error_;
      sid = next_sid_++;
      // Polled: the queue's next() polls this client while it waits.
      Driver drive;
      if (opt_.polled) drive = [this](Clock::time_point deadline) { drive_until(deadline); };
      if (!handler)
        queue = std::make_shared<QueueSubscription>(sid, opt_.subscription_queue_limit, app_wakeups_,
                                                    std::move(drive));
      subs_.emplace(sid, Entry{std::string(subject), std::string(group), handler, queue});
      s = current_;
    }
    if (s && s->restore_subscription(sid, subject, group, std::move(handler), queue)) mark_placed(sid);
    return std::pair{sid, queue};
  }

  /// The connected session, waiting up to `timeout` while reconnecting.
  Result<std::shared_ptr<Session>> wait_for_session(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu_);
    // The session's state is under its own lock and can change at any
    // moment (the I/O thread fails it), so it is read once: the session the
    // wait found open is the answer. Reading it again after the wait could
    // see it closed a microsecond later and report a timeout that never
    // happened, with no reconnect yet under way (seen once in 50 restarts).
    // If it fails before the caller uses it, the caller's operation fails
    // with kClosed and with_session() waits for the next one.
    std::shared_ptr<Session> open;
    cv_.wait_for(lock, timeout, [&] {
      if (closed_) return true;
      if (current_ && current_->close_reason().message.empty()) open = current_;
      return open != nullptr;
    });
    if (closed_) return close_error_;
    if (!open) {
      return Error{ErrorKind::kTimeout, "not connected to the broker for " + std::to_string(timeout.count()) +
                                            " ms (reconnecting: " + outage_.message + ")"};
    }
    return open;
  }

  /// Runs `op` on the session; if it fails because that session just
  /// failed (with whatever error closed it), waits for the next one within
  /// publish_timeout and tries again.
  template <typename Op>
  Status with_session(Op op) {
    const auto deadline = std::chrono::steady_clock::now() + opt_.publish_timeout;
    while (true) {
      auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      auto s = wait_for_session(std::max(left, std::chrono::milliseconds(0)));
      if (!s) return s.error();
      Status st = op(*s.value());
      if (st || std::chrono::steady_clock::now() >= deadline) return st;
      // A session that failed answers with the error that closed it (a reset,
      // the broker's shutdown...), not always kClosed: whatever the error, if
      // that session has closed, the next one gets the operation.
      if (st.error().kind != ErrorKind::kClosed && s.value()->close_reason().message.empty()) return st;
    }
  }

  /// Polled: one poll, waiting no later than `deadline` (a queue's next()).
  void drive_until(Clock::time_point deadline) {
    const auto left = std::chrono::duration_cast<std::chrono::microseconds>(deadline - Clock::now());
    (void)poll(std::clamp(left, std::chrono::microseconds(0), std::chrono::microseconds(100'000)));
  }

  void mark_placed(std::uint32_t sid) {
    std::lock_guard lock(mu_);
    if (auto it = subs_.find(sid); it != subs_.end()) it->second.placed = true;
  }

  /// Forgets the subscriptions the broker ended on `failed` (PERMISSION_DENIED
  /// with their id: refused, or revoked by a reload), so that a reconnect
  /// does not ask for them again. Before failed->close().
  void forget_ended(const Session& failed) {
    std::lock_guard lock(mu_);
    std::erase_if(subs_,
                  [&](const auto& kv) { return kv.second.placed && !failed.has_subscription(kv.first); });
  }

  void report(const ConnectionEvent& e) {
    if (opt_.on_connection_event) opt_.on_connection_event(e);
  }

  void supervise() {
    std::mt19937 rng(std::random_device{}());
    while (true) {
      std::shared_ptr<Session> failed;
      {
        std::unique_lock lock(mu_);
        // Woken by close(); otherwise looks at the session every 20 ms (a
        // failure is noticed that fast; the session has no failure callback
        // that could not also race with close()).
        cv_.wait_for(lock, std::chrono::milliseconds(20), [&] { return closed_; });
        if (closed_) return;
        if (current_->close_reason().message.empty()) continue;
        failed = current_;
        outage_ = failed->close_reason();
      }
      // With a server list, the next attempt begins with another server: the
      // failed one may be gone for good (docs/cluster.md). The list includes
      // what its broker announced until it failed.
      remember_announced(*failed);
      preferred_ = (preferred_ + 1) % servers().size();
      const auto down_since = std::chrono::steady_clock::now();
      forget_ended(*failed);
      // Release the dead connection at once (its QP or socket, its I/O
      // thread): a broker shutting down waits for its clients to leave.
      failed->close();
      report({ConnectionEvent::Kind::kDisconnected, failed->close_reason(), 0, {}, 0});
      auto delay = opt_.reconnect_delay;
      std::uint32_t attempts = 0;
      while (true) {
        {
          std::unique_lock lock(mu_);
          // Jitter: clients of a restarted broker do not all come back at once.
          const auto jittered = delay / 2 + std::chrono::milliseconds(rng() % (delay.count() / 2 + 1));
          if (cv_.wait_for(lock, jittered, [&] { return closed_; })) return;
        }
        ++attempts;
        auto next = connect_once();
        if (next) {
          // Restore every subscription that neither the application nor the
          // broker ended (forget_ended() dropped those the broker refused or
          // revoked; their queues are closed).
          std::size_t restored = 0;
          std::vector<std::pair<std::uint32_t, Entry>> to_restore;
          {
            std::lock_guard lock(mu_);
            for (auto& [sid, e] : subs_) to_restore.emplace_back(sid, e);
          }
          for (auto& [sid, e] : to_restore) {
            if (e.queue && e.queue->closed()) continue;
            if (next.value()->restore_subscription(sid, e.subject, e.group, e.handler, e.queue)) {
              mark_placed(sid);
              ++restored;
            }
          }
          // A polled session is not flushed here: its answers would run
          // callbacks on this thread. The application's next polls take in
          // the broker's verdict on what was restored.
          if (opt_.polled || next.value()->flush(opt_.connect_timeout)) {
            const auto downtime = std::chrono::duration_cast<std::chrono::milliseconds>(
                std::chrono::steady_clock::now() - down_since);
            {
              std::lock_guard lock(mu_);
              if (closed_) {
                next.value()->close();
                return;
              }
              add_stats(past_, current_->stats());  // the failed session's counts stay counted
              current_ = next.value();
            }
            cv_.notify_all();
            board_->set(next.value());
            report(
                {ConnectionEvent::Kind::kReconnected, failed->close_reason(), attempts, downtime, restored});
            break;
          }
          next.value()->close();
        } else {
          std::lock_guard lock(mu_);
          outage_ = next.error();
        }
        if (opt_.max_reconnect_attempts != 0 && attempts >= opt_.max_reconnect_attempts) {
          Error gave_up{ErrorKind::kClosed, ""};
          {
            std::lock_guard lock(mu_);
            closed_ = true;
            close_error_ =
                Error{ErrorKind::kClosed, "gave up reconnecting after " + std::to_string(attempts) +
                                              " attempts: " + outage_.message};
            gave_up = close_error_;
            for (auto& [sid, sub] : subs_) {
              if (sub.queue) sub.queue->close(close_error_.message);
            }
          }
          cv_.notify_all();
          board_->end(gave_up);
          report({ConnectionEvent::Kind::kGaveUp, gave_up, attempts, {}, 0});
          return;
        }
        delay = std::min(delay * 2, opt_.reconnect_max_delay);
      }
    }
  }

  const std::string url_;
  const std::vector<std::string> urls_;  // url_ as a server list (one URL: a list of one)
  ServerInfo last_info_;                 // what the last broker announced (guarded by mu_)
  std::size_t preferred_ = 0;            // the server tried first (supervisor thread, and start())
  const ClientOptions opt_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::shared_ptr<Session> current_;  // guarded by mu_
  // The same, for the consumers that outlive a connection.
  const std::shared_ptr<SessionBoard> board_ = std::make_shared<SessionBoard>();
  std::unordered_map<std::uint32_t, Entry> subs_;
  std::uint32_t next_sid_ = 1;
  bool closed_ = false;
  bool wake_pending_ = false;  // wake() while there was no connection to poll: for the next poll()
  Error close_error_{ErrorKind::kClosed, ""};
  Error outage_{ErrorKind::kClosed, ""};  // why the last connection failed, or the last attempt
  std::uint32_t last_max_frame_ = 0;
  std::thread supervisor_;
};

}  // namespace

Result<std::unique_ptr<Client>> connect_reconnecting(std::string_view url, ClientOptions options) {
  auto c = std::make_unique<ReconnectingClient>(std::string(url), std::move(options));
  if (auto st = c->start(); !st) return st.error();
  return std::unique_ptr<Client>(std::move(c));
}

}  // namespace rdmabroker
