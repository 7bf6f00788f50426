// SPDX-License-Identifier: Apache-2.0
#include "broker/authenticator.hpp"

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <string.h>

#include <algorithm>
#include <cstring>
#include <optional>

#include "rdmabroker/common/thread_name.hpp"

namespace rdmabroker::daemon {

namespace {

/// How many addresses and cache entries the authenticator remembers at most:
/// past it, sweeps run at every check (an attacker with many addresses costs
/// memory only up to this).
constexpr std::size_t kMaxRemembered = 100'000;

void wipe(std::string& s) { explicit_bzero(s.data(), s.size()); }

}  // namespace

std::size_t Authenticator::KeyHash::operator()(const Key& k) const {
  std::size_t h;
  std::memcpy(&h, k.data(), sizeof h);  // an HMAC output: its bytes are already uniform
  return h;
}

Authenticator::Authenticator(std::shared_ptr<const AuthTable> table, Policy policy, Done done)
    : done_(std::move(done)), table_(std::move(table)), policy_(policy) {
  if (RAND_bytes(hmac_key_.data(), static_cast<int>(hmac_key_.size())) != 1) {
    // Without a secret key the cache's keys could be computed by anyone who
    // reads the process's memory from a guessed password: no cache then.
    policy_.cache_ttl = std::chrono::seconds(0);
  }
}

Authenticator::~Authenticator() {
  stop();
  explicit_bzero(hmac_key_.data(), hmac_key_.size());
}

void Authenticator::start() {
  thread_ = std::thread([this] {
    name_this_thread("rb-auth");
    run();
  });
}

void Authenticator::stop() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Authenticator::update(std::shared_ptr<const AuthTable> table, Policy policy) {
  {
    std::lock_guard lock(mu_);
    table_ = std::move(table);
    policy_ = policy;
  }
  cv_.notify_one();  // a shorter delay may make a queued check due now
}

void Authenticator::submit(Request r) {
  {
    std::lock_guard lock(mu_);
    queued_by_connection_[r.connection] = r.address;
    incoming_.push_back(std::move(r));
  }
  cv_.notify_one();
}

void Authenticator::cancel(std::uint64_t connection) {
  std::lock_guard lock(mu_);
  auto it = queued_by_connection_.find(connection);
  if (it == queued_by_connection_.end()) return;  // answered already, or being checked now
  const auto matches = [&](const Request& r) { return r.connection == connection; };
  auto drop_from = [&](std::deque<Request>& q) {
    auto r = std::find_if(q.begin(), q.end(), matches);
    if (r == q.end()) return false;
    wipe(r->secret);
    q.erase(r);
    return true;
  };
  if (!drop_from(incoming_)) {
    if (auto a = addresses_.find(it->second);
        a != addresses_.end() && drop_from(a->second.queue) && a->second.queue.empty()) {
      turn_.erase(std::find(turn_.begin(), turn_.end(), it->second));  // it has no turn to take now
    }
  }
  queued_by_connection_.erase(it);
  cancelled_.fetch_add(1, std::memory_order_relaxed);
}

Authenticator::Key Authenticator::cache_key(const Request& r) const {
  // user NUL secret: a user name cannot contain NUL (CONNECT's length field
  // separates them on the wire, and config names are YAML strings checked
  // for it), so no two pairs give the same input.
  std::string input;
  input.reserve(r.user.size() + 1 + r.secret.size());
  input.append(r.user).push_back('\0');
  input.append(r.secret);
  Key key{};
  unsigned int len = 0;
  HMAC(EVP_sha256(), hmac_key_.data(), static_cast<int>(hmac_key_.size()),
       reinterpret_cast<const unsigned char*>(input.data()), input.size(), key.data(), &len);
  wipe(input);
  return key;
}

std::shared_ptr<const Identity> Authenticator::cached(const AuthTable& table, const Key& key,
                                                      Clock::time_point now) {
  auto it = cache_.find(key);
  if (it == cache_.end()) return nullptr;
  if (now >= it->second.expires) {
    cache_.erase(it);
    return nullptr;
  }
  Identity was;
  was.name = it->second.name;
  was.credential = it->second.credential;
  return table.renew(was);  // null when a reload removed the user or changed its credential
}

void Authenticator::sort_incoming(std::unique_lock<std::mutex>& lock) {
  (void)lock;  // held by the caller
  const auto now = Clock::now();
  while (!incoming_.empty()) {
    Request r = std::move(incoming_.front());
    incoming_.pop_front();
    if (policy_.cache_ttl.count() > 0) {
      // An HMAC costs microseconds: answered here, ahead of every queue and
      // of the address's failure delay (a hit needs the right secret).
      if (auto id = cached(*table_, cache_key(r), now)) {
        queued_by_connection_.erase(r.connection);
        cache_hits_.add();
        record_outcome(r, true, now);
        finish(r, id);
        continue;
      }
    }
    Address& a = addresses_[r.address];
    if (a.queue.empty()) turn_.push_back(r.address);
    a.queue.push_back(std::move(r));
  }
}

bool Authenticator::known(const Address& a, const Request& r, Clock::time_point now) const {
  if (a.known(now)) return true;
  const auto n = r.user.empty() ? names_.end() : names_.find(r.user);
  return n != names_.end() && n->second.known(now);
}

bool Authenticator::due(const Address& a, const Request& r, Clock::time_point now,
                        Clock::time_point& wake) const {
  auto at = a.not_before;
  // A user name that guessers try is slowed wherever they come from; a host
  // that logged in lately is not held back by it (only by its own failures).
  if (!r.user.empty() && !a.known(now)) {
    if (auto n = names_.find(r.user); n != names_.end()) at = std::max(at, n->second.not_before);
  }
  if (at <= now) return true;
  wake = std::min(wake, at);
  return false;
}

std::optional<Authenticator::Request> Authenticator::next_due(Clock::time_point now,
                                                              Clock::time_point& wake) {
  wake = Clock::time_point::max();
  // One pass over the addresses in turn: the first that is due is served and
  // goes to the back, unless a known one (a recent successful login of its
  // address or user name) is due further on: that one is served first.
  // Those still delayed keep their place.
  std::optional<std::size_t> pick;
  bool pick_known = false;
  for (std::size_t i = 0; i < turn_.size();) {
    Address& a = addresses_[turn_[i]];
    while (!a.queue.empty() && a.queue.front().deadline <= now) {
      queued_by_connection_.erase(a.queue.front().connection);
      wipe(a.queue.front().secret);
      a.queue.pop_front();
      expired_.add();
    }
    if (a.queue.empty()) {
      turn_.erase(turn_.begin() + static_cast<std::ptrdiff_t>(i));
      if (pick && *pick > i) --*pick;
      continue;
    }
    if (due(a, a.queue.front(), now, wake)) {
      const bool k = known(a, a.queue.front(), now);
      if (!pick || (k && !pick_known)) {
        pick = i;
        pick_known = k;
      }
      if (pick_known) break;
    }
    ++i;
  }
  if (!pick) return std::nullopt;
  std::string name = std::move(turn_[*pick]);
  turn_.erase(turn_.begin() + static_cast<std::ptrdiff_t>(*pick));
  Address& a = addresses_[name];
  Request r = std::move(a.queue.front());
  a.queue.pop_front();
  queued_by_connection_.erase(r.connection);
  if (!a.queue.empty()) turn_.push_back(std::move(name));
  return r;
}

void Authenticator::record_outcome(const Request& r, bool ok, Clock::time_point now) {
  // A success resets its address's delay, not its name's: the name's is
  // what guessers elsewhere earned, and one login of the user's own does
  // not speed them up again. Failures older than a full delay are forgotten.
  const auto apply = [&](Pacing& p, bool reset) {
    if (ok) {
      if (reset) {
        p.failures = 0;
        p.not_before = {};
      }
      p.succeeded = now;
      return;
    }
    if (p.failures > 0 && p.not_before + policy_.failure_delay_max <= now) p.failures = 0;
    ++p.failures;
    // failure_delay * 2^(failures-1), capped (the shift bounded before it can overflow).
    const auto base = policy_.failure_delay;
    const std::uint32_t shift = std::min<std::uint32_t>(p.failures - 1, 20);
    p.not_before = now + std::min(base * (std::int64_t{1} << shift), policy_.failure_delay_max);
  };
  apply(addresses_[r.address], true);
  if (!r.user.empty()) apply(names_[r.user], false);
}

void Authenticator::sweep(Clock::time_point now) {
  // An address or a name is remembered while it has queued checks or a delay
  // running, for failure_delay_max after it (a guesser that pauses for less
  // than that resumes at its doubled delay), and while its success is recent.
  for (auto it = addresses_.begin(); it != addresses_.end();) {
    const bool idle = it->second.queue.empty() && it->second.idle(now, policy_.failure_delay_max);
    it = idle ? addresses_.erase(it) : std::next(it);
  }
  std::erase_if(names_, [&](const auto& kv) { return kv.second.idle(now, policy_.failure_delay_max); });
  for (auto it = cache_.begin(); it != cache_.end();)
    it = now >= it->second.expires ? cache_.erase(it) : std::next(it);
}

void Authenticator::finish(Request& r, Result<std::shared_ptr<const Identity>> verdict) {
  wipe(r.secret);
  done_(r, std::move(verdict));
}

void Authenticator::run() {
  std::unique_lock lock(mu_);
  while (!stop_) {
    sort_incoming(lock);
    const auto now = Clock::now();
    if (now >= next_sweep_ || addresses_.size() + names_.size() + cache_.size() > kMaxRemembered) {
      sweep(now);
      next_sweep_ = now + std::chrono::seconds(1);
    }
    Clock::time_point wake;
    std::optional<Request> r = next_due(now, wake);
    if (!r) {
      const auto until = std::min(wake, now + std::chrono::seconds(1));  // sweeps go on while idle
      cv_.wait_until(lock, until, [&] { return stop_ || !incoming_.empty(); });
      continue;
    }
    if (addresses_[r->address].failures > 0) delayed_.add();
    auto table = table_;
    const Policy policy = policy_;
    lock.unlock();
    auto verdict = table->verify(r->user, r->secret);
    checks_.add();
    std::optional<Key> key;
    if (verdict && policy.cache_ttl.count() > 0 && !verdict.value()->anonymous) key = cache_key(*r);
    lock.lock();
    const auto done_at = Clock::now();
    record_outcome(*r, static_cast<bool>(verdict), done_at);
    if (!verdict) failures_.add();
    if (key)
      cache_[*key] =
          CacheEntry{verdict.value()->name, verdict.value()->credential, done_at + policy.cache_ttl};
    lock.unlock();
    finish(*r, std::move(verdict));  // outside the lock: the callback posts to a worker
    lock.lock();
  }
  // The workers are gone or going: nobody waits for an answer.
  for (auto& r : incoming_) wipe(r.secret);
  for (auto& [name, a] : addresses_)
    for (auto& r : a.queue) wipe(r.secret);
}

void Authenticator::visit(StatsVisitor& v) const {
  static constexpr StatFamily kDropped{"rdmabroker_auth_checks_dropped_total",
                                       "Credential checks dropped before crypt(3) ran, by why.", "reason"};
  v.count("auth.checks", checks_, "rdmabroker_auth_checks_total",
          "Credential checks run (crypt(3)), not counting cache hits.");
  v.count("auth.cache_hits", cache_hits_, "rdmabroker_auth_cache_hits_total",
          "Logins accepted from the cache of recently verified credentials (no crypt(3)).");
  v.count("auth.check_failures", failures_, "rdmabroker_auth_check_failures_total",
          "Credential checks that failed (unknown user, wrong password or token).");
  v.count("auth.delayed", delayed_, "rdmabroker_auth_delayed_checks_total",
          "Checks that waited for their address's failure delay (auth.failure_delay_ms).");
  v.counter(kDropped.series("auth.dropped.expired", "expired"), expired_.get());
  v.counter(kDropped.series("auth.dropped.cancelled", "cancelled"),
            cancelled_.load(std::memory_order_relaxed));
  std::int64_t queued = 0, delayed_addresses = 0, delayed_names = 0, longest_ms = 0;
  {
    std::lock_guard lock(mu_);
    const auto now = Clock::now();
    queued = static_cast<std::int64_t>(incoming_.size());
    for (const auto& [name, a] : addresses_) {
      queued += static_cast<std::int64_t>(a.queue.size());
      if (a.not_before > now) {
        ++delayed_addresses;
        longest_ms = std::max<std::int64_t>(
            longest_ms, std::chrono::duration_cast<std::chrono::milliseconds>(a.not_before - now).count());
      }
    }
    for (const auto& [name, p] : names_) delayed_names += p.not_before > now ? 1 : 0;
  }
  v.level("auth.queued", queued, "rdmabroker_auth_queued_checks",
          "Credential checks waiting for their turn.");
  v.level("auth.delayed_addresses", delayed_addresses, "rdmabroker_auth_delayed_addresses",
          "Addresses whose next login check waits for a failure delay.");
  v.level("auth.delayed_names", delayed_names, "rdmabroker_auth_delayed_names",
          "User names whose next login check waits for a failure delay (guessed from many addresses).");
  v.gauge({"auth.longest_delay_ms",
           "rdmabroker_auth_longest_delay_seconds",
           "The longest failure delay (auth.failure_delay_ms) an address is waiting out now.",
           {},
           {},
           1e-3},
          longest_ms);
}

}  // namespace rdmabroker::daemon
