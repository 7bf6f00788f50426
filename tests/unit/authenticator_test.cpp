// SPDX-License-Identifier: Apache-2.0
// The authenticator's defences (docs/security.md, "Password guessing and
// connection floods"): addresses served in turn, failure delays per address,
// no crypt(3) for connections that closed or whose deadline passed, and the
// cache of verified credentials.
#include "broker/authenticator.hpp"

#include <crypt.h>
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

namespace rdmabroker::daemon {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

std::string hash_secret(const std::string& secret, unsigned long rounds = 1000) {
  char setting[CRYPT_GENSALT_OUTPUT_SIZE];
  EXPECT_NE(crypt_gensalt_rn("$6$", rounds, nullptr, 0, setting, sizeof setting), nullptr);
  crypt_data data{};
  return crypt_r(secret.c_str(), setting, &data);
}

std::shared_ptr<const AuthTable> table_with(const std::string& password, unsigned long rounds = 1000) {
  config::AuthSettings s;
  config::User u;
  u.name = "alice";
  u.password_hash = hash_secret(password, rounds);
  s.users.push_back(u);
  u.name = "bob";
  s.users.push_back(u);
  return AuthTable::build(s);
}

/// The verdicts in the order the authenticator gave them.
struct Verdicts {
  struct One {
    std::uint64_t connection;
    std::string address;
    bool ok;
    Clock::time_point at;
  };
  std::mutex mu;
  std::condition_variable cv;
  std::vector<One> list;
  Authenticator::Done callback() {
    return [this](const Authenticator::Request& r, Result<std::shared_ptr<const Identity>> v) {
      std::lock_guard l(mu);
      list.push_back({r.connection, r.address, static_cast<bool>(v), Clock::now()});
      cv.notify_all();
    };
  }
  bool wait_for(std::size_t n, std::chrono::milliseconds timeout = 20s) {
    std::unique_lock l(mu);
    return cv.wait_for(l, timeout, [&] { return list.size() >= n; });
  }
  std::vector<One> get() {
    std::lock_guard l(mu);
    return list;
  }
};

Authenticator::Request request(std::uint64_t id, const std::string& address, const std::string& password,
                               Clock::duration deadline_in = 30s, const std::string& user = "alice") {
  return {0, id, address, user, password, Clock::now() + deadline_in};
}

StatsSnapshot stats(const Authenticator& a) {
  StatsSnapshotter s;
  a.visit(s);
  return s.snapshot;
}

Authenticator::Policy no_delay_no_cache() { return {0ms, 0ms, 0s}; }

/// Waits until the authenticator has taken every submitted check off its
/// queues (it is running the last one).
bool wait_until_checking(const Authenticator& auth) {
  for (int i = 0; i < 1000; ++i) {
    if (stats(auth)["auth.queued"] == 0) return true;
    std::this_thread::sleep_for(1ms);
  }
  return false;
}

TEST(Authenticator, AFloodFromOneAddressDelaysAnotherByOneCheckNotByTheFlood) {
  Verdicts v;
  // A hash slow enough that the flood's length shows: 40 checks ahead would take far longer than 2.
  Authenticator auth(table_with("right", 20000), no_delay_no_cache(), v.callback());
  for (std::uint64_t i = 0; i < 40; ++i) auth.submit(request(i, "10.0.0.66", "wrong"));
  auth.submit(request(100, "10.0.0.7", "right"));
  auth.start();
  ASSERT_TRUE(v.wait_for(41));
  const auto list = v.get();
  std::size_t position = 0;
  while (list[position].connection != 100) ++position;
  EXPECT_LE(position, 1u) << "the other address's login waited behind " << position << " guesses";
  EXPECT_TRUE(list[position].ok);
}

TEST(Authenticator, FailuresDelayTheirAddressOnlyAndASuccessResetsIt) {
  Verdicts v;
  Authenticator auth(table_with("right"), {200ms, 1000ms, 0s}, v.callback());
  auth.start();
  auth.submit(request(1, "10.0.0.66", "wrong"));
  ASSERT_TRUE(v.wait_for(1));
  const auto failed_at = v.get()[0].at;
  auth.submit(request(2, "10.0.0.66", "wrong"));             // waits out 200 ms
  auth.submit(request(3, "10.0.0.7", "right", 30s, "bob"));  // another address and name: not delayed
  ASSERT_TRUE(v.wait_for(3));
  auto list = v.get();
  // Checked before the delayed one submitted ahead of it, and not delayed
  // itself (a bound on its time would fail on a loaded machine).
  EXPECT_EQ(list[1].connection, 3u);
  EXPECT_EQ(stats(auth)["auth.delayed"], 1) << "only the failing address's second check waits";
  EXPECT_EQ(list[2].connection, 2u);
  EXPECT_GE(list[2].at - failed_at, 190ms);
  // Two failures: the next check of that address waits 400 ms (doubled), and
  // stat shows the delay running.
  auth.submit(request(4, "10.0.0.66", "right"));
  auto s = stats(auth);
  EXPECT_EQ(s["auth.delayed_addresses"], 1);
  EXPECT_GT(s["auth.longest_delay_ms"], 200);
  EXPECT_LE(s["auth.longest_delay_ms"], 400);
  ASSERT_TRUE(v.wait_for(4));
  list = v.get();
  EXPECT_GE(list[3].at - list[2].at, 390ms);
  EXPECT_TRUE(list[3].ok);
  // The success reset it: no delay now.
  auth.submit(request(5, "10.0.0.66", "right"));
  ASSERT_TRUE(v.wait_for(5));
  EXPECT_EQ(stats(auth)["auth.delayed"], 2) << "the check after the success waited";
}

// Issue 49: guessers spread over many addresses, each failing once, are
// slowed by the name they guess; the user's own host, known by a recent
// success, is neither slowed by that name nor made to wait its turn.
TEST(Authenticator, AGuessedNameIsSlowedEverywhereButItsKnownHostIsNot) {
  Verdicts v;
  Authenticator auth(table_with("right"), {200ms, 5000ms, 0s}, v.callback());
  auth.start();
  auth.submit(request(1, "10.0.0.7", "right"));  // alice's own host logs in
  ASSERT_TRUE(v.wait_for(1));
  for (std::uint64_t i = 0; i < 3; ++i) auth.submit(request(10 + i, "10.0.1." + std::to_string(i), "wrong"));
  ASSERT_TRUE(v.wait_for(4));
  auto list = v.get();
  // Three addresses, one failure each: only the name can have held them back.
  EXPECT_GE(list[2].at - list[1].at, 190ms);
  EXPECT_GE(list[3].at - list[2].at, 390ms);
  EXPECT_EQ(stats(auth)["auth.delayed_names"], 1);
  // Alice's name now waits 800 ms. A login from a host never seen waits it
  // out; her known host does not.
  auth.submit(request(20, "10.0.2.1", "right"));
  auth.submit(request(21, "10.0.0.7", "right"));
  ASSERT_TRUE(v.wait_for(6));
  list = v.get();
  EXPECT_EQ(list[4].connection, 21u) << "the known host waited out the name's delay";
  EXPECT_TRUE(list[4].ok);
  EXPECT_EQ(list[5].connection, 20u);
  EXPECT_GE(list[5].at - list[3].at, 790ms);
  EXPECT_TRUE(list[5].ok);
}

TEST(Authenticator, AKnownAddressIsCheckedBeforeEveryOtherAddressInTurn) {
  Verdicts v;
  // bob's hash is cheap; "slow"'s (500,000 rounds, a good part of a second)
  // keeps the thread busy while everything else is queued behind it.
  config::AuthSettings settings;
  config::User u;
  u.name = "bob";
  u.password_hash = hash_secret("right");
  settings.users.push_back(u);
  u.name = "slow";
  u.password_hash = hash_secret("right", 500000);
  settings.users.push_back(u);
  Authenticator auth(AuthTable::build(settings), no_delay_no_cache(), v.callback());
  auth.start();
  auth.submit(request(1, "10.0.0.7", "right", 30s, "bob"));
  ASSERT_TRUE(v.wait_for(1));
  auth.submit(request(3, "10.0.9.9", "right", 30s, "slow"));
  ASSERT_TRUE(wait_until_checking(auth));
  // Twenty guessers, each from its own address with its own name (no delay
  // holds them), all queued ahead of the known host's next login.
  for (std::uint64_t i = 0; i < 20; ++i)
    auth.submit(request(10 + i, "10.0.1." + std::to_string(i), "wrong", 30s, "guess" + std::to_string(i)));
  auth.submit(request(2, "10.0.0.7", "right", 30s, "bob"));
  ASSERT_TRUE(v.wait_for(23));
  const auto list = v.get();
  ASSERT_EQ(list[1].connection, 3u) << "the slow check was not the one running";
  EXPECT_EQ(list[2].connection, 2u) << "the known host's login waited behind guesses";
  EXPECT_TRUE(list[2].ok);
}

TEST(Authenticator, ChecksOfClosedOrOverdueConnectionsAreDroppedUnchecked) {
  Verdicts v;
  Authenticator auth(table_with("right"), no_delay_no_cache(), v.callback());
  for (std::uint64_t i = 0; i < 10; ++i) auth.submit(request(i, "10.0.0.66", "wrong"));
  for (std::uint64_t i = 0; i < 10; ++i) auth.cancel(i);  // their connections closed
  auth.submit(request(20, "10.0.0.67", "wrong", -1s));    // its deadline has passed
  auth.submit(request(30, "10.0.0.7", "right"));
  auth.start();
  ASSERT_TRUE(v.wait_for(1));
  auth.stop();
  const auto list = v.get();
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0].connection, 30u);
  auto s = stats(auth);
  EXPECT_EQ(s["auth.checks"], 1);
  EXPECT_EQ(s["auth.dropped.cancelled"], 10);
  EXPECT_EQ(s["auth.dropped.expired"], 1);
}

