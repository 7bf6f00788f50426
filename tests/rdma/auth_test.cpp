// SPDX-License-Identifier: Apache-2.0
// Authentication and permissions end to end (docs/security.md), each over
// RDMA (in the guest, label rdma) and TCP (on the host, label tcp): who may
// connect, what a user may publish and subscribe to, and what a reload does
// to connected clients. Brokers here start without --allow-anonymous.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>

#include "harness.hpp"
#include "rdmabroker/client.hpp"

namespace rdmabroker::test {
namespace {

using namespace std::chrono_literals;

ClientOptions credentials(std::string user, std::string password, std::string token = {}) {
  ClientOptions o;
  o.user = std::move(user);
  o.password = std::move(password);
  o.token = std::move(token);
  return o;
}

/// Collects a client's asynchronous errors (must outlive the client).
struct Errors {
  std::mutex mu;
  std::vector<Error> list;
  ClientOptions options(std::string user, std::string password) {
    ClientOptions o = credentials(std::move(user), std::move(password));
    o.on_error = [this](const Error& e) {
      std::lock_guard l(mu);
      list.push_back(e);
    };
    return o;
  }
  std::vector<Error> get() {
    std::lock_guard l(mu);
    return list;
  }
};

class Auth : public ::testing::TestWithParam<Via> {
 protected:
  void SetUp() override {
    if (GetParam() == Via::kRdma) require_rdma();
    write(base_config());
  }
  void TearDown() override { ::unlink(path_.c_str()); }

  /// alice (password): publishes to orders.> except orders.secret, subscribes
  /// to orders.> except orders.secret.>; bob (password) and ingest (token):
  /// everything.
  std::string base_config(
      const std::string& alice_subscribe = "{allow: [\"orders.>\"], deny: [\"orders.secret.>\"]}",
      bool with_bob = true) {
    std::string y = "logging: {level: info}\nauth:\n  anonymous: false\n  users:\n";
    y += "    - name: alice\n      password: '" + alice_hash_ + "'\n";
    y += "      publish: {allow: [\"orders.>\"], deny: [orders.secret]}\n";
    y += "      subscribe: " + alice_subscribe + "\n";
    if (with_bob) y += "    - name: bob\n      password: '" + bob_hash_ + "'\n";
    y += "    - name: ingest\n      token: '" + token_hash_ + "'\n";
    return y;
  }
  void write(const std::string& text) {
    std::ofstream out(path_, std::ios::trunc);
    out << text;
  }
  std::pair<int, std::string> reload(const BrokerProcess& b) {
    return run({"/bin/sh", "-c", cli_path() + " reload --admin-socket " + b.admin_socket() + " 2>&1"});
  }

