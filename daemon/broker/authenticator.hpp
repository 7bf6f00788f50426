// SPDX-License-Identifier: Apache-2.0
// The authenticator thread: checks passwords and tokens (crypt(3), slow on
// purpose) off the workers and answers each worker through a callback (its
// command queue). docs/security.md, "Password guessing and connection
// floods", says what it defends against:
//
// - Fair by address: every address has its own queue and the thread serves
//   the addresses in turn, one check each, so a flood of guesses from one
//   address delays another address's login by one check per busy address,
//   not by the flood's length.
// - Failed logins slow their address down: after a failure the address's
//   next check waits auth.failure_delay_ms, doubled per further failure up to
//   auth.failure_delay_max_ms; a success resets it. Other addresses are not
//   slowed.
// - ... and their user name: a guesser spread over many addresses is slowed
//   by the name it guesses, with the same delays. A name's delay does not
//   hold back an address that logged in successfully in the last
//   kRecentSuccess (the user's own hosts keep logging in while others guess
//   its password).
// - Known first: a check for an address, or a user name, with a successful
//   login in the last kRecentSuccess is served before every other address's.
// - No work for the dead: a check whose connection closed (cancel()) or whose
//   connection's deadline passed is dropped without running crypt(3).
// - A cache of credentials verified in the last auth.cache_ttl_s, keyed by
//   HMAC-SHA256 of user and secret under a key drawn at start (never the
//   secret itself), so that a reconnecting fleet does not pay crypt(3) per
//   connection. A hit needs the same secret; a reload that changes or
//   removes the user's credential makes its entries useless.
#pragma once

#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>

#include "broker/auth.hpp"
#include "broker/stats.hpp"

namespace rdmabroker::daemon {

class Authenticator {
 public:
  using Clock = std::chrono::steady_clock;
  /// How long a successful login makes its address and user name known.
  static constexpr std::chrono::minutes kRecentSuccess{15};

  /// What auth.* settings say about pacing and caching (live).
  struct Policy {
    std::chrono::milliseconds failure_delay{250};
    std::chrono::milliseconds failure_delay_max{30000};
    std::chrono::seconds cache_ttl{600};
    static Policy from(const config::AuthSettings& a) {
      return {std::chrono::milliseconds(a.failure_delay_ms),
              std::chrono::milliseconds(a.failure_delay_max_ms), std::chrono::seconds(a.cache_ttl_s)};
    }
  };

  struct Request {
    std::uint32_t worker = 0;
    std::uint64_t connection = 0;  // broker-wide unique: cancel() finds it by this
    std::string address;           // the peer's address without its port: fairness and delays are per address
    std::string user;
    std::string secret;          // wiped once checked or dropped
    Clock::time_point deadline;  // the connection's authentication deadline: not checked after it
  };
  using Done = std::function<void(const Request&, Result<std::shared_ptr<const Identity>>)>;

  Authenticator(std::shared_ptr<const AuthTable> table, Policy policy, Done done);
  ~Authenticator();
  Authenticator(const Authenticator&) = delete;
  Authenticator& operator=(const Authenticator&) = delete;

  void start();
  void stop();
  /// Any thread. Requests already queued are checked against the new table.
  void update(std::shared_ptr<const AuthTable> table, Policy policy);
  /// Any thread.
  void submit(Request r);
  /// Any thread: connection `id` closed; its check, if still queued, is dropped.
  void cancel(std::uint64_t connection);

  /// The authenticator's statistics (auth.checks, auth.cache_hits, ...).
  void visit(StatsVisitor& v) const;

 private:
  using Key = std::array<unsigned char, 32>;
  struct KeyHash {
    std::size_t operator()(const Key& k) const;
  };
  struct CacheEntry {
    std::string name;        // the identity it verified as
    std::string credential;  // ... against this hash: a reload that changes it makes the entry useless
    Clock::time_point expires;
  };
  /// Failed logins of an address or a user name, and its last success.
  struct Pacing {
    std::uint32_t failures = 0;    // consecutive failed logins
    Clock::time_point not_before;  // no check before (the failure delay)
    Clock::time_point succeeded;   // the last successful login (epoch: none)
    bool known(Clock::time_point now) const {
      return succeeded != Clock::time_point{} && now - succeeded < kRecentSuccess;
    }
    /// Forgettable: no delay to remember (failure_delay_max after it ends) and no recent success.
    bool idle(Clock::time_point now, std::chrono::milliseconds delay_max) const {
      return (failures == 0 || not_before + delay_max <= now) && !known(now);
    }
  };
  struct Address : Pacing {
    std::deque<Request> queue;
  };

  void run();
  /// Answers from the cache what it can of the newly submitted requests and
  /// queues the rest by address (under mu_).
  void sort_incoming(std::unique_lock<std::mutex>& lock);
  /// The next request to check: the next address in turn that has one and
  /// is not delayed; requests past their deadline are dropped on the way.
  /// Empty if none is due (`wake` then says when one will be).
  std::optional<Request> next_due(Clock::time_point now, Clock::time_point& wake);
  /// Whether `r`, first in its address's queue, may be checked now (else
  /// `wake` is lowered to when it may), and whether it is known (served first).
  bool due(const Address& a, const Request& r, Clock::time_point now, Clock::time_point& wake) const;
  bool known(const Address& a, const Request& r, Clock::time_point now) const;
  void record_outcome(const Request& r, bool ok, Clock::time_point now);
  Key cache_key(const Request& r) const;
  std::shared_ptr<const Identity> cached(const AuthTable& table, const Key& key, Clock::time_point now);
  /// Forgets idle addresses without failures to remember, and expired cache entries.
  void sweep(Clock::time_point now);
  void finish(Request& r, Result<std::shared_ptr<const Identity>> verdict);

  Done done_;
  std::array<unsigned char, 32> hmac_key_{};  // drawn at construction, never leaves the process
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::shared_ptr<const AuthTable> table_;              // guarded by mu_
  Policy policy_;                                       // guarded by mu_
  std::deque<Request> incoming_;                        // guarded by mu_
  std::unordered_map<std::string, Address> addresses_;  // guarded by mu_
  std::unordered_map<std::string, Pacing> names_;       // by user name (mu_)
  std::deque<std::string> turn_;                        // addresses with queued requests, in turn (mu_)
  std::unordered_map<std::uint64_t, std::string> queued_by_connection_;  // -> address (mu_)
  std::unordered_map<Key, CacheEntry, KeyHash> cache_;                   // authenticator thread only
  Clock::time_point next_sweep_{};                                       // authenticator thread only
  bool stop_ = false;                                                    // guarded by mu_
  std::thread thread_;

  // Statistics: written by the authenticator thread (cancelled: by cancel()'s
  // callers, under mu_); read by the admin thread.
  Counter checks_;  // crypt(3) runs
  Counter cache_hits_;
  Counter failures_;                         // checks that failed
  Counter expired_;                          // dropped: the connection's deadline had passed
  Counter delayed_;                          // checks that waited for their address's failure delay
  std::atomic<std::uint64_t> cancelled_{0};  // dropped: the connection had closed
};

}  // namespace rdmabroker::daemon