TEST(Authenticator, AVerifiedCredentialIsCachedUntilItChangesOrExpires) {
  Verdicts v;
  Authenticator auth(table_with("right"), {0ms, 0ms, 600s}, v.callback());
  auth.start();
  auth.submit(request(1, "10.0.0.7", "right"));
  ASSERT_TRUE(v.wait_for(1));
  auth.submit(request(2, "10.0.0.8", "right"));  // same secret: no crypt(3)
  auth.submit(request(3, "10.0.0.8", "wrong"));  // another secret: checked, and refused
  ASSERT_TRUE(v.wait_for(3));
  auto s = stats(auth);
  EXPECT_EQ(s["auth.cache_hits"], 1);
  EXPECT_EQ(s["auth.checks"], 2);
  auto list = v.get();
  EXPECT_TRUE(list[1].ok);
  EXPECT_FALSE(list[2].ok);
  // A reload that changes alice's password: the cached entry no longer lets the old one in.
  auth.update(table_with("new"), {0ms, 0ms, 600s});
  auth.submit(request(4, "10.0.0.7", "right"));
  ASSERT_TRUE(v.wait_for(4));
  EXPECT_FALSE(v.get()[3].ok);
  EXPECT_EQ(stats(auth)["auth.cache_hits"], 1);
  // With the cache off, every login pays its check.
  auth.update(table_with("right"), no_delay_no_cache());
  auth.submit(request(5, "10.0.0.7", "right"));
  auth.submit(request(6, "10.0.0.7", "right"));
  ASSERT_TRUE(v.wait_for(6));
  EXPECT_EQ(stats(auth)["auth.cache_hits"], 1);
  EXPECT_EQ(stats(auth)["auth.checks"], 5);
}

}  // namespace
}  // namespace rdmabroker::daemon