  const std::string path_ = "/tmp/rdmabroker-auth-" + std::to_string(getpid()) + ".yaml";
  const std::string alice_hash_ = hash_secret("alice-pw");
  const std::string bob_hash_ = hash_secret("bob-pw");
  const std::string token_hash_ = hash_secret("tok-ingest-1");
};

TEST_P(Auth, OnlyValidCredentialsConnectAndOthersAreUndisturbed) {
  BrokerProcess broker(next_port(), {"--config", path_}, /*allow_anonymous=*/false);
  ASSERT_TRUE(broker.running());
  Errors bob_errors;
  auto bob = connect_via(broker, GetParam(), bob_errors.options("bob", "bob-pw"));
  ASSERT_TRUE(bob);
  auto sub = bob->subscribe(std::string_view("orders.>"));
  ASSERT_TRUE(sub);
  ASSERT_TRUE(bob->flush(10s));

  auto refused = [&](ClientOptions opt, const std::string& why) -> std::string {
    // The refusal is connect()'s answer, not also an asynchronous error.
    auto told = std::make_shared<std::atomic<int>>(0);
    opt.on_error = [told](const Error&) { ++*told; };
    auto c = try_connect_via(broker, GetParam(), std::move(opt));
    if (c.ok()) {
      ADD_FAILURE() << why << ": connected";
      return "";
    }
    EXPECT_EQ(told->load(), 0) << why << ": on_error told it too";
    EXPECT_EQ(c.error().kind, ErrorKind::kAuthenticationFailed) << why << ": " << c.error().message;
    return c.error().message;
  };
  const std::string anon = refused({}, "anonymous");
  EXPECT_NE(anon.find("anonymous access is off"), std::string::npos) << anon;
  const std::string wrong = refused(credentials("alice", "wrong"), "wrong password");
  EXPECT_NE(wrong.find("unknown user, wrong password or unknown token"), std::string::npos) << wrong;
  refused(credentials("mallory", "alice-pw"), "unknown user");
  refused(credentials("", "", "tok-wrong"), "unknown token");

  // The right ones: password, token, and credentials in the URL.
  auto alice = connect_via(broker, GetParam(), credentials("alice", "alice-pw"));
  ASSERT_TRUE(alice);
  auto ingest = connect_via(broker, GetParam(), credentials("", "", "tok-ingest-1"));
  ASSERT_TRUE(ingest);
  std::string url = url_via(broker, GetParam());
  url.insert(url.find("://") + 3, "bob:bob-pw@");
  ClientOptions by_url;
  if (GetParam() == Via::kRdma) by_url.bind_address = guest_addr2();
  auto bob2 = Client::connect(url, by_url);
  ASSERT_TRUE(bob2.ok()) << bob2.error().message;

  // `rdmabroker stat` names each connection's user.
  auto [rc, out] = run({cli_path(), "stat", "--json", "--admin-socket", broker.admin_socket()});
  ASSERT_EQ(rc, 0) << out;
  std::multiset<std::string> users;
  const auto listed = nlohmann::json::parse(out);
  for (const auto& c : listed["connections"]) users.insert(c.value("user", ""));
  EXPECT_EQ(users, (std::multiset<std::string>{"alice", "bob", "bob", "ingest"})) << out;

  auto s = broker.wait_stats([](auto& s) { return s["connections.closed.auth_failed"] == 4; }, 10s);
  EXPECT_EQ(s["auth.failed"], 4);
  EXPECT_EQ(s["auth.ok"], 4);
  EXPECT_EQ(s["connections.closed.auth_failed"], 4);
  // The refusals disturbed nobody: bob still receives.
  ASSERT_TRUE(ingest->publish("orders.eu", std::string_view("after the refusals")));
  auto m = sub.value()->next(10s);
  ASSERT_TRUE(m) << m.error().message;
  EXPECT_EQ(m->data(), "after the refusals");
  EXPECT_TRUE(bob_errors.get().empty());
}

TEST_P(Auth, PermissionsAllowAndDenyPublishAndSubscribe) {
  BrokerProcess broker(next_port(), {"--config", path_}, false);
  ASSERT_TRUE(broker.running());
  Errors errors;
  auto alice = connect_via(broker, GetParam(), errors.options("alice", "alice-pw"));
  auto bob = connect_via(broker, GetParam(), credentials("bob", "bob-pw"));
  ASSERT_TRUE(alice && bob);
  auto everything = bob->subscribe(std::string_view(">"));
  ASSERT_TRUE(everything);
  ASSERT_TRUE(bob->flush(10s));

  // Subscriptions: orders.* is allowed (no orders.secret.x in it); orders.>
  // could see orders.secret.x and is refused, ending that subscription.
  auto allowed = alice->subscribe(std::string_view("orders.*"));
  auto denied = alice->subscribe(std::string_view("orders.>"));
  ASSERT_TRUE(allowed && denied);
  ASSERT_TRUE(alice->flush(10s));
  auto end = denied.value()->next(5s);
  ASSERT_FALSE(end);
  EXPECT_EQ(end.error().kind, ErrorKind::kClosed);
  EXPECT_NE(end.error().message.find("subscribe to 'orders.>' denied for user 'alice'"), std::string::npos)
      << end.error().message;

  // Publishes: allowed ones flow; denied ones get an ERROR each, go nowhere,
  // and the connection stays.
  ASSERT_TRUE(alice->publish("orders.secret", std::string_view("no")));
  ASSERT_TRUE(alice->publish("billing.x", std::string_view("no")));
  // A denied message in fragments (SPEC.md §3.7): refused at its first, the rest go nowhere.
  ASSERT_TRUE(alice->publish("billing.big", std::vector<std::byte>(100000, std::byte{'n'})));
  ASSERT_TRUE(alice->publish("orders.eu", std::string_view("yes")));
  ASSERT_TRUE(alice->flush(10s));
  auto m = everything.value()->next(10s);
  ASSERT_TRUE(m) << m.error().message;
  EXPECT_EQ(m->subject, "orders.eu");
  EXPECT_FALSE(everything.value()->next(300ms)) << "a denied publish was delivered";
  auto mine = allowed.value()->next(10s);
  ASSERT_TRUE(mine) << mine.error().message;
  EXPECT_EQ(mine->subject, "orders.eu");

  const auto e = errors.get();
  ASSERT_EQ(e.size(), 4u);
  EXPECT_EQ(e[0].kind, ErrorKind::kPermissionDenied);
  EXPECT_NE(e[1].message.find("publish to 'orders.secret' denied for user 'alice'"), std::string::npos)
      << e[1].message;
  EXPECT_NE(e[2].message.find("publish to 'billing.x' denied"), std::string::npos) << e[2].message;
  EXPECT_NE(e[3].message.find("publish to 'billing.big' denied"), std::string::npos) << e[3].message;
  EXPECT_TRUE(alice->close_reason().message.empty()) << alice->close_reason().message;
  auto s = broker.stats();
  EXPECT_EQ(s["permissions.denied.publish"], 3);
  EXPECT_EQ(s["permissions.denied.subscribe"], 1);
  EXPECT_EQ(s["messages.in"], 1);  // refused publishes were never accepted
  EXPECT_EQ(s["bytes.in"], 3);     // nor counted as received, in fragments either
  EXPECT_EQ(s["messages.dropped.slow_consumer"] + s["messages.dropped.subscriber_closed"], 0);
}

TEST_P(Auth, ReloadRevokesSubscriptionsAndUsersOfConnectedClients) {
  BrokerProcess broker(next_port(), {"--config", path_}, false);
  ASSERT_TRUE(broker.running());
  auto alice = connect_via(broker, GetParam(), credentials("alice", "alice-pw"));
  auto bob = connect_via(broker, GetParam(), credentials("bob", "bob-pw"));
  auto ingest = connect_via(broker, GetParam(), credentials("", "", "tok-ingest-1"));
  ASSERT_TRUE(alice && bob && ingest);
  auto eu = alice->subscribe(std::string_view("orders.eu"));
  auto us = alice->subscribe(std::string_view("orders.us"));
  ASSERT_TRUE(eu && us);
  ASSERT_TRUE(alice->flush(10s));
  ASSERT_TRUE(ingest->publish("orders.us", std::string_view("before")));
  auto before = us.value()->next(10s);
  ASSERT_TRUE(before) << before.error().message;

  // alice may now subscribe to orders.eu.> and orders.eu only; bob is removed.
  write(base_config("{allow: [\"orders.eu\", \"orders.eu.>\"]}", /*with_bob=*/false));
  auto [rc, out] = reload(broker);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("auth.users"), std::string::npos) << out;

  // The revoked subscription ends; the other keeps receiving.
  auto end = us.value()->next(10s);
  ASSERT_FALSE(end);
  EXPECT_NE(end.error().message.find("subscription to 'orders.us' revoked"), std::string::npos)
      << end.error().message;
  ASSERT_TRUE(ingest->publish("orders.us", std::string_view("after")));
  ASSERT_TRUE(ingest->publish("orders.eu", std::string_view("after")));
  ASSERT_TRUE(ingest->flush(10s));
  auto still = eu.value()->next(10s);
  ASSERT_TRUE(still) << still.error().message;
  EXPECT_EQ(still->subject, "orders.eu");

  // bob's connection is closed with the reason; alice and ingest stay. The
  // close is counted when it starts; the connection leaves
  // connections.current when its teardown ends (over RDMA, after the CM's
  // disconnect: CI saw 3 in between).
  auto s = broker.wait_stats(
      [](auto& s) { return s["connections.closed.auth_revoked"] == 1 && s["connections.current"] == 2; },
      10s);
  EXPECT_EQ(s["connections.closed.auth_revoked"], 1);
  EXPECT_EQ(s["permissions.revoked"], 1);
  EXPECT_EQ(s["connections.current"], 2);
  EXPECT_NE(bob->close_reason().message, "");
  EXPECT_FALSE(bob->publish("orders.eu", std::string_view("x")));
  EXPECT_TRUE(alice->close_reason().message.empty());
  // A new client with bob's password is refused now.
  auto again = try_connect_via(broker, GetParam(), credentials("bob", "bob-pw"));
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.error().kind, ErrorKind::kAuthenticationFailed);
}

// The CLI's exit codes (docs/cli.md, sysexits(3) where one fits) let a script
// tell what happened, one check per row of the table: 0 done, 1 failed, 3
// timed out, 4 no responders, 64 usage, 66 a --file it cannot read, 69 the
// broker or its admin socket unreachable, 77 credentials or permissions
// refused (and says why, once).
TEST_P(Auth, CliExitCodesTellScriptsWhatHappened) {
  BrokerProcess broker(next_port(), {"--config", path_}, /*allow_anonymous=*/false);
  ASSERT_TRUE(broker.running());
  // Output and error together; the arguments have no spaces or shell characters.
  auto cli = [&](const std::string& args, const std::string& user = "alice",
                 const std::string& password = "alice-pw") {
    std::string command = cli_path() + " " + args;
    for (const auto& w : cli_where(broker, GetParam())) command += " " + w;
    command += " --user " + user + " --password " + password + " 2>&1";
    return run({"/bin/sh", "-c", command});
  };
  auto expect = [&](const std::string& args, int code, const std::string& says,
                    const std::string& user = "alice", const std::string& password = "alice-pw") {
    const auto [rc, out] = cli(args, user, password);
    EXPECT_EQ(rc, code) << args << ": " << out;
    if (!says.empty()) {
      EXPECT_NE(out.find(says), std::string::npos) << args << ": " << out;
    }
  };
  expect("pub orders.eu hi", 0, "");
  expect("pub orders..eu hi", 1, "orders..eu");
  expect("pub orders.secret hi", 77, "permission denied: ");
  expect("sub orders.secret.x -n 1 --timeout 10", 77, "permission denied: ");
  expect("sub orders.eu -n 1 --timeout 0.5", 3, "timed out after 0 message(s)");
  // alice may not subscribe to the reply inbox: her request is refused.
  expect("request orders.eu hi --timeout 2", 77, "permission denied: ");
  expect("request nobody.here hi --timeout 5", 4, "no responders", "bob", "bob-pw");
  expect("reply orders.secret.x ok -n 1", 77, "permission denied: ");
  expect("pub", 64, "subject is required");
  expect("pub orders.eu --file /nonexistent/payload", 66, "/nonexistent/payload: No such file or directory");
  {
    const auto [rc, out] = cli("pub orders.eu hi", "alice", "wrong");
    EXPECT_EQ(rc, 77) << out;
    const std::string says = "unknown user, wrong password or unknown token";
    const auto first = out.find(says);
    EXPECT_NE(first, std::string::npos) << out;
    EXPECT_EQ(out.find(says, first + 1), std::string::npos) << "said twice: " << out;
  }
  const auto [stat_rc, stat_out] =
      run({"/bin/sh", "-c", cli_path() + " stat --admin-socket /nonexistent 2>&1"});
  EXPECT_EQ(stat_rc, 69) << stat_out;
  // A broker nobody runs: a port with nothing listening.
  const auto [gone_rc, gone_out] = run(
      {"/bin/sh", "-c",
       cli_path() + " pub x hi -s " + (GetParam() == Via::kTcp ? "tcp" : "rdma") + "://127.0.0.1:1 2>&1"});
  EXPECT_EQ(gone_rc, 69) << gone_out;
  EXPECT_EQ(run({cli_path(), "--help"}).first, 0);
  // Each refusal was the broker's, counted there.
  auto s = broker.stats();
  EXPECT_GE(s["permissions.denied.publish"], 1) << "publish refusals";
  EXPECT_GE(s["permissions.denied.subscribe"], 3) << "subscription refusals";
}

// Credentials in a URL are percent-decoded (RFC 3986): a password with ':',
// '@' and '%' logs in written as %3A, %40 and %25, from the library and the
// CLI; the same password left encoded is a wrong password.
TEST_P(Auth, APercentEncodedPasswordInAUrlLogsIn) {
  write(base_config() + "    - name: carol\n      password: '" + hash_secret("p:ss@w%rd") + "'\n");
  BrokerProcess broker(next_port(), {"--config", path_}, /*allow_anonymous=*/false);
  ASSERT_TRUE(broker.running());
  auto with_credentials = [&](const std::string& userinfo) {
    std::string url = url_via(broker, GetParam());
    return url.insert(url.find("://") + 3, userinfo + "@");
  };
  auto ok = try_connect_url(with_credentials("carol:p%3Ass%40w%25rd"), GetParam());
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  auto sub = ok.value()->subscribe(std::string_view("carol.x"));
  ASSERT_TRUE(sub);
  ASSERT_TRUE(ok.value()->flush(10s));

  std::string command =
      cli_path() + " pub carol.x encoded -s '" + with_credentials("carol:p%3Ass%40w%25rd") + "'";
  if (GetParam() == Via::kRdma) command += " -b " + guest_addr2();
  command += " 2>&1";
  const auto [rc, out] = run({"/bin/sh", "-c", command});
  EXPECT_EQ(rc, 0) << out;
  auto m = sub.value()->next(10s);
  ASSERT_TRUE(m) << m.error().message;
  EXPECT_EQ(m->data(), "encoded");

  auto literal = try_connect_url(with_credentials("carol:p%253Ass"), GetParam());
  ASSERT_FALSE(literal.ok());
  EXPECT_EQ(literal.error().kind, ErrorKind::kAuthenticationFailed);
}

INSTANTIATE_TEST_SUITE_P(Via, Auth, ::testing::Values(Via::kRdma, Via::kTcp),
                         [](const auto& info) { return to_string(info.param); });

// docs/cli.md, "A host without RDMA": with no --server and no
// RDMABROKER_URL, a host without RDMA devices goes to tcp://localhost:7471,
// where its broker serves TCP; a URL the user gave is never changed (an
// rdma:// one there fails: unavailable, saying what to use). The CLI, not
// the transport, is under test: the host only.
TEST(Tcp, TheCliGoesOverTcpByDefaultOnAHostWithoutRdma) {
  const std::string no_devices = "/tmp/rdmabroker-no-rdma-" + std::to_string(getpid());
  ASSERT_TRUE(std::filesystem::create_directories(no_devices));
  BrokerProcess broker(next_port(), {"--rdma", "off"}, /*allow_anonymous=*/true, /*tcp_port=*/7471);
  ASSERT_TRUE(broker.running()) << "is something else listening on port 7471?";
  const std::string env = "env -u RDMABROKER_URL RDMABROKER_SYSFS_INFINIBAND=" + no_devices + " ";
  const auto [rc, out] = run({"/bin/sh", "-c", env + cli_path() + " pub default.url hi -v 2>&1"});
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("no RDMA device on this host: using tcp://localhost:7471"), std::string::npos) << out;
  EXPECT_EQ(broker.stats()["messages.in"], 1);

  const std::string given = "rdma://127.0.0.1:" + std::to_string(broker.port());
  const auto [given_rc, given_out] =
      run({"/bin/sh", "-c", env + "RDMABROKER_URL=" + given + " " + cli_path() + " pub default.url hi 2>&1"});
  EXPECT_EQ(given_rc, 69) << given_out;
  EXPECT_EQ(broker.stats()["messages.in"], 1) << "a URL the user gave went elsewhere";
  std::error_code ec;
  if (std::filesystem::is_empty("/sys/class/infiniband", ec) || ec) {  // this host has no RDMA indeed
    EXPECT_NE(given_out.find("no RDMA device on this host"), std::string::npos) << given_out;
    EXPECT_NE(given_out.find("connect over TCP instead (tcp://HOST:7471"), std::string::npos) << given_out;
  }
  std::filesystem::remove(no_devices);
}

// `rdmabroker passwd` (docs/security.md): the hash it prints from stdin is
// what auth.users takes, and the broker accepts that secret and no other.
// The CLI, not the transport, is under test: TCP on the host only.
TEST(Tcp, PasswdPrintsAHashTheBrokerAccepts) {
  // sha512crypt at its lowest cost: the check is tested, not the cost.
  auto [rc, hash] = run({cli_path(), "passwd", "--scheme", "sha512crypt", "--cost", "1000"}, "carol-pw\n");
  ASSERT_EQ(rc, 0) << hash;
  ASSERT_FALSE(hash.empty());
  ASSERT_EQ(hash.back(), '\n');
  hash.pop_back();
  EXPECT_EQ(hash.rfind("$6$rounds=1000$", 0), 0u) << hash;
  EXPECT_EQ(hash.find("carol-pw"), std::string::npos) << "the secret itself is in the output";

  const std::string path = "/tmp/rdmabroker-passwd-" + std::to_string(getpid()) + ".yaml";
  std::ofstream(path) << "auth:\n  anonymous: false\n  users:\n    - name: carol\n      password: '" << hash
                      << "'\n";
  BrokerProcess broker(next_port(), {"--config", path}, /*allow_anonymous=*/false);
  ::unlink(path.c_str());
  ASSERT_TRUE(broker.running());
  EXPECT_TRUE(connect_via(broker, Via::kTcp, credentials("carol", "carol-pw")));
  auto wrong = try_connect_via(broker, Via::kTcp, credentials("carol", "carol-pw2"));
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.error().kind, ErrorKind::kAuthenticationFailed);

  // Nothing to hash, or a scheme it does not know: usage errors (status 64), no hash.
  auto [empty_rc, empty_out] = run({cli_path(), "passwd"}, "");
  EXPECT_EQ(empty_rc, 64) << empty_out;
  EXPECT_EQ(empty_out, "");
  auto [scheme_rc, scheme_out] = run({cli_path(), "passwd", "--scheme", "md5"}, "x\n");
  EXPECT_EQ(scheme_rc, 64) << scheme_out;
  EXPECT_EQ(scheme_out, "");
}

}  // namespace
}  // namespace rdmabroker::test
